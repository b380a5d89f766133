"""Consensus of the partitions of several federated fits (restarts, ``n_init > 1``), run by the server."""

from __future__ import annotations

import numpy as np

from fedsonmf._validation import is_int

__all__ = ["co_association", "consensus_labels"]


def co_association(partitions) -> np.ndarray:
    """Fraction of partitions in which each pair of samples shares a cluster, (n, n)."""
    P = [np.asarray(p).ravel() for p in partitions]
    if not P:
        raise ValueError("partitions is empty")
    n = P[0].size
    if any(p.size != n for p in P):
        raise ValueError("partitions differ in length")
    C = np.zeros((n, n))
    for p in P:
        _, inv = np.unique(p, return_inverse=True)
        H = np.zeros((n, inv.max() + 1))
        H[np.arange(n), inv] = 1.0
        C += H @ H.T
    return C / len(P)


def consensus_labels(partitions, n_clusters: int, random_state=None) -> np.ndarray:
    """Consensus of several partitions of the same samples (evidence accumulation).

    The co-association matrix A (A_ij = share of partitions that put i and j
    together) is clustered with average-linkage agglomerative clustering on
    the distance 1 - A into ``n_clusters`` groups -- the classic
    evidence-accumulation consensus (Fred & Jain 2005); it needs no labels and
    no choice among restarts (``restart_rule="consensus"``; the default keeps the
    medoid restart instead, :mod:`fedsonmf.estimators.restarts`).  Average linkage is deterministic;
    ``random_state`` is accepted for API symmetry (unused).

    Identical partitions give that partition back (up to renaming of the
    clusters, returned as 0..k-1 in order of first appearance) when it has
    ``n_clusters`` clusters.
    """
    from sklearn.cluster import AgglomerativeClustering

    P = [np.asarray(p).ravel() for p in partitions]
    A = co_association(P)
    n = A.shape[0]
    if not is_int(n_clusters) or not 1 <= n_clusters <= n:
        raise ValueError(f"n_clusters must be an integer in [1, {n}], got {n_clusters!r}")
    if n_clusters == 1:
        return np.zeros(n, dtype=int)
    D = 1.0 - A
    np.fill_diagonal(D, 0.0)
    labels = AgglomerativeClustering(n_clusters=n_clusters, metric="precomputed",
                                     linkage="average").fit_predict(D)
    # canonical names: order of first appearance
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(first)
    remap = np.empty(order.size, dtype=int)
    remap[order] = np.arange(order.size)
    return remap[labels]
