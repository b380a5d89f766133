"""Adapted FedMGS: gradient sharing, prox at the server (docs/algorithm.md §9.2).

Client p at round s, from the broadcast V^s::

    repeat tau times:  U <- Usolve(X_p, V^s, U)          (V stays at V^s)
    upload g_p = grad_V f_p(U, V^s)                       (gradient="last")
       or  the mean of grad_V f_p(U^{k+1}, V^s) over the tau U-steps  (gradient="average")

Server: V^{s+1} = P_{eta_S mu}(V^s - eta_S (1/m) sum_p g_p), eta_S = eta_tilde by
default [C] (the proposed method's per-round step).  Downlink V^{s+1}, uplink
g_p: one r x n matrix each way.

The tau U-steps against a fixed V stop early once U no longer changes (the
U-solver is deterministic, so the result is the same as running all tau).
"""

from __future__ import annotations

from fedsonmf.algorithms._local import (
    alternating_steps,
    diagnostics_of,
    grad_at,
    resolve_step,
)
from fedsonmf.algorithms.base import FederatedAlgorithm
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import ClientState, Message, ServerState

__all__ = ["FedMGS"]


class FedMGS(FederatedAlgorithm):
    """Adapted FedMGS.

    Parameters
    ----------
    gradient : {"last", "average"}
        Upload the gradient at the last U, or the mean over the U-steps.
    server_step : {"eta_tilde", "alpha", "eta_g_alpha"} or float
        eta_S (a name is resolved from the run's FedConfig).
    local_steps : int or None
        U-steps per round; None uses ``cfg.tau``.
    name : str
        Registry name.
    """

    uplink_keys = ("grad",)
    summed_uplink_keys = ("grad",)
    downlink_keys = ("V",)
    server_v_nonnegative = True  # V = P(V - eta G)

    def __init__(
        self,
        gradient: str = "last",
        server_step: str | float = "eta_tilde",
        local_steps: int | None = None,
        *,
        name: str | None = None,
    ):
        if gradient not in ("last", "average"):
            raise ValueError(f"gradient must be 'last' or 'average', got {gradient!r}")
        if local_steps is not None and (not isinstance(local_steps, int) or local_steps < 1):
            raise ValueError(f"local_steps must be None or an integer >= 1, got {local_steps!r}")
        self.gradient = gradient
        self.server_step = server_step
        self.local_steps = local_steps
        self.name = name or ("fedmgs" if gradient == "last" else "fedmgs_avg")

    def broadcast(self, state: ServerState) -> Message:
        return self.round_message(state, {"V": state.arrays["V"]})

    def client_round(self, X, x_sqnorm, state: ClientState, msg: Message, cfg: FedConfig, cols=None):
        V = msg.arrays["V"]
        tau = self.local_steps or cfg.tau
        grads = []
        observe = None
        if self.gradient == "average":
            def observe(k, U, UtX):
                grads.append(grad_at(U, UtX, V))

        tr = alternating_steps(X, state.arrays["U"], V, tau, cfg, observe=observe)
        if grads:
            # steps skipped after U stopped changing would repeat the last gradient
            g = (sum(grads) + (tau - len(grads)) * grads[-1]) / tau
        else:
            g = grad_at(tr.U, tr.UtX, V)
        diag = diagnostics_of(X, x_sqnorm, state.arrays, V, tr, cfg)
        new_state = ClientState(msg.round, {"U": tr.U, "UtX": tr.UtX})
        return new_state, Message("round", msg.round, {"grad": g}, {}, diag)

    def server_round(self, state: ServerState, replies: list[Message], cfg: FedConfig, agg=None, *,
                     clients=None, keep_g: bool = False, n_clients: int | None = None) -> ServerState:
        eta = resolve_step(self.server_step, cfg)
        V = state.arrays["V"]
        G = self.mean_of("grad", replies, agg)
        return state.next({"V": prox_l21_nonneg(V - eta * G, eta * cfg.mu_value)})
