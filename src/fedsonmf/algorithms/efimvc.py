"""EFIMVC (Liu et al. 2025, efficient federated incomplete multi-view clustering).

A comparison method of the paper's Table 1, written from the updates of the authors' public
MATLAB release (Tracesource/EFIMVC, commit 3f32edb: run.m, client_pretrain.m,
server_pretrain.m, client_train.m, server_train.m); no code is copied.  Client v holds a view
X_v (d_v x n, columns are samples) of which it has the samples marked by ind_v; it learns m
anchors A_v (d_v x m) and a simplex code Z_v (m x n, zero on the samples it lacks).  The server
holds the consensus code Zall (m x n) and one orthogonal alignment P_v (m x m) per view.  With
beta the graph weight and L_v the Laplacian of an anchor graph S_v (below), the problem is

    min  sum_v ||X_v - A_v Z_v||^2 + lambda2 ||(P_v Zall) o ind_v - Z_v||^2        (clients)
         + sum_v ||(P_v Zall) o ind_v - Z_v||^2 + 2 beta tr(Zall^T P_v^T L_v P_v Zall)  (server)
    s.t. every held column of Z_v and every column of Zall on the simplex, P_v^T P_v = I.

Start: client v runs k-means (m centres, 10 replicates, 100 iterations) on its held samples
for A_v, then codes each held sample x by  min_z 1/2 z^T (A^T A + lambda2 I) z - (A^T x)^T z
on the simplex; the server averages the codes, per sample over the views that hold it, into
Zall; P_v = I.  One round:

* client v (sends Z_v and S_v): alternate the exact least-squares A_v = X Z^T (Z Z^T)^-1 (pinv
  when Z Z^T is ill-conditioned) and the per-sample simplex QP with H = A^T A + lambda2 I and
  linear term -(A^T x_i + lambda2 (P_v Zall)_i), until the client objective changes by less
  than ``tol`` (relative) or after ``client_max_iter``; then S_v = exp(-D / (2 sigma^2)), D the
  squared distances between the anchors (columns of A_v), sigma = 0.3 ((m - 1) / 2 - 1) + 0.8
  (so S_v carries the anchor geometry, not the data);
* server (sends P_v and Zall): symmetrise S_v, L_v = diag(S_v 1) - S_v and
  Lmx_v = lambda_max(L_v) I - L_v; then alternate (i) for every v repeated orthogonal Procrustes
  steps P_v = U V^T from the SVD of 2 beta Lmx_v P_v Zall Zall^T + Z_v Zall^T (the
  minorise-maximise step of the P-part of the server objective, at least 4 and at most
  ``procrustes_max_iter`` repeats, stopped by the release's rule), and (ii) every column of Zall
  by the simplex QP with H_i = h_i I + 2 beta sum_v P_v^T L_v P_v, h_i the number of views
  holding sample i, linear term -(sum_v P_v^T Z_v)_i; until the server objective changes by
  less than ``tol`` or after ``server_max_iter``.

The rounds stop when the summed client and server objective changes by less than ``tol``
(relative) or after ``max_iter``; the top-k left singular vectors of Zall^T (n x k), each row
scaled to unit norm, are clustered by k-means.  The three loops stop by the release's rule
``iter > 1 and (relative change < tol or iter > max_iter or objective < 1e-10)``, so a loop runs
at most ``max_iter + 1`` times (6 rounds, 31 client and 31 server iterations by default).

Defaults (``EFIMVC_DEFAULTS``) are our choice: the release searches m in {k, 2k, 3k} and
lambda2, beta in {0.001, 0.1, 1, 100} and reports the best ACC against the ground truth, which a
label-free comparison cannot do; we fix m = 2k, lambda2 = beta = 1 (the middle of that grid)
for every data set.  The views are used as given (no scaling; the release also feeds them as
stored).  The release's final k-means averages 20 runs of 20 replicates; we take one seeded run
of 20 replicates (1000 iterations).  ``random_state`` seeds every random choice (the anchors'
k-means, the final k-means); the release fixes its generator instead.

The simplex QPs (the release calls quadprog per sample, with an upper bound 1 the simplex
implies) are solved here for all samples of a step at once (``simplex_qp``): FISTA with gradient
restart, step 1 / lambda_max(H), the exact sorting projection onto the simplex, warm-started
from the previous codes, with a few sweeps of the primal active-set method (exact solves on
the support, batched over samples) every 10 iterations, since a view with fewer features than
anchors makes H nearly singular (cond ~1e9 on Handwritten) and FISTA alone crawls there.  A
sample stops when its Frank-Wolfe duality gap is below ``qp_tol`` = 1e-9 of its scale, or
below the round-off floor min(10 eps cond(H), 1e-6) where that is larger, or after
``qp_max_iter``; a sample still above its gap then (a singular H: lambda2 = 0 and fewer features
than anchors) is finished by proximal-point steps, each a strongly convex QP solved the same way;
no sample is returned worse than its warm start, so every Z-step (and every exact A-step) lowers
the client objective.

Where the release is loose we chose: the views' rows of samples a client lacks are never read
(in the release they meet only zero codes, so no update depends on them); every fit starts
from the pretraining (run.m reuses the codes of the previous beta of its grid); the Procrustes
stopping quantity is the release's (beta tr(P_new^T Lmx P_old ZZ) + tr(P_new^T Z_v Zall^T),
growth below 1e-3 of its magnitude); the anchors' k-means starts from random samples, as the
release's litekmeans; m >= k is required (the final step needs k singular vectors of the
m x n Zall).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from fedsonmf._validation import check_view_arrays

__all__ = ["EFIMVCResult", "efimvc", "efimvc_cluster", "EFIMVC_DEFAULTS"]

#: our fixed hyper-parameters (n_anchors None = 2 * n_clusters) and the release's loop limits and tolerances
EFIMVC_DEFAULTS: dict[str, Any] = {
    "n_anchors": None, "lambda2": 1.0, "lambda3": 1.0, "max_iter": 5, "client_max_iter": 30, "server_max_iter": 30,
    "procrustes_max_iter": 100, "tol": 1e-3, "qp_tol": 1e-9, "qp_max_iter": 1000}


@dataclass
class EFIMVCResult:
    """``Zall`` (m, n) the consensus code, ``P`` the (m, m) alignments per view, ``Z`` the clients'
    codes (m, n), ``objective`` the summed objective per round, ``n_iter`` rounds run."""

    Zall: np.ndarray
    P: list
    Z: list = field(default_factory=list)
    objective: list = field(default_factory=list)
    n_iter: int = 0


def project_simplex(V: np.ndarray) -> np.ndarray:
    """Euclidean projection of every column of V (m, N) onto {z >= 0, 1^T z = 1} (sorting method)."""
    V = np.asarray(V, dtype=np.float64)
    m, N = V.shape
    U = -np.sort(-V, axis=0)
    css = np.cumsum(U, axis=0) - 1.0
    ok = U - css / np.arange(1, m + 1)[:, None] > 0  # true on a prefix; the first row always
    rho = m - 1 - np.argmax(ok[::-1], axis=0)  # last true index per column
    theta = css[rho, np.arange(N)] / (rho + 1.0)
    return np.maximum(V - theta, 0.0)


def _qp_objective(G: np.ndarray, shift: np.ndarray, F: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """Per column 1/2 z^T (G + shift_i I) z + f_i^T z: (N,)."""
    HZ = G @ Z + shift * Z
    return 0.5 * np.sum(Z * HZ, axis=0) + np.sum(F * Z, axis=0)


def simplex_qp(G: np.ndarray, shift, F: np.ndarray, Z0: np.ndarray | None = None, *,
               tol: float = EFIMVC_DEFAULTS["qp_tol"], max_iter: int = EFIMVC_DEFAULTS["qp_max_iter"],
               polish_every: int = 10, polish_sweeps: int = 4, prox_steps: int = 200) -> np.ndarray:
    """Solve  min_z 1/2 z^T (G + shift_i I) z + f_i^T z  on the simplex for every column i at once.

    G (m, m) symmetric positive semidefinite, shift scalar or (N,) nonnegative, F (m, N) the linear
    terms, Z0 (m, N) a warm start (uniform if None).  FISTA with gradient restart, step
    1 / lambda_max(H_i) per column; a column stops when its Frank-Wolfe gap z^T g - min_j g_j (an
    upper bound on its distance to the optimum in objective) is at most max(tol, min(10 eps
    cond(H_i), 1e-6)) (lambda_max(H_i) + ||f_i||_inf) (the second term: the round-off floor).
    First and every ``polish_every`` iterations, ``polish_sweeps`` sweeps of the primal active-set
    method start from the iterate (see ``_active_set_sweeps``).  A column still above its gap after
    ``max_iter`` iterations (a singular H) is finished by at most ``prox_steps`` proximal-point steps
    (``_proximal_finish``).  Returns Z (m, N); no column is worse than its (projected) warm start.
    """
    G = 0.5 * (G + G.T)
    F = np.asarray(F, dtype=np.float64)
    m, N = F.shape
    shift = np.broadcast_to(np.asarray(shift, dtype=np.float64), (N,)).copy()
    Z0 = np.full((m, N), 1.0 / m) if Z0 is None else project_simplex(Z0)
    ev = np.linalg.eigvalsh(G)
    Lip = np.maximum(max(float(ev[-1]), 0.0) + shift, 1e-300)
    # the gap of a computed solution cannot go below about eps * cond(H_i) of the scale (round-off in the
    # support solves; a view with fewer features than anchors and a small lambda2 reaches cond ~1e9)
    with np.errstate(divide="ignore"):
        floor = np.minimum(10 * np.finfo(float).eps * Lip / np.maximum(float(ev[0]) + shift, 0.0), 1e-6)
    thr = np.maximum(tol, floor) * (Lip + np.max(np.abs(F), axis=0, initial=0.0))
    Z = Z0.copy()
    act = np.arange(N)
    Zc, Fa, sa, step, ta = Z0, F, shift, 1.0 / Lip, thr
    HZc = G @ Zc + sa * Zc
    Zp, HZp = Zc, HZc
    tk = np.ones(N)
    for it in range(max_iter):
        if it % polish_every == 0:
            # FISTA finds the support long before it converges on ill-conditioned views (few features,
            # many anchors): a few primal active-set sweeps from its iterate (exact solves on the support)
            # finish the job; they never raise the objective, and the gap check below decides as usual
            Zc = _active_set_sweeps(G, sa, Fa, Zc, ta, polish_sweeps)
            HZc = G @ Zc + sa * Zc
            Zp, HZp, tk = Zc, HZc, np.ones_like(tk)
        grad = HZc + Fa
        gap = np.sum(Zc * grad, axis=0) - grad.min(axis=0)
        done = gap <= ta
        if done.any():  # write converged columns out and iterate on the rest only
            Z[:, act[done]] = Zc[:, done]
            keep = ~done
            act = act[keep]
            if act.size == 0:
                break
            Zc, HZc, Zp, HZp = Zc[:, keep], HZc[:, keep], Zp[:, keep], HZp[:, keep]
            Fa, sa, step, ta, tk = Fa[:, keep], sa[keep], step[keep], ta[keep], tk[keep]
        tn = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * tk * tk))
        mom = (tk - 1.0) / tn
        Y = Zc + mom * (Zc - Zp)
        gY = (1.0 + mom) * HZc - mom * HZp + Fa  # H is linear: no extra product for the extrapolated point
        Zn = project_simplex(Y - step * gY)
        HZn = G @ Zn + sa * Zn
        # restart the momentum of a column whose step points against its last move (O'Donoghue & Candes)
        tk = np.where(np.sum((Y - Zn) * (Zn - Zc), axis=0) > 0, 1.0, tn)
        Zp, HZp, Zc, HZc = Zc, HZc, Zn, HZn
    if act.size:  # the cap was reached: keep the last iterate
        Z[:, act] = Zc
        if prox_steps > 0:
            Z[:, act] = _proximal_finish(G, max(float(ev[-1]), 0.0), shift[act], F[:, act], Zc, thr[act], tol,
                                         max_iter, prox_steps)
    worse = _qp_objective(G, shift, F, Z) > _qp_objective(G, shift, F, Z0)
    Z[:, worse] = Z0[:, worse]
    return Z


def _proximal_finish(G: np.ndarray, lam_max: float, shift: np.ndarray, F: np.ndarray, Z: np.ndarray, thr: np.ndarray,
                     tol: float, max_iter: int, steps: int) -> np.ndarray:
    """Proximal-point iterations for the columns :func:`simplex_qp` left above their gap: each step
    solves min 1/2 z^T (H + rho I) z + (f - rho z_k)^T z on the simplex with the same routine, whose
    minimiser z_{k+1} is the proximal point of z_k, and the iterates converge to a minimiser of the
    original QP (Rockafellar 1976).  Why: a singular H (lambda2 = 0, fewer features than anchors)
    has directions of zero curvature; the active-set solves there are singular, and the polishing
    restarts FISTA's momentum, so a column pulled along such a direction by its linear term alone
    creeps at the 1 / lambda_max step.  With rho = 1e-3 lambda_max(H) every step is well conditioned.
    ``lam_max``: lambda_max(G), as :func:`simplex_qp` computed it.  Stops a column at its gap
    ``thr``; at most ``steps`` steps; returns Z (m, N)."""
    rho = 1e-3 * lam_max + 1e-3 * shift
    rho = np.maximum(rho, 1e-12)
    act = np.arange(Z.shape[1])
    Z = Z.copy()
    for _ in range(int(steps)):
        Zk = Z[:, act]
        Z[:, act] = simplex_qp(G, shift[act] + rho[act], F[:, act] - rho[act] * Zk, Zk, tol=tol, max_iter=max_iter,
                               prox_steps=0)
        grad = G @ Z[:, act] + shift[act] * Z[:, act] + F[:, act]
        act = act[np.sum(Z[:, act] * grad, axis=0) - grad.min(axis=0) > thr[act]]
        if act.size == 0:
            break
    return Z


def _support_solve(G: np.ndarray, shift: np.ndarray, F: np.ndarray, W: np.ndarray) -> np.ndarray | None:
    """Per column, the minimiser of 1/2 z^T (G + shift_i I) z + f_i^T z with 1^T z = 1 and z_j = 0 off the
    working set W (m, N) bool (its KKT system, batched over columns): (m, N), or None if not solvable."""
    m, N = W.shape
    S = W.T  # (N, m)
    K = np.zeros((N, m + 1, m + 1))
    K[:, :m, :m] = G * (S[:, :, None] & S[:, None, :])
    diag = np.arange(m)
    K[:, diag, diag] = np.where(S, np.diag(G) + shift[:, None], 1.0)  # an identity row pins z_j = 0 off S
    K[:, :m, m] = S
    K[:, m, :m] = S
    rhs = np.concatenate([np.where(S, -F.T, 0.0), np.ones((N, 1))], axis=1)
    try:
        sol = np.linalg.solve(K, rhs[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:  # a singular restricted H (lambda2 = 0): least-norm solutions
        sol = (np.linalg.pinv(K) @ rhs[:, :, None])[:, :, 0]
    if not np.all(np.isfinite(sol)):
        return None
    return np.where(S, sol[:, :m], 0.0).T


def _active_set_sweeps(G: np.ndarray, shift: np.ndarray, F: np.ndarray, Z: np.ndarray, thr: np.ndarray,
                       sweeps: int) -> np.ndarray:
    """Sweeps of the primal active-set method for every column at once, from the feasible Z (m, N).

    The working set starts as the support of Z.  A sweep solves the QP on the working set exactly; a
    column moves towards that solution as far as it stays nonnegative, dropping the coordinates that
    block, or, if it got there and its duality gap is still above ``thr``, adds the coordinate of
    the smallest gradient.  Moving towards the face's minimiser never raises a convex objective; a
    step that would (round-off on a near-singular system) is not taken.
    """
    W = Z > 0
    obj = 0.5 * np.sum(Z * (G @ Z + shift * Z), axis=0) + np.sum(F * Z, axis=0)
    for _ in range(sweeps):
        cand = _support_solve(G, shift, F, W)
        if cand is None:
            break
        neg = cand < 0
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(neg, Z / (Z - cand), np.inf)
        alpha = np.minimum(ratio.min(axis=0), 1.0)
        new = np.maximum(Z + alpha * (cand - Z), 0.0)
        new[neg & (ratio <= alpha)] = 0.0  # the blocking coordinates leave the working set
        new /= new.sum(axis=0)
        Hn = G @ new + shift * new
        obj_new = 0.5 * np.sum(new * Hn, axis=0) + np.sum(F * new, axis=0)
        ok = obj_new <= obj
        Z, obj = np.where(ok, new, Z), np.where(ok, obj_new, obj)
        W = np.where(ok, new > 0, W)
        g = np.where(ok, Hn, G @ Z + shift * Z) + F
        add = ok & (alpha >= 1.0) & (np.sum(Z * g, axis=0) - g.min(axis=0) > thr)
        W[np.argmin(g, axis=0)[add], np.flatnonzero(add)] = True
        if not ok.any():
            break
    return Z


def _stop(history: list, it: int, tol: float, max_iter: int) -> bool:
    """The release's rule: after the first iteration, stop on a small relative change, the cap, or ~0."""
    if it < 2:
        return False
    prev, obj = history[-2], history[-1]
    rel = abs(prev - obj) / abs(prev) if prev != 0 else 0.0
    return rel < tol or it > max_iter or obj < 1e-10


