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

from dataclasses import dataclass

import numpy as np

from fedsonmf.core._linalg import axpy, ut_x, x_vt
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.core.ustep import PenaltyOptions, solve_u

__all__ = ["drift_correction", "LocalResult", "local_round"]


def drift_correction(V_prev: np.ndarray, Vbar: np.ndarray, eta_tilde: float, G_prev: np.ndarray) -> np.ndarray:
    """``C_p^s = (V^{s-1} - Vbar^s) / eta_tilde - G_p^{s-1}`` (§4.2), shape (r, n).

    Because Vbar^s = V^{s-1} - eta_tilde G^{s-1}, this equals the previous
    round's global average gradient minus this client's, so sum_p C_p^s = 0.
    """
    return (V_prev - Vbar) / eta_tilde - G_prev


@dataclass
class LocalResult:
    """Output of one client's tau local steps.

    U : (d_p, r) final basis U^{s,tau};  UtX : (r, n) U^T X_p for that U;
    Vhat : (r, n) pre-proximal copy to upload;  G_avg : (r, n) mean local
    gradient G_p^s;  XVt0, VVt0 : X_p V^{sT} (d_p, r) and V^s V^{sT} (r, r)
    from the first step, reused for diagnostics;  inner : total penalty
    iterations of the U-steps.
    """

    U: np.ndarray
    UtX: np.ndarray
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
    """
    if cols is not None:
        return _local_round_cols(X, U, V_start, C, alpha=alpha, mu=mu, tau=tau, rho1=rho1, ustep=ustep,
                                 cols=cols, weights=weights)
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
