"""Adapted FedMAvg: model averaging of post-proximal local copies (docs/algorithm.md §9.1).

Client p at round s, from the broadcast V^s::

    V~ <- V^s;  repeat tau_s times:  U <- Usolve(X_p, V~, U);  V~ <- P_{alpha mu}(V~ - alpha grad_V f_p(U, V~))
    upload V~ (post-proximal)

Server: V^{s+1} = (1/m) sum_p V~_p (plain average, not re-proximated: the
average of row-sparse matrices need not be row-sparse -- this is the
"interchange of averaging and the proximal map" the paper criticises).
Downlink V^{s+1}, uplink V~_p: one r x n matrix each way.

``schedule="constant"``: tau_s = tau.  ``schedule="decreasing"`` [R:WC22
ICASSP'21 principle, schedule C]: tau_s = max(1, ceil(tau / sqrt(s))).
"""

from __future__ import annotations

import math

from fedsonmf.algorithms._local import alternating_steps, diagnostics_of, grad_at
from fedsonmf.algorithms.base import FederatedAlgorithm
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import ClientState, Message, ServerState

__all__ = ["FedMAvg"]


class FedMAvg(FederatedAlgorithm):
    """Adapted FedMAvg.

    Parameters
    ----------
    schedule : {"constant", "decreasing"}
        Local steps per round: tau, or max(1, ceil(tau / sqrt(s))).
    name : str
        Registry name (what a remote driver rebuilds the algorithm from).
    """

    uplink_keys = ("V",)
    summed_uplink_keys = ("V",)
    downlink_keys = ("V",)

    def __init__(self, schedule: str = "constant", *, name: str | None = None):
        if schedule not in ("constant", "decreasing"):
            raise ValueError(f"schedule must be 'constant' or 'decreasing', got {schedule!r}")
        self.schedule = schedule
        self.name = name or ("fedmavg" if schedule == "constant" else "fedmavg_decreasing")

    def local_steps(self, tau: int, s: int) -> int:
        """tau_s of round s (s >= 1)."""
        if self.schedule == "constant":
            return tau
        return max(1, math.ceil(tau / math.sqrt(s)))

    def broadcast(self, state: ServerState) -> Message:
        return self.round_message(state, {"V": state.arrays["V"]})

    def client_round(self, X, x_sqnorm, state: ClientState, msg: Message, cfg: FedConfig, cols=None):
        V = msg.arrays["V"]
        alpha, t = cfg.alpha, cfg.alpha * cfg.mu_value

        def v_update(k, U, UtX, Vl):
            return prox_l21_nonneg(Vl - alpha * grad_at(U, UtX, Vl), t)

        tr = alternating_steps(X, state.arrays["U"], V, self.local_steps(cfg.tau, msg.round), cfg, v_update)
        diag = diagnostics_of(X, x_sqnorm, state.arrays, V, tr, cfg)
        new_state = ClientState(msg.round, {"U": tr.U, "UtX": tr.UtX})
        return new_state, Message("round", msg.round, {"V": tr.V}, {}, diag)

    def server_round(self, state: ServerState, replies: list[Message], cfg: FedConfig, agg=None, *,
                     clients=None, keep_g: bool = False, n_clients: int | None = None) -> ServerState:
        return state.next({"V": self.mean_of("V", replies, agg)})
