"""Stationarity residuals R_V, R_U, R and their normalised forms (docs/algorithm.md §7).

Client side (:func:`client_diagnostics`): from products the client already has,
f_p(U^{s,0}, V^s), grad_V f_p(U^{s,0}, V^s) and r_U at U^{s,0} and U^{s,tau}.
Server side (:func:`round_metrics`): the objective F^s, and

    V-check = P_{eta mu}(V^s - eta grad_V f({U^{s,0}}, V^s))       (virtual exact step)
    R_V^s   = ||(V^s - V-check) / eta||_F^2                       (primary reading, §7.1)
    R_U^s   = (1/m) sum_p r_p(U_p^{s,tau}; grad_U f_p(., V^s))
    R^s     = R_V^s + R_U^s

with the measurement step eta = eta_tilde of the proposed method for every
algorithm.  :func:`normalised` gives R^s / ref and the running average over
rounds divided by ref, for ref in {R^1 (paper), R^0 (at initialisation)}.

The server's own step gives a second reading without any upload (:func:`step_residual`, §7.5):
R_step^s = ||(V^s - V^{s+1}) / eta||_F^2 + R_U^s, the mapping of the step it took with the
clients' trajectory gradient; a clustering fit stops on R_step^s / R_step^1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedsonmf.core.objective import grad_u, grad_v_orth, stationarity_u
from fedsonmf.core.prox import l21_norm, prox_l21_nonneg

__all__ = [
    "client_diagnostics", "round_metrics", "round_metrics_from_sums", "diagnostic_sums", "normalised", "step_residual",
    "effective_rank", "DIAGNOSTIC_ARRAYS", "RESIDUALS_KEY", "DIAGNOSTIC_SCALARS", "DIAGNOSTIC_DEGREES",
]

#: what :func:`client_diagnostics` returns (declared for the privacy audit)
DIAGNOSTIC_ARRAYS = ("grad0",)  # r x n: grad_V f_p(U^{s,0}, V^s), needed for R_V
DIAGNOSTIC_SCALARS = ("f0", "rU0", "rU")
#: how each diagnostic scales with the data (X -> cX: grad0 -> c grad0, f0 -> c^2 f0, r_U -> c^4 r_U);
#: the server only ever uses their sums over the clients (:func:`round_metrics_from_sums`)
DIAGNOSTIC_DEGREES = {"grad0": 1, "f0": 2, "rU0": 4, "rU": 4}
#: the round-message scalar that asks for no diagnostic arrays: False when the server stops on nothing
#: they give (``fedsonmf.federation.loop.run_federation``'s ``residuals``), so no client computes them
RESIDUALS_KEY = "residuals"


def client_diagnostics(x_sqnorm, U0, V, U_end, XVt0, VVt0, UtX0=None) -> dict:
    """Monitoring values a client adds to its round-s reply.

    U0 : (d_p, r) = U_p^{s,0};  V : (r, n) = V^s;  U_end : (d_p, r) = U_p^{s,tau};
    XVt0 : (d_p, r) = X_p V^{sT};  VVt0 : (r, r);  UtX0 : (r, n) = U0^T X_p, given when the reply
    carries the gradient ``grad0`` (the server's R_V; without it the scalars only).
    f_p(U0, V^s) = ||X||^2 - 2 <U0, X V^T> + <U0^T U0, V V^T> needs no r x n array.
    """
    UtU0 = U0.T @ U0
    out = {
        "f0": max(x_sqnorm - 2.0 * float(np.vdot(U0, XVt0)) + float(np.vdot(UtU0, VVt0)), 0.0),
        "rU0": stationarity_u(U0, grad_u(U0, XVt0, VVt0)),
        "rU": stationarity_u(U_end, grad_u(U_end, XVt0, VVt0)),
    }
    if UtX0 is not None:
        out["grad0"] = grad_v_orth(UtX0, V)
    return out


def effective_rank(V: np.ndarray, tol: float = 0.0) -> int:
    """Number of nonzero rows of V (components still in use)."""
    return int(np.count_nonzero(np.sqrt(np.einsum("ij,ij->i", V, V)) > tol))


def diagnostic_sums(diagnostics: Sequence[dict], cols=None, shape=None) -> dict:
    """Sums over the clients of every diagnostic, in client order.

    ``grad0`` blocks of incomplete views (``cols[p]`` not None) are summed into
    their columns of an array of ``shape`` (r, n).  Scalars are summed with
    ``np.sum`` so ``sum / m`` is bit-identical to ``np.mean``.
    """
    if cols is not None and any(c is not None for c in cols):
        from fedsonmf.core.masks import scatter_columns

        S, _ = scatter_columns([d["grad0"] for d in diagnostics], cols, shape)
    else:
        S = np.array(diagnostics[0]["grad0"], dtype=np.float64, copy=True)
        for d in diagnostics[1:]:
            S += d["grad0"]
    out = {"grad0": S}
    for k in DIAGNOSTIC_SCALARS:
        out[k] = float(np.sum(np.asarray([d[k] for d in diagnostics], dtype=np.float64)))
    return out


def round_metrics_from_sums(V: np.ndarray, sums: Mapping, m: int, eta: float, mu: float, counts=None) -> dict:
    """Objective and residuals of round s from the *sums* of the clients' diagnostics.

    ``sums``: ``grad0`` (r x n, the sum of the m clients' gradients at the round
    start; blocks of incomplete views summed into their columns) and the
    scalars ``f0, rU0, rU`` summed; ``m`` the number of clients summed;
    ``counts`` (incomplete views, §15.1): the holder count c_j of every column
    among them (public membership), the gradient of the weighted objective being
    the per-column mean over the holders.  This is all the server needs, which
    is what lets secure aggregation hide each client's diagnostics.
    """
    if counts is not None:
        grad = sums["grad0"] / np.maximum(counts, 1)
    else:
        grad = sums["grad0"] / m
    V_check = prox_l21_nonneg(V - eta * grad, eta * mu)
    D = (V - V_check) / eta
    R_V = float(np.vdot(D, D))
    R_U = float(sums["rU"] / m)
    return {
        "objective": float(sums["f0"] / m) + mu * l21_norm(V),
        "R_V": R_V,
        "R_U": R_U,
        "R": R_V + R_U,
        # residual at the start of the round (U^{s,0}); at s = 1 this is R^0
        "R_start": R_V + float(sums["rU0"] / m),
    }


def round_metrics(V: np.ndarray, diagnostics: Sequence[dict], eta: float, mu: float, cols=None) -> dict:
    """Objective and residuals of round s from the clients' diagnostics.

    ``cols`` (incomplete views, §15.1): each client's sample indices (None =
    all); ``grad0`` is then its r x |Omega_p| block and the gradient of the
    weighted objective is the per-column mean over the holders.  With partial
    participation the diagnostics are those of the clients that took part.
    The same numbers as :func:`round_metrics_from_sums` of :func:`diagnostic_sums`.
    """
    masked = cols is not None and any(c is not None for c in cols)
    counts = None
    if masked:
        from fedsonmf.core.masks import column_counts

        counts = column_counts(cols, V.shape[1])
    return round_metrics_from_sums(V, diagnostic_sums(diagnostics, cols, V.shape), len(diagnostics), eta, mu,
                                   counts=counts)


def step_residual(V: np.ndarray, V_next: np.ndarray, eta: float) -> float:
    """``||(V^s - V^{s+1}) / eta||_F^2``: the squared prox-gradient mapping of the server's own step
    (docs/algorithm.md §7.5), from the two matrices the server holds; nothing is sent for it."""
    D = np.subtract(V, V_next)
    return float(np.vdot(D, D)) / (float(eta) ** 2)


def normalised(R: Sequence[float], ref: float, average: bool, eps: float = 1e-12) -> np.ndarray:
    """``R^s / max(ref, eps)``, or the running mean (1/s) sum_{t<=s} R^t over it.

    ``average=True, ref=R^1`` is the paper's printed metric, which can never
    fall below 1/s (§7.3); the other three variants are reported next to it.
    """
    Rs = np.asarray(R, dtype=float)
    vals = np.cumsum(Rs) / np.arange(1, len(Rs) + 1) if average else Rs
    return np.asarray(vals / max(ref, eps))
