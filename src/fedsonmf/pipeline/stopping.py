"""Label-free stopping for clustering: the server's step has settled, or its k-means on V has.

A clustering fit needs the partition, not the factorisation's last digits: on the shared
data sets the k-means assignments stop changing long before R/R1 reaches 1e-4
(measurement in docs/speed.md).  Both rules run on the server, on what it holds after every
round -- no labels, nothing more sent -- so they work for any engine that calls a stopping hook
(:func:`fedsonmf.federation.loop.run_federation`'s ``stop_rule``):

* :class:`StepResidual`: R_step^s / R_step^1 <= ``tol``, the residual of the server's own step
  (docs/algorithm.md §7.5).  It replaces the paper's R/R1 in a clustering fit because R/R1 needs
  every client's r x n gradient at the round's start in every reply, as large as the upload
  itself; the step's residual needs nothing sent.
* :class:`LabelStability` (``early_stop="labels"``).
"""

from __future__ import annotations

import warnings

import numpy as np

from fedsonmf.protocol.params import options_of

__all__ = ["STOPPING_RULES", "LABEL_CHANGE_TOLERANCE", "StepResidual", "LabelStability", "FirstOf"]

#: FedMultiViewClustering's ``early_stop``: "labels" (:class:`LabelStability`, and R_step/R_step1 <= tol) or
#: "none" (R_step/R_step1 <= tol only)
STOPPING_RULES = options_of("early_stop")  # declared once, in the parameter table

#: :class:`LabelStability` counts a round as settled when at most this fraction of the samples changed
#: cluster (rounded down: none below 10 000 samples, 100 of a million). Unchanged labels alone would let a
#: single sample on a boundary hold a fit of a million samples to its round budget.
LABEL_CHANGE_TOLERANCE = 1e-4


class StepResidual:
    """Stop when the server's step residual has fallen to ``tol`` of the first round's:
    ``row["R_step_rel"] <= tol`` (:class:`fedsonmf.protocol.history.History`).

    Call it as ``rule(round, V, row)``; it returns a reason string or None.
    """

    def __init__(self, tol: float):
        self.tol = float(tol)

    def __call__(self, round_: int, V: np.ndarray, row: dict | None = None) -> str | None:
        rel = (row or {}).get("R_step_rel")
        if rel is not None and rel <= self.tol:
            return f"R_step/R_step1 = {rel:.3g} <= tol = {self.tol:g} at round {round_}"
        return None


class FirstOf:
    """Several stopping rules, asked in order every round (each sees every round until one stops)."""

    def __init__(self, *rules):
        self.rules = [r for r in rules if r is not None]

    def __call__(self, round_: int, V: np.ndarray, row: dict | None = None) -> str | None:
        for rule in self.rules:
            why = rule(round_, V, row)
            if why:
                return why
        return None


class LabelStability:
    """Stop when a cheap k-means of V^T gives the same assignment ``patience`` rounds in a row:
    the same up to :data:`LABEL_CHANGE_TOLERANCE` of the samples (exactly the same below 10 000).

    Every round: k-means (one Lloyd run, scikit-learn) on V^T -- rows normalised when the
    clustering normalises its embedding -- started from the previous round's centres
    (round 1: one seeded k-means++ start).  Warm-started, the labels keep their
    numbering, so "unchanged" is a plain array comparison.  The final clustering is
    still the estimator's own k-means (``kmeans_n_init`` starts) on the final V.

    Call it as ``rule(round, V, row)``; it returns a reason string or None.
    """

    def __init__(self, n_clusters: int, *, patience: int = 5, normalize: bool = True, random_state: int = 0):
        self.n_clusters = int(n_clusters)
        self.patience = int(patience)
        self.normalize = bool(normalize)
        self.random_state = random_state
        self.centers = None
        self.labels = None
        self.stable = 0

    def __call__(self, round_: int, V: np.ndarray, row: dict | None = None) -> str | None:
        from sklearn.cluster import KMeans
        from sklearn.preprocessing import normalize

        E = np.asarray(V, dtype=np.float64).T
        if self.normalize:
            E = normalize(E)  # unit rows; all-zero rows stay zero
        if E.shape[0] < self.n_clusters:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # duplicate points, fewer distinct samples than clusters
            if self.centers is None:
                km = KMeans(self.n_clusters, n_init=1, random_state=self.random_state).fit(E)
            else:
                km = KMeans(self.n_clusters, init=self.centers, n_init=1, random_state=self.random_state).fit(E)
        labels = km.labels_
        allowed = int(LABEL_CHANGE_TOLERANCE * labels.size)
        same = self.labels is not None and int(np.count_nonzero(labels != self.labels)) <= allowed
        self.stable = self.stable + 1 if same else 0
        self.centers, self.labels = km.cluster_centers_, labels
        if self.stable >= self.patience:
            some = f" but for at most {allowed} samples" if allowed else ""
            return (f"the server's k-means assignments of V unchanged{some} for {self.patience} rounds "
                    f"(early_stop='labels') at round {round_}")
        return None
