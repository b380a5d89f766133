"""Stationarity residuals R_V, R_U, R and their normalised forms (ALGORITHM.md §7).

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
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fedsonmf.core.objective import grad_u, grad_v_orth, stationarity_u
from fedsonmf.core.prox import l21_norm, prox_l21_nonneg

__all__ = [
    "client_diagnostics", "round_metrics", "normalised", "effective_rank", "DIAGNOSTIC_ARRAYS", "DIAGNOSTIC_SCALARS",
]

#: what :func:`client_diagnostics` returns (declared for the privacy audit)
DIAGNOSTIC_ARRAYS = ("grad0",)  # r x n: grad_V f_p(U^{s,0}, V^s), needed for R_V
DIAGNOSTIC_SCALARS = ("f0", "rU0", "rU")


def client_diagnostics(x_sqnorm, U0, UtX0, V, U_end, XVt0, VVt0) -> dict:
    """Monitoring values a client adds to its round-s reply.

    U0 : (d_p, r) = U_p^{s,0};  UtX0 : (r, n) = U0^T X_p;  V : (r, n) = V^s;
    U_end : (d_p, r) = U_p^{s,tau};  XVt0 : (d_p, r) = X_p V^{sT};  VVt0 : (r, r).
    """
    UtU0 = U0.T @ U0
    return {
        "f0": max(x_sqnorm - 2.0 * float(np.vdot(UtX0, V)) + float(np.vdot(UtU0, VVt0)), 0.0),
        "grad0": grad_v_orth(UtX0, V),
        "rU0": stationarity_u(U0, grad_u(U0, XVt0, VVt0)),
        "rU": stationarity_u(U_end, grad_u(U_end, XVt0, VVt0)),
    }


def effective_rank(V: np.ndarray, tol: float = 0.0) -> int:
    """Number of nonzero rows of V (components still in use)."""
    return int(np.count_nonzero(np.sqrt(np.einsum("ij,ij->i", V, V)) > tol))


def round_metrics(V: np.ndarray, diagnostics: Sequence[dict], eta: float, mu: float, cols=None) -> dict:
    """Objective and residuals of round s from the clients' diagnostics.

    ``cols`` (incomplete views, §15.1): each client's sample indices (None =
    all); ``grad0`` is then its r x |Omega_p| block and the gradient of the
    weighted objective is the per-column mean over the holders.  With partial
    participation the diagnostics are those of the clients that took part.
    """
    m = len(diagnostics)
    if cols is not None and any(c is not None for c in cols):
        from fedsonmf.core.masks import scatter_columns

        S, c = scatter_columns([d["grad0"] for d in diagnostics], cols, V.shape)
        grad = S / np.maximum(c, 1)
    else:
        grad = sum(d["grad0"] for d in diagnostics) / m
    V_check = prox_l21_nonneg(V - eta * grad, eta * mu)
    D = (V - V_check) / eta
    R_V = float(np.vdot(D, D))
    R_U = float(np.mean([d["rU"] for d in diagnostics]))
    return {
        "objective": float(np.mean([d["f0"] for d in diagnostics])) + mu * l21_norm(V),
        "R_V": R_V,
        "R_U": R_U,
        "R": R_V + R_U,
        # residual at the start of the round (U^{s,0}); at s = 1 this is R^0
        "R_start": R_V + float(np.mean([d["rU0"] for d in diagnostics])),
    }


def normalised(R: Sequence[float], ref: float, average: bool, eps: float = 1e-12) -> np.ndarray:
    """``R^s / max(ref, eps)``, or the running mean (1/s) sum_{t<=s} R^t over it.

    ``average=True, ref=R^1`` is the paper's printed metric, which can never
    fall below 1/s (§7.3); the other three variants are reported next to it.
    """
    R = np.asarray(R, dtype=float)
    vals = np.cumsum(R) / np.arange(1, len(R) + 1) if average else R
    return vals / max(ref, eps)
