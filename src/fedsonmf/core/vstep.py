"""The local V update: variable splitting and drift correction (docs/algorithm.md §4).

Within round s a client keeps two copies of V:

* ``Vhat`` (pre-proximal) accumulates plain gradient steps and is what gets
  uploaded -- the l2,1 + nonnegativity prox is kept out of the averaging;
* ``V`` (post-proximal) = P_{(k+1) alpha mu}(Vhat) feeds the next U-step and
  the next gradient.

Each local step: U-step (7), gradient g = grad_V f_p(U^{k+1}, V^k),
Vhat <- Vhat - alpha (g + C_p^s), V <- P_{(k+1) alpha mu}(Vhat).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fedsonmf.core._linalg import axpy, ut_x, x_vt
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.core.ustep import PenaltyOptions, solve_u
from fedsonmf.exceptions import ParameterError

__all__ = ["drift_correction", "LocalResult", "local_round", "AUTO_BATCH_MIN_SAMPLES", "resolve_batch",
           "draw_batches"]

#: ``batch_size="auto"`` takes every sample in every local step below this many samples, and
#: ceil(n / tau) from it on (docs/algorithm.md §16): the shared sets (n <= 2 000) keep the full-batch
#: code bit for bit, and a round at n = 1e5 costs about a fifth of a full-batch round
#: (benchmarks/bench_minibatch.py)
AUTO_BATCH_MIN_SAMPLES = 20_000


def drift_correction(V_prev: np.ndarray, Vbar: np.ndarray, eta_tilde: float, G_prev: np.ndarray) -> np.ndarray:
    """``C_p^s = (V^{s-1} - Vbar^s) / eta_tilde - G_p^{s-1}`` (§4.2), shape (r, n).

    Because Vbar^s = V^{s-1} - eta_tilde G^{s-1}, this equals the previous
    round's global average gradient minus this client's, so sum_p C_p^s = 0.
    """
    C = np.subtract(V_prev, Vbar)  # one r x n array for the three operations, bit for bit
    C /= eta_tilde
    C -= G_prev
    return C


@dataclass
class LocalResult:
    """Output of one client's tau local steps.

    U : (d_p, r) final basis U^{s,tau};  UtX : (r, n) U^T X_p for that U (None after stochastic
    local steps, which never form it: the caller computes it when a rule needs it);
    Vhat : (r, n) pre-proximal copy to upload;  G_avg : (r, n) mean local
    gradient G_p^s;  XVt0, VVt0 : X_p V^{sT} (d_p, r) and V^s V^{sT} (r, r)
    from the first step, reused for diagnostics;  inner : total penalty
    iterations of the U-steps.
    """

    U: np.ndarray
    UtX: np.ndarray | None
    Vhat: np.ndarray
    G_avg: np.ndarray
    XVt0: np.ndarray
    VVt0: np.ndarray
    inner: int


def local_round(
    X,
    U: np.ndarray,
    V_start: np.ndarray,
    C: np.ndarray | None,
    *,
    alpha: float,
    mu: float,
    tau: int,
    rho1: float,
    ustep: PenaltyOptions,
    cols: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    batches: tuple[list[np.ndarray], np.ndarray] | None = None,
) -> LocalResult:
    """Run the tau local steps of the proposed method (§4.1) from V^s.

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (d_p, n)
    U : ndarray of shape (d_p, r), the carried-over basis U_p^{s,0}.
    V_start : ndarray of shape (r, n), the post-proximal global V^s.
    C : ndarray of shape (r, n) or None
        Drift correction C_p^s (None means zero).

    Two passes over X per step (X V^T for the U-step, U^T X for the gradient).

    Incomplete views (§15.1): ``cols`` (sorted sample indices) are the
    columns Omega_p the client holds, ``X`` is then (d_p, |Omega_p|) and
    ``weights`` (|Omega_p|,) are m/c_j.  The U-step uses the weighted
    B = 2 X W V_Omega^T, A = 2 V_Omega W V_Omega^T; the V-step moves only the
    held columns with the client's own unscaled gradient 2(V - U^T X) and the
    per-column correction C (r, |Omega_p|).  The local prox is applied to the
    whole r x n copy [C]: its row norms (the l2,1 groups) span every sample,
    the columns the client does not hold stay at V^s.  ``Vhat``, ``G_avg``
    and ``UtX`` of the result are the r x |Omega_p| blocks (the upload).
    ``cols=None`` is exactly the complete-data code below.

    Stochastic local steps (§16): ``batches = (blocks, counts)`` from :func:`draw_batches`
    moves at step k only the columns ``blocks[k]``, column j by alpha tau / counts[j] per
    visit; ``None`` is the full-batch code below.
    """
    if cols is not None:
        return _local_round_cols(X, U, V_start, C, alpha=alpha, mu=mu, tau=tau, rho1=rho1, ustep=ustep,
                                 cols=cols, weights=weights)
    if batches is not None:
        return _local_round_batches(X, U, V_start, C, alpha=alpha, mu=mu, tau=tau, rho1=rho1, ustep=ustep,
                                    blocks=batches[0], counts=batches[1])
    Vhat = V_start.copy(order="K")  # keep the layout (see _linalg.ut_x)
    V = V_start
    inner = 0
    XVt0 = VVt0 = None
    UtX = None
    for k in range(tau):
        XVt = x_vt(X, V)  # pass 1 over X
        VVt = V @ V.T
        if k == 0:
            XVt0, VVt0 = XVt, VVt
        U, info = solve_u(2.0 * XVt, 2.0 * VVt, U, rho1, ustep)
        inner += info.inner_iterations
        UtX = ut_x(U, X)  # pass 2 over X
        # Vhat <- Vhat - alpha (g + C) with g = 2 (V - U^T X) (U^T U = I): three
        # fused passes, no temporaries (the r x n work is what bounds sparse views)
        axpy(2.0 * alpha, UtX, Vhat)
        axpy(-2.0 * alpha, V, Vhat)
        if C is not None:
            axpy(-alpha, C, Vhat)
        # the post-proximal copy reuses one buffer (V^s itself must survive the round)
        V = prox_l21_nonneg(Vhat, (k + 1) * alpha * mu, out=None if V is V_start else V)
    # Vhat = V^s - alpha sum_k (g_k + C) gives the mean local gradient without
    # accumulating it step by step: G_p^s = (V^s - Vhat) / (alpha tau) - C
    G_avg = V_start - Vhat
    G_avg *= 1.0 / (alpha * tau)
    if C is not None:
        G_avg -= C
    assert UtX is not None and XVt0 is not None and VVt0 is not None  # tau >= 1 steps ran
    return LocalResult(U, UtX, Vhat, G_avg, XVt0, VVt0, inner)


def _local_round_cols(X, U, V_start, C, *, alpha, mu, tau, rho1, ustep, cols, weights) -> LocalResult:
    """:func:`local_round` for a client holding the columns ``cols`` only (§15.1)."""
    Vhat = V_start.copy()
    V = V_start
    inner = 0
    XVt0 = VVt0 = None
    UtX = None
    w = np.ones(len(cols)) if weights is None else np.asarray(weights, dtype=np.float64)
    for k in range(tau):
        Vc = V[:, cols]
        Vw = Vc * w
        XVt = x_vt(X, Vw)  # X W V_Omega^T
        VVt = Vw @ Vc.T
        if k == 0:
            XVt0, VVt0 = XVt, VVt
        U, info = solve_u(2.0 * XVt, 2.0 * VVt, U, rho1, ustep)
        inner += info.inner_iterations
        UtX = ut_x(U, X)
        step = 2.0 * alpha * (UtX - Vc)
        if C is not None:
            step -= alpha * C
        Vhat[:, cols] += step
        V = prox_l21_nonneg(Vhat, (k + 1) * alpha * mu)
    Vhat_c = Vhat[:, cols]
    G_avg = (V_start[:, cols] - Vhat_c) * (1.0 / (alpha * tau))
    if C is not None:
        G_avg -= C
    assert UtX is not None and XVt0 is not None and VVt0 is not None  # tau >= 1 steps ran
    return LocalResult(U, UtX, Vhat_c, G_avg, XVt0, VVt0, inner)


# ---------------------------------------------------------------------------------- stochastic local steps


def resolve_batch(batch_size: int | str, n: int, tau: int) -> int | None:
    """The samples per local step for ``n`` samples, or None for the full batch (§16).

    "auto": None below :data:`AUTO_BATCH_MIN_SAMPLES` samples, else ceil(n / tau).  An int
    b >= n is the full batch; b < ceil(n / tau) is refused: a round would leave samples
    unvisited, and their drift correction and prox weights would need an importance
    weight n / (b tau) > 1 that makes C_p oscillate (docs/algorithm.md §16).
    """
    low = math.ceil(n / tau)
    if isinstance(batch_size, str):
        if batch_size != "auto":
            raise ParameterError(f"batch_size must be a positive integer or 'auto', got {batch_size!r}")
        return None if n < AUTO_BATCH_MIN_SAMPLES or low >= n else low
    b = int(batch_size)
    if b >= n:
        return None
    if b < low:
        raise ParameterError(f"batch_size={b} is too small for {n} samples and tau={tau}: a round must visit every "
                             f"sample, so batch_size must be at least ceil(n / tau) = {low} (or 'auto')")
    return b


def draw_batches(n: int, tau: int, b: int, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    """The tau sample blocks of one round and each sample's visit count (§16).

    The blocks are consecutive slices of length b of ceil(b tau / n) concatenated random
    permutations of 0..n-1 (random reshuffling), each sorted and without repeats (a slice
    across two permutations drops a repeated sample, so a block may hold fewer than b).
    b tau >= n, so every sample is visited at least once: counts >= 1.
    """
    reps = -(-tau * b // n)
    order = np.concatenate([rng.permutation(n) for _ in range(reps)])
    blocks = [np.unique(order[k * b:(k + 1) * b]) for k in range(tau)]
    counts = np.bincount(np.concatenate(blocks), minlength=n)
    return blocks, counts


def _columns(X, idx: np.ndarray):
    """The columns ``idx`` of a view (CSC slice, or a dense copy)."""
    return X[:, idx] if sp.issparse(X) else np.take(X, idx, axis=1)


def _row_radius(S: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per row i, the norm nu_i of the weighted prox's output (§16): the root of
    f(nu) = sum_c S[c, i] / (nu + t_c)^2 - 1, 0 when there is none (the row vanishes).

    ``S`` (classes x r): sums of squares of the row's positive parts in each class of columns,
    ``t`` (classes,): each class's threshold T_c mu >= 0.  One threshold: nu = max(||y|| - t, 0).
    f is convex and decreasing, and nu_0 = max(sqrt(S_0), sqrt(sum S) - max t, 0) (S_0: the mass
    at t = 0) lies left of the root, so Newton's steps rise to it monotonically.
    """
    total = S.sum(axis=0)
    if np.all(t == t[0]):
        return np.maximum(np.sqrt(total) - t[0], 0.0)
    tt = t[:, None]
    mass = S > 0
    nu = np.maximum(np.sqrt(total) - t.max(), 0.0)
    if np.any(t == 0):
        nu = np.maximum(nu, np.sqrt(S[t == 0].sum(axis=0)))
    at_zero = (np.where(mass & (tt > 0), S, 0.0) / np.where(tt > 0, tt, 1.0) ** 2).sum(axis=0)
    live = (nu > 0) | (at_zero > 1.0)  # f(0) > 0: a root exists
    nu = np.where(live, nu, 0.0)
    for _ in range(100):
        d = np.where(mass, nu + tt, 1.0)
        q = np.where(mass, S / d**2, 0.0)
        f = q.sum(axis=0) - 1.0
        fp = 2.0 * (q / d).sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where(live & (f > 0) & (fp > 0), f / fp, 0.0)
        nu = nu + step
        if not np.any(step > 1e-15 * np.maximum(nu, 1e-300)):
            break
    return nu


