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

Several starts, and which one is kept (``refine_starts``). Lloyd's algorithm only finds the
local optimum near its start, and on dense features the fit's partition is not always the best
start (docs/clustering.md: UCI digits 78.9 from it, 91.3 with ten starts). So the server also
refines ``refine_starts - 1`` partitions of k-means on V with other seeds (one replicate each:
diverse starts, computed from V alone) and keeps the refined partition with the lowest *score*.
The score is a sum over the clients in which each client judges the partition by its own view:
a client whose view is dense (its mean sample holds more than half of its energy after the
per-sample scaling -- the statistic that decides its preprocessing -- and at least
:data:`MIN_SCORE_SPREAD` of it lies off the mean sample) reports its k-means objective (the mean
over its samples of the distance to their cluster's mean) *divided by its one-cluster objective*
(the mean distance of its samples to their mean sample: the share of its spread the partition
leaves within the clusters, in [0, 1]); any other client reports 0.
The reason for the abstention: on sparse high-dimensional counts (text) the k-means objective
prefers worse partitions than the factorisation's (3Sources 82.8 -> 59.8 when every view scores,
3 seeds), on dense features it prefers better ones. When no client scores (every view sparse),
the first refined start -- the fit's partition -- is kept and no further start is refined, so
text costs nothing more. Every client decides alone, from its own view; the server sees only the
summed score (masked under secure aggregation, like the distances).

Why the share and not the objective itself: with rows at unit norm a view's objective is at most
its spread, 1 minus its mean sample's share of the energy, and dense views differ in spread by an
order of magnitude (UCI digits: 0.02 for the 216 profile correlations, 0.19 for the 76 Fourier
coefficients). Summed raw, the widest view decides alone: a spectral candidate that left 36 % more
of the profile view's spread within its clusters was kept because the Fourier view's objective fell
by 5 % (81.0 ACC against 89.3 with the shares, 3 seeds; docs/clustering.md). Each client divides by
a number of its own view, so every scoring view has the same say and nothing new is sent.

Seeded starts (``refine_seeded_starts``, when a client scores). The starts from V all lie near
the factorisation's partition; on dense data with many clusters Lloyd's algorithm from them stops
far from what k-means on the pooled views finds from its own k-means++ seeding (ORL faces, 40
classes: 66.7 against 74.2 ACC). So, once the first start has scored (a dense view takes part),
the server also seeds ``refine_seeded_starts`` partitions by greedy k-means++ (Arthur &
Vassilvitskii, 2007; the best of 2 + ln c candidates per centre) on the pooled row-normalised
views, federated with the same exchange: the distance of every sample to a *sample* j is its
distance to the mean of a cluster that holds j alone, so labels that put up to c - 1 drawn
samples each alone in a cluster (every other sample in the last one) return, summed over the
views, the distances the seeding needs (:func:`sample_distances`, :func:`seeded_starts`: c - 1
further centres, the starts side by side, then the nearest-centre partitions). Each seeded
partition is refined and scored like the others; ties keep the earlier (V) starts.

What it costs in privacy: every client learns the partitions being refined (the clustering the
federation computes, and the candidates); the server learns the summed distances -- n x c
numbers per iteration, each a sum over the views -- and one summed score per iteration, which is
zero exactly when no client's view is dense. The seeded starts add, per start, the summed
distances of every sample to c (2 + ln c) drawn samples: that many columns of the pooled views'
distance matrix (``refine_seeded_starts=0`` sends none; a text-only federation never seeds).
Off with ``refine="none"``.

