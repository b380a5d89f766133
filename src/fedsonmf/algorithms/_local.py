"""Pieces shared by the baselines (docs/algorithm.md §9): one alternating local loop.

Every baseline's client runs "U-step (7) against the current local V, then
(maybe) move the local V" a few times, starting from the broadcast V^s.  The
first U-step always sees V^s, so X_p V^{sT} and V^s V^{sT} from that step are
what :func:`fedsonmf.core.residuals.client_diagnostics` needs: every algorithm
reports the same diagnostics and the residuals stay comparable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedsonmf.core._linalg import ut_x, x_vt
from fedsonmf.core.objective import grad_v_orth
from fedsonmf.core.residuals import client_diagnostics
from fedsonmf.core.ustep import solve_u
from fedsonmf.protocol.config import FedConfig

__all__ = ["LocalTrace", "alternating_steps", "diagnostics_of", "resolve_step"]


@dataclass
class LocalTrace:
    """What :func:`alternating_steps` returns.

    U, UtX : final basis (d_p, r) and U^T X_p (r, n);  V : final local V (r, n);
    XVt0, VVt0 : products at V^s from the first step;  steps : U-steps run.
    """

    U: np.ndarray
    UtX: np.ndarray
    V: np.ndarray
    XVt0: np.ndarray
    VVt0: np.ndarray
    steps: int


def alternating_steps(
    X,
    U: np.ndarray,
    V_start: np.ndarray,
    n_steps: int,
    cfg: FedConfig,
    v_update: Callable[[int, np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None,
    observe: Callable[[int, np.ndarray, np.ndarray], None] | None = None,
) -> LocalTrace:
    """``n_steps`` times: U <- Usolve(X, V, U, rho1); V <- v_update(k, U, U^T X, V).

    ``v_update=None`` keeps V = V^s fixed; then the loop stops as soon as a
    U-step returns its input unchanged (the solver is deterministic, so all
    further steps would return it too: the result is exactly that of
    ``n_steps`` steps).  ``observe(k, U, U^T X)`` is called after each U-step
    that was actually run (``steps`` in the result says how many).
    """
    V = V_start
    XVt0 = VVt0 = None
    UtX = None
    steps = 0
    for k in range(n_steps):
        if k == 0 or v_update is not None:
            XVt = x_vt(X, V)
            VVt = V @ V.T
        if k == 0:
            XVt0, VVt0 = XVt, VVt
        U_new, _ = solve_u(2.0 * XVt, 2.0 * VVt, U, cfg.rho1, cfg.ustep)
        steps += 1
        unchanged = v_update is None and np.array_equal(U_new, U)
        if UtX is None or not np.array_equal(U_new, U):
            UtX = ut_x(U_new, X)
        U = U_new
        if unchanged:
            break
        if observe is not None:
            observe(k, U, UtX)
        if v_update is not None:
            V = v_update(k, U, UtX, V)
    assert UtX is not None and XVt0 is not None and VVt0 is not None  # at least one step ran
    return LocalTrace(U, UtX, V, XVt0, VVt0, steps)


def grad_at(U: np.ndarray, UtX: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``grad_V f_p(U, V) = 2 U^T (U V - X_p) = 2 (V - U^T X_p)`` (U^T U = I for every
    U-step output) -- the same expression as the proposed method's local step."""
    return grad_v_orth(UtX, V)


def diagnostics_of(X, x_sqnorm: float, state_arrays: dict, V: np.ndarray, trace: LocalTrace, cfg: FedConfig) -> dict:
    """The standard diagnostics dict (same as the proposed method's) or {}."""
    if not cfg.diagnostics:
        return {}
    return client_diagnostics(x_sqnorm, state_arrays["U"], V, trace.U, trace.XVt0, trace.VVt0,
                              UtX0=state_arrays["UtX"])


def resolve_step(spec: str | float, cfg: FedConfig) -> float:
    """A server step given by name (from the config) or as a number.

    ``"eta_tilde"`` = eta_g tau alpha, ``"alpha"`` = alpha, ``"eta_g_alpha"`` =
    eta_g alpha; a positive float is used as is.
    """
    if isinstance(spec, str):
        table = {"eta_tilde": cfg.eta_tilde, "alpha": cfg.alpha, "eta_g_alpha": cfg.eta_g * cfg.alpha}
        try:
            return float(table[spec])
        except KeyError:
            raise ValueError(f"unknown step {spec!r}; choose one of {sorted(table)} or a positive number") from None
    step = float(spec)
    if not step > 0:
        raise ValueError(f"step must be > 0, got {spec!r}")
    return step
