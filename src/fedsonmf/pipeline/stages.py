"""The server's driver of the clustering after the fits, over whichever exchanges an engine has.

Once the fits' V are on the server, the rest of the pipeline is the same on both engines; only the
way a request reaches the clients differs.  :func:`cluster_fits` runs k-means on every fit's V, keeps
the medoid fit (:func:`~fedsonmf.pipeline.restarts.medoid_restart`) and hands it to
:func:`finish_clustering`, which runs the stages over exchanges the caller passes in -- the
in-process estimator's local sums (:class:`~fedsonmf.estimators.clustering.FedMultiViewClustering`)
or the Flower transport's messages (the ServerApp, :mod:`fedsonmf.federation.flower.server_app`) --
so the fit kept, the partitions, the centres and the counts reported are one computation's:

1. the k-means refinement (:mod:`fedsonmf.pipeline.refine`): the fit's partition and
   ``refine_starts - 1`` k-means partitions of V (:func:`~fedsonmf.pipeline.steps.refine_starts`),
   the seeded starts once the first start has scored (:func:`~fedsonmf.pipeline.refine.seeded_starts`),
   all refined side by side and the lowest summed score kept (:func:`~fedsonmf.pipeline.refine.refine_best`);
2. the graph stage (:func:`~fedsonmf.pipeline.spectral.graph_stage`): the graph refinement from the
   partition reached, with its spectral step when a products exchange is given;
3. the centres of the partition reached in the fit's embedding
   (:func:`~fedsonmf.pipeline.steps.embedding_centers`), or k-means' own when no stage refined it.

Partitions a client refuses (its minimum cluster size, :class:`~fedsonmf.pipeline.policy.NodePolicy`)
leave notes: a refused seeding drops the seeded starts, a start stops at the last partition answered,
the graph refinement at the lowest cut met; only a refinement whose every start is refused at once
ends at the fit's partition, with the refusal as its error.  A client lost during a stage
(:class:`~fedsonmf.exceptions.FederationError`) ends the stages with the partition reached before it
(in the graph stage: the lowest cut the graph refinement had met) and the error in the report.  No
file is read or written here; the caller keeps or writes what it returns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np

from fedsonmf.exceptions import FederationError, PartitionRefused
from fedsonmf.pipeline.policy import NodePolicy
from fedsonmf.pipeline.refine import refine_best, seeded_starts
from fedsonmf.pipeline.restarts import medoid_restart
from fedsonmf.pipeline.spectral import graph_stage, spectral_steps
from fedsonmf.pipeline.steps import cluster_embedding, embedding_centers, refine_starts

__all__ = ["STAGE_OPTIONS", "STAGE_EXCHANGES", "cluster_fits", "finish_clustering"]

#: the options :func:`finish_clustering` reads from its ``opts`` (the estimator's parameters of the same name)
STAGE_OPTIONS = ("normalize_embedding", "kmeans_n_init", "kmeans_max_iter", "refine_starts", "refine_seeded_starts",
                 "refine_spectral_steps")
#: the keys of the report's ``exchanges``: the round trips of the k-means refinement (its seeding
#: included), of the graph refinement (its labels, with a spectral block beside them when both run),
#: of spectral blocks alone, of the spectral candidate's own graph refinement, and of the score of
#: the candidate against the graph refinement's partition
STAGE_EXCHANGES = ("kmeans", "graph", "spectral", "candidate", "score")


def cluster_fits(Vs, seeds, n_clusters: int, *, opts: Mapping, results=None, kmeans=None,
                 exchanges: Callable[[int], dict] | None = None, say: Callable[[str], None] | None = None):
    """The clustering after the fits, on both engines: k-means on every fit's V, the medoid fit kept,
    then :func:`finish_clustering` from its partition.

    ``Vs`` (the fits' V, each (r, n)) and ``seeds`` (each fit's seed, which also seeds its k-means);
    ``results`` (optional): the fits' :class:`~fedsonmf.protocol.history.FitResult`, whose final
    objectives break a tie of the medoid; ``kmeans`` (optional): ``(labels, centers, km)`` of every
    fit when the engine has computed them already (:func:`~fedsonmf.pipeline.steps.cluster_embedding`
    with the same seed and options gives the same); ``exchanges(best) -> dict`` (optional): the
    exchanges of :func:`finish_clustering` (``refine``, ``graph``, ``spectral``, ``both``, ``policy``)
    for the kept fit, made once it is known (an engine points its clients at that fit's bases).
    Once the medoid is chosen the entries of ``Vs`` and ``results`` of the fits not kept are set to None:
    the stages need the kept fit's V only, and a caller holding no other reference to the others
    frees their r x n arrays before the graph stage.

    Returns ``(best, labels, centers, km, report)``: the index of the fit kept, the final partition
    and centres, that fit's k-means and :func:`finish_clustering`'s report.
    """
    if kmeans is None:
        kmeans = [cluster_embedding(V, n_clusters, seed=int(s), normalize_embedding=bool(opts["normalize_embedding"]),
                                    kmeans_n_init=int(opts["kmeans_n_init"]),
                                    kmeans_max_iter=int(opts["kmeans_max_iter"]))
                  for V, s in zip(Vs, seeds)]
    best = medoid_restart([k[0] for k in kmeans], results) if len(kmeans) > 1 else 0
    if say is not None and len(kmeans) > 1:
        say(f"fit {best + 1} of {len(kmeans)} kept (the medoid of their partitions)")
    labels, centers, km = kmeans[best]
    for i in range(len(Vs)):
        if i != best:
            Vs[i] = None
            if results is not None:
                results[i] = None
    ex = exchanges(best) if exchanges is not None else {}
    labels, centers, report = finish_clustering(Vs[best], labels, centers, n_clusters, seed=int(seeds[best]),
                                                opts=opts, say=say, **ex)
    return best, labels, centers, km, report


def finish_clustering(V, labels, centers, n_clusters: int, *, seed: int, opts: Mapping, refine: Callable | None = None,
                      graph: Callable | None = None, spectral: Callable | None = None, both: Callable | None = None,
                      policy: NodePolicy | None = None, say: Callable[[str], None] | None = None):
    """The stages after the fit, from the kept fit's ``V`` (r, n), its k-means ``labels`` (n,) and
    ``centers`` (c, r), seeded with that fit's ``seed``; ``opts`` holds :data:`STAGE_OPTIONS`.

    The exchanges (each optional; None skips its stage or step):

    * ``refine(labels) -> (D, score)``: the summed distances and scores of one refinement exchange,
      for (n,) labels ((n, c), (1,)) or an (S, n) block ((S, n, c), (S,)); NaN for a refused partition;
    * ``graph(labels) -> L``: the summed neighbour counts per cluster (n, c) of one graph exchange;
    * ``spectral(M) -> sum_p A_p M / n``: the products of one spectral exchange, for the graph
      stage's spectral step (with ``graph``);
    * ``both(labels, M) -> (L, P)``: the two in one exchange (with ``spectral``).

    ``policy``: what the server knows of the clients' minimum cluster sizes, shared by the
    exchanges that respect it (its ``refused`` count and ``floor`` make the notes; None: nothing
    known, nothing refused).  ``say(line)`` (optional): one progress line per stage.

    Returns ``(labels, centers, report)``: the partition reached, its centres, and ``report`` with
    ``refine_iterations`` and ``refine_start`` (the k-means refinement's exchanges and the start
    kept; None when it did not end), ``graph_iterations``, ``spectral_kept`` and ``graph_chosen``
    (the graph stage's exchanges, whether its spectral candidate was kept, which partition it
    returned; ``""`` when it did not end), ``spectral_steps`` (the orthogonal iteration's steps made,
    fewer than asked once its span settled: :class:`~fedsonmf.pipeline.spectral.PowerSteps`),
    ``exchanges`` (the round trips per :data:`STAGE_EXCHANGES`; they sum to ``refine_iterations +
    graph_iterations``), ``notes`` (the partitions not sent, list of str) and ``error`` (the lost
    client's error as text, or None).

    When no client scores (the k-means refinement's first summed score is 0, the text case of
    :func:`~fedsonmf.pipeline.refine.refine_best`) the graph stage sends no score exchange: both of
    its partitions would score 0 and the candidate would be kept, as it is without one.
    """
    c = int(n_clusters)
    n = int(np.shape(V)[1])
    policy = NodePolicy(c) if policy is None else policy
    report: dict = {"refine_iterations": 0, "refine_start": None, "graph_iterations": 0, "spectral_kept": False,
                    "graph_chosen": "", "spectral_steps": 0, "exchanges": dict.fromkeys(STAGE_EXCHANGES, 0),
                    "notes": [], "error": None}
    refined = False
    progress: dict = {}  # the graph stage's lowest cut met so far
    scored: list = []  # the summed score of the k-means refinement's first reply
    try:
        if refine is not None:
            labels = _kmeans_refinement(V, labels, c, seed, opts, _first_score(refine, scored), policy, report)
            report["exchanges"]["kmeans"] = report["refine_iterations"]
            refined = True
            if say is not None:
                say(f"k-means refinement: {report['refine_iterations']} exchanges, start {report['refine_start']} kept")
        if graph is not None:
            steps = spectral_steps(n, c, int(opts["refine_spectral_steps"])) if spectral is not None else 0
            before = policy.refused
            # no client scores (the first reply's summed score is 0, as refine_best reads it): the two
            # partitions' scores would both be 0 and the candidate kept, so that exchange is not sent
            score = None if scored and scored[0] == 0.0 else refine
            labels, info = graph_stage(labels, graph, spectral, c, steps=steps, refine=score, both=both,
                                       max_iter=int(opts["kmeans_max_iter"]), n_init=int(opts["kmeans_n_init"]),
                                       seed=seed, progress=progress)
            report.update(graph_iterations=int(info["exchanges"]), spectral_kept=bool(info["kept"]),
                          graph_chosen=str(info["chosen"]), spectral_steps=int(info["steps_taken"]))
            report["exchanges"].update(info["counts"])
            refined = True
            if policy.refused > before:
                report["notes"].append(f"{policy.refused - before} partition(s) of the graph stage not sent, below "
                                       f"the nodes' refine-min-cluster-size = {policy.floor}: the graph refinement "
                                       f"kept the lowest cut met, a refused spectral candidate was not kept")
            if say is not None:
                say(f"graph stage: {info['exchanges']} exchanges, the {info['chosen']} partition kept")
    except FederationError as exc:  # a client lost during a stage: the partition reached stands
        report["error"] = f"{type(exc).__name__}: {exc}"
        if "labels" in progress:  # the lowest cut the graph refinement had met before it
            labels, refined = progress["labels"], True
    if refined:  # a refined partition: its centres in the fit's embedding (else k-means' own)
        centers = embedding_centers(V, labels, c, normalize_embedding=bool(opts["normalize_embedding"]))
    return labels, centers, report


def _first_score(refine: Callable, into: list) -> Callable:
    """``refine``, which also appends the summed score of its first reply to ``into``."""
    def exchange(labels):
        D, score = refine(labels)
        if not into:
            into.append(float(np.sum(score)))
        return D, score
    return exchange


def _kmeans_refinement(V, labels, n_clusters: int, seed: int, opts: Mapping, refine: Callable, policy: NodePolicy,
                       report: dict):
    """The k-means refinement from the fit's partition, the k-means starts of V and the seeded ones;
    the exchanges, the start kept and the notes go into ``report``.  Returns the partition kept."""
    starts = refine_starts(V, labels, n_clusters, seed=seed, n_starts=int(opts["refine_starts"]),
                           normalize_embedding=bool(opts["normalize_embedding"]),
                           kmeans_max_iter=int(opts["kmeans_max_iter"]))
    seeding = functools.partial(seeded_starts, n_samples=int(np.shape(V)[1]), n_clusters=n_clusters,
                                n_starts=int(opts["refine_seeded_starts"]), seed=seed)
    before, seeding_refused = policy.refused, [0]  # the seeding's own partitions among those refused

    def seeded(exchange):
        def counted(rows):
            D, score = exchange(rows)
            seeding_refused[0] += int(np.isnan(score).sum())
            return D, score

        try:
            return seeding(counted)
        except PartitionRefused as exc:  # a client's policy refuses labels that single out samples
            report["notes"].append(f"seeded starts skipped: {exc} (the nodes' refine-min-cluster-size = "
                                   f"{policy.floor})")
            return []

    labels, report["refine_iterations"], report["refine_start"] = refine_best(starts, refine, seeded=seeded)
    stopped = policy.refused - before - seeding_refused[0]
    if stopped:
        report["notes"].append(f"{stopped} partition(s) of the starts not sent, below the nodes' "
                               f"refine-min-cluster-size = {policy.floor}: each start stopped at the last "
                               f"partition answered")
    return labels
