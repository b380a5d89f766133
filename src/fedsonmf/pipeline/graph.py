"""Federated graph refinement: the partition refined on the views' neighbourhood graphs.

After the k-means refinement (:mod:`fedsonmf.pipeline.refine`) the partition is refined once
more, on a different picture of the samples: each client's k-nearest-neighbour graph of its own
view. Multi-view spectral clustering, the strongest simple reference on image, biological and
many-view data (docs/clustering.md), clusters the average of these graphs; its objective, the
normalized cut of the summed graph A = sum_p A_p,

    ncut(Z) = sum_k links(k, rest) / vol(k),   vol(k) = sum_{i in k} d_i,   d = A 1,

is also the objective of weighted kernel k-means with weights d and kernel D^-1 A D^-1
(Dhillon, Guan & Kulis, "Kernel k-means, spectral clustering and normalized cuts", KDD 2004).
Its assignment step needs, for every sample i and cluster k, only

    L[i, k] = sum_p (A_p Z)[i, k]     (i's neighbours in cluster k, counted over the views),

because d = L 1 and links(k, k) = sum_{i in k} L[i, k]:

    dist(i, k) = -2 L[i, k] / (d_i vol(k)) + links(k, k) / vol(k)^2   (+ a term of i alone).

So one iteration is one exchange, exactly like the k-means refinement: the server sends the
labels, each client returns its (n, c) matrix A_p Z (masked under secure aggregation: the server
decodes only the sum), the server reassigns. Started from the federated partition, it is a local
search for the normalized cut the reference's spectral relaxation approximates: the factorisation
gives the start (which, on text, the graph alone does not find: multi-view spectral clustering
loses 20-35 points on BBCSport and Reuters), the graph moves the samples whose neighbourhoods
disagree with their cluster. The kernel is not positive semi-definite, so an iteration may raise
the cut; the partition of lowest cut met is kept (the server computes the cut from L).

The graph: per client, the symmetric k-NN graph of its samples scaled to unit l2 norm (nearest
by cosine), built by the client on its own view and never sent; with masks only the held samples
have edges. k is the reference's max(10, round(log2 n)), raised to half the mean cluster size
n / (2c) of the client's held samples where that is larger, up to 20 (:func:`graph_neighbors`):
a local search on the sparsest graph that connects the samples follows its noise, and more
neighbours average it out, while k near the cluster size would join clusters (docs/clustering.md,
"The neighbours of the graph"). Where neighbours tie (sparse
rows of one or two entries, duplicated rows) the tied ones share the weight of the edges left
(:func:`client_graph`), so no edge is an arbitrary pick of the search. A client sends
``A_p Z / n`` (entries at most 1, the public bound of the fixed point); the common factor 1/n
changes no assignment.

What it costs in privacy: per exchange the server learns, for every sample, how many of its
neighbours (summed over the views) lie in each cluster; between two exchanges the change of that
matrix is the summed neighbourhood of the samples that moved. It is the same kind of quantity as
the k-means refinement's summed distances (which reveal summed inner products of moved samples),
coarser (counts of a 0/1 graph). Off with ``refine="kmeans"`` or ``"none"``.

A partition a client refuses (a node's ``refine-min-cluster-size`` policy; the module docstring of
:mod:`fedsonmf.pipeline.refine`) is answered with NaN links: the search ends there, at the
partition of lowest cut met; a start refused at once is kept as it is, with an infinite cut.

Pure functions over arrays, called by the in-process estimator and by the Flower apps alike
(:mod:`fedsonmf.pipeline.steps`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from fedsonmf.pipeline.refine import refine_stages, refine_view

__all__ = ["MAX_TIE_GROUP", "TIE_TOLERANCE", "EXACT_GRAPH_MAX", "approximate_search", "check_graph_search",
           "graph_neighbors", "client_graph", "client_links", "client_products", "graph_assign", "normalized_cut",
           "GraphSearch", "graph_refine"]

#: the fewest neighbours of the k-NN graphs (the multi-view spectral reference's rule)
MIN_NEIGHBORS = 10
#: the most neighbours the cluster-size rule gives (graph_neighbors; the graph holds n k edges)
MAX_NEIGHBORS = 20
#: a sample whose neighbours tied at its k-th similarity are more than this many times k keeps only
#: the strictly nearer ones (client_graph)
MAX_TIE_GROUP = 3
#: cosine similarities within this of the k-th one are ties (unit rows: similarities are at most 1)
TIE_TOLERANCE = 1e-9
#: the most held samples whose graph the default search (``search="auto"``) finds exactly: above, the
#: exact search (quadratic in n: 2.3 s of CPU per planted sparse view at 10^4, ~9 s at 2 x 10^4)
#: gives way to the approximate one (client_graph; docs/speed.md, "The graph stage")
EXACT_GRAPH_MAX = 20_000
#: the approximate search (client_graph) ranks this many candidates per neighbour by their exact cosine
CANDIDATES = 3
#: the principal subspace the approximate search looks in: 2c dimensions, at least this many
SUBSPACE_MIN = 20
#: power iterations of its randomized SVD
SUBSPACE_ITER = 4
#: the HNSW index's links per node and its candidate lists while building and searching (64: 96 % of
#: the subspace's own nearest 60 found at 3 x 10^5 planted rows, in half the time of 128's 99 %)
HNSW_CONNECTIVITY = 16
HNSW_EXPANSION = 64


def graph_neighbors(n_samples: int, n_clusters: int | None = None, n_held: int | None = None) -> int:
    """k of every client's k-NN graph, at most ``n - 1``: ``max(10, round(log2 n))`` (the multi-view
    spectral reference's rule), or, given the number of clusters c, half the mean cluster size of
    the ``n_held`` samples the client holds (default n), ``n_held // (2c)``, when that is larger,
    at most :data:`MAX_NEIGHBORS`.

    Why (measured: docs/clustering.md, "The neighbours of the graph"): the graph refinement is a
    local search of the normalized cut, and on the reference's sparse graph it follows the graph's
    noise (WebKB, Movies, Prokaryotic, the 4-view BBC: 0.3-2.5 points lower than with 20 neighbours);
    with k near the size of a cluster the neighbourhoods cross clusters (40 faces of 10 samples
    each: 6-11 points lower at k = 20-30), hence half the mean cluster size.
    """
    n = int(n_samples)
    k = max(MIN_NEIGHBORS, int(round(np.log2(max(n, 2)))))
    if n_clusters is not None:
        held = n if n_held is None else int(n_held)
        k = max(k, min(MAX_NEIGHBORS, held // (2 * max(int(n_clusters), 1))))
    return int(max(1, min(k, n - 1)))


def client_graph(X, held=None, n_neighbors: int | None = None, n_clusters: int | None = None,
                 search: str = "auto") -> sp.csr_array:
    """A client's neighbourhood graph of its own view: (n, n) symmetric, weights in (0, 1], CSR.

    Every held sample (a row of ``X``, (n, d_p), dense or sparse) is scaled to unit l2 norm and
    joined to its ``n_neighbors`` = k nearest held samples by cosine (default
    :func:`graph_neighbors` of n, ``n_clusters`` and the held samples with a nonzero row); the
    graph is then symmetrised (the larger of the two directions).
    All-zero rows and samples not held get no edges.

    **Ties are shared, never broken by the search's order.** When several samples are at the
    distance of the k-th nearest (rows of one or two nonzero entries -- a citation list, a few
    tags -- or duplicated rows), the strictly nearer ones get weight 1 and the tied ones share
    the remaining weight equally: the graph is the expectation of the 0/1 k-NN graph over a
    uniformly random order among ties, so it does not depend on the order of the samples.
    Without ties it is the 0/1 k-NN graph. A sample whose tied group is larger than
    :data:`MAX_TIE_GROUP` x k keeps only its strictly nearer neighbours: its share would be below
    1/3 of an edge per tied sample (no neighbourhood to speak of, e.g. a sample that shares no
    feature with anyone else nearby), and the graph stays O(n k). Measured: docs/clustering.md.

    **The search** (``search``): ``"exact"`` compares every pair of held samples, in blocks --
    O(m^2 nnz/d_p) for m held samples, quadratic in n; ``"approximate"`` ranks by exact cosine the
    :data:`CANDIDATES` x k samples nearest to each in the view's principal subspace (its top
    max(2c, :data:`SUBSPACE_MIN`) right singular vectors, or the view itself when it is no wider),
    found by an HNSW index (``usearch``, the optional extra ``fedsonmf[scale]``; about O(m log m)),
    and applies the rule above to those, so a tie group is shared among the candidates found;
    ``"auto"`` (the default) is exact up to :data:`EXACT_GRAPH_MAX` held samples and approximate
    above. The subspace keeps the directions the view's samples share and drops the features few
    samples hold, so on a wide sparse view the approximate graph is a different graph, not a lossy
    copy: few of the exact neighbours, more of its weight inside a cluster. Measured (its recall of
    the exact edges, their share inside the planted clusters, the labels against the exact graph's):
    docs/speed.md, "The graph stage".
    """
    if search not in ("auto", "exact", "approximate"):
        raise ValueError(f"search must be 'auto', 'exact' or 'approximate', got {search!r}")
    Y = refine_view(X, held=held)
    n = Y.shape[0]
    sq = np.asarray(Y.multiply(Y).sum(axis=1)).ravel() if sp.issparse(Y) else np.einsum("ij,ij->i", Y, Y)
    present = np.flatnonzero(sq > 0)
    m = present.size
    k = min(int(n_neighbors) if n_neighbors is not None else graph_neighbors(n, n_clusters, m), m - 1)
    if k < 1:
        return sp.csr_array((n, n), dtype=np.float64)
    if m < n:  # every sample present (the usual case): the normalised view itself, no copy of it
        Y = Y[present]
    P = sp.csr_array(Y) if sp.issparse(Y) else np.ascontiguousarray(Y, dtype=np.float64)
    del Y
    approximate = search == "approximate" or (search == "auto" and m > EXACT_GRAPH_MAX)
    if approximate and k + 1 < m:
        rows, cols, weights = _approximate_edges(P, k, n_clusters)
    else:
        rows, cols, weights = _exact_edges(P, k)
    if m < n:
        rows, cols = present[rows], present[cols]
    A = sp.csr_array((weights, (rows, cols)), shape=(n, n))
    del rows, cols, weights  # the edge lists (3 n k numbers) are in A now, not held through the symmetrising
    return sp.csr_array(A.maximum(A.T))



def approximate_search(n_samples: int):
    """The approximate search's index module (``usearch.index``) for a graph of ``n_samples`` held samples above
    :data:`EXACT_GRAPH_MAX`, or an ImportError that says what to install (asked before any fit:
    :func:`check_graph_search`)."""
    try:
        import usearch.index as index_module
    except ImportError:
        raise ImportError(
            f"the k-NN graph of {n_samples} samples needs the approximate search above "
            f"{EXACT_GRAPH_MAX} samples (the exact one is quadratic in n): pip install 'fedsonmf[scale]' "
            "(usearch), or refine='kmeans' to leave the graph stage out") from None
    return index_module


def check_graph_search(refine: str, n_held: int, *, dp: bool = False) -> None:
    """Raise :func:`approximate_search`'s ImportError when the stages of ``refine`` (with ``dp``:
    :func:`~fedsonmf.pipeline.refine.refine_stages`) build a graph of more than :data:`EXACT_GRAPH_MAX`
    held samples and the extra is missing. The estimator calls it before the fits, a Flower node at
    its set-up: a missing extra is said before hours of factorisation, not after them."""
    if "graph" in refine_stages(refine, dp=dp) and n_held > EXACT_GRAPH_MAX:
        approximate_search(n_held)


def _share_ties(S, k: int) -> np.ndarray:
    """The edge weights of each row of similarities ``S`` (rows, candidates; -inf: no candidate):
    1 for the candidates strictly above the row's k-th largest, the rest of k shared by those tied
    with it (within :data:`TIE_TOLERANCE`), nothing for a tie group over :data:`MAX_TIE_GROUP` x k."""
    width = S.shape[1]
    kth = np.partition(S, width - k, axis=1)[:, width - k]  # the k-th largest similarity of each row
    strict = S > kth[:, None] + TIE_TOLERANCE
    # no candidate (-inf) is ever tied: a row with fewer than k of them keeps its strictly nearer ones
    tied = ~strict & (S >= kth[:, None] - TIE_TOLERANCE) & (S > -np.inf)
    n_strict, n_tied = strict.sum(axis=1), tied.sum(axis=1)
    share = np.divide(k - n_strict, n_tied, out=np.zeros(n_tied.shape), where=n_tied > 0)
    share[n_tied > MAX_TIE_GROUP * k] = 0.0
    return strict + tied * share[:, None]


def _edge_index(n: int):
    """The edge lists' index type for ``n`` samples: int32 (half of int64) when it holds them."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


