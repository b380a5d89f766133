"""Products with a client's view X_p (d_p x n), dense or ``scipy.sparse``.

These are the only passes over the data.  Sparse views are never densified
and X_p - U V is never formed: norms use the expansion
||X - U V||^2 = ||X||^2 - 2 <U^T X, V> + <U^T U, V V^T>.

Storage [measured in benchmarks/bench_scale.py]: a dense view is the
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

__all__ = ["sqnorm", "x_vt", "ut_x", "axpy"]


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
    """``U^T X`` of shape (r, n), float64.

    For a sparse (CSC) view the result is F-ordered (the transpose of an
    (n, r) C array): no transposing copy, and a V derived from it is again
    F-ordered, which is the layout ``X @ V.T`` needs without a copy.
    Every later elementwise operation keeps the layout.
    """
    Uc = _cast(U, X)
    if sp.issparse(X):
        out = (X.T @ Uc).T  # CSC^T is CSR: a fast sparse x dense product
    else:
        out = Uc.T @ X  # one GEMM; cheaper than a sparse U^T (which copies X)
    return np.asarray(out, dtype=np.float64)


def axpy(a: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``y += a * x`` in one pass and without a temporary (BLAS daxpy) when
    both are float64 and share a contiguous layout; NumPy otherwise."""
    same = (x.flags.c_contiguous and y.flags.c_contiguous) or (x.flags.f_contiguous and y.flags.f_contiguous)
    if same and x.dtype == y.dtype == np.float64 and x.shape == y.shape and y.size:
        _daxpy(x.ravel(order="K"), y.ravel(order="K"), a=a)  # ravel views write through to y
    else:
        y += a * x
    return y


from scipy.linalg.blas import daxpy as _daxpy  # noqa: E402
