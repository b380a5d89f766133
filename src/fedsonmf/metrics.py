"""External clustering metrics: accuracy (Hungarian matching), NMI, purity and the adjusted Rand index.

Definitions follow docs/algorithm.md §10: ACC matches clusters to classes one-to-one with the
Hungarian algorithm on the contingency matrix; purity assigns every cluster its majority
class; NMI is :func:`sklearn.metrics.normalized_mutual_info_score`, the adjusted Rand index
:func:`sklearn.metrics.adjusted_rand_score` (not in the paper's tables; reported where a user scores
one clustering file).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from sklearn.metrics.cluster import contingency_matrix

__all__ = ["clustering_accuracy", "purity", "nmi", "adjusted_rand", "clustering_scores", "format_scores"]

_AVERAGE_METHODS = {"arithmetic": "arithmetic", "geometric": "geometric", "sqrt": "geometric",
                    "max": "max", "min": "min"}


def _check_labels(y_true, y_pred) -> tuple[np.ndarray, np.ndarray]:
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    for name, y in (("y_true", y_true), ("y_pred", y_pred)):
        if y.ndim != 1:
            raise ValueError(f"{name} must be 1-D of shape (n_samples,), got shape {y.shape}")
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"y_true and y_pred differ in length: {y_true.shape[0]} != {y_pred.shape[0]}"
        )
    if y_true.size == 0:
        raise ValueError("y_true and y_pred are empty")
    return y_true, y_pred


def _contingency(y_true, y_pred) -> np.ndarray:
    """Dense contingency matrix of shape (n_classes, n_clusters)."""
    return np.asarray(contingency_matrix(*_check_labels(y_true, y_pred)))


def clustering_accuracy(y_true, y_pred) -> float:
    """Clustering accuracy under the best one-to-one cluster-to-class matching.

    Parameters
    ----------
    y_true : array-like of shape (n_samples,)
        Class labels (any hashable values).
    y_pred : array-like of shape (n_samples,)
        Cluster labels. The number of clusters may differ from the number of classes; the
        unmatched clusters (or classes) count as errors.

    Returns
    -------
    acc : float in [0, 1]
        ``max over matchings sum_k C[class_k, cluster_k] / n_samples``, with the contingency
        matrix ``C`` and the Hungarian algorithm.
    """
    C = _contingency(y_true, y_pred)
    rows, cols = linear_sum_assignment(C, maximize=True)
    return float(C[rows, cols].sum() / C.sum())


def purity(y_true, y_pred) -> float:
    """Purity: each cluster counts its majority class.

    Parameters
    ----------
    y_true, y_pred : array-like of shape (n_samples,)
        Class labels and cluster labels.

    Returns
    -------
    purity : float in [0, 1]
        ``sum over clusters of max_class C[class, cluster] / n_samples``.
    """
    C = _contingency(y_true, y_pred)
    return float(C.max(axis=0).sum() / C.sum())


def nmi(y_true, y_pred, average_method: str = "arithmetic") -> float:
    """Normalized mutual information.

    Parameters
    ----------
    y_true, y_pred : array-like of shape (n_samples,)
        Class labels and cluster labels.
    average_method : {"arithmetic", "geometric", "sqrt", "max", "min"}, default="arithmetic"
        Mean of the two entropies that normalises the mutual information; ``"sqrt"`` is an
        alias of ``"geometric"`` and ``"max"`` matches Deng Cai's ``MutualInfo.m``.

    Returns
    -------
    nmi : float in [0, 1]
    """
    if average_method not in _AVERAGE_METHODS:
        raise ValueError(
            f"average_method must be one of {sorted(_AVERAGE_METHODS)}, got {average_method!r}"
        )
    y_true, y_pred = _check_labels(y_true, y_pred)
    return float(normalized_mutual_info_score(
        y_true, y_pred, average_method=_AVERAGE_METHODS[average_method]
    ))


def adjusted_rand(y_true, y_pred) -> float:
    """Adjusted Rand index of a clustering, in [-0.5, 1] (1: the classes exactly, 0: chance)."""
    return float(adjusted_rand_score(*_check_labels(y_true, y_pred)))


def clustering_scores(y_true, y_pred, average_method: str = "arithmetic", ari: bool = False) -> dict[str, float]:
    """ACC, NMI and purity of a clustering (and with ``ari`` its adjusted Rand index).

    Parameters
    ----------
    y_true, y_pred : array-like of shape (n_samples,)
        Class labels and cluster labels.
    average_method : str, default="arithmetic"
        NMI normalisation, see :func:`nmi`.
    ari : bool, default=False
        Add ``"ari"``: :func:`adjusted_rand`.

    Returns
    -------
    scores : dict
        ``{"acc": float, "nmi": float, "purity": float}``, each in [0, 1], and ``"ari"`` when asked.
    """
    scores = {
        "acc": clustering_accuracy(y_true, y_pred),
        "nmi": nmi(y_true, y_pred, average_method=average_method),
        "purity": purity(y_true, y_pred),
    }
    if ari:
        scores["ari"] = adjusted_rand(y_true, y_pred)
    return scores


def format_scores(scores: dict, digits: int = 1) -> str:
    """One line of :func:`clustering_scores`' output: ``ACC 83.3 %  NMI 41.2 %  purity 83.3 %  ARI 0.4444``."""
    line = "  ".join(f"{name} {100 * scores[key]:.{digits}f} %"
                     for key, name in (("acc", "ACC"), ("nmi", "NMI"), ("purity", "purity")))
    return line + (f"  ARI {scores['ari']:.4f}" if "ari" in scores else "")
