"""The ablation variants of Fig. 4-5 (docs/algorithm.md §9.4).

| registry name        | local V copies | U-steps/round | correction | V step per round                       |
|----------------------|----------------|---------------|------------|----------------------------------------|
| ``server_update``    | none           | 1             | --         | server: P_{a mu}(V^s - a mean g), a = alpha |
| ``local_tau1``       | yes            | 1             | (irrelevant) | proposed with tau = 1 (eta~ = eta_g alpha) |
| ``no_correction``    | yes            | cfg.tau       | C_p^s = 0  | proposed (eta~ = eta_g tau alpha)       |
| ``fedsonmf``         | yes            | cfg.tau       | yes        | proposed                                 |

The variants that fix their own number of local steps (``server_update``,
``local_tau1``) ignore ``cfg.tau`` for the algorithm, so that one FedConfig
(tau = 10 in the study) serves all four variants and the residuals are
measured with the same step eta_tilde = eta_g tau alpha of the proposed
method (§9: "residuals use §7 with the proposed method's eta~").

``server_update_etag`` uses a_S = eta_g alpha: with tau = 1 it coincides with
``local_tau1``, ``no_correction`` and ``fedsonmf`` (§6 test 5).  The §9.4
default a_S = alpha makes the server-update variant a 1/eta_g-times smaller
step, which is why the two are listed separately.
"""

from __future__ import annotations

from fedsonmf.algorithms.fedmgs import FedMGS
from fedsonmf.algorithms.proposed import FedSONMFAlgorithm
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import ClientState, Message, ServerState

__all__ = ["ServerUpdateV", "LocalCopy"]


class ServerUpdateV(FedMGS):
    """"Server update of V": one U-step per round against V^s, upload
    grad_V f_p(U_p^{s+1}, V^s); the server takes one prox-gradient step.

    Parameters
    ----------
    server_step : {"alpha", "eta_g_alpha", "eta_tilde"} or float
        a_S; default alpha [C, §9.4].
    """

    def __init__(self, server_step: str | float = "alpha", *, name: str | None = None):
        names = {"alpha": "server_update", "eta_g_alpha": "server_update_etag"}
        default = names.get(server_step, "server_update_custom") if isinstance(server_step, str) \
            else "server_update_custom"
        super().__init__(gradient="last", server_step=server_step, local_steps=1, name=name or default)


class LocalCopy(FedSONMFAlgorithm):
    """The proposed splitting method with a fixed number of local steps and/or
    the drift correction switched off.

    Parameters
    ----------
    local_steps : int or None
        tau used by the algorithm (and its eta~ = eta_g tau alpha); None uses ``cfg.tau``.
    correction : bool
        Drift correction on/off (overrides ``cfg.correction``).
    """

    def __init__(self, local_steps: int | None = None, correction: bool = True, *, name: str | None = None):
        if local_steps is not None and (not isinstance(local_steps, int) or local_steps < 1):
            raise ValueError(f"local_steps must be None or an integer >= 1, got {local_steps!r}")
        self.local_steps = local_steps
        self.correction = bool(correction)
        if name is None:
            name = f"local_tau{local_steps}" if local_steps is not None else "local"
            if not correction:
                name += "_nocorr"
        self.name = name

    def inner_config(self, cfg: FedConfig) -> FedConfig:
        """The config the algorithm itself runs with (tau, correction overridden)."""
        tau = self.local_steps or cfg.tau
        if tau == cfg.tau and self.correction == cfg.correction:
            return cfg
        return cfg.replace(tau=tau, correction=self.correction)

    def server_init(self, Vbar1, cfg: FedConfig) -> ServerState:
        return super().server_init(Vbar1, self.inner_config(cfg))

    def client_round(self, X, x_sqnorm, state: ClientState, msg: Message, cfg: FedConfig, cols=None):
        return super().client_round(X, x_sqnorm, state, msg, self.inner_config(cfg), cols=cols)

    def server_round(self, state: ServerState, replies: list[Message], cfg: FedConfig, agg=None, *,
                     clients=None, keep_g: bool = False, n_clients: int | None = None) -> ServerState:
        return super().server_round(state, replies, self.inner_config(cfg), agg=agg, clients=clients,
                                    keep_g=keep_g, n_clients=n_clients)
