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
from fedsonmf.core.prox import shared_prox
from fedsonmf.core.residuals import DIAGNOSTIC_DEGREES
from fedsonmf.core.server import aggregate
from fedsonmf.protocol.config import FedConfig, resolve_mu
from fedsonmf.protocol.messages import Aggregate, ClientState, Message, ServerState

__all__ = ["FederatedAlgorithm"]


class FederatedAlgorithm:
    """Base class: shared initialisation protocol and the round interface."""

    name = "base"
    #: keys of the uplink ``arrays`` this algorithm sends each round (for audits)
    uplink_keys: tuple[str, ...] = ()
    downlink_keys: tuple[str, ...] = ()
    #: the server's V is a proximal output (P_t(.) >= 0), so a saved V with a negative entry is damaged
    server_v_nonnegative: bool = False
    #: incomplete views (§15.1) and partial participation (§15.2) are implemented
    supports_masks: bool = False
    supports_partial: bool = False
    #: the uplink ``arrays`` the server only ever averages (secure aggregation may mask them);
    #: every algorithm here averages its whole uplink
    summed_uplink_keys: tuple[str, ...] = ()
    #: homogeneity degree of each summed uplink array in the data scale (1: like V)
    summed_degree: int = 1

    def summed_items(self, cfg: FedConfig, kind: str, **options) -> dict[str, tuple[str, int]]:
        """The reply items of an exchange ``kind`` ("setup" / "round") the server only sums.

        ``{key: (field, degree)}`` with ``field`` the Message field holding it
        ("arrays", "scalars" or "diagnostics") and ``degree`` how it scales with
        the data (X -> cX gives item -> c^degree item), which the fixed-point
        encoding of secure aggregation uses to bound it.  The server reads these
        items only from the :class:`~fedsonmf.protocol.messages.Aggregate`.
        ``options``: run features that add items (``kept_sum``: the proposed method's
        server-kept correction from sums, :class:`~fedsonmf.algorithms.FedSONMFAlgorithm`).
        """
        if kind == "setup":
            return {"Vproj": ("arrays", 1)} if cfg.init_v == "projection" else {"x_sqnorm": ("scalars", 2)}
        items = {k: ("arrays", self.summed_degree) for k in self.summed_uplink_keys}
        if cfg.diagnostics:
            items.update({k: ("diagnostics", d) for k, d in DIAGNOSTIC_DEGREES.items()})
        return items

    @staticmethod
    def mean_of(key: str, replies: list[Message], agg: Aggregate | None) -> np.ndarray:
        """Mean over the clients of uplink array ``key``: from the aggregate when it holds it,
        else from the replies (in client order; bit-identical to the aggregate's S / m)."""
        if agg is not None and key in agg.sums:
            return np.asarray(agg.sums[key] / agg.count)
        return aggregate([rep.arrays[key] for rep in replies])
    #: differential privacy (fedsonmf.protocol.privacy) is implemented: ``dp_references`` names every
    #: uplink array and the public point it is clipped around
    supports_dp: bool = False
    #: arrays / scalars a reply may carry in the clear under DP (public facts, e.g. the view's shape)
    dp_clear_arrays: tuple[str, ...] = ()
    dp_clear_scalars: tuple[str, ...] = ("d", "n")

    def setup_uplink(self, cfg: FedConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(array keys, scalar keys)`` of a client's setup reply (declared for audits)."""
        if cfg.init_v == "projection":
            return ("Vproj",), ("d", "n")
        return (), ("d", "n", "x_sqnorm")

    # ------------------------------------------------------------------ client side
    def client_setup(self, X, x_sqnorm: float, msg: Message, cfg: FedConfig, cols=None,
                     n: int | None = None) -> tuple[ClientState, Message]:
        """Draw U_p^{1,0} from the client's own seeded stream; reply with what
        the server needs for Vbar^1 (docs/algorithm.md §6).

        ``cols`` (sorted sample indices) and ``n`` describe an incomplete view
        (§15.1): ``X`` then holds only those columns.  Only algorithms with
        :attr:`supports_masks` accept them.
        """
        _no_masks(self, cols)
        d, n = X.shape
        rng = client_rng(int(msg.scalars["seed"]), int(msg.scalars["client"]))
        U = init_basis(X, cfg.n_components, cfg.init_u, rng)
        UtX = ut_x(U, X)
        state = ClientState(0, {"U": U, "UtX": UtX})
        scalars = {"d": d, "n": n}
        if cfg.init_v == "projection":
            return state, Message("setup", 0, {"Vproj": np.maximum(UtX, 0.0)}, scalars)
        return state, Message("setup", 0, {}, {**scalars, "x_sqnorm": float(x_sqnorm)})

    def client_round(self, X, x_sqnorm: float, state: ClientState, msg: Message, cfg: FedConfig,
                     cols=None) -> tuple[ClientState, Message]:
        """One round on one client. Returns ``(new_state, reply)``.

        ``cols``: the held samples of an incomplete view (:attr:`supports_masks`).
        """
        raise NotImplementedError

    def dp_references(self, msg: Message, cfg: FedConfig, cols=None) -> dict:
        """Under DP: ``{uplink array key: public point it is clipped around (None = zero)}``
        for the reply to ``msg``.  The setup upload V_proj has no public counterpart."""
        if msg.kind == "setup":
            return {"Vproj": None}
        raise NotImplementedError(f"{self.name} does not implement differential privacy")

    def dp_released(self, state: ClientState, sent: Message, released: Message, cfg: FedConfig) -> ClientState:
        """Under DP: the client's state once its reply ``sent`` has left as ``released`` (clipped and
        noised around :meth:`dp_references`).  What the algorithm keeps about its own upload (e.g.
        a drift correction's memory of its gradient) must describe what the server received, not
        what was computed.  Default: the state unchanged."""
        return state

    # ------------------------------------------------------------------ server side
    def server_setup(self, replies: list[Message], cfg: FedConfig, seed: int,
                     agg: Aggregate | None = None) -> ServerState:
        """Vbar^1 from the setup replies (in client order), then round 1's state.

        ``agg`` holds the sums of :meth:`summed_items` (``Vproj`` or ``x_sqnorm``);
        None: they are read from the replies.
        ``mu="auto"`` is resolved here from Vbar^1 (:func:`~fedsonmf.protocol.config.resolve_mu`);
        the state keeps the number as the 0-d array ``"mu"``.
        """
        r, n = cfg.n_components, int(replies[0].scalars["n"])
        if cfg.init_v == "projection":
            Vbar1 = self.mean_of("Vproj", replies, agg)
        else:
            # Uniform[0, 1] scaled so ||Vbar^1||_F^2 = mean_p ||X_p||_F^2 (V ~ U^T X)
            Vbar1 = server_rng(seed).uniform(size=(r, n))
            if agg is not None and "x_sqnorm" in agg.sums:
                target = float(agg.sums["x_sqnorm"]) / agg.count
            else:
                target = float(np.mean([float(rep.scalars["x_sqnorm"]) for rep in replies]))
            Vbar1 *= np.sqrt(target) / max(np.linalg.norm(Vbar1), 1e-300)
        return self.state_from_vbar1(Vbar1, cfg)

    def state_from_vbar1(self, Vbar1: np.ndarray, cfg: FedConfig) -> ServerState:
        """Round 1's state from Vbar^1; resolves ``mu="auto"`` into :attr:`ServerState.mu`."""
        if cfg.mu_is_auto:
            cfg = cfg.resolved(resolve_mu(cfg.mu_scale, cfg.eta_tilde, Vbar1))
        state = self.server_init(Vbar1, cfg)
        state.mu = cfg.mu_value  # the number in force: broadcast every round, kept in checkpoints
        return state

    def server_init(self, Vbar1: np.ndarray, cfg: FedConfig) -> ServerState:
        """Round 1's state; V-bar^1 and V^1 read-only, as every later state's (``core.server``)."""
        Vbar1 = np.asarray(Vbar1)
        Vbar1.flags.writeable = False
        return ServerState(1, {"Vbar": Vbar1, "V": shared_prox(Vbar1, cfg.eta_tilde * cfg.mu_value)})

    def broadcast(self, state: ServerState) -> Message:
        """The downlink message of round ``state.round``."""
        return self.round_message(state, {"Vbar": state.arrays["Vbar"]})

    @staticmethod
    def round_message(state: ServerState, arrays: dict[str, np.ndarray]) -> Message:
        """A round message with ``arrays`` and the l2,1 weight in force (scalar ``mu``)."""
        if state.mu is None:
            raise ValueError("the server state holds no mu (built without state_from_vbar1?)")
        return Message("round", state.round, arrays, {"mu": float(state.mu)})

    def current_v(self, state: ServerState) -> np.ndarray:
        """The post-proximal V^s of the state (nonnegative, row-sparse)."""
        return state.arrays["V"]

    def server_round(self, state: ServerState, replies: list[Message], cfg: FedConfig,
                     agg: Aggregate | None = None, *, clients=None, keep_g: bool = False,
                     n_clients: int | None = None) -> ServerState:
        """The server step from the round's replies; the items of :meth:`summed_items`
        are read from ``agg`` when given (their sums), else from the replies.

        Partial participation (§15.2, :attr:`supports_partial`) adds: ``clients``, the
        indices of the replies when not every client answered (None: all did);
        ``keep_g`` with ``n_clients``, the server keeps every client's last correction
        (rejoin rule "server").  The loop passes them only to algorithms that support
        partial rounds.
        """
        raise NotImplementedError

    def reply_columns(self, state: ServerState, clients) -> list | None:
        """Sample indices of each reply's blocks (None: complete data)."""
        return None

    def rejoin_message(self, state: ServerState, base: Message, rule: str, has_rounds: bool) -> Message:
        """The round message for a client that missed the previous round (§15.2).

        ``base`` is the round's ordinary message, ``rule`` the participation's rejoin
        rule, ``has_rounds`` whether the client took part in any round before.
        Only algorithms with :attr:`supports_partial` implement it.
        """
        raise NotImplementedError(f"{self.name} does not support partial participation")


def _no_masks(alg: FederatedAlgorithm, cols) -> None:
    if cols is not None and not alg.supports_masks:
        from fedsonmf.exceptions import ParameterError

        raise ParameterError(f"algorithm {alg.name!r} does not support incomplete views (masks)")
