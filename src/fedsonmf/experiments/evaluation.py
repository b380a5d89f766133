"""The real-data evaluation protocol (docs/algorithm.md §10) and the centralized context methods.

:func:`evaluate_clustering` runs :class:`~fedsonmf.estimators.clustering.FedMultiViewClustering`
over seeds and scores it (labels are used for scoring only); :func:`evaluate_method`
does the same for any ``fit_predict(seed)``.  The centralized references live in
:mod:`fedsonmf.experiments.references`; :func:`concat_kmeans` (k-means on the views as given)
and :func:`concat_nmf` (= ``references.nmf_kmeans``) stay here for existing callers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from fedsonmf.estimators.clustering import FedMultiViewClustering, kmeans_on_embedding
from fedsonmf.estimators.options import flat, from_flat
from fedsonmf.experiments.references import concat_views, nmf_kmeans
from fedsonmf.metrics import clustering_scores
from fedsonmf.protocol.params import default

__all__ = ["concat_kmeans", "concat_nmf", "ClusteringReport", "evaluate_method", "evaluate_clustering",
           "BaselineClustering", "clustering_model"]


# ----------------------------------------------------------------------------- context methods


def concat_kmeans(Xs, n_clusters: int, *, random_state=None, n_init: int = 10, max_iter: int = 300):
    """k-means on the concatenated views as given (no scaling; the references scale themselves:
    :mod:`fedsonmf.experiments.references`)."""
    labels, _ = kmeans_on_embedding(concat_views(Xs), n_clusters, normalize=False, n_init=n_init,
                                    max_iter=max_iter, random_state=random_state)
    return labels


#: scikit-learn NMF + k-means on the Frobenius-scaled concatenation (the ``nmf-kmeans`` reference)
concat_nmf = nmf_kmeans


# ----------------------------------------------------------------------------- protocol


@dataclass
class ClusteringReport:
    """Scores of one method on one dataset over several seeds.

    ``scores`` maps ``"acc"``, ``"nmi"``, ``"purity"`` to one value per seed (in [0, 1]);
    ``seconds`` is the wall time of each seed's fit; ``info`` holds per-seed extras
    (mu used, rounds, effective rank).
    """

    method: str
    seeds: list[int]
    scores: dict[str, list[float]]
    seconds: list[float]
    params: dict = field(default_factory=dict)
    info: list[dict] = field(default_factory=list)

    def mean(self, key: str) -> float:
        return float(np.mean(self.scores[key]))

    def std(self, key: str) -> float:
        return float(np.std(self.scores[key]))

    def summary(self) -> dict:
        """Mean and std (population, over seeds) of every score, in %, and the mean seconds."""
        out = {}
        for k in ("acc", "nmi", "purity"):
            out[k] = 100 * self.mean(k)
            out[k + "_std"] = 100 * self.std(k)
        out["seconds"] = float(np.mean(self.seconds))
        out["seconds_total"] = float(np.sum(self.seconds))
        return out

    def to_dict(self) -> dict:
        return {"method": self.method, "seeds": self.seeds, "scores": self.scores, "seconds": self.seconds,
                "params": _jsonable(self.params), "info": _jsonable(self.info), "summary": self.summary()}


def _jsonable(o):
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if o is None or isinstance(o, (bool, int, float, str)):
        return o
    return repr(o)


def evaluate_method(
    method: str,
    fit_predict: Callable[[int], tuple[np.ndarray, dict]],
    y,
    seeds: Iterable[int],
    *,
    average_method: str = "arithmetic",
    params: dict | None = None,
    callback: Callable[[int, dict], None] | None = None,
) -> ClusteringReport:
    """Score ``fit_predict(seed) -> (labels, info)`` against ``y`` for every seed."""
    seeds = [int(s) for s in seeds]
    scores: dict[str, list[float]] = {"acc": [], "nmi": [], "purity": []}
    seconds, infos = [], []
    for seed in seeds:
        t0 = time.perf_counter()
        labels, info = fit_predict(seed)
        seconds.append(time.perf_counter() - t0)
        sc = clustering_scores(y, labels, average_method=average_method)
        for k in scores:
            scores[k].append(sc[k])
        infos.append(info)
        if callback is not None:
            callback(seed, {**sc, **info, "seconds": seconds[-1]})
    return ClusteringReport(method, seeds, scores, seconds, params or {}, infos)


class BaselineClustering(FedMultiViewClustering):
    """The clustering pipeline with another federated algorithm's fits (``algorithm``: a name of
    :data:`fedsonmf.algorithms.ALGORITHMS`), for the paper's comparisons (Table 1); the estimator
    itself always fits with the paper's method."""

    def __init__(self, n_clusters=default("n_clusters"), *, algorithm=default("algorithm"), n_components="auto",
                 preprocess=default("preprocess"), n_init=default("n_init"), refine=default("refine"),
                 max_rounds=default("max_rounds"), tol=default("tol"), method=default("method"),
                 refinement=default("refinement"), privacy=default("privacy"), federation=default("federation"),
                 random_state=default("random_state"), n_jobs=default("n_jobs"),
                 checkpoint_dir=default("checkpoint_dir"), verbose=default("verbose")):
        super().__init__(n_clusters, n_components=n_components, preprocess=preprocess, n_init=n_init, refine=refine,
                         max_rounds=max_rounds, tol=tol, method=method, refinement=refinement, privacy=privacy,
                         federation=federation, random_state=random_state, n_jobs=n_jobs,
                         checkpoint_dir=checkpoint_dir, verbose=verbose)
        self.algorithm = algorithm

    def _algorithm(self) -> str:
        return str(self.algorithm)