def _as_float(X):
    return X.tocsr().astype(np.float64) if sp.issparse(X) else np.asarray(X, dtype=np.float64)


class _Client:
    """One view's private state: its held samples Xh (n_held, d), anchors A (d, m), code Z (m, n)."""

    def __init__(self, X, held: np.ndarray, m: int, lambda2: float, seed: int, qp: dict):
        from sklearn.cluster import KMeans

        self.held = np.flatnonzero(held)
        self.Xh = X[self.held]
        self.m, self.lambda2, self.qp = m, lambda2, qp
        self.xx = float(self.Xh.power(2).sum()) if sp.issparse(self.Xh) else float(np.sum(self.Xh ** 2))
        # anchors: k-means on the held samples, random samples as starts (as the release's litekmeans)
        km = KMeans(n_clusters=m, init="random", n_init=10, max_iter=100, random_state=seed).fit(self.Xh)
        self.A = np.asarray(km.cluster_centers_, dtype=np.float64).T
        XA = np.asarray(self.Xh @ self.A)
        self.Z = np.zeros((m, X.shape[0]))
        self.Z[:, self.held] = simplex_qp(self.A.T @ self.A, lambda2, -XA.T, **qp)
        self.history: list[float] = []  # the client objective over its last train()

    def objective(self, PZ: np.ndarray) -> float:
        """||X - A Z||^2 + lambda2 ||P Zall - Z||^2 over the held samples, without forming X - A Z."""
        Zh = self.Z[:, self.held]
        XA = np.asarray(self.Xh @ self.A)
        fit = self.xx - 2.0 * np.sum(XA.T * Zh) + np.sum((self.A.T @ self.A) * (Zh @ Zh.T))
        return float(max(fit, 0.0) + self.lambda2 * np.sum((PZ - Zh) ** 2))

    def train(self, Zall: np.ndarray, P: np.ndarray, tol: float, max_iter: int):
        """Alternate the A- and Z-steps; return Z (m, n), S (m, m) and the final objective."""
        PZ = P @ Zall[:, self.held]
        self.history = []
        it = 0
        while True:
            it += 1
            Zh = self.Z[:, self.held]
            C = Zh @ Zh.T
            D = np.asarray(self.Xh.T @ Zh.T)  # (d, m)
            if np.linalg.cond(C) > 1e12:  # an unused anchor makes Z Z^T singular: least-norm solution
                self.A = D @ np.linalg.pinv(C)
            else:
                self.A = np.linalg.solve(C, D.T).T
            XA = np.asarray(self.Xh @ self.A)
            F = -(XA.T + self.lambda2 * PZ)
            self.Z[:, self.held] = simplex_qp(self.A.T @ self.A, self.lambda2, F, Zh, **self.qp)
            self.history.append(self.objective(PZ))
            if _stop(self.history, it, tol, max_iter):
                break
        sq = np.sum(self.A ** 2, axis=0)
        dist = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (self.A.T @ self.A), 0.0)
        sigma = 0.3 * ((self.m - 1) * 0.5 - 1.0) + 0.8
        S = np.exp(-dist / (2.0 * sigma ** 2))
        return self.Z.copy(), S, self.history[-1]


