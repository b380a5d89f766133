"""Row normalisers: every sample (row) to unit l2 norm, for views (client side) and for V^T (server side).

The other embeddings k-means could see (raw V^T, component-normalised) were measured and are not
used (``docs/clustering.md``); ``benchmarks/bench_clustering_study.py`` computes them.

All-zero rows stay zero (a sample a view does not have, or an empty document): no NaN anywhere.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["normalize_rows", "row_normalize"]


def normalize_rows(E: np.ndarray) -> np.ndarray:
    """Scale every row of the dense ``E`` to unit l2 norm; all-zero rows stay zero (no NaN).

    >>> normalize_rows(np.array([[3.0, 4.0], [0.0, 0.0]]))
    array([[0.6, 0.8],
           [0. , 0. ]])
    """
    E = np.asarray(E, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", E, E))
    out = np.zeros_like(E)
    ok = norms > 0
    out[ok] = E[ok] / norms[ok, None]
    return out


def row_normalize(X):
    """Samples (rows) to unit l2 norm; all-zero rows stay zero. Keeps sparse input sparse.

    Each row is divided by its largest |entry| first, so rows of 1e200 or 1e-200
    neither overflow nor underflow in the norm.
    """
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64, copy=True)
        amax = np.asarray(abs(X).max(axis=1).todense()).ravel()
        X = sp.csr_matrix(sp.diags(np.divide(1.0, amax, out=np.zeros_like(amax), where=amax > 0)) @ X)
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
        return sp.csr_matrix(sp.diags(scale) @ X)
    X = np.asarray(X, dtype=np.float64)
    amax = np.max(np.abs(X), axis=1) if X.shape[1] else np.zeros(X.shape[0])
    X = X * np.divide(1.0, amax, out=np.zeros_like(amax), where=amax > 0)[:, None]
    norms = np.linalg.norm(X, axis=1)
    scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return X * scale[:, None]
