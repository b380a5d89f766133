"""Products with a client's view X_p (d_p x n), dense or ``scipy.sparse``.

These are the only passes over the data.  Sparse views are never densified
and X_p - U V is never formed: norms use the expansion
||X - U V||^2 = ||X||^2 - 2 <U^T X, V> + <U^T U, V V^T>.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["sqnorm", "x_vt", "ut_x"]


def sqnorm(X) -> float:
    """``||X||_F^2`` for a dense or sparse matrix."""
    if sp.issparse(X):
        data = X.data
        return float(np.dot(data, data))
    return float(np.vdot(X, X))


def x_vt(X, V: np.ndarray) -> np.ndarray:
    """``X V^T`` of shape (d_p, r), always a dense ndarray."""
    return np.asarray(X @ V.T)


def ut_x(U: np.ndarray, X) -> np.ndarray:
    """``U^T X`` of shape (r, n), dense.

    U (d_p x r) has at most one positive entry per row on S_+, so a sparse
    U^T makes this O(nnz(X)) instead of O(nnz(X) r) [issue 6].
    """
    Ut = sp.csr_matrix(U.T)
    out = Ut @ X
    if sp.issparse(out):
        return out.toarray()
    return np.asarray(out)