def _procrustes(P: np.ndarray, Lmx: np.ndarray, ZZ: np.ndarray, ZZv: np.ndarray, beta: float,
                max_rep: int, tol: float) -> np.ndarray:
    """Maximise beta tr(P^T Lmx P ZZ) + tr(P^T ZZv) over orthogonal P by repeated Procrustes steps.

    Each step maximises the linearisation at the current P (Lmx and ZZ are PSD, so the value never
    decreases).  The stopping quantity is the release's: beta tr(P_new^T Lmx P_old ZZ) + tr(P_new^T ZZv),
    at least 4 repeats, stop once it grows by less than ``tol`` relative.
    """
    f1 = 0.0
    for rep in range(1, max_rep + 1):
        LPZZ = Lmx @ P @ ZZ
        U, _, Vt = np.linalg.svd(2.0 * beta * LPZZ + ZZv)
        P = U @ Vt
        f2, f1 = f1, float(beta * np.sum(P * LPZZ) + np.sum(P * ZZv))
        if rep > 3 and f1 - f2 < tol * abs(f1):
            break
    return P


def _server_train(P: list, Zall: np.ndarray, Zs: list, Ss: list, beta: float, ind: np.ndarray,
                  tol: float, max_iter: int, max_rep: int, qp: dict):
    """Align the views and update the consensus; return Zall (m, n), P, the final objective."""
    m = Zall.shape[0]
    Ls, Lmx = [], []
    for S in Ss:
        S = 0.5 * (S + S.T)
        L = np.diag(S.sum(axis=0)) - S
        Ls.append(L)
        Lmx.append(np.linalg.eigvalsh(L)[-1] * np.eye(m) - L)  # lambda_max I - L: PSD, so the P-step is an MM step
    h = ind.sum(axis=1)
    history: list[float] = []
    it = 0
    while True:
        it += 1
        ZZ = Zall @ Zall.T
        P = [_procrustes(P[v], Lmx[v], ZZ, Zs[v] @ Zall.T, beta, max_rep, tol) for v in range(len(Zs))]
        Lp = sum(Pv.T @ L @ Pv for Pv, L in zip(P, Ls))
        B = sum(Pv.T @ Zv for Pv, Zv in zip(P, Zs))  # Z_v is zero where view v lacks the sample
        Zall = simplex_qp(2.0 * beta * Lp, h, -B, Zall, **qp)
        fit = sum(np.sum((Pv @ Zall * ind[:, v] - Zv) ** 2) for v, (Pv, Zv) in enumerate(zip(P, Zs)))
        graph = float(np.sum(Zall * (Lp @ Zall)))  # sum_v tr(Zall^T P_v^T L_v P_v Zall)
        history.append(float(fit + 2.0 * beta * graph))
        if _stop(history, it, tol, max_iter):
            break
    return Zall, P, history[-1]


