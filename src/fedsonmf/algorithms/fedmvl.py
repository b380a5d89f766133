"""FedMVL (Huang, Shi, Xu & Tsang, "Iterative Orthogonal Federated Multi-view Learning", IJCAI-FML 2019).

A comparison method of the paper's Table 1, written from its published algorithm (the
authors' public MATLAB release describes every update and its hyper-parameters; no code is
copied).  Every client m holds a view X_m (d_m x n) and learns a basis U_m and its own
nonnegative indicator V_m (n x c); the server holds the consensus V and an auxiliary G.
The problem

    min  sum_m alpha_m^r ||X_m - U_m V_m^T||_F^2 + mu/2 ||G^T V - I||_F^2
    s.t. V_m >= 0,  V_m = V,  G = V,  sum_m alpha_m = 1,  alpha >= 0

is solved by ADMM: multipliers Phi_m (V_m = V, kept by client m) and Psi (G = V, server),
penalties rho and varrho.  One round:

* client m: U_m = X_m V_m (V_m^T V_m)^-1; one linearised step
  V_m <- max(V_m + [rho (V - V_m) - Phi_m + 2 alpha_m^r (X_m - U_m V_m^T)^T U_m] (M U_m^T U_m + rho I)^-1, 0);
  it sends V_m, Phi_m and its residual Q_m = ||X_m - U_m V_m^T||^2;
* server: V = (mu G G^T + (varrho + rho M) I)^-1 ((mu + varrho) G - Psi + sum_m (Phi_m + rho V_m)),
  G = (mu V V^T + varrho I)^-1 ((mu + varrho) V + Psi), Psi += varrho (V - G),
  alpha_m proportional to (r Q_m)^(1/(1-r)); it sends V and alpha_m back;
* client m: Phi_m += rho (V_m - V).

Stopped when the objective (sum_m Q_m + mu/2 ||G^T V - I||^2) / M changes by less than
``tol`` or after ``max_iter`` rounds; k-means on V clusters the samples.  Each sample of each
view is standardised over its features first (the published preprocessing).  Defaults are the
published ones: 35 rounds, rho = varrho = 0.1 sqrt(2), mu = 1e3, r = 10^0.5; every client
updates all its samples every round (the release's "systems heterogeneity" simulation, which
drops a random share of them, is off).  The two n x n solves use the Woodbury identity (G and V
have c columns), so a round costs O(n c^2 + sum_m d_m n c).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from fedsonmf._validation import check_view_arrays

__all__ = ["FedMVLResult", "fedmvl", "fedmvl_cluster", "FEDMVL_DEFAULTS"]

#: the published hyper-parameters
FEDMVL_DEFAULTS = {"rho": 0.1 * np.sqrt(2.0), "varrho": 0.1 * np.sqrt(2.0), "mu": 1e3, "r": 10 ** 0.5,
                   "max_iter": 35, "tol": 1e-6}


@dataclass
class FedMVLResult:
    """``V`` (n, c) the consensus, ``G`` (n, c) its auxiliary copy, ``alpha`` the view weights,
    ``objective`` per round, ``n_iter`` rounds run."""

    V: np.ndarray
    G: np.ndarray
    alpha: np.ndarray
    objective: list = field(default_factory=list)
    n_iter: int = 0


def _standardize_samples(X) -> np.ndarray:
    """(d, n) with every column (sample) centred and scaled to unit std over its features (0 if constant)."""
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    X = X - X.mean(axis=0, keepdims=True)
    sd = X.std(axis=0, ddof=1, keepdims=True) if X.shape[0] > 1 else np.ones((1, X.shape[1]))
    return X / np.where(sd > 0, sd, 1.0)


def _solve_low_rank(a: float, mu: float, G: np.ndarray, B: np.ndarray) -> np.ndarray:
    """(a I + mu G G^T)^-1 B for G (n, c), by Woodbury: (B - G (a/mu I + G^T G)^-1 G^T B) / a."""
    if mu == 0:
        return B / a
    small = (a / mu) * np.eye(G.shape[1]) + G.T @ G
    return (B - G @ np.linalg.solve(small, G.T @ B)) / a


class _Client:
    """One view's private state: X_m (d, n), U_m, V_m, Phi_m."""

    def __init__(self, X, c: int, rng, init: str):
        self.X = X
        if init == "kmeans":  # the indicator of k-means on the client's own view, plus 0.2
            from sklearn.cluster import KMeans

            lab = KMeans(c, n_init=10, random_state=int(rng.integers(2**31))).fit_predict(X.T)
            self.V = np.eye(c)[lab] + 0.2
        else:
            self.V = rng.random((X.shape[1], c))
        self.Phi = np.zeros_like(self.V)
        self.U: np.ndarray | None = None

    def round(self, V: np.ndarray, weight: float, rho: float, n_views: int):
        X, Vm = self.X, self.V
        self.U = np.linalg.lstsq(Vm.T @ Vm, (X @ Vm).T, rcond=None)[0].T  # X V_m (V_m^T V_m)^-1
        U = self.U
        assert U is not None
        R = X - U @ Vm.T
        rhs = rho * (V - Vm) - self.Phi + 2.0 * weight * (R.T @ U)
        lhs = n_views * (U.T @ U) + rho * np.eye(U.shape[1])
        self.V = np.maximum(Vm + np.linalg.solve(lhs.T, rhs.T).T, 0.0)
        return self.V, self.Phi, float(np.sum((X - U @ self.V.T) ** 2))

    def dual(self, V: np.ndarray, rho: float):
        self.Phi = self.Phi + rho * (self.V - V)