Partitions a client refuses. A client may refuse to answer a partition (on Flower, a node's
``refine-min-cluster-size`` policy refuses labels with a cluster smaller than its minimum, so that
no reply is about a handful of samples). An exchange then answers that partition with NaN distances
and a NaN score, and the server goes on with the partitions answered: a start stops at the last
partition answered for it (its score is that partition's), a start refused at once takes no part
in the choice, the seeding (whose partitions put drawn samples alone in a cluster) raises
:class:`~fedsonmf.exceptions.PartitionRefused` and is dropped by the caller, and when every start is
refused the refinement raises it too. In process no partition is refused.

The steps are pure functions over arrays, called by the in-process estimator and by the Flower
apps alike (:mod:`fedsonmf.pipeline.steps` exposes them to the nodes and server).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from fedsonmf.exceptions import ParameterError, PartitionRefused
from fedsonmf.pipeline.view_rule import MEAN_SHARE_THRESHOLD, energy_and_mean, mean_energy_share
from fedsonmf.protocol.params import options_of

__all__ = ["REFINE_RULES", "MIN_SCORE_SPREAD", "refine_stages", "refine_view", "scores_partitions", "score_weight",
           "client_distances", "client_score", "client_refine", "assign", "BATCH_VALUES", "batch_rows",
           "exchange_batch", "refine_partition", "refine_side_by_side", "refine_best", "sample_distances",
           "seeded_starts"]

#: a dense view scores only when at least this share of its energy (rows at unit norm) is off its
#: mean sample.  Our choice, between the measured 3.5e-6 of a 3 025-feature view of ACM that is all
#: ones but for a few entries (its objective picked among near-identical scores: 67.4 -> 62.3 on one
#: seed) and the 4e-4 of the 6 morphological features of Handwritten and UCI digits (real features
#: that keep scoring)
MIN_SCORE_SPREAD = 1e-4

#: FedMultiViewClustering's ``refine``: the stages run after the fit, in order -- "kmeans" (this
#: module), "graph" (:mod:`fedsonmf.pipeline.graph`), both, or "none"; "auto" (the default) is
#: both, and none under differential privacy (the refinements read the exact views: no noise covers them)
REFINE_RULES = options_of("refine")  # declared once, in the parameter table

#: the most distances one refinement exchange asks of a node: partitions travel side by side, up
#: to BATCH_VALUES // (n c) of them per exchange (a node's reply then stays under 32 MB of float64),
#: and a node refuses a block larger than that
BATCH_VALUES = 2**22


def refine_stages(rule: str, *, dp: bool = False) -> tuple[str, ...]:
    """The stages of a ``refine`` rule (a value of :data:`REFINE_RULES`), in order: ``("kmeans", "graph")``,
    ``("kmeans",)``, ``("graph",)`` or ``()``; ``"auto"`` is the first, or ``()`` when the fit runs
    with differential privacy (``dp``).  Any other value is refused (a Flower run config's
    ``refine`` reaches the ServerApp unchecked)."""
    if rule not in REFINE_RULES:
        raise ParameterError(f"refine must be one of {', '.join(map(repr, REFINE_RULES))}, got {rule!r}")
    if rule == "auto":
        rule = "none" if dp else "kmeans+graph"
    return () if rule == "none" else tuple(rule.split("+"))


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
        # one copy of the view, scaled in place: the squares share its indices, the scales are
        # its entries' (at 10^6 samples a copy of a view is hundreds of MB)
        Y = sp.csr_matrix(X, dtype=np.float64, copy=True)
        Y.sum_duplicates()
        squares = sp.csr_matrix((Y.data * Y.data, Y.indices, Y.indptr), shape=Y.shape, copy=False)
        norms = np.sqrt(np.asarray(squares.sum(axis=1)).ravel())
        del squares
        scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
        if held is not None:
            keep = np.zeros(Y.shape[0], dtype=bool)
            keep[np.asarray(held)] = True
            scale[~keep] = 0.0
        Y.data *= np.repeat(scale, np.diff(Y.indptr))
        Y.eliminate_zeros()
        return Y
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


def scores_partitions(Y, held=None) -> bool:
    """Whether a client's refinement view ``Y`` (rows at unit norm, :func:`refine_view`) scores the
    candidate partitions: its mean sample holds more than half of its energy (a *dense* view,
    the statistic of :func:`~fedsonmf.pipeline.view_rule.preprocess_view`), over the held rows,
    and at least :data:`MIN_SCORE_SPREAD` of it lies off the mean sample (a nearly constant view's
    k-means objective differs between partitions only in digits no cluster decides)."""
    if held is not None:
        Y = Y[np.asarray(held)]
    if Y.shape[0] == 0:
        return False
    share = mean_energy_share(Y)
    return bool(MEAN_SHARE_THRESHOLD < share <= 1.0 - MIN_SCORE_SPREAD)


def score_weight(Y, held=None) -> float:
    """The weight of a client's k-means objective in its score: 0 when its view does not score
    (:func:`scores_partitions`), else 1 / its one-cluster objective -- the mean squared distance of
    its held rows to their mean (``1 - mean_energy_share`` when every row has unit norm; positive
    whenever the view scores) -- so that its score is the share of its spread left within the
    clusters (module docstring).  Computed by the client from its own view, once."""
    if not scores_partitions(Y, held=held):
        return 0.0
    if held is not None:
        Y = Y[np.asarray(held)]
    energy, mean = energy_and_mean(Y)
    return 1.0 / (energy / Y.shape[0] - float(mean @ mean))  # mean ||y_i - y_bar||^2 = mean ||y_i||^2 - ||y_bar||^2


def client_score(D, labels, held=None, *, scores: float = 1.0) -> np.ndarray:
    """A client's score of the partition ``labels``: ``scores`` (its :func:`score_weight`; ``True``
    is 1) times its k-means objective, the mean over its held samples of the distance to their
    cluster's mean (``D`` from :func:`client_distances`), as an array of shape (1,); ``[0.]`` when
    the client does not score (``scores`` 0 or False)."""
    labels = np.asarray(labels, dtype=np.int64)
    rows = np.arange(labels.size) if held is None else np.asarray(held)
    if not scores or rows.size == 0:
        return np.zeros(1)
    return np.array([float(scores) * float(np.mean(D[rows, labels[rows]]))])


def client_refine(Y, labels, n_clusters: int, held=None, *, scores: float = 1.0):
    """One client's reply to a refinement exchange: ``(D, score)``, its distances (n, c) and its
    score (1,) of the partition it was sent (:func:`client_distances`, :func:`client_score`; ``scores``
    its :func:`score_weight`); for a block of partitions (S, n), side by side: (S, n, c) and (S,)."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.ndim == 2:
        replies = [client_refine(Y, row, n_clusters, held, scores=scores) for row in labels]
        return (np.stack([D for D, _ in replies]).reshape(labels.shape[0], Y.shape[0], int(n_clusters)),
                np.concatenate([s for _, s in replies]).reshape(labels.shape[0]))
    D = client_distances(Y, labels, n_clusters, held=held)
    return D, client_score(D, labels, held, scores=scores)


def assign(D) -> np.ndarray:
    """The server's half: every sample to its nearest cluster (ties: the lowest index)."""
    return np.asarray(np.argmin(np.asarray(D), axis=1), dtype=np.int64)


def batch_rows(n_samples: int, n_clusters: int) -> int:
    """The most partitions one refinement exchange carries: :data:`BATCH_VALUES` // (n c), at least 1
    (a node's reply then holds at most that many distances; a node refuses a larger batch)."""
    return max(1, BATCH_VALUES // max(1, int(n_samples) * int(n_clusters)))


def exchange_batch(exchange: Callable, rows, n_clusters: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The replies to the partitions ``rows`` (a list of (n,) labels or an (S, n) array), sent side by
    side: as few exchanges as :func:`batch_rows` allows, each sent an (S_k, n) block.

    ``exchange(labels) -> (D, score)`` answers an (S, n) block with the summed distances (S, n, c) and
    scores (S,).  Returns ``(D, score, exchanges)``: (S, n, c), (S,) and the exchanges used."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise ValueError(f"exchange_batch needs a nonempty (S, n) block of labels, got shape {rows.shape}")
    per = batch_rows(rows.shape[1], n_clusters)
    Ds, scores, calls = [], [], 0
    for lo in range(0, rows.shape[0], per):
        block = rows[lo:lo + per]
        D, s = exchange(block)
        Ds.append(np.asarray(D, dtype=np.float64).reshape(block.shape[0], rows.shape[1], int(n_clusters)))
        scores.append(np.asarray(s, dtype=np.float64).reshape(block.shape[0]))
        calls += 1
    return np.concatenate(Ds), np.concatenate(scores), calls


class _Lloyd:
    """One start's Lloyd iterations, advanced one reply at a time (so that several starts can share
    each exchange); :func:`refine_partition` is its loop."""

    def __init__(self, labels, max_iter: int):
        self.labels = np.asarray(labels, dtype=np.int64)
        self.max_iter, self.iterations, self.score, self.done = int(max_iter), 0, 0.0, int(max_iter) < 1
        self.answered: np.ndarray | None = None  # the last labels a reply was given for

    def step(self, D, score) -> None:
        """The reply (D, score) to the current labels: the next labels, or done when they did not
        change (the score is then that of the labels kept) or the iterations ran out.  A NaN score
        (a client refused the labels): done, back at the last labels answered, with their score;
        refused at once, the score is infinite (the start takes no part in the choice)."""
        score = float(np.sum(score))
        if np.isnan(score):
            if self.answered is None:
                self.score = np.inf
            else:
                self.labels = self.answered
            self.done = True
            return
        self.iterations += 1
        self.score = score
        self.answered = self.labels
        new = assign(D)
        if np.array_equal(new, self.labels):
            self.done = True
            return
        self.labels = new
        self.done = self.iterations >= self.max_iter


def refine_partition(labels, exchange: Callable, *, max_iter: int = 100):
    """Lloyd iterations from ``labels`` until they stop changing (or ``max_iter``).

    ``exchange(labels) -> (D, score)``: the summed distances (n, c) and the summed score of
    every client for the labels sent (one round trip).
    Returns ``(labels, iterations, score)``; the score is that of the returned labels when they
    converged (the last exchange was sent them), else of the labels before the last assignment;
    labels a client refused (a NaN score) end the iterations at the last labels answered, and a
    start refused at once is returned with 0 iterations and an infinite score.
    """
    run = _Lloyd(labels, max_iter)
    _alone(run, exchange)
    return run.labels, run.iterations, run.score


def _alone(run: _Lloyd, exchange: Callable) -> int:
    """Advance one Lloyd run until it is done, one exchange per iteration; the exchanges used."""
    calls = 0
    while not run.done:
        run.step(*exchange(run.labels))
        calls += 1
    return calls


def _side_by_side(runs: list, exchange: Callable, n_clusters: int) -> int:
    """Advance the Lloyd runs until each is done, each exchange carrying every run still moving;
    the exchanges used."""
    calls = 0
    while live := [r for r in runs if not r.done]:
        D, score, k = exchange_batch(exchange, [r.labels for r in live], n_clusters)
        calls += k
        for r, Dr, sr in zip(live, D, score):
            r.step(Dr, sr)
    return calls


def refine_side_by_side(starts, exchange: Callable, n_clusters: int, *, max_iter: int = 100):
    """:func:`refine_partition` of every start, the starts side by side: each exchange carries the
    labels of every start still moving (:func:`exchange_batch`), so the exchanges are those of the
    slowest start, not the sum over the starts.  Every start's result is the one it reaches alone.

    Returns ``(results, exchanges)``: ``(labels, iterations, score)`` per start, and the exchanges used.
    """
    runs = [_Lloyd(s, max_iter) for s in starts]
    calls = _side_by_side(runs, exchange, n_clusters)
    return [(r.labels, r.iterations, r.score) for r in runs], calls


def sample_distances(exchange: Callable, ids, n_samples: int, n_clusters: int) -> np.ndarray:
    """The summed distances of every sample to the samples ``ids``, (n_samples, len(ids)), through
    refinement exchanges (``exchange(labels) -> (D, score)``, labels an (S, n) block): each
    partition sent puts up to ``n_clusters - 1`` of them each alone in a cluster and every other
    sample in the last one, so column k of its reply is the distance to the k-th (a client not
    holding it replies ``||y_i||^2``); the partitions travel side by side (:func:`exchange_batch`)."""
    if int(n_clusters) < 2:  # one cluster leaves no room for a sample alone beside the rest
        raise ValueError(f"sample_distances needs n_clusters >= 2, got {n_clusters}")
    ids, back = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True)  # a sample asked twice: once
    per = int(n_clusters) - 1
    chunks = [ids[lo:lo + per] for lo in range(0, ids.size, per)]
    rows = np.full((len(chunks), int(n_samples)), int(n_clusters) - 1, dtype=np.int64)
    for row, chunk in zip(rows, chunks):
        row[chunk] = np.arange(chunk.size)
    D, score, _ = exchange_batch(exchange, rows, n_clusters)
    if np.isnan(score).any():
        raise PartitionRefused("a client refused the seeding's partitions (each puts drawn samples alone in a cluster)")
    out = np.concatenate([D[i][:, :chunk.size] for i, chunk in enumerate(chunks)], axis=1)
    return out[:, back.ravel()]


def seeded_starts(exchange: Callable, n_samples: int, n_clusters: int, *, n_starts: int, seed: int) -> list:
    """``n_starts`` partitions seeded by federated k-means++ on the pooled row-normalised views.

    Greedy k-means++ (Arthur & Vassilvitskii, 2007, with scikit-learn's ``2 + ln c`` candidates per
    centre): the first centre a sample drawn uniformly; for each next one, ``2 + ln c`` samples are
    drawn with probability proportional to their summed squared distance to the nearest centre
    chosen, and the one that lowers the summed distances most is kept.  The distances come from
    :func:`sample_distances`; the starts are seeded side by side, so centre t of every start costs
    one exchange (more only past :func:`batch_rows`).  Each start is the partition into the
    nearest centre; the random draws are those of ``numpy.random.default_rng([seed, 7919])``.
    Returns a list of (n_samples,) int arrays.
    """
    n, c, m = int(n_samples), int(n_clusters), int(n_starts)
    if m <= 0 or c < 2 or n < c:
        return []
    rng = np.random.default_rng([int(seed) % 2**32, 7919])
    trials = 2 + int(np.log(c))
    firsts = [int(j) for j in rng.choice(n, size=m, replace=m > n)]
    cent = np.empty((m, n, c))  # per start, the distances to its centres: column t for centre t
    cent[:, :, 0] = sample_distances(exchange, firsts, n, c).T
    near = cent[:, :, 0].copy()  # per start, the distance to its nearest centre so far, (m, n)
    for t in range(1, c):
        cands = []
        for i in range(m):
            w = np.maximum(near[i], 0.0)
            total_ = float(w.sum())
            cands.append(rng.choice(n, size=trials, p=w / total_ if total_ > 0 else None))
        D = sample_distances(exchange, np.concatenate(cands), n, c)
        for i in range(m):
            block = D[:, i * trials:(i + 1) * trials]
            pot = np.minimum(near[i][:, None], block).sum(axis=0)
            b = int(np.argmin(pot))
            cent[i, :, t] = block[:, b]
            near[i] = np.minimum(near[i], block[:, b])
    return [np.asarray(np.argmin(d, axis=1), dtype=np.int64) for d in cent]


def refine_best(starts, exchange: Callable, *, max_iter: int = 100, seeded: Callable | None = None):
    """Refine every start (:func:`refine_partition`) and keep the refined partition of lowest
    summed score; ties keep the earlier start.

    The first exchange carries the first start alone.  When its summed score is 0 (no client
    scores: no dense view), that start is refined alone and kept, and no other start is sent.
    Otherwise ``seeded(exchange)`` (optional) gives more starts through ``exchange``
    (:func:`seeded_starts`, after the others in the order) -- the starts already there ride on its
    exchanges, refining meanwhile (:class:`_Riding`) -- and every start -- the first from where its
    first exchange left it -- is refined side by side (:func:`refine_side_by_side`): the
    partitions reached and kept are those of refining them one by one, in far fewer exchanges.
    ``exchange`` answers (n,) labels with ((n, c), (1,)) and an (S, n) block with ((S, n, c), (S,));
    a NaN score marks a partition a client refused (module docstring): its start stops at the last
    partition answered, or, refused at once, is not kept; the first start refused at once leaves
    the others to be refined side by side.

    Returns ``(labels, exchanges, index)``: the kept partition, the exchanges of the whole
    refinement (the seeding's included), and the index of the start it came from.  Raises
    :class:`~fedsonmf.exceptions.PartitionRefused` when every start was refused at once.
    """
    starts = list(starts)
    if not starts:
        raise ValueError("refine_best needs at least one start")
    first = _Lloyd(starts[0], max_iter)
    D, score = exchange(first.labels)
    first.step(D, score)
    calls = 1
    if first.score == 0.0:  # nobody scores (text): the fit's partition, refined alone
        calls += _alone(first, exchange)
        return first.labels, calls, 0
    runs = [first] + [_Lloyd(s, max_iter) for s in starts[1:]]
    c = np.asarray(D).shape[1]
    if seeded is not None:
        riding = _Riding(exchange, runs, c)
        runs += [_Lloyd(s, max_iter) for s in seeded(riding)]
        calls += riding.calls
    calls += _side_by_side(runs, exchange, c)
    index = min(range(len(runs)), key=lambda i: (runs[i].score, i))  # the lowest score; ties: the earlier
    if runs[index].answered is None:
        raise PartitionRefused(f"a client refused every start of the refinement ({len(runs)})")
    return runs[index].labels, calls, index


class _Riding:
    """The seeding's exchange, on which the starts already refining ride: each block the seeding sends
    also carries the labels of the runs still moving (as many as :func:`batch_rows` leaves room
    for), and they advance by their rows of the reply; the seeding gets its own rows back.  Each
    run's iterations are those it makes alone (a row's reply depends on that row only), so the
    refinement reaches the same partitions, in the seeding's exchanges instead of after them.  A
    failed exchange (a node refusing the seeding's labels) advances nothing.  Counts its round trips."""

    def __init__(self, exchange: Callable, runs: list, n_clusters: int):
        self.exchange, self.runs, self.n_clusters, self.calls = exchange, runs, int(n_clusters), 0

    def __call__(self, labels):
        block = np.asarray(labels, dtype=np.int64).reshape(-1, np.shape(labels)[-1])
        room = batch_rows(block.shape[1], self.n_clusters) - block.shape[0]
        riders = [r for r in self.runs if not r.done][:max(room, 0)]
        self.calls += 1  # a round trip, answered or not
        D, score = self.exchange(np.concatenate([block] + [r.labels[None, :] for r in riders]))
        S = block.shape[0]
        D = np.asarray(D, dtype=np.float64).reshape(S + len(riders), block.shape[1], self.n_clusters)
        score = np.asarray(score, dtype=np.float64).reshape(S + len(riders))
        for k, r in enumerate(riders):
            r.step(D[S + k], score[S + k:S + k + 1])
        if np.ndim(labels) == 1:
            return D[0], score[:1]
        return D[:S], score[:S]
