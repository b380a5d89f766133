"""PSFedML (Li et al. 2024, "Partially Shared Federated Multi-view Learning").

A comparison method of the paper's Table 1, written from the updates of the authors' public
MATLAB release (robotpear/PSFedML, commit 3589e6f: PSFedML.m, main.m); no code is copied.
Client p holds a view X_p (d_p x n, columns are samples), scaled to [0, 1] (below), and a
graph-regularised NMF X_p ~ B_p H_p (B_p d_p x C, H_p C x n), W_p the k-NN heat-kernel graph of
its samples, D_p = diag(W_p 1), L_p = D_p - W_p.  The server holds the shared code V (n x K,
K = rho C) and one selection G_p (C x K) per view.  The two objectives are

    client p:  ||X_p - B_p H_p||_F^2 + lambda tr(H_p L_p H_p^T),              B_p, H_p >= 0
    server:    sum_p ||H_p^T G_p - V||_F^2 + beta ||G_p||_{2,1}.

Start: B_p, H_p, V and G_p uniform on [0, 1).  One round:

* client p: the multiplicative (GNMF) steps
  B_p <- B_p o (X_p H_p^T) / max(B_p H_p H_p^T, 1e-5),
  H_p <- H_p o (B_p^T X_p + lambda H_p W_p) / max(B_p^T B_p H_p + lambda H_p D_p, 1e-5);
  it sends H_p (the basis B_p and the data stay local);
* server: G_p = (H_p H_p^T + beta Dt_p)^-1 H_p V with the l2,1 reweighting
  Dt_p = diag(0.5 / sqrt(||row_i G_p||^2 + 1e-5)) of the current G_p; then G_p is replaced by
  the 0/1 matrix that puts its K rows of largest norm into the columns (the i-th largest row to
  column i); V = sum_p (d_p / sum_q d_q) H_p^T G_p; it sends V and the selected rows back;
* client p: the selected rows of H_p are overwritten by the columns of V ("partially shared":
  K of the C rows of every H_p carry the consensus, the other C - K stay private).

After ``max_iter`` rounds, k-means on V clusters the samples.

Defaults (``PSFEDML_DEFAULTS``) are main.m's: rho = 0.2, 100 rounds, one client and one server
iteration per round, beta = 1, lambda = 0.1, the graph of 10 neighbours with t = 1, the stopping
threshold 1e-4 of the inner loops; all clients take part every round (main.m sets the dropout
probability ``var`` to 0, so its random client sampling is off and not implemented).  main.m's
C = 20 gives K = 4 shared dimensions, too few to separate more than a few clusters; our choice is
C = max(20, ceil(c / rho)), so K = rho C >= c (C = 20, K = 4 for c <= 4, as in main.m).

Where the release is loose we chose:

* scaling: the release calls the helper ``scaleSVM(Data{p}, 0, 1)`` (not shipped with it) on the
  d_p x n matrix; the libsvm-style helpers of that name take min and max along MATLAB's first
  dimension, i.e. per column, and the columns here are samples.  So every sample is min-max
  scaled over its own features to [0, 1] (a constant sample becomes 0, as those helpers do with
  the NaN column), which also makes views with negative entries nonnegative;
* the graph is Deng Cai's ``constructW`` as the release configures it: the k + 1 nearest samples
  (Euclidean, on the scaled view, the sample itself included), weight exp(-||x_i - x_j||^2 /
  (2 t^2)), self-loops removed, symmetrised by the elementwise max; kept sparse;
* the release records as client loss ||X - BH||^2 + tr(H L H^T) (graph weight 1, not lambda),
  averaged over the views; we record the objective the steps descend (weight lambda), averaged
  over the views, and the server objective above with Dt_p as used in the G-step;
* the inner loops stop when the loss changes by less than 1e-4 (absolute), compared within the
  round (the release compares entries of the first round there, an indexing slip invisible with
  one iteration per loop);
* the reweighting Dt_p uses the current G_p: the random start in round one, afterwards the 0/1
  selection of the previous round (as the release does), which favours keeping the selection;
* ties in the row norms keep the lower row first (MATLAB's stable sort); the final k-means is
  scikit-learn's (10 replicates, 300 iterations, seeded) where the release calls MATLAB's once.

``random_state`` seeds every random choice (the starts of B_p, H_p, V, G_p; the final k-means).
The dense work per round is O(sum_p d_p n C) on the clients and O(P (n C K + C^3)) on the server;
the graphs cost O(n k) memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from fedsonmf._validation import as_view_list, check_view_arrays

__all__ = ["PSFedMLResult", "psfedml", "psfedml_cluster", "PSFEDML_DEFAULTS"]

#: main.m's hyper-parameters, except n_components (C): None = max(20, ceil(n_clusters / rho)), our choice
PSFEDML_DEFAULTS: dict[str, Any] = {
    "n_components": None, "rho": 0.2, "beta": 1.0, "lam": 0.1, "max_iter": 100, "client_max_iter": 1,
    "server_max_iter": 1, "n_neighbors": 10, "t": 1.0, "tol": 1e-4}

_FLOOR = 1e-5  # the release's floor of the multiplicative denominators and of the l2,1 reweighting


@dataclass
class PSFedMLResult:
    """``V`` (n, K) the shared code, ``selected`` the K rows of H_p (C, n) shared per view (the i-th
    to column i of V), ``client_objective`` / ``server_objective`` per client / server iteration,
    ``n_iter`` rounds run."""

    V: np.ndarray
    selected: list = field(default_factory=list)
    client_objective: list = field(default_factory=list)
    server_objective: list = field(default_factory=list)
    n_iter: int = 0


def scale01(X) -> np.ndarray:
    """(d, n) view -> (d, n) with every column (sample) min-max scaled to [0, 1] (0 if constant)."""
    X = np.asarray(X.toarray() if sp.issparse(X) else X, dtype=np.float64)
    lo, hi = X.min(axis=0, keepdims=True), X.max(axis=0, keepdims=True)
    span = hi - lo
    return np.where(span > 0, (X - lo) / np.where(span > 0, span, 1.0), 0.0)


def knn_heat_graph(X: np.ndarray, k: int, t: float) -> sp.csr_matrix:
    """Sparse (n, n) graph of the samples (columns of X (d, n)): exp(-||x_i - x_j||^2 / (2 t^2)) on the
    k nearest neighbours of each sample, symmetrised by the elementwise max, zero diagonal."""
    from sklearn.neighbors import NearestNeighbors

    n = X.shape[1]
    m = min(k + 1, n)
    dist, idx = NearestNeighbors(n_neighbors=m).fit(X.T).kneighbors(X.T)
    rows = np.repeat(np.arange(n), m)
    W = sp.csr_matrix((np.exp(-dist.ravel() ** 2 / (2.0 * t * t)), (rows, idx.ravel())), shape=(n, n))
    W.setdiag(0.0)
    W.eliminate_zeros()
    return W.maximum(W.T).tocsr()


class _Client:
    """One view's private state: X (d, n) scaled, B (d, C), H (C, n), its graph W (n, n) and degrees."""

    def __init__(self, X: np.ndarray, C: int, rng: np.random.Generator, lam: float, k: int, t: float):
        self.X = X
        self.B = rng.random((X.shape[0], C))
        self.H = rng.random((C, X.shape[1]))
        self.W = knn_heat_graph(X, k, t)
        self.deg = np.asarray(self.W.sum(axis=1)).ravel()
        self.lam = lam

    def step(self) -> None:
        """One multiplicative step of B, then of H (the release's order and floors)."""
        X, B, H = self.X, self.B, self.H
        HHt = H @ H.T
        B = B * ((X @ H.T) / np.maximum(B @ HHt, _FLOOR))
        HW = (self.W @ H.T).T  # H W, W symmetric
        num = B.T @ X + self.lam * HW
        den = (B.T @ B) @ H + self.lam * H * self.deg
        self.B, self.H = B, H * (num / np.maximum(den, _FLOOR))

    def objective(self) -> float:
        """||X - B H||_F^2 + lambda tr(H L H^T), L = D - W."""
        H = self.H
        graph = float(np.sum(H * H * self.deg) - np.sum(H.T * (self.W @ H.T)))
        return float(np.sum((self.X - self.B @ H) ** 2)) + self.lam * graph

    def share(self, rows: np.ndarray, V: np.ndarray) -> None:
        """Overwrite the selected rows of H by the columns of V (n, K): H[rows[i]] = V[:, i]."""
        self.H[rows] = V.T


