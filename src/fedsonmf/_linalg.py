"""Products with a client's view X_p (d_p x n), dense or ``scipy.sparse``.

These are the only passes over the data.  Sparse views are never densified
and X_p - U V is never formed: norms use the expansion
||X - U V||^2 = ||X||^2 - 2 <U^T X, V> + <U^T U, V V^T>.

Storage [issue 6, measured in benchmarks/bench_scale.py]: a dense view is the
transposed (F-ordered) view of the user's (n, d_p) array, so no copy is made;
a sparse view is CSC (d_p x n), which is the free transpose of the usual
CSR (n, d_p) input and was 3-6x faster than CSR for both products.

Precision [C]: float32 views stay float32 (half the memory of the largest
object).  The two products are then computed in float32 with V cast to
float32, and their (small) results promoted to float64; every state matrix
(U, V, corrections, gradients) stays float64.  float32 products carry a
relative error of order 1e-7 * sqrt(n), far below the residual targets
(tests/test_scale.py checks float32 against float64).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["sqnorm", "x_vt", "ut_x"]


def sqnorm(X) -> float:
    """``||X||_F^2`` for a dense or sparse matrix, accumulated in float64."""
    data = X.data if sp.issparse(X) else np.asarray(X)
    sub = "i,i->" if data.ndim == 1 else "ij,ij->"
    return float(np.einsum(sub, data, data, dtype=np.float64))


def _cast(A: np.ndarray, X) -> np.ndarray:
    return A if A.dtype == X.dtype else A.astype(X.dtype)


def x_vt(X, V: np.ndarray) -> np.ndarray:
    """``X V^T`` of shape (d_p, r), float64 ndarray."""
    out = X @ _cast(V, X).T
    return np.asarray(out, dtype=np.float64)


def ut_x(U: np.ndarray, X) -> np.ndarray:
    """``U^T X`` of shape (r, n), float64 C-ordered ndarray."""
    Uc = _cast(U, X)
    if sp.issparse(X):
        out = (X.T @ Uc).T  # CSC^T is CSR: a fast sparse x dense product
    else:
        out = Uc.T @ X  # one GEMM; cheaper than a sparse U^T (which copies X)
    return np.ascontiguousarray(out, dtype=np.float64)
