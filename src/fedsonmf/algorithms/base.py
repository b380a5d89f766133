"""The interface every federated algorithm implements, and the shared setup.

An algorithm is a pair of pure steps over :class:`~fedsonmf.protocol.messages.Message`
objects and small states:

* client side: ``client_setup`` (initial basis, seeded) and ``client_round``;
* server side: ``server_setup`` (builds Vbar^1 from the setup replies),
  ``broadcast`` and ``server_round``.

Drivers (the in-process engine, the Flower apps) only move messages; they
never touch the mathematics.
"""

from __future__ import annotations

import numpy as np

from fedsonmf.core._linalg import ut_x
from fedsonmf.core.init import client_rng, init_basis, server_rng
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.core.server import aggregate
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import ClientState, Message, ServerState

__all__ = ["FederatedAlgorithm"]


class FederatedAlgorithm:
    """Base class: shared initialisation protocol and the round interface."""

    name = "base"
    #: keys of the uplink ``arrays`` this algorithm sends each round (for audits)
    uplink_keys: tuple[str, ...] = ()
    downlink_keys: tuple[str, ...] = ()
    #: incomplete views (§15.1) and partial participation (§15.2) are implemented
    supports_masks: bool = False
    supports_partial: bool = False

    def setup_uplink(self, cfg: FedConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(array keys, scalar keys)`` of a client's setup reply (declared for audits)."""
        if cfg.init_v == "projection":
            return ("Vproj",), ("d", "n")
        return (), ("d", "n", "x_sqnorm")

    # ------------------------------------------------------------------ client side
    def client_setup(self, X, x_sqnorm: float, msg: Message, cfg: FedConfig) -> tuple[ClientState, Message]:
        """Draw U_p^{1,0} from the client's own seeded stream; reply with what
        the server needs for Vbar^1 (ALGORITHM.md §6)."""
        d, n = X.shape
        rng = client_rng(int(msg.scalars["seed"]), int(msg.scalars["client"]))
        U = init_basis(X, cfg.n_components, cfg.init_u, rng)
        UtX = ut_x(U, X)
        state = ClientState(0, {"U": U, "UtX": UtX})
        scalars = {"d": d, "n": n}
        if cfg.init_v == "projection":
            return state, Message("setup", 0, {"Vproj": np.maximum(UtX, 0.0)}, scalars)
        return state, Message("setup", 0, {}, {**scalars, "x_sqnorm": float(x_sqnorm)})

    def client_round(self, X, x_sqnorm: float, state: ClientState, msg: Message, cfg: FedConfig):
        """One round on one client. Returns ``(new_state, reply)``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ server side
    def server_setup(self, replies: list[Message], cfg: FedConfig, seed: int) -> ServerState:
        """Vbar^1 from the setup replies (in client order), then round 1's state."""
        r, n = cfg.n_components, int(replies[0].scalars["n"])
        if cfg.init_v == "projection":
            Vbar1 = aggregate([rep.arrays["Vproj"] for rep in replies])
        else:
            # Uniform[0, 1] scaled so ||Vbar^1||_F^2 = mean_p ||X_p||_F^2 (V ~ U^T X)
            Vbar1 = server_rng(seed).uniform(size=(r, n))
            target = float(np.mean([rep.scalars["x_sqnorm"] for rep in replies]))
            Vbar1 *= np.sqrt(target) / max(np.linalg.norm(Vbar1), 1e-300)
        return self.server_init(Vbar1, cfg)

    def server_init(self, Vbar1: np.ndarray, cfg: FedConfig) -> ServerState:
        return ServerState(1, {"Vbar": Vbar1, "V": prox_l21_nonneg(Vbar1, cfg.eta_tilde * cfg.mu)})

    def broadcast(self, state: ServerState) -> Message:
        """The downlink message of round ``state.round``."""
        return Message("round", state.round, {"Vbar": state.arrays["Vbar"]})

    def current_v(self, state: ServerState) -> np.ndarray:
        """The post-proximal V^s of the state (nonnegative, row-sparse)."""
        return state.arrays["V"]

    def server_round(self, state: ServerState, replies: list[Message], cfg: FedConfig) -> ServerState:
        raise NotImplementedError

    def reply_columns(self, state: ServerState, clients):
        """Sample indices of each reply's blocks (None: complete data)."""
        return None