def select_rows(H: np.ndarray, V: np.ndarray, G: np.ndarray, beta: float):
    """The server's G-step for one view: H (C, n), V (n, K), G (C, K) the current selection.

    Returns the 0/1 selection (C, K), the selected rows (K,) (largest norm first) and the
    reweighting diagonal (C,) used in the solve (for the server objective)."""
    K = V.shape[1]
    dt = 0.5 / np.sqrt(np.sum(G * G, axis=1) + _FLOOR)
    Gs = np.linalg.solve(H @ H.T + beta * np.diag(dt), H @ V)
    norms = np.linalg.norm(Gs, axis=1)
    rows = np.argsort(-norms, kind="stable")[:K]
    G01 = np.zeros_like(G)
    G01[rows, np.arange(K)] = 1.0
    return G01, rows, dt


def _check(Xs, n_clusters, n_components, rho, beta, lam, max_iter, client_max_iter, server_max_iter,
           n_neighbors, t, tol):
    """Validate the views and parameters; return the views as (d_p, n) float arrays, C and K.

    The views are checked by :func:`fedsonmf._validation.check_view_arrays` (an InputError naming the
    view for NaN/Inf, non-2-D, non-numeric, empty or all-zero views and different numbers of samples).
    ``scale01`` then densifies a sparse view as given (not the CSR the check makes of COO, DOK, ...): the
    dense array's memory order follows the format, and with it the rounding of the run."""
    checked = check_view_arrays(Xs)
    raw = as_view_list(Xs)
    if int(n_clusters) != n_clusters or n_clusters < 2:
        raise ValueError(f"n_clusters must be an integer >= 2, got {n_clusters!r}")
    if not (0 < rho <= 1):
        raise ValueError(f"rho must lie in (0, 1], got {rho!r}")
    for name, val in (("beta", beta), ("lam", lam), ("tol", tol)):
        if not np.isfinite(val) or val < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {val!r}")
    if not np.isfinite(t) or t <= 0:
        raise ValueError(f"t must be a finite number > 0, got {t!r}")
    for name, ival in (("max_iter", max_iter), ("client_max_iter", client_max_iter),
                       ("server_max_iter", server_max_iter), ("n_neighbors", n_neighbors)):
        if int(ival) != ival or ival < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {ival!r}")
    C = max(20, math.ceil(n_clusters / rho - 1e-9)) if n_components is None else n_components
    if int(C) != C or C < 1:
        raise ValueError(f"n_components must be an integer >= 1, got {C!r}")
    K = math.floor(rho * C + 1e-9)
    if K < 1:
        raise ValueError(f"n_components * rho must be >= 1 (K shared rows), got {C} * {rho}")
    views = [scale01((X if sp.issparse(X) else M).T) for X, M in zip(raw, checked)]
    return views, int(C), int(K)