def _check(Xs, n_clusters: int, masks, n_anchors, lambda2: float, lambda3: float):
    """Validate the views and parameters; return the views as float arrays and ind (n, V).

    The views are checked by :func:`fedsonmf._validation.check_view_arrays` (an InputError naming the
    view for NaN/Inf, non-2-D, non-numeric, empty or all-zero views and different numbers of samples),
    then converted by ``_as_float`` as before (float64; sparse as CSR)."""
    Xs = [_as_float(X) for X in check_view_arrays(Xs)]
    n = Xs[0].shape[0]
    if int(n_clusters) != n_clusters or n_clusters < 2:
        raise ValueError(f"n_clusters must be an integer >= 2, got {n_clusters!r}")
    if masks is None:
        ind = np.ones((n, len(Xs)))
    else:
        if len(masks) != len(Xs) or any(np.shape(mk) != (n,) for mk in masks):
            raise ValueError(f"masks must be one bool array of shape ({n},) per view")
        ind = np.column_stack([np.asarray(mk, dtype=bool) for mk in masks]).astype(np.float64)
        if np.any(ind.sum(axis=1) == 0):
            raise ValueError("masks: every sample must be held by at least one view")
    m = 2 * int(n_clusters) if n_anchors is None else n_anchors
    if int(m) != m or m < max(2, n_clusters) or m > ind.sum(axis=0).min():
        raise ValueError(f"n_anchors must be an integer between max(2, n_clusters) and the held samples of "
                         f"every view ({int(ind.sum(axis=0).min())}), got {m!r}")
    for name, val in (("lambda2", lambda2), ("lambda3", lambda3)):
        if not np.isfinite(val) or val < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {val!r}")
    return Xs, ind, int(m)


