"""Label-free stopping for clustering: stop when the server's k-means on V has settled.

A clustering fit needs the partition, not the factorisation's last digits: on the shared
data sets the k-means assignments stop changing long before R/R1 reaches 1e-4
(measurement in docs/speed.md).  The rule runs on the server, on the V it holds after
every round -- no labels, nothing more sent -- so it works for any engine that calls a
stopping hook on V (:func:`fedsonmf.federation.loop.run_federation`'s ``stop``).
"""

from __future__ import annotations

import warnings

import numpy as np

from fedsonmf.protocol.params import options_of

__all__ = ["STOPPING_RULES", "LabelStability"]

#: FedMultiViewClustering's ``early_stop``: "labels" (this rule, and R/R1 <= tol) or "none" (tol only)
STOPPING_RULES = options_of("early_stop")  # declared once, in the parameter table


class LabelStability:
    """Stop when a cheap k-means of V^T gives the same assignment ``patience`` rounds in a row.

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
        self.stable = self.stable + 1 if self.labels is not None and np.array_equal(labels, self.labels) else 0
        self.centers, self.labels = km.cluster_centers_, labels
        if self.stable >= self.patience:
            return (f"the server's k-means assignments of V unchanged for {self.patience} rounds "
                    f"(early_stop='labels') at round {round_}")
        return None
