"""Adapted FedVRA-U: primal-dual (ADMM-like) federated method (docs/algorithm.md §9.3).

Client p keeps U_p and a dual variable Lambda_p (r x n, zero at start).  Round s,
from the broadcast V^s::

    V~ <- V^s;  repeat tau times:
        U  <- Usolve(X_p, V~, U)
        V~ <- V~ - alpha (grad_V f_p(U, V~) + Lambda_p + rho (V~ - V^s))   # local augmented Lagrangian
    Lambda_p <- Lambda_p + a rho (V~ - V^s)                              # a in (0, 1]; a = 1: federated ADMM
    upload W_p = V~ + Lambda_p / rho

Server: V^+ = P_{mu/rho}((1/m) sum_p W_p) -- the exact minimiser over V >= 0 of
mu ||V||_{2,1} + (1/m) sum_p [<Lambda_p, V~_p - V> + rho/2 ||V~_p - V||^2] -- and
V^{s+1} = (1 - theta) V^s + theta V^+ (theta = ``relaxation``; FedVRA's
aggregation step, whose exact form we could not retrieve; theta = 1 by default).
A convex combination of nonnegative matrices stays nonnegative.

Defaults [C]: rho = 1 / eta_tilde, a = 1, theta = 1.
"""

from __future__ import annotations

import numpy as np

from fedsonmf.algorithms._local import alternating_steps, diagnostics_of, grad_at
from fedsonmf.algorithms.base import FederatedAlgorithm
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import ClientState, Message, ServerState

__all__ = ["FedVRA"]


class FedVRA(FederatedAlgorithm):
    """Adapted FedVRA-U.

    Parameters
    ----------
    rho_scale : float > 0
        rho = rho_scale / eta_tilde.
    dual_step : float in (0, 1]
        a, the dual step (adaptive dual step size of FedVRA; 1 gives ADMM).
    relaxation : float in (0, 1]
        theta, the server's aggregation step.
    name : str
        Registry name.
    """

    uplink_keys = ("W",)
    summed_uplink_keys = ("W",)
    downlink_keys = ("V",)
    server_v_nonnegative = True  # V = (1 - theta) V + theta P(mean W), theta in (0, 1]

    def __init__(self, rho_scale: float = 1.0, dual_step: float = 1.0, relaxation: float = 1.0, *,
                 name: str = "fedvra"):
        if not rho_scale > 0:
            raise ValueError(f"rho_scale must be > 0, got {rho_scale!r}")
        if not 0 < dual_step <= 1:
            raise ValueError(f"dual_step must be in (0, 1], got {dual_step!r}")
        if not 0 < relaxation <= 1:
            raise ValueError(f"relaxation must be in (0, 1], got {relaxation!r}")
        self.rho_scale = rho_scale
        self.dual_step = dual_step
        self.relaxation = relaxation
        self.name = name

    def rho(self, cfg: FedConfig) -> float:
        return self.rho_scale / cfg.eta_tilde

    def broadcast(self, state: ServerState) -> Message:
        return self.round_message(state, {"V": state.arrays["V"]})

    def client_round(self, X, x_sqnorm, state: ClientState, msg: Message, cfg: FedConfig, cols=None):
        V = msg.arrays["V"]
        rho, alpha = self.rho(cfg), cfg.alpha
        Lam = state.arrays.get("Lambda")
        if Lam is None:
            Lam = np.zeros_like(V)

        def v_update(k, U, UtX, Vl):
            return Vl - alpha * (grad_at(U, UtX, Vl) + Lam + rho * (Vl - V))

        tr = alternating_steps(X, state.arrays["U"], V, cfg.tau, cfg, v_update)
        Lam_new = Lam + self.dual_step * rho * (tr.V - V)
        diag = diagnostics_of(X, x_sqnorm, state.arrays, V, tr, cfg)
        new_state = ClientState(msg.round, {"U": tr.U, "UtX": tr.UtX, "Lambda": Lam_new})
        return new_state, Message("round", msg.round, {"W": tr.V + Lam_new / rho}, {}, diag)

    def server_round(self, state: ServerState, replies: list[Message], cfg: FedConfig, agg=None, *,
                     clients=None, keep_g: bool = False, n_clients: int | None = None) -> ServerState:
        rho = self.rho(cfg)
        V_plus = prox_l21_nonneg(self.mean_of("W", replies, agg), cfg.mu_value / rho)
        V = state.arrays["V"]
        theta = self.relaxation
        V_next = V_plus if theta == 1.0 else (1.0 - theta) * V + theta * V_plus
        return state.next({"V": V_next})
