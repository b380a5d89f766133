"""Federated k-means refinement of a partition: the last step of the clustering pipeline.

The federated factorisation gives a partition (k-means on the shared V); for dense and signed
features V (2c nonnegative components, each a group of features) is a coarse summary, and
k-means on the pooled views -- every sample scaled to unit l2 norm in every view, views side by
side -- finds better clusters (docs/clustering.md). That k-means can run federatedly, because its
squared distance splits over the views:

    d(i, k) = sum_p || y_i^p - mu_k^p ||^2,

where y_i^p is sample i's row of view p scaled to unit norm and mu_k^p the mean of those rows
over the samples of cluster k -- both computable by client p alone, given the partition. So one
refinement iteration is one exchange: the server sends the current labels; each client returns its
(n, c) matrix of distances D_p (masked under secure aggregation: the server decodes only their
sum); the server assigns every sample to its nearest cluster. It is Lloyd's algorithm on the
pooled row-normalised views, started from the federated partition instead of random centres,
until the labels stop changing.

What it costs in privacy: every client learns the partition being refined (which is the
clustering the federation computes); the server learns the summed distances -- n x c numbers per
iteration, each a sum over the views. Off with ``refine="none"``.

The steps are pure functions over arrays, called by the in-process estimator and by the Flower
apps alike (:mod:`fedsonmf.estimators.clustering_steps` exposes them to the nodes and server).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

__all__ = ["REFINE_RULES", "refine_view", "client_distances", "assign", "refine_partition"]

#: FedMultiViewClustering's ``refine``: "kmeans" (this module) or "none"
REFINE_RULES = ("kmeans", "none")


def refine_view(X, held=None):
    """A client's view for the refinement: every sample (row) scaled to unit l2 norm.

    Parameters
    ----------
    X : array or sparse matrix of shape (n_samples, n_features)
        The client's raw view (rows are samples).
    held : int array or None
        The samples the client holds (incomplete views); rows outside are zeroed.

    Returns
    -------
    ndarray or CSR matrix of shape (n_samples, n_features), float64; all-zero rows stay zero.
    """
    if sp.issparse(X):
        Y = sp.csr_matrix(X, dtype=np.float64, copy=True)
        norms = np.sqrt(np.asarray(Y.multiply(Y).sum(axis=1)).ravel())
        scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
        if held is not None:
            keep = np.zeros(Y.shape[0], dtype=bool)
            keep[np.asarray(held)] = True
            scale[~keep] = 0.0
        Y = sp.diags(scale) @ Y
        Y.eliminate_zeros()
        return sp.csr_matrix(Y)
    Y = np.array(X, dtype=np.float64, copy=True)
    norms = np.sqrt(np.einsum("ij,ij->i", Y, Y))
    scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    if held is not None:
        keep = np.zeros(Y.shape[0], dtype=bool)
        keep[np.asarray(held)] = True
        scale[~keep] = 0.0
    return Y * scale[:, None]


def client_distances(Y, labels, n_clusters: int, held=None) -> np.ndarray:
    """One client's half of a refinement iteration: ``D[i, k] = ||y_i - mu_k||^2`` (n, c).

    ``mu_k`` is the mean of the held rows of cluster k (a cluster with no held sample: the
    zero vector, so its distance is ``||y_i||^2``).  Rows of samples the client does not hold
    are zero (they add nothing to the sum over the views).
    """
    labels = np.asarray(labels, dtype=np.int64)
    n = Y.shape[0]
    mask = np.ones(n, dtype=bool)
    if held is not None:
        mask = np.zeros(n, dtype=bool)
        mask[np.asarray(held)] = True
    # indicator of the held samples of each cluster, divided by the cluster's size: mu = A^T Y
    counts = np.bincount(labels[mask], minlength=n_clusters).astype(np.float64)
    weights = np.divide(1.0, counts, out=np.zeros_like(counts), where=counts > 0)
    rows = np.flatnonzero(mask)
    A = sp.csr_matrix((weights[labels[rows]], (rows, labels[rows])), shape=(n, n_clusters))
    mu_ = A.T @ Y  # (c, d): sparse when Y is
    mu = mu_.toarray() if sp.issparse(mu_) else np.asarray(mu_, dtype=np.float64)
    cross = np.asarray(Y @ mu.T)  # (n, c)
    y2 = np.asarray(Y.multiply(Y).sum(axis=1)).ravel() if sp.issparse(Y) else np.einsum("ij,ij->i", Y, Y)
    mu2 = np.einsum("ij,ij->i", mu, mu)
    D = np.maximum(y2[:, None] - 2.0 * cross + mu2[None, :], 0.0)
    D[~mask] = 0.0
    return D


def assign(D) -> np.ndarray:
    """The server's half: every sample to its nearest cluster (ties: the lowest index)."""
    return np.asarray(np.argmin(np.asarray(D), axis=1), dtype=np.int64)


def refine_partition(labels, exchange: Callable[[np.ndarray], np.ndarray], *, max_iter: int = 100):
    """Lloyd iterations from ``labels`` until they stop changing (or ``max_iter``).

    ``exchange(labels) -> D``: the summed distances of every client (one round trip).
    Returns ``(labels, iterations)``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    for it in range(1, int(max_iter) + 1):
        new = assign(exchange(labels))
        if np.array_equal(new, labels):
            return labels, it
        labels = new
    return labels, int(max_iter)