def efimvc(Xs, n_clusters: int, *, random_state=None, masks=None,
           n_anchors: int | None = EFIMVC_DEFAULTS["n_anchors"], lambda2: float = EFIMVC_DEFAULTS["lambda2"],
           lambda3: float = EFIMVC_DEFAULTS["lambda3"], max_iter: int = EFIMVC_DEFAULTS["max_iter"],
           client_max_iter: int = EFIMVC_DEFAULTS["client_max_iter"],
           server_max_iter: int = EFIMVC_DEFAULTS["server_max_iter"],
           procrustes_max_iter: int = EFIMVC_DEFAULTS["procrustes_max_iter"], tol: float = EFIMVC_DEFAULTS["tol"],
           qp_tol: float = EFIMVC_DEFAULTS["qp_tol"], qp_max_iter: int = EFIMVC_DEFAULTS["qp_max_iter"]
           ) -> EFIMVCResult:
    """Run EFIMVC in process on the views ``Xs`` (list of (n_samples, d_v), dense or sparse).

    ``masks``: None (every sample held) or one bool array (n_samples,) per view, True = held; rows of
    samples a view lacks are ignored.  See the module docstring for the updates and defaults.
    """
    Xs, ind, m = _check(Xs, n_clusters, masks, n_anchors, lambda2, lambda3)
    rng = np.random.default_rng(random_state)
    seeds = rng.integers(2**31 - 1, size=len(Xs))
    qp = {"tol": qp_tol, "max_iter": qp_max_iter}
    clients = [_Client(X, ind[:, v] > 0, m, lambda2, int(seeds[v]), qp) for v, X in enumerate(Xs)]
    # server start: the views' codes averaged per sample over the views holding it
    Zall = sum(cl.Z for cl in clients) / ind.sum(axis=1)
    P = [np.eye(m) for _ in clients]
    history: list[float] = []
    it = 0
    while True:
        it += 1
        outs = [cl.train(Zall, P[v], tol, client_max_iter) for v, cl in enumerate(clients)]
        Zs, Ss = [o[0] for o in outs], [o[1] for o in outs]
        Zall, P, obj_server = _server_train(P, Zall, Zs, Ss, lambda3, ind, tol, server_max_iter,
                                            procrustes_max_iter, qp)
        history.append(float(sum(o[2] for o in outs) + obj_server))
        if _stop(history, it, tol, max_iter):
            break
    return EFIMVCResult(Zall=Zall, P=P, Z=[cl.Z for cl in clients], objective=history, n_iter=it)


def efimvc_cluster(Xs, n_clusters: int, *, random_state=None, masks=None, **params) -> np.ndarray:
    """EFIMVC, then k-means (20 replicates, 1000 iterations, seeded) on the row-normalised top-k
    left singular vectors of Zall^T: labels (n,).  ``masks`` as for :func:`efimvc` (``reproduce
    table1`` passes an incomplete file's availability masks)."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(random_state)
    fit_seed, km_seed = (int(s) for s in rng.integers(2**31 - 1, size=2))
    res = efimvc(Xs, n_clusters, random_state=fit_seed, masks=masks, **params)
    U = np.linalg.svd(res.Zall.T, full_matrices=False)[0][:, :n_clusters]
    norms = np.linalg.norm(U, axis=1, keepdims=True)
    F = U / np.where(norms > 0, norms, 1.0)
    return KMeans(n_clusters=n_clusters, n_init=20, max_iter=1000, random_state=km_seed).fit_predict(F)