def clustering_model(n_clusters: int, params: dict, random_state=None) -> FedMultiViewClustering:
    """The clustering estimator of the table's flat ``params`` (``algorithm`` other than the paper's:
    :class:`BaselineClustering`)."""
    params = dict(params)
    algorithm = params.pop("algorithm", default("algorithm"))
    kw = from_flat(params)
    if algorithm == default("algorithm"):
        return FedMultiViewClustering(n_clusters, random_state=random_state, **kw)
    return BaselineClustering(n_clusters, algorithm=algorithm, random_state=random_state, **kw)


def evaluate_clustering(
    Xs,
    y,
    n_clusters: int | None = None,
    *,
    seeds: Iterable[int] = range(10),
    average_method: str = "arithmetic",
    method: str | None = None,
    callback: Callable[[int, dict], None] | None = None,
    round_callback: Callable[[dict], None] | None = None,
    masks=None,
    **params,
) -> ClusteringReport:
    """Run the real-data protocol of docs/algorithm.md §10 for :class:`FedMultiViewClustering`.

    For every seed: fit on ``Xs`` with ``random_state=seed`` (federation and
    k-means), then score ACC / NMI / purity against ``y``.  Labels are used for
    scoring only.

    Parameters
    ----------
    Xs : list of {array-like, sparse matrix} of shape (n_samples, n_features_p)
    y : array-like of shape (n_samples,)
    n_clusters : int, optional
        Defaults to the number of distinct labels (the usual protocol).
    seeds : iterable of int, default=range(10)
    average_method : str
        NMI normalisation (:func:`fedsonmf.metrics.nmi`).
    method : str, optional
        Name in the report (default: the algorithm's name).
    callback : callable(seed, row), optional
        Called after each seed with its scores and info.
    round_callback : callable(history_row), optional
        Called after every federated round (progress display).
    masks : list, optional
        Incomplete views (docs/algorithm.md §15.1), as :meth:`FedMultiViewClustering.fit` takes them.
    **params
        The table's flat names (:func:`~fedsonmf.estimators.options.from_flat`: ``tau``,
        ``refine_starts``, ``dp_epsilon``, ...) and ``algorithm`` (another federated algorithm's
        fits in the same pipeline: :class:`BaselineClustering`).

    Returns
    -------
    ClusteringReport
    """
    y = np.asarray(y)
    c = int(np.unique(y).size) if n_clusters is None else n_clusters

    def run(seed):
        model = clustering_model(c, params, random_state=seed)
        labels = model.fit_predict(Xs, callback=round_callback, masks=masks)
        hist = model.history_.rows
        info = {"mu": model.mu_, "n_components": model.n_components_,
                "centered_views": [p for p, i in enumerate(model.preprocessing_) if i.get("centered")],
                "n_rounds": model.n_rounds_, "effective_rank": model.effective_rank_,
                "R_rel": hist[-1].get("R_rel") if hist else None}
        if model.privacy_ is not None:
            info["privacy"] = model.privacy_
        return labels, info

    name = method or params.get("algorithm", "fedsonmf")
    model = clustering_model(c, params)
    full = {k: v for k, v in flat(model.get_params()).items() if k != "random_state"}
    return evaluate_method(name, run, y, seeds, average_method=average_method, params=full, callback=callback)

