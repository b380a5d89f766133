"""The synthetic multi-view generator of docs/algorithm.md §8."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsonmf.exceptions import ParameterError

__all__ = ["SyntheticData", "make_synthetic"]


@dataclass(frozen=True)
class SyntheticData:
    """Views and ground truth of :func:`make_synthetic`.

    views : list of ndarray (n_samples, d)   -- X_p^T, the estimator's convention
    bases : list of ndarray (d, r)           -- planted U_p* in S_+
    V : ndarray (r, n)                        -- shared V* (zero rows off ``active``)
    client_V : list of ndarray (r, n)         -- V_p* = (1-h) V* + h E_p
    active : ndarray of bool (r,)             -- rows of V* that are not zero
    """

    views: list
    bases: list
    V: np.ndarray
    client_V: list
    active: np.ndarray

    def __repr__(self) -> str:
        """One line: the views' shapes, the rank and the active rows of V* (no array printed)."""
        shapes = {tuple(X.shape) for X in self.views}
        views = (f"{len(self.views)} views of {'x'.join(map(str, shapes.pop()))}" if len(shapes) == 1
                 else f"{len(self.views)} views " + ", ".join("x".join(map(str, X.shape)) for X in self.views))
        return (f"SyntheticData({views} dense, n_samples={self.V.shape[1]}, rank={self.V.shape[0]} "
                f"({int(np.count_nonzero(self.active))} active rows of V*), no labels)")


def make_synthetic(
    n_clients: int = 10,
    n_samples: int = 100,
    n_features: int = 20,
    rank: int = 6,
    heterogeneity: float = 0.0,
    n_zero_rows: int = 2,
    noise: float = 0.01,
    random_state: int | None = 0,
) -> SyntheticData:
    """Planted federated sparse ONMF problem with heterogeneity ``h``.

    V* (r x n) has |N(0,1)| entries on r - n_zero_rows random rows and zeros
    elsewhere (joint row sparsity).  Client p has a planted basis U_p* in S_+
    (balanced random supports, Uniform[0.5,1] entries, unit columns), a private
    part E_p with the same row pattern, V_p* = (1-h) V* + h E_p and
    X_p = U_p* V_p* + noise N(0,1).  h = 0: all clients share V*; h -> 1: the
    clients' optimal V disagree (client drift).
    """
    for name, v, lo in (("n_clients", n_clients, 1), ("n_samples", n_samples, 1), ("n_features", n_features, 1),
                        ("rank", rank, 1), ("n_zero_rows", n_zero_rows, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ParameterError(f"{name} must be an integer >= {lo}, got {v!r}")
    if rank > n_features:
        raise ParameterError(f"rank={rank} must not exceed n_features={n_features}")
    if n_zero_rows >= rank:
        raise ParameterError(f"n_zero_rows={n_zero_rows} must be smaller than rank={rank}")
    if not (0.0 <= heterogeneity <= 1.0):
        raise ParameterError(f"heterogeneity must be in [0, 1], got {heterogeneity!r}")
    if not (noise >= 0):
        raise ParameterError(f"noise must be >= 0, got {noise!r}")
    rng = np.random.default_rng(random_state)
    r, n, d, h = rank, n_samples, n_features, float(heterogeneity)
    active = np.zeros(r, dtype=bool)
    active[rng.choice(r, r - n_zero_rows, replace=False)] = True
    V = np.zeros((r, n))
    V[active] = np.abs(rng.standard_normal((active.sum(), n)))
    views, bases, client_V = [], [], []
    for _ in range(n_clients):
        cols = rng.permutation(np.arange(d) % r)
        U = np.zeros((d, r))
        U[np.arange(d), cols] = rng.uniform(0.5, 1.0, d)
        U /= np.linalg.norm(U, axis=0)
        E = np.zeros((r, n))
        E[active] = np.abs(rng.standard_normal((active.sum(), n)))
        Vp = (1.0 - h) * V + h * E
        X = U @ Vp + noise * rng.standard_normal((d, n))
        views.append(X.T.copy())
        bases.append(U)
        client_V.append(Vp)
    return SyntheticData(views, bases, V, client_V, active)
