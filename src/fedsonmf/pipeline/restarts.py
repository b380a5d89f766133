"""The restarts of a federated clustering fit (``n_init``): how many, their seeds, the one kept.

The factorisation is non-convex: from different seeds it reaches different local minima, and
some of them cluster far worse than others (4-view BBC: 61.8 against 83.4 ACC, 3Sources: 56.2
against 92.3).  The fit kept is the *medoid*: the fit whose partition (k-means of its V) has the
highest summed adjusted Rand index to the others.  Good local minima resemble each other and bad
ones differ, so the medoid is rarely a bad one (3Sources 74.2 -> 81.0 from one fit to five,
4-view BBC 76.1 -> 80.6, BBCSport 93.3 -> 96.0, MSRC-v1 85.7 -> 87.0; docs/clustering.md).  It
needs only the partitions, which the server has, and returns one real fit, whose V, bases and
centres stay consistent with the labels; only that fit is refined, so the restarts add no
refinement exchange.
"""

from __future__ import annotations

import numpy as np

from fedsonmf._validation import check_auto_or_count

__all__ = ["AUTO_N_INIT", "resolve_n_init", "restart_seeds", "final_objective", "medoid_restart"]

#: the number of fits of ``n_init="auto"`` (measured, random draws of fits: 1 -> 3 -> 5 fits gave 3Sources
#: 74.2 -> 77.0 -> 81.0, 4-view BBC 76.1 -> 78.4 -> 80.6, BBCSport 93.3 -> 95.6 -> 96.0; docs/clustering.md)
AUTO_N_INIT = 5


def resolve_n_init(n_init, *, dp: bool, diagnostics: bool) -> int:
    """The number of fits of ``n_init`` ("auto" or a positive int): "auto" is :data:`AUTO_N_INIT`,
    or 1 when the fits report no objective (differential privacy, ``diagnostics=False``), where
    every further fit would spend privacy budget or could not be told apart."""
    count = check_auto_or_count("n_init", n_init)  # also a run config's text
    if count == "auto":
        return 1 if dp or not diagnostics else AUTO_N_INIT
    return int(count)


def restart_seeds(seed: int, n_init: int) -> list[int]:
    """The seed of every fit: ``seed`` first (one fit is the plain fit), then draws from it.
    The in-process estimator and the Flower ServerApp use these, so both run the same fits."""
    return [int(seed)] + [int(s) for s in np.random.default_rng(int(seed)).integers(2**32, size=int(n_init) - 1)]


def final_objective(result) -> float:
    """The objective F of the last round of a fit (``FitResult``), NaN when it was not reported."""
    F = result.history.column("objective")  # NaN in rows without it; empty without rows
    return float(F[-1]) if F.size else float("nan")


def medoid_restart(partitions, results=None) -> int:
    """The index of the medoid partition: the one with the highest summed adjusted Rand index
    to the others (the restart the others agree with most).  Ties -- always with two
    partitions -- go to the lower final objective when every fit reports one (``results``),
    else to the first.  Computed by the server from the partitions alone (O(k^2 n))."""
    from sklearn.metrics import adjusted_rand_score

    P = [np.asarray(p).ravel() for p in partitions]
    if not P:
        raise ValueError("partitions is empty")
    agree = np.array([sum(adjusted_rand_score(a, b) for j, b in enumerate(P) if j != i) for i, a in enumerate(P)])
    F = np.array([final_objective(r) for r in results], dtype=np.float64) if results is not None else None
    tie = F if F is not None and np.all(np.isfinite(F)) else np.arange(len(P), dtype=np.float64)
    top = np.flatnonzero(np.isclose(agree, agree.max(), rtol=0.0, atol=1e-12))
    return int(top[np.argmin(tie[top])])