def fedmvl(Xs, n_clusters: int, *, random_state=None, rho: float = FEDMVL_DEFAULTS["rho"],
           varrho: float = FEDMVL_DEFAULTS["varrho"], mu: float = FEDMVL_DEFAULTS["mu"],
           r: float = FEDMVL_DEFAULTS["r"], max_iter: int = FEDMVL_DEFAULTS["max_iter"],
           tol: float = FEDMVL_DEFAULTS["tol"], init: str = "random") -> FedMVLResult:
    """Run FedMVL in process on the views ``Xs`` (list of (n_samples, d_m)); see the module docstring.

    The views are checked first by :func:`fedsonmf._validation.check_view_arrays` (an InputError naming
    the view for NaN/Inf, non-2-D, non-numeric, empty or all-zero views and different numbers of samples)."""
    Xs = check_view_arrays(Xs)
    if init not in ("random", "kmeans"):
        raise ValueError(f"init must be 'random' or 'kmeans', got {init!r}")
    if r == 1:
        raise ValueError("r must differ from 1 (the weights use the exponent 1 / (1 - r))")
    rng = np.random.default_rng(random_state)
    M = len(Xs)
    n = Xs[0].shape[0]
    c = int(n_clusters)
    V = rng.random((n, c))  # the server's consensus and auxiliary copy, then the clients' own V_m
    G = rng.random((n, c))
    clients = [_Client(_standardize_samples(X.T if not sp.issparse(X) else X.T.tocsr()), c, rng, init) for X in Xs]
    Psi = np.zeros((n, c))
    alpha = np.full(M, 1.0 / M)
    history = []
    it = 0
    for it in range(1, max_iter + 1):
        ups = [cl.round(V, alpha[m] ** r, rho, M) for m, cl in enumerate(clients)]
        sum_v = sum(u[0] for u in ups)
        sum_phi = sum(u[1] for u in ups)
        Q = np.array([u[2] for u in ups])
        V = _solve_low_rank(varrho + rho * M, mu, G, (mu + varrho) * G - Psi + sum_phi + rho * sum_v)
        G = _solve_low_rank(varrho, mu, V, (mu + varrho) * V + Psi)
        Psi = Psi + varrho * (V - G)
        for cl in clients:
            cl.dual(V, rho)
        with np.errstate(divide="ignore", over="ignore"):
            w = (r * np.maximum(Q, 1e-300)) ** (1.0 / (1.0 - r))
        alpha = w / w.sum() if np.all(np.isfinite(w)) and w.sum() > 0 else np.full(M, 1.0 / M)
        obj = float((Q.sum() + 0.5 * mu * np.sum((G.T @ V - np.eye(c)) ** 2)) / M)
        history.append(obj)
        if it > 1 and abs(history[-2] - obj) < tol:
            break
    return FedMVLResult(V=V, G=G, alpha=alpha, objective=history, n_iter=it)


def fedmvl_cluster(Xs, n_clusters: int, *, random_state=None, **params) -> np.ndarray:
    """FedMVL, then k-means (10 replicates, 300 iterations, seeded) on the consensus V: labels (n,)."""
    from sklearn.cluster import KMeans

    res = fedmvl(Xs, n_clusters, random_state=random_state, **params)
    return KMeans(n_clusters=n_clusters, n_init=10, max_iter=300, random_state=random_state).fit_predict(res.V)