def _local_round_batches(X, U, V_start, C, *, alpha, mu, tau, rho1, ustep, blocks, counts) -> LocalResult:
    """:func:`local_round` with stochastic local steps (§16).

    Step k moves the columns B_k only: Vhat_B -= (alpha tau / c_B) (g_B + C_B), so column j has
    moved by the step T_j = alpha tau v_j / c_j after v_j of its c_j visits.  The U-step sees the
    whole post-proximal copy V_k = prox of h in the metric diag(T) at Vhat_k (the variable-metric
    prox-gradient step; one T for all columns gives the full batch's P_{k alpha mu}): row i of it is
    y_ij nu_i / (nu_i + T_j mu) with y = max(Vhat_k, 0) and nu_i from :func:`_row_radius`.
    Columns with equal (v_j, c_j) share T_j; per such class the statistics
    W_c = X_c y_c^T (d_p x r) and P_c = y_c y_c^T (r x r) are kept exact by rank-b updates, so
    X V_k^T = sum_c W_c diag(s_c) and V_k V_k^T = sum_c diag(s_c) P_c diag(s_c).  One pass over X
    at the start (X V^{sT}, also the diagnostics'), and per step two passes over the columns X_B; no U^T X
    of the final basis (``LocalResult.UtX`` is None).
    """
    Vhat = np.array(V_start, dtype=np.float64, copy=True)
    XVt0 = x_vt(X, V_start)  # the round's one full pass for the U-step (and the diagnostics)
    VVt0 = V_start @ V_start.T
    counts = np.asarray(counts, dtype=np.int64)
    visits = np.zeros_like(counts)
    # class (v, c) -> [W_c, P_c, number of columns]; V^s >= 0, so y_0 = V^s
    stats: dict[tuple[int, int], list] = {}
    values = np.unique(counts)
    for i, c in enumerate(values):
        if i == len(values) - 1:  # the last class by difference: no slice of X for it
            W = XVt0 - sum((st[0] for st in stats.values()), np.zeros_like(XVt0))
            P = VVt0 - sum((st[1] for st in stats.values()), np.zeros_like(VVt0))
            stats[(0, int(c))] = [W, P, int((counts == c).sum())]
        else:
            idx = np.flatnonzero(counts == c)
            Vc = V_start[:, idx]
            stats[(0, int(c))] = [x_vt(_columns(X, idx), Vc), Vc @ Vc.T, idx.size]
    weight = (alpha * tau) / counts  # per visit; a column's visits add up to alpha tau
    inner = 0
    for B in blocks:
        keys = list(stats)
        T = np.array([alpha * tau * v / c for v, c in keys])
        S = np.maximum(np.stack([np.diag(stats[key][1]) for key in keys]), 0.0)
        nu = _row_radius(S, T * mu)
        den = nu[None, :] + (T * mu)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            scales = np.where(den > 0, nu[None, :] / den, 0.0)  # (classes, r)
        XVt = sum(stats[key][0] * scales[c] for c, key in enumerate(keys))
        VVt = sum(scales[c][:, None] * stats[key][1] * scales[c][None, :] for c, key in enumerate(keys))
        U, info = solve_u(2.0 * XVt, 2.0 * VVt, U, rho1, ustep)
        inner += info.inner_iterations
        XB = _columns(X, B)
        if len(keys) > 1:  # each column's class index: (v, c) coded as v * K + c
            K = int(counts.max()) + 1
            codes = np.array([v * K + c for v, c in keys])
            order = np.argsort(codes)
            cls = order[np.searchsorted(codes[order], visits[B] * K + counts[B])]
        else:
            cls = np.zeros(B.size, dtype=np.intp)
        Y_old = np.maximum(Vhat[:, B], 0.0)
        # g_B = 2 (V_B - U^T X_B), V_B the post-proximal copy's columns
        step = scales[cls].T * Y_old
        step -= ut_x(U, XB)
        step *= 2.0
        if C is not None:
            step += C[:, B]
        step *= weight[B]
        Vhat[:, B] -= step
        Y_new = np.maximum(Vhat[:, B], 0.0)
        for c in np.unique(cls):  # each column moves from class (v, c_j) to (v + 1, c_j)
            m = np.flatnonzero(cls == c)
            old = keys[c]
            new = (old[0] + 1, old[1])
            Xm = XB if m.size == B.size else _columns(XB, m)
            Yo, Yn = Y_old[:, m], Y_new[:, m]
            st_old = stats[old]
            st_old[0] = st_old[0] - x_vt(Xm, Yo)
            st_old[1] = st_old[1] - Yo @ Yo.T
            st_old[2] -= m.size
            st_new = stats.setdefault(new, [np.zeros_like(XVt0), np.zeros_like(VVt0), 0])
            st_new[0] = st_new[0] + x_vt(Xm, Yn)
            st_new[1] = st_new[1] + Yn @ Yn.T
            st_new[2] += m.size
            if st_old[2] == 0:
                del stats[old]
        visits[B] += 1
    G_avg = V_start - Vhat
    G_avg *= 1.0 / (alpha * tau)
    if C is not None:
        G_avg -= C
    return LocalResult(U, None, Vhat, G_avg, XVt0, VVt0, inner)
