"""The proposed method: federated alternating minimisation with variable
splitting and drift correction (ALGORITHM.md §4–§6).

Downlink: Vbar^s (r x n, pre-proximal).  Uplink: Vhat_p^{s,tau} (r x n).
Each client recomputes V^s = P_{eta_tilde mu}(Vbar^s) and its correction C_p^s
itself; C_p^1 = 0 [C].  ``FedConfig.correction = False`` gives the
"no correction" ablation (C_p^s = 0 in every round).
"""

from __future__ import annotations

from fedsonmf.algorithms.base import FederatedAlgorithm
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.core.residuals import client_diagnostics
from fedsonmf.core.server import server_step
from fedsonmf.core.vstep import drift_correction, local_round
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import ClientState, Message, ServerState

__all__ = ["FedSONMFAlgorithm"]


class FedSONMFAlgorithm(FederatedAlgorithm):
    name = "fedsonmf"
    uplink_keys = ("Vhat",)
    downlink_keys = ("Vbar",)

    def client_round(self, X, x_sqnorm, state: ClientState, msg: Message, cfg: FedConfig):
        eta = cfg.eta_tilde
        Vbar = msg.arrays["Vbar"]
        V = prox_l21_nonneg(Vbar, eta * cfg.mu)
        st = state.arrays
        C = None
        if cfg.correction and "G_prev" in st:
            C = drift_correction(st["V_prev"], Vbar, eta, st["G_prev"])
        res = local_round(
            X, st["U"], V, C, alpha=cfg.alpha, mu=cfg.mu, tau=cfg.tau, rho1=cfg.rho1, ustep=cfg.ustep
        )
        diag = {}
        if cfg.diagnostics:
            diag = client_diagnostics(x_sqnorm, st["U"], st["UtX"], V, res.U, res.XVt0, res.VVt0)
        new_state = ClientState(msg.round, {"U": res.U, "UtX": res.UtX, "G_prev": res.G_avg, "V_prev": V})
        return new_state, Message("round", msg.round, {"Vhat": res.Vhat}, {}, diag)

    def server_round(self, state: ServerState, replies: list[Message], cfg: FedConfig) -> ServerState:
        Vbar, V = server_step(
            state.arrays["V"], [rep.arrays["Vhat"] for rep in replies], cfg.eta_g, cfg.eta_tilde, cfg.mu
        )
        return ServerState(state.round + 1, {"Vbar": Vbar, "V": V})
