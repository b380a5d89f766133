"""The spectral step of the graph refinement: a second candidate from a few steps of the summed graph.

The graph refinement (:mod:`fedsonmf.pipeline.graph`) is a local search for the normalized cut
of the summed k-NN graph A = sum_p A_p, started from the k-means-refined partition. Where the
factorisation's partition lies far from the graph's clusters (citation graphs, an imbalanced
biology set: docs/clustering.md, "The spectral step") the search stops at a local optimum well
above the cut that multi-view spectral clustering reaches. This step gives the search a second
start that has seen more of the graph than one sample's neighbours:

* **T steps of orthogonal iteration** of the normalised summed graph S = D^-1/2 A D^-1/2 from the
  start's indicator, F_0 = D^1/2 Z, F_{t+1} = orth(S F_t) -- a power method for the top
  eigenvectors that multi-view spectral clustering computes, stopped after T steps (or once a step
  turns the block's span by at most :data:`SUBSPACE_TOL`, "Settled" below) and started from
  the federated partition, so it moves the partition towards the graph's clusters without
  forgetting where it began. Each step is one exchange: the server sends the block
  M = D^-1/2 F_t / s (n, c; s scales its entries to at most 1, the fixed point's public bound),
  each client returns ``A_p M / n`` (:func:`~fedsonmf.pipeline.graph.client_products`, masked
  under secure aggregation), the server rescales and orthonormalises the sum. The first step is the
  graph refinement's first exchange, of the start itself (``A Z`` is what a graph exchange
  returns). From there the graph refinement and the orthogonal iteration are independent, so
  :func:`graph_stage` sends each further block in the same exchange as the graph refinement's
  next labels while both run: the T - 1 products cost only the exchanges by which they outlast
  the graph refinement (the partitions are those of the two run one after the other).
* **k-means on the rows of the block**, scaled to unit norm: Lloyd's algorithm from the start's
  centroids and ``n_init`` k-means++ replicates seeded by the fit's seed, the run of lowest
  k-means objective kept (ties: the start's centroids) -- the standard replicate rule. From the
  start's centroids alone, Lloyd's stopped at a poor local minimum of the block's objective where
  clusters are many and small (ORL, 40 classes of 10 faces: 76.4 % ACC over three seeds, 83.0
  with the replicates; docs/clustering.md). Then the graph refinement from that partition.
* **Kept only when it is clearly better by both pictures**: its normalized cut is at least
  ``SPECTRAL_MARGIN`` (1 %) below the graph refinement's partition's, and the summed k-means score
  of the clients whose view is dense (:mod:`fedsonmf.pipeline.refine`: each such view's objective
  as a share of its spread, so every dense view has the same say) is not higher. Spectral
  partitions lower the cut on every data set measured, also where they are worse (the digit and
  image sets, by 5-13 points); there the dense views' k-means objective rises, and the margin keeps
  the near-ties of text sets (WebKB, Wikipedia: cuts within 1 %) on the refinement's partition.

What it costs in privacy (docs/privacy.md): the server learns the summed graph's products with T
blocks of c columns, i.e. the summed graph restricted to a subspace of dimension at most T c. So T
is capped at n // (2 c) (:func:`spectral_steps`): the step adds at most half of the sample space
(ORL, 400 faces in 40 classes: 5 steps) to what the graph refinement's own exchanges (products with
partition indicators) already give, and every node enforces the cap itself (it answers at most
the columns of T - 1 blocks per job). The clients see the blocks they are sent, so each can
learn, up to a c x c mixing, the other clients' summed graph on the same directions.
``refine_spectral_steps=0`` sends none.

Settled. The orthogonal iteration stops before its T steps once one step turns the block's span by
at most :data:`SUBSPACE_TOL` (the sine of the largest principal angle between successive blocks,
:func:`settled_angle`): the server computes it from the blocks it has, so the rule costs nothing
and sends fewer products (less of the summed graph leaves the clients, too). It is not a proof that
the candidate is the T-step one -- where two eigenvalues nearly tie, the angles level off instead
of falling (3Sources: near 0.048 per step) and a loose tolerance stops there, on another block --
so the tolerance sits well below such plateaus; measured on the four shared sets: docs/clustering.md,
"Fewer exchanges".  Several steps per exchange are not possible: a client holds A_p, not the sum,
and S^2 needs the cross products A_p D^-1 A_q, so each step is one exchange.

Pure functions over arrays, called by the in-process estimator and by the Flower apps alike
(:mod:`fedsonmf.pipeline.steps`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from fedsonmf.pipeline.graph import GraphSearch, graph_refine
from fedsonmf.pipeline.restarts import medoid_restart

__all__ = ["SPECTRAL_MARGIN", "SUBSPACE_SHARE", "SUBSPACE_TOL", "STAGE_PARTITIONS", "spectral_steps", "PowerSteps",
           "settled_angle",
           "spectral_partition", "block_partition", "spectral_refine", "medoid_choice", "graph_stage"]

#: the relative drop of the normalized cut a spectral candidate must reach to be kept
SPECTRAL_MARGIN = 0.01
#: T c <= n / SUBSPACE_SHARE: the products never span more than half of the sample space
SUBSPACE_SHARE = 2
#: the orthogonal iteration stops once a step turns its block's span by at most this: the sine of the
#: largest principal angle between successive blocks (:func:`settled_angle`); 0 runs every step.
#: Measured on the four shared sets, seeds 0 and 1 (docs/clustering.md, "Fewer exchanges"): no label
#: moved up to 2e-2, 135 of 3Sources' 169 did at 5e-2 (its angles level off near 0.048)
SUBSPACE_TOL = 1e-2
#: the names of the stage's three partitions, in the order :func:`medoid_choice` weighs them (ties: the first)
STAGE_PARTITIONS = ("refined", "start", "spectral")


def spectral_steps(n_samples: int, n_clusters: int, max_steps: int) -> int:
    """The steps of the spectral candidate: ``max_steps``, at most ``n // (2 c)`` (module docstring)."""
    return max(0, min(int(max_steps), int(n_samples) // (SUBSPACE_SHARE * max(int(n_clusters), 1))))


def _start_centroids(E: np.ndarray, labels: np.ndarray, n_clusters: int) -> np.ndarray:
    """The centroids of ``labels`` in ``E``; an empty cluster takes the row farthest from its own
    centroid not taken yet (deterministic)."""
    counts = np.bincount(labels, minlength=n_clusters)
    sums = np.zeros((n_clusters, E.shape[1]))
    np.add.at(sums, labels, E)
    cen = sums / np.maximum(counts, 1)[:, None]
    if np.any(counts == 0):
        far = np.argsort(-np.sum((E - cen[labels]) ** 2, axis=1), kind="stable")
        for k, i in zip(np.flatnonzero(counts == 0), far):
            cen[k] = E[i]
    return cen


class PowerSteps:
    """The orthogonal iteration of :func:`spectral_partition` between exchanges, so that a driver can
    send its blocks in the same round trip as the graph refinement's labels (:func:`graph_stage`).

    ``first``: the summed links ``sum_p A_p Z / n`` (n, c) of the graph exchange sent the start (the
    first step, and the degrees ``d / n``); ``request()`` gives the next block ``M`` (n, c), entries
    at most 1 (``None``: the ``steps`` steps are done, or the span has settled); ``feed(P)`` takes
    ``sum_p A_p M / n`` for it; ``F`` is the orthonormal block (n, c) reached, ``deg`` the degrees
    ``d / n``, ``taken`` the steps made (the first included), ``angle`` the last step's
    :func:`settled_angle`.  The iteration stops before ``steps`` once a step turns the block's span by
    at most ``tol`` (default :data:`SUBSPACE_TOL`; 0: never): every further exchange would move it less
    while the ratio of successive angles stays below 1 (module docstring, "Settled").
    """

    def __init__(self, first, steps: int, *, tol: float | None = None):
        first = np.asarray(first, dtype=np.float64)
        self.deg = first.sum(axis=1)  # d / n: the common factor cancels in D^-1/2 A D^-1/2
        self._isq = np.where(self.deg > 0, 1.0 / np.sqrt(np.where(self.deg > 0, self.deg, 1.0)), 0.0)
        self.F, _ = np.linalg.qr(self._isq[:, None] * first)  # S D^1/2 Z = D^-1/2 A Z: the graph exchange's links
        self.remaining, self._scale = int(steps) - 1, 0.0
        self.tol = float(SUBSPACE_TOL if tol is None else tol)  # read at each start (a sweep may set it)
        self.taken, self.angle = 1, np.nan  # the steps made (the first: the links); the last step's angle

    def request(self):
        if self.remaining < 1:
            return None
        M = self._isq[:, None] * self.F
        self._scale = float(np.max(np.abs(M))) if M.size else 0.0
        if self._scale <= 0:
            self.remaining = 0
            return None
        return M / self._scale

    def feed(self, P) -> None:
        F, _ = np.linalg.qr(self._isq[:, None] * np.asarray(P, dtype=np.float64) * self._scale)
        self.angle = settled_angle(self.F, F)
        self.F, self.taken = F, self.taken + 1
        self.remaining = 0 if self.tol > 0 and self.angle <= self.tol else self.remaining - 1


def settled_angle(F, G) -> float:
    """The sine of the largest principal angle between the spans of the orthonormal blocks ``F`` and
    ``G`` (n, c each): ``||G - F (F^T G)||_2``, 0 for the same subspace, 1 for orthogonal ones."""
    F, G = np.asarray(F, dtype=np.float64), np.asarray(G, dtype=np.float64)
    if F.size == 0:
        return 0.0
    return float(np.linalg.norm(G - F @ (F.T @ G), 2))


def spectral_partition(labels, first: np.ndarray, products: Callable, n_clusters: int, steps: int, *,
                       seed: int | None, max_iter: int = 300, n_init: int = 10) -> np.ndarray:
    """The server's spectral candidate (before the graph refinement): ``steps`` steps of orthogonal
    iteration of D^-1/2 A D^-1/2 from the indicator of ``labels``, then k-means on the unit rows of
    the block: Lloyd's from the centroids of ``labels`` and ``n_init`` k-means++ replicates
    (``random_state=seed``, the fit's seed: no default, so no caller gets a fixed one silently;
    0 replicates: the start's centroids only), the lowest objective kept.

    ``first``: the summed links ``sum_p A_p Z / n`` (n, c) of a graph exchange sent ``labels`` (the
    first step, and the degrees ``d / n``); ``products(M) -> sum_p A_p M / n`` (n, c) for a block
    ``M`` with entries at most 1: one exchange per further step. Samples with no edge keep their label.
    Returns labels (n,).
    """
    power = PowerSteps(first, steps)
    while (M := power.request()) is not None:
        power.feed(products(M))
    return block_partition(power, labels, n_clusters, seed=seed, max_iter=max_iter, n_init=n_init)


def block_partition(power: PowerSteps, labels, n_clusters: int, *, seed: int | None, max_iter: int = 300,
                    n_init: int = 10) -> np.ndarray:
    """k-means on the unit rows of the block reached by ``power`` (:func:`spectral_partition`)."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    labels = np.asarray(labels, dtype=np.int64)
    c = int(n_clusters)
    norms = np.linalg.norm(power.F, axis=1, keepdims=True)
    E = power.F / np.where(norms > 0, norms, 1.0)
    with warnings.catch_warnings():  # fewer distinct rows than clusters: Lloyd's empty clusters stay empty
        warnings.simplefilter("ignore", ConvergenceWarning)
        runs = [KMeans(c, init=_start_centroids(E, labels, c), n_init=1, max_iter=int(max_iter)).fit(E)]
        if int(n_init) > 0:
            runs.append(KMeans(c, n_init=int(n_init), max_iter=int(max_iter), random_state=seed).fit(E))
    km = min(runs, key=lambda run: run.inertia_)  # ties: the first, the start's centroids
    new = np.asarray(km.labels_, dtype=np.int64)
    new[power.deg <= 0] = labels[power.deg <= 0]
    return new


def spectral_refine(start, first, refined, refined_cut: float, graph_exchange: Callable, products: Callable,
                    n_clusters: int, *, steps: int, seed: int | None, refine: Callable | None = None,
                    max_iter: int = 300, n_init: int = 10):
    """The spectral step after the graph refinement (module docstring).

    ``start``: the graph refinement's start (labels, (n,)) and ``first`` its links (the reply of
    the graph exchange sent ``start``); ``refined``, ``refined_cut``: the graph refinement's result
    and that partition's normalized cut (:func:`~fedsonmf.pipeline.graph.graph_refine`);
    ``graph_exchange(labels) -> L``, ``products(M) -> sum_p A_p M / n``: the exchanges with the
    clients; ``refine(labels) -> (D, score)`` (optional): a k-means refinement exchange, whose summed
    scores (0 without dense views) of the candidate and ``refined``, sent side by side as a (2, n)
    block in one exchange, are compared only when the cut has dropped; ``n_init``, ``seed``:
    the k-means replicates on the block (:func:`spectral_partition`).
    Returns ``(labels, info)`` with info ``{"steps", "exchanges", "cut", "kept"}``: the candidate's
    cut, and whether it replaced ``refined``.
    """
    refined = np.asarray(refined, dtype=np.int64)
    info: dict = {"steps": int(steps), "exchanges": 0, "cut": None, "kept": False}
    if int(steps) < 1:
        return refined, info
    count = [0]

    def counted(fn):
        def call(arg):
            count[0] += 1
            return fn(arg)
        return call

    start = np.asarray(start, dtype=np.int64)
    candidate = spectral_partition(start, first, counted(products), n_clusters, steps, max_iter=max_iter,
                                   n_init=n_init, seed=seed)
    labels, info["cut"], info["kept"], iterations, scored = _choose(candidate, refined, refined_cut, graph_exchange,
                                                                    refine, n_clusters)
    info["exchanges"] = count[0] + iterations + scored
    return labels, info


def _choose(candidate, refined, refined_cut: float, graph_exchange: Callable, refine: Callable | None,
            n_clusters: int):
    """The candidate's own graph refinement, then the rule of the module docstring: the candidate
    replaces ``refined`` when its cut is ``SPECTRAL_MARGIN`` lower and the dense views' summed score
    (``refine``, both partitions in one exchange) is not higher.
    Returns ``(labels, candidate's cut, kept, the candidate's graph exchanges, score exchanges (0 or 1))``."""
    candidate, iterations, cut = graph_refine(candidate, graph_exchange, n_clusters)
    kept, scored = False, 0
    if cut < (1.0 - SPECTRAL_MARGIN) * float(refined_cut):
        if refine is None:
            kept = True
        else:  # both partitions' scores in one exchange, side by side
            scored = 1
            scores = np.asarray(refine(np.stack([candidate, refined]))[1], dtype=np.float64).reshape(2)
            kept = bool(scores[0] <= scores[1])
    return (np.asarray(candidate, dtype=np.int64) if kept else refined), float(cut), kept, iterations, scored


def medoid_choice(start, refined, candidate) -> tuple[np.ndarray, str]:
    """The medoid of the graph stage's three partitions (labels, (n,) each): the one with the highest
    summed adjusted Rand index to the other two (:func:`~fedsonmf.pipeline.restarts.medoid_restart`;
    ties: ``refined``, then ``start``). Returns ``(labels, name)``, name one of :data:`STAGE_PARTITIONS`.

    Why (docs/clustering.md, "The graph stage's medoid"): ``start`` is the k-means refinement's partition
    (the factorisation and the pooled features), ``candidate`` the spectral partition of the summed
    graph before any local search (the graph alone), and ``refined`` the local search of the cut
    between them. When the search ends further from both than they are from each other it has
    followed the graph's noise -- on a single weak text view (tr45), 4 points of ACC -- and the medoid
    is the partition the other two agree with most. With three partitions the medoid is the one
    opposite the least similar pair, so ``refined`` stays unless that pair includes it.
    """
    partitions = [np.asarray(refined, dtype=np.int64), np.asarray(start, dtype=np.int64),
                  np.asarray(candidate, dtype=np.int64)]
    index = medoid_restart(partitions)
    return partitions[index], STAGE_PARTITIONS[index]


def graph_stage(start, graph_exchange: Callable, products: Callable | None, n_clusters: int, *, steps: int,
                seed: int | None, refine: Callable | None = None, both: Callable | None = None,
                max_iter: int = 300, n_init: int = 10, progress: dict | None = None):
    """The whole graph stage from the k-means refinement's partition ``start``: the graph refinement
    (:func:`~fedsonmf.pipeline.graph.graph_refine`), then its spectral step (:func:`spectral_refine`;
    ``steps`` < 1: none) -- the same partitions, with fewer round trips when ``both`` is given.

    ``both(labels, M) -> (L, P)`` (optional): one exchange carrying the graph refinement's labels and
    the spectral step's block side by side, replying the links of the one and the products of the
    other. The two searches are independent once the first exchange (the start's links: the graph
    refinement's first iteration and the orthogonal iteration's first step) is in, so they travel
    together until the shorter is over: the stage costs max(iterations, steps) round trips for the
    two instead of their sum, the candidate's own refinement and the score exchange after them.
    ``progress`` (optional dict): ``progress["labels"]`` is kept at the best partition the graph
    refinement has met, so a driver whose exchange fails mid-way keeps what was reached.
    The stage returns the medoid of the start, the partition the cut rule keeps and the raw spectral
    candidate (:func:`medoid_choice`; no exchange: the clients answered all three), so a local
    search of the cut that ended far from both is not kept.
    ``graph_exchange``, ``products``, ``refine``, ``seed``, ``max_iter``, ``n_init``: as in
    :func:`spectral_refine`. Returns ``(labels, info)`` with info ``{"graph_iterations", "exchanges",
    "steps", "cut", "kept", "chosen"}``: the graph refinement's own iterations, the stage's round trips,
    :func:`spectral_refine`'s fields, and which of :data:`STAGE_PARTITIONS` the stage returns.
    Partitions a client refuses (NaN links, :mod:`fedsonmf.pipeline.graph`): the graph refinement
    ends at the lowest cut met, a refused candidate is neither kept nor chosen (its cut is infinite),
    and a refused start is returned as it is.
    """
    if products is None and int(steps) > 1:
        raise ValueError(f"graph_stage: {steps} spectral steps need a products exchange")
    start = np.asarray(start, dtype=np.int64)
    progress = {} if progress is None else progress
    search = GraphSearch(start, n_clusters)
    L = graph_exchange(start)
    search.feed(L)
    progress["labels"] = search.best
    # the stage's round trips by what they carried: the graph refinement's labels (with or without a
    # block), a block alone, the candidate's own refinement, the score of the two partitions
    counts = {"graph": 1, "spectral": 0, "candidate": 0, "score": 0}
    if search.iterations == 0:  # the start refused by a client's policy: no links, no search, no block
        return start, {"graph_iterations": 0, "exchanges": 1, "counts": counts, "steps": int(steps),
                       "steps_taken": 0, "cut": None, "kept": False, "chosen": "start"}
    power = PowerSteps(L, steps)  # steps < 2: no block to ask; stops early once its span has settled
    while True:  # the graph refinement's iterations and the power steps, side by side
        labels, M = search.request(), power.request()
        if labels is None and M is None:
            break
        if labels is not None and M is not None and both is not None:
            counts["graph"] += 1
            L, P = both(labels, M)
            search.feed(L)
            power.feed(P)
        elif labels is not None:
            counts["graph"] += 1
            search.feed(graph_exchange(labels))
            if M is not None:  # no combined exchange: the block goes alone (the request is not lost)
                counts["spectral"] += 1
                power.feed(products(M))  # type: ignore[misc]  # checked above: steps > 1 come with products
        else:
            counts["spectral"] += 1
            power.feed(products(M))  # type: ignore[misc]
        progress["labels"] = search.best
    refined, cut = search.best, float(search.best_cut)
    info: dict = {"graph_iterations": search.iterations, "steps": int(steps), "steps_taken": 0, "cut": None,
                  "kept": False, "chosen": "refined"}
    if int(steps) >= 1:
        info["steps_taken"] = power.taken
        candidate = block_partition(power, start, n_clusters, seed=seed, max_iter=max_iter, n_init=n_init)
        refined, info["cut"], info["kept"], counts["candidate"], counts["score"] = _choose(
            candidate, refined, cut, graph_exchange, refine, n_clusters)
        if np.isfinite(info["cut"]):  # an infinite cut: the clients refused the candidate
            refined, info["chosen"] = medoid_choice(start, refined, candidate)
    info["counts"] = counts
    info["exchanges"] = sum(counts.values())
    return refined, info