def _exact_edges(P, k: int):
    """Every pair compared, in blocks of 32 MB of similarities: (rows, cols, weights) in ``P``'s rows."""
    m = P.shape[0]
    index = _edge_index(m)
    # the transpose once, in the layout of the product (a CSC transpose is otherwise converted to
    # CSR again in every block product: the same graph, measured 2.3x faster per block at 10^6)
    PT = sp.csr_array(P.T) if sp.issparse(P) else P.T
    rows, cols, weights = [], [], []
    chunk = max(1, (1 << 22) // m)  # 32 MB of similarities at a time (a few such blocks live at once)
    for lo in range(0, m, chunk):
        hi = min(m, lo + chunk)
        block = P[lo:hi] @ PT
        S = np.asarray(sp.csr_array(block).toarray() if sp.issparse(block) else block, dtype=np.float64)
        S[np.arange(hi - lo), np.arange(lo, hi)] = -np.inf  # not its own neighbour
        W = _share_ties(S, k)
        r, q = np.nonzero(W)
        rows.append((lo + r).astype(index))
        cols.append(q.astype(index))
        weights.append(W[r, q])
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(weights)


def _subspace(P, dim: int) -> np.ndarray:
    """The rows of ``P`` (m, d; unit l2 norm) in the span of their top ``dim`` right singular vectors,
    scaled to unit norm again: (m, min(d, dim)) float32, where the search looks for candidates. With
    d <= dim the rows themselves (an exact picture of the cosines)."""
    if P.shape[1] <= dim:
        Z = np.asarray(P.toarray() if sp.issparse(P) else P, dtype=np.float32)
    else:
        from sklearn.utils.extmath import randomized_svd

        _, _, Vt = randomized_svd(P, dim, n_iter=SUBSPACE_ITER, random_state=0)
        Z = np.asarray(P @ Vt.T, dtype=np.float32)
    norms = np.linalg.norm(Z, axis=1, keepdims=True)
    Z /= np.where(norms > 0, norms, 1.0)
    return np.ascontiguousarray(Z)


def _candidate_index(P, width: int, n_clusters: int | None):
    """An HNSW index (usearch, one thread, so the same index on every run) over the rows of ``P`` in
    their principal subspace (:func:`_subspace`), that picture ``Z`` and the order the rows were added
    in: grouped by their largest coordinate in ``Z``, so that the index's neighbouring nodes sit close in
    memory (measured 1.4x faster to build and search than in the given order at 3 x 10^5 rows)."""
    index_module = approximate_search(P.shape[0])
    Z = _subspace(P, max(SUBSPACE_MIN, 2 * int(n_clusters or 0)))
    m = Z.shape[0]
    top = np.argmax(np.abs(Z), axis=1)
    order = np.lexsort((Z[np.arange(m), top], top))
    index = index_module.Index(ndim=Z.shape[1], metric="ip", dtype="f32", connectivity=HNSW_CONNECTIVITY,
                               expansion_add=HNSW_EXPANSION, expansion_search=max(HNSW_EXPANSION, width))
    index.add(order.astype(np.uint64), Z[order], threads=1)
    return index, Z, order


def _search(index, Q, width: int):
    """The ``width`` nearest keys of every row of ``Q`` in ``index``, (rows, width) int64, and how many
    of each row's are real (usearch fills a short list with key 0; one row comes back unbatched)."""
    found = index.search(Q, width, threads=1)
    if hasattr(found, "counts"):
        return (np.asarray(found.keys, dtype=np.int64).reshape(Q.shape[0], -1),
                np.asarray(found.counts, dtype=np.int64).reshape(Q.shape[0]))
    keys = np.asarray(found.keys, dtype=np.int64).ravel()[:len(found)]
    C = np.zeros((1, width), dtype=np.int64)
    C[0, :keys.size] = keys
    return C, np.array([keys.size], dtype=np.int64)


def _approximate_edges(P, k: int, n_clusters: int | None = None):
    """The :data:`CANDIDATES` x k nearest of every row in the index of :func:`_candidate_index`,
    weighted by :func:`_share_ties` on their exact cosine similarities in the view: (rows, cols,
    weights) in ``P``'s rows. Searched and ranked a block of rows at a time: O(m k) memory."""
    m = P.shape[0]
    width = min(m, CANDIDATES * k + 1)  # +1: the search lists the sample itself
    edge = _edge_index(m)
    index, Z, order = _candidate_index(P, width, n_clusters)
    rows, cols, weights = [], [], []
    # a block's candidates' rows are gathered at once: about 2^19 stored values per block (~25 MB live)
    per_row = P.nnz / max(m, 1) if sp.issparse(P) else P.shape[1]
    chunk = max(1, int((1 << 19) // (width * max(per_row, 1.0))))
    for lo in range(0, m, chunk):
        block = order[lo:lo + chunk]  # in the index's order: its memory is read in sequence
        Cb, counts = _search(index, Z[block], width)
        own = block[:, None]
        valid = (np.arange(Cb.shape[1])[None, :] < counts[:, None]) & (Cb != own)  # fewer found than asked
        safe = np.where(valid, Cb, own)
        if sp.issparse(P):
            S = np.asarray(P[np.repeat(block, Cb.shape[1])].multiply(P[safe.ravel()]).sum(axis=1))
            S = S.reshape(Cb.shape)
        else:
            S = np.einsum("ij,ikj->ik", P[block], P[safe])
        S = np.where(valid, S, -np.inf)
        W = _share_ties(S, k)
        r, q = np.nonzero(W)
        rows.append(block[r].astype(edge))
        cols.append(Cb[r, q].astype(edge))
        weights.append(W[r, q])
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(weights)


def _indicator(labels, n_clusters: int) -> sp.csr_array:
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.size
    return sp.csr_array((np.ones(n), (np.arange(n), labels)), shape=(n, int(n_clusters)))


def client_links(A, labels, n_clusters: int) -> np.ndarray:
    """A client's reply to a graph exchange: ``A_p Z / n`` (n, c), sample i's neighbours in its
    graph ``A`` (:func:`client_graph`) that lie in each cluster of ``labels``, divided by n."""
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.size
    if A.shape != (n, n):
        raise ValueError(f"a graph of shape {A.shape} for {n} labels")
    AZ = A @ _indicator(labels, n_clusters)
    return np.asarray(AZ.toarray(), dtype=np.float64) / max(n, 1)


def client_products(A, M) -> np.ndarray:
    """A client's reply to a spectral exchange (:mod:`fedsonmf.pipeline.spectral`): ``A_p M / n``
    (n, c) for the server's block ``M`` (n, c), entries at most 1 in absolute value, so the reply's
    entries are too (``A_p`` has at most n - 1 unit edges per row) -- the public bound of the fixed
    point, as for :func:`client_links`, which is the same product with the partition's indicator."""
    M = np.asarray(M, dtype=np.float64)
    n = A.shape[0]
    if M.ndim != 2 or M.shape[0] != n or M.shape[1] < 1:
        raise ValueError(f"a block of shape {M.shape} for a graph of {n} samples")
    return np.asarray(A @ M, dtype=np.float64) / max(n, 1)


def _volumes(L, labels, n_clusters: int):
    d = L.sum(axis=1)
    vol = np.bincount(labels, weights=d, minlength=n_clusters)
    within = np.bincount(labels, weights=L[np.arange(labels.size), labels], minlength=n_clusters)
    return d, vol, within


def normalized_cut(L, labels, n_clusters: int) -> float:
    """The normalized cut ``sum_k (vol(k) - links(k, k)) / vol(k)`` of ``labels`` on the summed
    graph, from the summed links ``L`` (n, c) of an exchange that was sent ``labels``; clusters
    of zero volume count 0."""
    L = np.asarray(L, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    _, vol, within = _volumes(L, labels, int(n_clusters))
    live = vol > 0
    return float(np.sum((vol[live] - within[live]) / vol[live]))


def graph_assign(L, labels, n_clusters: int) -> np.ndarray:
    """The server's half of a graph exchange: every sample to the cluster whose kernel mean is
    nearest (weighted kernel k-means for the normalized cut; module docstring).  A sample with no
    edge in any view keeps its label; a cluster of zero volume takes no sample.  Ties: the lowest
    index."""
    L = np.asarray(L, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    d, vol, within = _volumes(L, labels, int(n_clusters))
    live = vol > 0
    dist = np.full(L.shape, np.inf)
    safe_d = np.where(d > 0, d, 1.0)
    dist[:, live] = -2.0 * L[:, live] / (safe_d[:, None] * vol[None, live]) + within[live] / vol[live] ** 2
    new = np.asarray(np.argmin(dist, axis=1), dtype=np.int64)
    new[d <= 0] = labels[d <= 0]
    return new


class GraphSearch:
    """The state of :func:`graph_refine` between exchanges, so that a driver can send its labels in
    the same round trip as another request (the spectral step's products:
    :func:`~fedsonmf.pipeline.spectral.graph_stage`).

    ``request()`` gives the labels of the next exchange (``None``: the search is over); ``feed(L)``
    takes that exchange's summed links (n, c); ``best``, ``best_cut``, ``iterations``: the partition
    of lowest normalized cut met so far (ties: the earlier), its cut, the exchanges fed.
    """

    def __init__(self, labels, n_clusters: int, *, max_iter: int = 100):
        self.labels = np.asarray(labels, dtype=np.int64)
        self.n_clusters, self.max_iter = int(n_clusters), int(max_iter)
        self.best, self.best_cut, self.iterations = self.labels, np.inf, 0
        self.done = self.max_iter < 1
        self._seen = {self.labels.tobytes()}

    def request(self):
        return None if self.done else self.labels

    def feed(self, L) -> None:
        if np.isnan(L).any():  # refused by a client's policy: the search ends at the best partition met
            self.done = True
            return
        self.iterations += 1
        cut = normalized_cut(L, self.labels, self.n_clusters)
        if cut < self.best_cut:
            self.best, self.best_cut = self.labels, cut
        labels = graph_assign(L, self.labels, self.n_clusters)
        # a partition met before: a fixed point, or a cycle (the kernel is indefinite)
        self.done = labels.tobytes() in self._seen or self.iterations >= self.max_iter
        self._seen.add(labels.tobytes())
        self.labels = labels


def graph_refine(labels, exchange: Callable, n_clusters: int, *, max_iter: int = 100, first: list | None = None):
    """Kernel k-means iterations on the summed graph from ``labels`` until they reach a partition
    met before (a fixed point, or a cycle: the kernel is indefinite, and two partitions that
    send samples back and forth are common) or ``max_iter``; the partition of lowest normalized
    cut met is returned (ties: the earlier).

    ``exchange(labels) -> L``: the summed ``A_p Z / n`` of every client (n, c), one round trip.
    ``first`` (optional list): the reply to the first exchange, sent ``labels``, is appended to it
    (the spectral step starts from it: :func:`~fedsonmf.pipeline.spectral.spectral_refine`).
    Returns ``(labels, iterations, cut)``; NaN links (a partition refused) end the search, and a start
    refused at once comes back with 0 iterations and an infinite cut.
    """
    search = GraphSearch(labels, n_clusters, max_iter=max_iter)
    while (request := search.request()) is not None:
        L = exchange(request)
        if first is not None and search.iterations == 0:
            first.append(L)
        search.feed(L)
    return search.best, search.iterations, float(search.best_cut)