def psfedml(Xs, n_clusters: int, *, random_state=None,
            n_components: int | None = PSFEDML_DEFAULTS["n_components"], rho: float = PSFEDML_DEFAULTS["rho"],
            beta: float = PSFEDML_DEFAULTS["beta"], lam: float = PSFEDML_DEFAULTS["lam"],
            max_iter: int = PSFEDML_DEFAULTS["max_iter"], client_max_iter: int = PSFEDML_DEFAULTS["client_max_iter"],
            server_max_iter: int = PSFEDML_DEFAULTS["server_max_iter"],
            n_neighbors: int = PSFEDML_DEFAULTS["n_neighbors"], t: float = PSFEDML_DEFAULTS["t"],
            tol: float = PSFEDML_DEFAULTS["tol"]) -> PSFedMLResult:
    """Run PSFedML in process on the views ``Xs`` (list of (n_samples, d_p), dense or sparse).

    ``n_components`` is C (None: max(20, ceil(n_clusters / rho))), K = rho C rows are shared; see the
    module docstring for the updates and defaults."""
    views, C, K = _check(Xs, n_clusters, n_components, rho, beta, lam, max_iter, client_max_iter,
                         server_max_iter, n_neighbors, t, tol)
    rng = np.random.default_rng(random_state)
    clients = [_Client(X, C, rng, lam, int(n_neighbors), float(t)) for X in views]
    n = views[0].shape[1]
    V = rng.random((n, K))
    G = [rng.random((C, K)) for _ in clients]
    d = np.array([X.shape[0] for X in views], dtype=np.float64)
    weights = d / d.sum()
    rows: list[np.ndarray] = [np.arange(K) for _ in clients]
    client_hist: list[float] = []
    server_hist: list[float] = []
    for _round in range(max_iter):  # the release runs every round (no outer stopping rule)
        prev = None
        for _ in range(client_max_iter):
            for cl in clients:
                cl.step()
            loss = float(np.mean([cl.objective() for cl in clients]))
            client_hist.append(loss)
            if prev is not None and abs(prev - loss) < tol:
                break
            prev = loss
        prev = None
        for _ in range(server_max_iter):
            dts = []
            for p, cl in enumerate(clients):
                G[p], rows[p], dt = select_rows(cl.H, V, G[p], beta)
                dts.append(dt)
            V = sum(w * (cl.H.T @ Gp) for w, cl, Gp in zip(weights, clients, G))
            loss = float(sum(np.sum((cl.H.T @ Gp - V) ** 2) + beta * np.sum(dt[:, None] * Gp * Gp)
                             for cl, Gp, dt in zip(clients, G, dts)))
            server_hist.append(loss)
            if prev is not None and abs(prev - loss) < tol:
                break
            prev = loss
        for p, cl in enumerate(clients):
            cl.share(rows[p], V)
    return PSFedMLResult(V=np.asarray(V), selected=[r.copy() for r in rows], client_objective=client_hist,
                         server_objective=server_hist, n_iter=int(max_iter))


def psfedml_cluster(Xs, n_clusters: int, *, random_state=None, **params) -> np.ndarray:
    """PSFedML, then k-means (10 replicates, 300 iterations, seeded) on the shared code V: labels (n,)."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(random_state)
    fit_seed, km_seed = (int(s) for s in rng.integers(2**31 - 1, size=2))
    res = psfedml(Xs, n_clusters, random_state=fit_seed, **params)
    return KMeans(n_clusters=n_clusters, n_init=10, max_iter=300, random_state=km_seed).fit_predict(res.V)
