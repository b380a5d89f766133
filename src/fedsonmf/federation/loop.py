"""The server's round loop and the client's message handler, shared by every driver.

A driver supplies a *transport* -- an object with ``n_clients`` and
``exchange(messages) -> replies`` (one message per client, replies in client
order).  The in-process engine calls :class:`ClientRuntime` objects directly;
the Flower apps carry the same messages over the network to the same
``ClientRuntime`` code.

The server reads the reply items an algorithm declares as only summed
(``FederatedAlgorithm.summed_items``: its uploads, the diagnostics, the
V-bar^1 projection) from an :class:`~fedsonmf.protocol.messages.Aggregate`:
summed here from plain replies, or -- with ``FedConfig.secure_aggregation`` --
decoded from pairwise-masked uploads (:mod:`fedsonmf.federation.secagg`), of
which no single one reveals anything.  Both engines run the same code.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, Protocol, cast, runtime_checkable

import numpy as np

from fedsonmf._validation import check_seed
from fedsonmf.algorithms import FederatedAlgorithm, get_algorithm
from fedsonmf.core._linalg import sqnorm
from fedsonmf.core.dp import gaussian_release
from fedsonmf.core.masks import column_counts, held_columns, scatter_columns
from fedsonmf.core.prox import l21_norm
from fedsonmf.core.residuals import (
    DIAGNOSTIC_ARRAYS,
    RESIDUALS_KEY,
    effective_rank,
    round_metrics_from_sums,
    step_residual,
)
from fedsonmf.core.server import total
from fedsonmf.exceptions import (
    DivergenceWarning,
    FederationError,
    ParameterError,
    ProtocolError,
    warn,
)
from fedsonmf.federation import secagg
from fedsonmf.federation.budget import resolve_budget
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import FitResult, History
from fedsonmf.protocol.messages import Aggregate, ClientState, Message, ServerState
from fedsonmf.protocol.participation import Participation

__all__ = ["ClientRuntime", "Transport", "run_federation", "DivergenceWarning", "ProtocolError",
           "DivergenceMonitor", "plain_aggregate", "exchange_sum", "RESIDUALS_KEY", "without_residuals"]


def _algorithm(name) -> FederatedAlgorithm:
    """``get_algorithm`` with the project's error: an unknown name is a ParameterError."""
    try:
        return get_algorithm(name)
    except ValueError as exc:
        raise ParameterError(f"algorithm: {exc}") from None


@runtime_checkable
class Transport(Protocol):
    """What the loop needs of a driver: send one message to every client, get the replies.

    ``exchange(messages)`` sends ``messages[p]`` to client ``p`` and returns the
    replies in client order; a lost client raises
    :class:`~fedsonmf.exceptions.FederationError`.
    """

    n_clients: int

    def exchange(self, messages: Sequence[Message]) -> list[Message]: ...


@runtime_checkable
class PartialTransport(Transport, Protocol):
    """A transport that can run partial rounds (§15.2): ask some clients, keep who answered.

    ``exchange_some({p: message})`` returns ``{p: reply}`` for the clients that
    answered in time; missing clients are simply absent (the loop checks the quorum).
    """

    def exchange_some(self, messages: Mapping[int, Message]) -> dict[int, Message]: ...


class ClientRuntime:
    """Everything a client does: holds its view and private state, answers messages.

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (d_p, n)
        The client's view (features x samples).  Never leaves this object.
    algorithm : str or FederatedAlgorithm
    cfg : FedConfig
    state : ClientState, optional
        A saved state to resume from.
    mask : bool array of length n, int array of sample ids, or None
        The samples this client holds (§15.1); None or all-True: every sample
        (the complete-data code path).  Only the held columns of ``X`` are
        used (a missing sample's column may hold anything, e.g. zeros).
    x_sqnorm : float, optional
        ``||X_p||_F^2`` of the held columns when already known (saves one pass over X_p).
    upload_hook : callable(reply, msg, runtime) -> reply, optional
        Transforms every reply before it leaves the client (and before secure
        aggregation masks it): see :meth:`finalise_upload`.
    dp_seed : int or sequence of int, optional
        Seed of this client's differential-privacy noise (``cfg.dp_enabled``).  It
        must be the client's secret: a server that knew it could subtract the
        noise.  None (a deployment node) draws 128 bits from OS entropy at setup;
        the in-process simulation passes one derived from ``random_state``
        (reproducible runs).  Kept in the client state (resume), never sent.
    signer : fedsonmf.federation.secagg.KeySigner, optional
        Secure aggregation's authenticated key agreement: this client's signing key and every
        client's pinned public signing key.  Given, the client signs its key and refuses any
        relayed key not signed by its slot's pinned key, and any round-1 message whose key-list
        echoes show that the server relayed different keys to different clients.  None: the
        relayed keys are trusted (a server that swaps them could unmask every upload).
    """

    upload_hook: Callable[[Message, Message, ClientRuntime], Message] | None = None

    def __init__(self, X, algorithm, cfg: FedConfig, state: ClientState | None = None, mask=None,
                 x_sqnorm: float | None = None, upload_hook=None, dp_seed=None, signer=None):
        self.n = X.shape[1]
        self.cols = held_columns(mask, self.n)
        self.algorithm = _algorithm(algorithm)
        if self.cols is not None:
            if not self.algorithm.supports_masks:
                raise ParameterError(f"algorithm {self.algorithm.name!r} does not support incomplete views (masks)")
            X = X[:, self.cols]
        self.X = X
        # ||X_p||^2 of the held columns; a driver that knows it (the Flower node caches it) passes it
        self.x_sqnorm = sqnorm(X) if x_sqnorm is None else float(x_sqnorm)
        self.cfg = cfg
        self.state = state
        if upload_hook is not None:
            self.upload_hook = upload_hook
        self.dp_seed = dp_seed
        self.signer = signer
        if cfg.dp_enabled and not self.algorithm.supports_dp:
            raise ParameterError(f"algorithm {self.algorithm.name!r} does not implement differential privacy")

    def finalise_upload(self, reply: Message, msg: Message) -> Message:
        """The reply as it leaves this client, before any masking.

        The one place for client-side transforms of the uploads (e.g. differential
        privacy: clip and add noise to the items of ``algorithm.summed_items``):
        ``upload_hook(reply, msg, self)`` when set, else the reply unchanged.
        Secure aggregation masks exactly what this returns.
        """
        return reply if self.upload_hook is None else self.upload_hook(reply, msg, self)

    def _kw(self, setup: bool = False) -> dict:
        if self.cols is None:
            return {}
        return {"cols": self.cols, "n": self.n} if setup else {"cols": self.cols}

    def handle(self, msg: Message) -> Message:
        secure = self.cfg.secure_aggregation
        if msg.kind == "setup":
            self.state, reply = self.algorithm.client_setup(self.X, self.x_sqnorm, msg, self.cfg, **self._kw(True))
            if self.cfg.dp_enabled:  # clip + noise first: the masking (if any) sits after it
                self.state.arrays["dp_seed"] = _dp_seed_words(self.dp_seed)
                reply = self._privatise(msg, reply, self.cfg)
            reply = self.finalise_upload(reply, msg)
            if secure:  # key advertisement; the summed setup items wait for the init exchange
                self.state, reply = secagg.client_setup(
                    self.state, reply, self.algorithm.summed_items(self.cfg, "setup"), me=int(msg.scalars["client"]),
                    seed=int(msg.scalars["seed"]), x_sqnorm=self.x_sqnorm, cols=self.cols, n=self.n,
                    signer=self.signer)
            return reply
        if msg.kind in ("init", "unmask"):
            if not secure:
                raise ProtocolError(f"{msg.kind} message but this client runs without secure aggregation")
            if self.state is None:
                raise ProtocolError(f"{msg.kind} message before setup")
            if msg.kind == "init":
                self.state, reply = secagg.client_init(self.state, msg, signer=self.signer)
            else:
                self.state, reply = secagg.client_unmask(self.state, msg)
            return reply
        if msg.kind != "round":
            raise ProtocolError(f"unknown message kind {msg.kind!r}")
        if self.state is None:
            raise ProtocolError(f"round {msg.round} message before setup")
        # a client returning after missed rounds (§15.2) is told so by the server
        gap_ok = bool(msg.scalars.get("rejoin")) and msg.round > self.state.round
        if msg.round != self.state.round + 1 and not gap_ok:
            # a stale or replayed state would silently corrupt the run: refuse it
            raise ProtocolError(
                f"round {msg.round} message but the client state has completed round {self.state.round}"
            )
        cfg = self.cfg
        # every round message carries the l2,1 weight in force: the number the server resolved
        # from V-bar^1 when the config says mu="auto" (§11 [C]), else the config's own
        if "mu" in msg.scalars:
            mu = float(msg.scalars["mu"])
            if not cfg.mu_is_auto and mu != cfg.mu_value:
                raise ProtocolError(f"round {msg.round} message says mu={mu!r} but this client's config has "
                                    f"mu={cfg.mu_value!r}")
            cfg = cfg.resolved(mu)
        elif cfg.mu_is_auto:
            raise ProtocolError(f"round {msg.round} message carries no 'mu' but the config says mu='auto'")
        dp_seed = self.state.arrays.get("dp_seed")
        if cfg.dp_enabled and dp_seed is None:
            raise ProtocolError("differential privacy: the client state holds no noise seed (set up without DP?)")
        if secure:  # a threshold round completed without this client's unmask answer counted its upload
            self.state = secagg.commit_counted(self.state, msg)
        old = self.state
        self.state, reply = self.algorithm.client_round(self.X, self.x_sqnorm, self.state, msg, cfg, **self._kw())
        residuals = msg.scalars.get(RESIDUALS_KEY, True) is not False
        if not residuals:  # the server stops on nothing they give: the diagnostic arrays stay here
            reply = dataclasses.replace(reply, diagnostics={k: v for k, v in reply.diagnostics.items()
                                                            if k not in DIAGNOSTIC_ARRAYS})
        if secure:
            self.state = secagg.keep_protocol_state(old, self.state)
        if cfg.dp_enabled:
            assert dp_seed is not None  # checked above
            self.state.arrays["dp_seed"] = dp_seed
            reply = self._privatise(msg, reply, cfg)
        reply = self.finalise_upload(reply, msg)
        if secure:
            spec = self.algorithm.summed_items(cfg, "round", kept_sum=bool(msg.scalars.get("kept_sum")))
            if not residuals:
                spec = without_residuals(spec)
            self.state, reply = secagg.client_mask(self.state, reply, msg, spec, cols=self.cols, n=self.n,
                                                   signer=self.signer, threshold_cfg=self.cfg.secagg_threshold)
        return reply

    def _privatise(self, msg: Message, reply: Message, cfg: FedConfig) -> Message:
        """The DP hook: the reply as it leaves the node (before any transport or masking).

        Every uplink array is clipped around its public reference and noised
        (:func:`fedsonmf.core.dp.gaussian_release`); the noise stream is the
        client's own, one per (round, array).  Fails closed: a reply carrying
        diagnostics, or an array or scalar the algorithm does not declare, is an error.
        """
        alg = self.algorithm
        refs = alg.dp_references(msg, cfg, **({} if self.cols is None else {"cols": self.cols}))
        if reply.diagnostics:
            raise ProtocolError("differential privacy: a reply carries diagnostics, which the noise does not cover")
        extra = sorted(set(reply.arrays) - set(refs) - set(alg.dp_clear_arrays))
        extra += sorted(set(reply.scalars) - set(alg.dp_clear_scalars))
        if extra:
            raise ProtocolError(f"differential privacy: {alg.name} reply items {extra} are not covered by the noise")
        assert self.state is not None and cfg.dp_sigma is not None  # set up, with DP on
        seed = self.state.arrays["dp_seed"]
        clip = cfg.dp_clip_setup if msg.kind == "setup" else cfg.dp_clip
        std = cfg.dp_sigma * 2.0 * clip  # multiplier x L2 sensitivity (2 clip) of replacing the view
        arrays = dict(reply.arrays)
        for i, key in enumerate(sorted(refs)):
            if key in arrays:
                rng = np.random.default_rng([int(w) for w in seed] + [int(msg.round), i])
                arrays[key], _ = gaussian_release(arrays[key], refs[key], clip, std, rng)
        released = dataclasses.replace(reply, arrays=arrays)
        # the algorithm's memory of its own upload follows what was released (its drift correction)
        self.state = alg.dp_released(self.state, reply, released, cfg)
        return released


def without_residuals(spec: dict) -> dict:
    """A summed-items spec without the diagnostic arrays (what a round sums when R/R1 is not used)."""
    return {k: v for k, v in spec.items() if not (v[0] == "diagnostics" and k in DIAGNOSTIC_ARRAYS)}


def _dp_seed_words(seed) -> np.ndarray:
    """The client's noise seed as uint64 words: ``seed`` given, else 128 bits of OS entropy."""
    if seed is None:
        words = [secrets.randbits(32) for _ in range(4)]
    else:
        words = [int(w) for w in np.atleast_1d(np.asarray(seed, dtype=np.int64))]
        if any(w < 0 for w in words):
            raise ParameterError(f"dp_seed must hold non-negative integers, got {seed!r}")
    return np.asarray(words, dtype=np.uint64)


def step_hint(alg: FederatedAlgorithm, cfg: FedConfig) -> str:
    """The parameters that most likely make a run of ``alg`` diverge, with their values."""
    base = (f"alpha={cfg.alpha:g}, tau={cfg.tau}, eta_g={cfg.eta_g:g} "
            f"(server step eta_tilde = eta_g*tau*alpha = {cfg.eta_tilde:g})")
    spec = getattr(alg, "server_step", None)
    if spec is not None:
        try:
            from fedsonmf.algorithms._local import resolve_step

            value = f" = {resolve_step(spec, cfg):g}"
        except Exception:  # pragma: no cover - an unusual custom step
            value = ""
        return (f"its server step eta_S ({spec!r}{value}; set by server_step / alpha, tau, eta_g) "
                f"and the local step alpha={cfg.alpha:g} (tau={cfg.tau}, eta_g={cfg.eta_g:g})")
    return base


class DivergenceMonitor:
    """Watch a run for divergence.

    With diagnostics the signal is the objective F^s against F^1, without
    them the norm ||V^s||_F against ||V^1||_F (F scales like ||V||^2, U being
    orthonormal).  The reference is floored at a small fraction of
    ||V^1||_F^2 (resp. ||V^1||_F), so a run that starts at an almost exact
    fit is not flagged for a rounding-level increase.

    * ``warn``: F^s > 2 F^1 (without diagnostics ||V^s||^2 > 10 ||V^1||^2):
      one :class:`DivergenceWarning`, the run continues;
    * ``stop``: F^s > 1e3 F^1 (||V^s||^2 > 1e6 ||V^1||^2), or a non-finite V or
      objective: :class:`DivergenceWarning` and the run stops (with the last
      finite V when V became non-finite); ``result.extra["diverged"]`` is True.

    Measured (synthetic 10 x 20 x 100, r = 6, V^1 = the V round 1 starts
    from): normal runs of every algorithm never exceed F^1 after round 1 and
    reach at most 2.0 ||V^1||^2; FedMGS at alpha = 0.09 / 0.2 reaches 2.9 / 14 F^1
    and 23 / 310 ||V^1||^2, the proposed method at alpha = 0.5, tau = 30,
    eta_g = 3 reaches 2.3-3.6 F^1 but only 2.5 ||V^1||^2.  The norm of V is the
    weaker signal (FedMGS at alpha = 1: F x94, ||V||^2 x2.3): without
    diagnostics the mild cases go unnoticed; exploding or non-finite V is caught.

    It sees only rounds whose uploads were within their public bounds: a round with an upload
    out of bounds (a dishonest or broken client, :func:`check_plain_bounds`,
    :func:`fedsonmf.federation.secagg.check_sum_bound`) fails before it, so its reason blames
    the steps only when the uploads were in bounds.
    """

    warn_factor = 2.0
    stop_factor = 1e3
    v_warn_factor = 10.0
    v_stop_factor = 1e6
    floor = 1e-2

    def __init__(self, alg: FederatedAlgorithm, cfg: FedConfig):
        self.alg, self.cfg = alg, cfg
        self.F1: float | None = None
        self.N1: float | None = None
        self.warned = False

    def _ref(self, F1: float, N1: float) -> float:
        return max(F1, self.floor * N1 * N1)

    def check(self, s: int, V: np.ndarray, objective: float | None, V_start: np.ndarray | None = None) -> str | None:
        """None to continue, or the reason to stop.  Warns as a side effect.

        ``V`` is the server's V after round ``s``, ``objective`` F^s (at the
        round's start, None without diagnostics), ``V_start`` the V the round
        started from (the reference ||V^1|| is taken from the first round's).
        """
        if self.N1 is None and V_start is not None and np.all(np.isfinite(V_start)):
            n1 = float(np.sqrt(sqnorm(V_start)))
            if n1 > 0:
                self.N1, self.F1 = n1, objective
        vnorm = float(np.sqrt(sqnorm(V))) if np.all(np.isfinite(V)) else float("nan")
        hint = step_hint(self.alg, self.cfg)
        if not np.isfinite(vnorm) or (objective is not None and not np.isfinite(objective)):
            what = "V" if not np.isfinite(vnorm) else "the objective"
            reason = (f"diverged at round {s}: {what} is no longer finite (NaN/Inf) with every upload within its "
                      f"public bound; the steps are too large for this data -- reduce {hint}")
            self._warn(reason)
            return reason
        if self.N1 is None:  # no usable V^1 (all zero): the first nonzero V is the reference
            if vnorm > 0:
                self.N1, self.F1 = vnorm, objective
            return None
        if objective is not None and self.F1 is not None:
            ratio, unit = objective / max(self._ref(self.F1, self.N1), np.finfo(float).tiny), "objective F"
            warn_at, stop_at = self.warn_factor, self.stop_factor
        else:
            ratio, unit = (vnorm / max(self.N1, np.finfo(float).tiny)) ** 2, "||V||_F^2"
            warn_at, stop_at = self.v_warn_factor, self.v_stop_factor
        if ratio > stop_at:
            reason = (f"diverged at round {s}: the {unit} grew to {ratio:.3g}x its round-1 value with every upload "
                      f"within its public bound; the steps are too large for this data -- reduce {hint}")
            self._warn(reason)
            return reason
        if ratio > warn_at and not self.warned:
            self.warned = True
            self._warn(f"the {unit} grew to {ratio:.3g}x its round-1 value at round {s} (the run goes on): "
                       f"the steps may be too large -- consider reducing {hint}")
        return None

    def _warn(self, msg: str) -> None:
        warn(f"{self.alg.name}: {msg}", DivergenceWarning)


def setup_messages(m: int, seed: int, cfg: FedConfig, algorithm: str) -> list[Message]:
    """The setup message of each client: its index, the run seed and the config."""
    cfg_json = json.dumps(cfg.to_dict())
    return [
        Message("setup", 0, {}, {"seed": seed, "client": p, "algorithm": algorithm, "config": cfg_json})
        for p in range(m)
    ]


def run_federation(
    transport: Transport,
    algorithm: str | FederatedAlgorithm,
    cfg: FedConfig,
    *,
    max_rounds: int,
    tol: float = 0.0,
    seed: int | None = None,
    callback: Callable[[dict], None] | None = None,
    on_round_end: Callable[[ServerState, History], None] | None = None,
    resume: tuple[ServerState, History] | None = None,
    participation: Participation | None = None,
    stop_rule: Callable[[int, np.ndarray, dict], str | None] | None = None,
    residuals: bool = True,
) -> FitResult:
    """Run the federation: setup, then rounds until ``tol``, ``stop_rule`` or ``max_rounds``.

    Parameters
    ----------
    transport : Transport
    algorithm : str or FederatedAlgorithm
    cfg : FedConfig
    max_rounds : int >= 1
    tol : float >= 0
        Stop when R^s / R^1 <= tol (needs ``cfg.diagnostics``); 0 disables.
    seed : int, optional
        Run seed; drawn from OS entropy (and recorded) when None.
    callback : callable(row), optional
        Called with each history row (progress display).
    on_round_end : callable(server_state, history), optional
        Called after every completed round (checkpointing).
    resume : (ServerState, History), optional
        Continue a saved run (the clients must hold their matching states).
    participation : Participation, optional
        Partial participation (§15.2): rounds proceed with the clients that
        replied (``transport.exchange_some``) when a quorum did; the history
        gets ``participants`` and ``n_participants`` columns.  None: every
        client in every round (a missing client stops the run).
    stop_rule : callable(round, V, row) -> str or None, optional
        A server-side stopping rule, called after every round with the new
        post-proximal V (r x n, which the server holds) and the history row; a
        returned string ends the run as converged, with that reason.  It sees
        what the server sees, so it runs unchanged in a deployment.  Its own
        memory is not checkpointed: after a resume it starts afresh.
    residuals : bool, default=True
        With ``cfg.diagnostics``: the clients also send their diagnostic arrays (``grad0``, r x n,
        as large as the upload itself), from which the server computes R_V and R/R1.  False (a
        deployment whose ``tol`` is 0, where nothing stops on R/R1): every round message says so
        (scalar ``residuals`` = False) and the replies carry the diagnostic scalars only; the rows
        keep the objective and R_U, not R_V, R or R/R1.  The fit itself is the same, bit for bit.
    """
    alg = _algorithm(algorithm)
    if cfg.dp_enabled and not alg.supports_dp:
        raise ParameterError(f"algorithm {alg.name!r} does not implement differential privacy")
    max_rounds, tol = resolve_budget(cfg, max_rounds, tol)  # given values: validated by the one rule
    seed = check_seed(seed)
    if seed is None:
        seed = secrets.randbits(32)
    m = transport.n_clients
    if participation is not None:
        participation.check(m)
        if not alg.supports_partial:
            raise ParameterError(f"algorithm {alg.name!r} does not support partial participation")
        if not isinstance(transport, PartialTransport):
            raise ParameterError(f"{type(transport).__name__} cannot run partial rounds (no exchange_some)")
    t_start = time.perf_counter()

    secure = cfg.secure_aggregation
    if secure:
        _check_secure(alg, m, participation, cfg)
        secagg.warn_two_parties(m, cfg.dp_enabled)
    if resume is None:
        replies = transport.exchange(setup_messages(m, seed, cfg, alg.name))
        ns = {int(rep.scalars["n"]) for rep in replies}
        if len(ns) != 1:
            raise ProtocolError(f"clients hold different numbers of samples: {sorted(ns)}")
        spec = alg.summed_items(cfg, "setup")
        shape = (cfg.n_components, ns.pop())
        bound_exp = echoes = None
        if secure:
            agg, sa_exp, echoes = _secure_init(transport, spec, replies, m, shape)
        else:
            bound_exp = _plain_exponent(replies)
            check_plain_bounds(replies, range(m), spec, "setup", 0, bound_exp, 0.0)
            agg = plain_aggregate(replies, range(m), spec, "setup", 0,
                                  cols=[rep.arrays.get("cols") for rep in replies], shape=shape)
        state = alg.server_setup(replies, cfg, seed, agg=agg)
        if secure:
            state.arrays["secagg_exp"] = np.asarray(int(sa_exp))
            if echoes is not None:
                state.arrays[ECHOES_STATE] = np.frombuffer(json.dumps(echoes).encode(), dtype=np.uint8).copy()
        elif bound_exp is not None:
            state.arrays[BOUND_STATE] = np.asarray(int(bound_exp))
        history = History()
    else:
        state, history = resume
        if secure and "secagg_exp" not in state.arrays:
            raise ProtocolError("the saved run did not use secure aggregation; resume it with secure_aggregation=False")
    cfg_given = cfg
    if state.mu is None:
        raise ProtocolError("the server state holds no mu (a checkpoint of an older version?)")
    cfg = cfg.resolved(state.mu)  # the number the server resolved at setup; every round message carries it
    sa_exp_arr = state.arrays.get("secagg_exp")
    echoes_arr = state.arrays.get(ECHOES_STATE)
    echoes = None if echoes_arr is None else json.loads(np.asarray(echoes_arr, dtype=np.uint8).tobytes().decode())
    bound_arr = state.arrays.get(BOUND_STATE)  # plain runs: the exponent of the public upload bounds
    # rule (b) of partial participation under secure aggregation keeps its G's as a sum (clients send dG)
    kept_sum = secure and participation is not None and participation.rejoin == "server"
    round_spec = alg.summed_items(cfg, "round", kept_sum=kept_sum)
    residuals = bool(residuals) or tol > 0  # R/R1 needs the diagnostic arrays
    if not residuals:
        round_spec = without_residuals(round_spec)

    reason, converged, diverged = f"max_rounds={max_rounds} reached", False, False
    if resume is not None and tol > 0 and history.rows and history.rows[-1].get("R_rel", np.inf) <= tol:
        # the saved run had already met the tolerance: resuming it changes nothing
        last = history.rows[-1]
        reason, converged = f"R/R1 = {last['R_rel']:.3g} <= tol = {tol:g} at round {last['round']}", True
    monitor = DivergenceMonitor(alg, cfg)
    if cfg.dp_enabled:
        monitor.warned = True  # the DP noise, not the steps, makes ||V|| grow: only a real blow-up is reported
    prev_state: ServerState | None = None
    while not converged and state.round <= max_rounds:
        t0 = time.perf_counter()
        s = state.round
        # released before the clients work: the last round's uploads (m x 2 r x n with the diagnostics),
        # their sums and the server's previous state would otherwise live through this round's exchange
        replies, agg, prev_state = [], None, None
        msg = alg.broadcast(state)
        if kept_sum:
            msg = dataclasses.replace(msg, scalars={**msg.scalars, "kept_sum": True})
        if not residuals and cfg.diagnostics:
            msg = dataclasses.replace(msg, scalars={**msg.scalars, RESIDUALS_KEY: False})
        V_s = alg.current_v(state)
        bits = None
        if secure:  # the fixed point of this round, from public numbers only
            assert sa_exp_arr is not None  # set at setup (or refused at resume)
            bits = secagg.server_bits(round_spec, int(sa_exp_arr), float(np.sqrt(sqnorm(V_s))), m)
        extra_up = 0
        if participation is None:
            if bits is not None:
                # the key-list echoes go with round 1, where every client checks them (a resumed run's
                # clients checked them before its checkpoint)
                msg = with_secagg(msg, range(m), bits, **({} if echoes is None or s != 1 else {"echoes": echoes}))
                replies, agg = exchange_sum(transport, [msg] * m, bits)
            else:
                replies = transport.exchange([msg] * m)
            who = list(range(m))
        else:
            replies, who, msgs, agg, extra_up = _partial_exchange(cast(PartialTransport, transport), alg, state, msg,
                                                                  participation, history,
                                                                  m, seed, round_spec if secure else None,
                                                                  sa_exp_arr, V_s, echoes, cfg.secagg_threshold)
        for p, rep in zip(who, replies):
            if rep.round != s:
                raise ProtocolError(f"client {p} answered round {rep.round} to round {s}")
        prev_state = state
        cols = alg.reply_columns(state, who)
        if not secure:
            if bound_arr is not None:
                check_plain_bounds(replies, who, round_spec, "round", s, int(bound_arr),
                                   float(np.sqrt(sqnorm(V_s))))
            agg = plain_aggregate(replies, who, round_spec, "round", s, cols=cols, shape=V_s.shape)
        # plain replies carry the uploads themselves (the sums from them are bit-identical); with
        # secure aggregation the server step reads them from the aggregate only
        kw: dict[str, Any] = {"agg": agg} if secure else {}
        if participation is None:
            state = alg.server_round(state, replies, cfg, **kw)
        else:
            if participation.rejoin == "server":
                kw.update(keep_g=True, n_clients=m)
            state = alg.server_round(state, replies, cfg, clients=None if len(who) == m else who, **kw)
        for key, kept in (("secagg_exp", sa_exp_arr), (ECHOES_STATE, echoes_arr), (BOUND_STATE, bound_arr)):
            if kept is not None:
                state.arrays[key] = kept
        diag_masked = sum(a.nbytes for rep in replies for k, a in rep.arrays.items()
                          if k.startswith(secagg.MASKED_PREFIX + "diagnostics."))
        bytes_up = int(sum(rep.nbytes for rep in replies) - diag_masked + extra_up)
        bytes_diagnostics = int(sum(rep.diagnostics_nbytes for rep in replies) + diag_masked)
        replies = []  # counted and summed: not held through the residuals' temporaries
        row: dict[str, Any] = {"round": s}
        if cfg.diagnostics:
            counts = None
            if cols is not None and any(c is not None for c in cols):
                counts = column_counts(cols, V_s.shape[1])
            if residuals:
                row.update(round_metrics_from_sums(V_s, agg.sums, agg.count, cfg.eta_tilde, cfg.mu_value,
                                                   counts=counts))
            else:  # the same objective and R_U as round_metrics_from_sums, without the gradient's R_V
                row.update({"objective": float(agg.sums["f0"] / agg.count) + cfg.mu_value * l21_norm(V_s),
                            "R_U": float(agg.sums["rU"] / agg.count)})
        # the server's own step: its residual needs no upload (§7.5); a clustering fit stops on it
        row["R_step"] = step_residual(V_s, alg.current_v(state), cfg.eta_tilde) + float(row.get("R_U", 0.0))
        row["effective_rank"] = effective_rank(alg.current_v(state))
        row["bytes_up"] = bytes_up
        row["bytes_down"] = int(m * msg.nbytes) if participation is None else int(sum(x.nbytes for x in msgs))
        row["bytes_diagnostics"] = bytes_diagnostics
        if participation is not None:
            row["participants"] = list(who)
            row["n_participants"] = len(who)
        row["seconds"] = time.perf_counter() - t0
        history.append(row)
        if on_round_end is not None:
            on_round_end(state, history)
        if callback is not None:
            callback(row)
        stop = monitor.check(s, alg.current_v(state), row.get("objective"), V_start=V_s)
        if stop is not None:
            reason, diverged = stop, True
            if not np.all(np.isfinite(alg.current_v(state))):
                state = prev_state  # return the last finite V
            break
        if tol > 0 and row["R_rel"] <= tol:
            reason, converged = f"R/R1 = {row['R_rel']:.3g} <= tol = {tol:g} at round {s}", True
            break
        if stop_rule is not None:
            why = stop_rule(s, alg.current_v(state), row)
            if why:
                reason, converged = str(why), True
                break
    if not converged and not diverged and tol > 0:
        from fedsonmf.exceptions import (
            ConvergenceWarning,  # imports scikit-learn: only when it fires
        )

        warn(f"stopped after max_rounds={max_rounds} with R/R1 = {history.rows[-1]['R_rel']:.3g} > tol = {tol:g}; "
             "increase max_rounds or tol", ConvergenceWarning)
    seconds = time.perf_counter() - t_start
    result = FitResult(
        V=alg.current_v(state).copy(),
        bases=None,
        history=history,
        n_rounds=len(history),
        stopping_reason=f"{reason} after {seconds:.2f} s",
        converged=converged,
        seed=int(seed),
        config={"algorithm": alg.name, "max_rounds": max_rounds, "tol": tol, "n_clients": m, **cfg_given.to_dict(),
                "mu_value": float(cfg.mu_value),
                **({"participation": participation.to_dict()} if participation is not None else {})},
        seconds=seconds,
        server_state=state,
        mu=float(cfg.mu_value),
    )
    if diverged:
        result.extra["diverged"] = True
    if participation is not None:
        _report_absent_views(result, participation, m, int(seed))
    if cfg.dp_enabled:
        from fedsonmf.protocol.privacy import privacy_report

        result.extra["privacy"] = privacy_report(cfg_given, len(history), m)
    return result



def _report_absent_views(result: FitResult, participation: Participation, m: int, seed: int) -> None:
    """A partial run whose view was absent from most rounds says so: ``result.extra["absent_views"]``
    ``{client: rounds without it}`` (clients that failed to answer at least once and were absent
    from more than half of the rounds; a sampled client's unasked rounds count as absent), the
    stopping reason names them, and a :class:`~fedsonmf.exceptions.DataWarning` is given: V was
    shaped mostly without those views."""
    from fedsonmf.exceptions import DataWarning

    rows = [row for row in result.history.rows if "participants" in row]
    if not rows:
        return
    absent, dropped = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    for row in rows:
        took = {int(p) for p in row["participants"]}
        asked = {int(p) for p in participation.asked(m, int(row["round"]), seed)}
        for p in range(m):
            absent[p] += p not in took
            dropped[p] += p in asked and p not in took
    lost = {p: int(absent[p]) for p in range(m) if 2 * absent[p] > len(rows) and dropped[p] > 0}
    if not lost:
        return
    what = ", ".join(f"view {p} absent from {k} of {len(rows)} rounds" for p, k in lost.items())
    result.extra["absent_views"] = {str(p): k for p, k in lost.items()}
    result.stopping_reason += f"; {what} (V was fitted mostly without it)"
    warn(f"{what}: the model was fitted mostly without {'that view' if len(lost) == 1 else 'those views'}",
         DataWarning)


def _last_rounds(history: History, m: int) -> np.ndarray:
    """The last round each client took part in (0: none yet), from the history."""
    last = np.zeros(m, dtype=np.int64)
    for row in history.rows:
        for p in row.get("participants", range(m)):
            last[int(p)] = int(row["round"])
    return last


def _partial_exchange(transport: PartialTransport, alg: FederatedAlgorithm, state: ServerState, msg: Message,
                      participation: Participation,
                      history: History, m: int, seed: int, spec=None, sa_exp=None, V_s=None, echoes=None,
                      threshold_cfg=None):
    """One partial round (§15.2): ask the sampled clients, keep those that replied.

    Returns ``(replies, clients, messages_sent, aggregate, extra_up_bytes)`` with replies in
    client order.  A client that missed round s-1 gets the rejoin message of the algorithm.

    With secure aggregation (``spec`` given) the uploads carry the pairwise masks of the asked
    cohort *and* each client's self mask (Bonawitz et al.'s double masking): an ``unmask``
    step then asks the clients that replied for this round's self-mask keys and their pair
    keys with the clients that did not, so the server removes exactly the masks of the sum of
    those who replied -- and a dropped client's upload, should it arrive late, stays hidden
    behind its own self mask.  Threshold recovery (Bonawitz et al.; docs/privacy.md): every
    upload carries its client's Shamir shares (threshold t, :func:`fedsonmf.federation.secagg.threshold`
    of ``threshold_cfg``) of this round's self-mask key and pair-mask keys, encrypted to each
    peer; the unmask step relays them and any t survivors' shares rebuild the keys, so survivors
    that drop during the unmask step do not fail the round.  Fewer than t uploads or t unmask
    answers fail it, with the threshold named and nothing decoded.  The aggregate is None
    without secure aggregation.
    """
    s = state.round
    asked = participation.asked(m, s, seed)
    last = _last_rounds(history, m)
    need = participation.quorum(m)
    bits = nonce = t = None
    if spec is not None:
        bits = secagg.server_bits(spec, int(sa_exp), float(np.sqrt(sqnorm(V_s))), len(asked))
        nonce = secrets.token_hex(8)
        t = secagg.threshold(threshold_cfg, len(asked))
        # the key-list echoes go with the rounds of clients that have not checked them yet (no round so far)
        first = echoes is not None and any(last[p] == 0 for p in asked)
        # "counted": the last round the server counted each client's upload (public: the participants),
        # so a client whose upload was summed without its unmask answer commits what it kept pending
        counted = {str(p): int(last[p]) for p in asked}
        msg = with_secagg(msg, asked, bits, nonce=nonce, self=True, threshold=t, counted=counted,
                          **({"echoes": echoes} if first else {}))
    msgs = {}
    for p in asked:
        if s > 1 and last[p] < s - 1:
            msgs[p] = alg.rejoin_message(state, msg, participation.rejoin, has_rounds=bool(last[p] > 0))
        else:
            msgs[p] = msg
    got = transport.exchange_some(msgs)
    who = sorted(got)
    _check_quorum(s, asked, who, need)
    replies = [got[p] for p in who]
    if spec is None or bits is None:
        return replies, who, list(msgs.values()), None, 0
    assert t is not None
    if len(who) < t:
        _below_threshold(s, f"{len(who)} of the {len(asked)} asked clients uploaded", sorted(set(asked) - set(who)), t)
    params = secagg.params_json(asked, bits, nonce=nonce, survivors=who, threshold=t)
    pos = {p: i for i, p in enumerate(asked)}  # row of holder p in each dealer's shares
    try:
        boxes = {d: np.asarray(got[d].arrays[secagg.SHARES_KEY], dtype=np.uint8) for d in who}
    except KeyError:
        raise ProtocolError(f"secure aggregation: round {s}: an upload carries no threshold shares") from None
    width = {b.shape for b in boxes.values()}
    if len(width) != 1 or next(iter(width))[0] != len(asked):
        raise ProtocolError(f"secure aggregation: round {s}: the uploads' share arrays have shapes "
                            f"{sorted(width)}, expected ({len(asked)}, ...) each")
    keys = transport.exchange_some({
        p: Message("unmask", s, {secagg.SHARES_IN_KEY: np.stack([boxes[d][pos[p]] for d in who])},
                   {secagg.SECAGG_KEY: params}) for p in who})
    if len(keys) < t:
        _below_threshold(s, f"{len(keys)} of the {len(who)} clients that uploaded answered the unmask step",
                         sorted(set(who) - set(keys)), t)
    agg = secagg.aggregate_masked(replies, who, "round", s, bits, unmask=keys, cohort=asked, threshold=t)
    extra = sum(r.nbytes for r in keys.values())
    return replies, who, list(msgs.values()), agg, extra


def _check_quorum(s: int, asked, who, need: int) -> None:
    if len(who) < need:
        missing = sorted(set(asked) - set(who))
        raise FederationError(
            f"round {s}: only {len(who)} of the {len(asked)} asked clients replied (clients {list(who)}; missing "
            f"{missing}), the quorum min_clients is {need}",
            client=missing[0] if len(missing) == 1 else None, round=s)


# ----------------------------------------------------------------------------- sums


def plain_aggregate(replies: Sequence[Message], clients, spec: dict, kind: str, round: int, *, cols=None,
                    shape=None) -> Aggregate:
    """The :class:`Aggregate` of plain replies: every item of ``spec`` summed in client order.

    Arrays are summed as ``S = a_0 (copy); S += a_1; ...`` and column blocks of incomplete views
    (``cols[i]`` not None) into their columns of an array of ``shape`` -- the arithmetic the server
    used before the sums existed, so plain runs are bit-identical; scalars with ``np.sum``.
    """
    masked = cols is not None and any(c is not None for c in cols)
    sums: dict[str, Any] = {}
    for key, (field, _deg) in spec.items():
        vals = [getattr(rep, field)[key] for rep in replies]
        if field == "scalars" or np.ndim(vals[0]) == 0:
            sums[key] = float(np.sum(np.asarray(vals, dtype=np.float64)))
        elif masked:
            sums[key], _ = scatter_columns(vals, cols, shape)
        else:
            sums[key] = total(vals)
    return Aggregate(kind, int(round), sums, tuple(int(p) for p in clients))


def exchange_sum(transport, messages: Sequence[Message], bits: dict) -> tuple[list[Message], Aggregate]:
    """One masked exchange with every client: ``(replies, Aggregate)``.

    The aggregate is the ring sum of the masked items decoded at the scale ``bits``.
    """
    replies = transport.exchange(messages)
    return replies, secagg.aggregate_masked(replies, range(len(replies)), messages[0].kind, messages[0].round, bits)


def with_secagg(msg: Message, cohort, bits: dict, **extra) -> Message:
    """``msg`` with the public parameters of one masked exchange: the cohort, the scales and a
    fresh nonce (so a retried or resumed round never reuses a mask)."""
    extra.setdefault("nonce", secrets.token_hex(8))
    return dataclasses.replace(msg, scalars={**msg.scalars,
                                             secagg.SECAGG_KEY: secagg.params_json(list(cohort), bits, **extra)})


#: server-state arrays: the clients' signed key-list echoes (JSON, uint8), relayed with every masked
#: round message; a plain run's exponent E of the public upload bounds (L = 2^E)
ECHOES_STATE, BOUND_STATE = "secagg_echoes", "bound_exp"


#: extra bits of a plain run's bound exponent when it comes from the setup projection
#: ||max(U_p^T X_p, 0)||_F <= ||X_p||_F instead of ||X_p||_F itself (init_v="projection")
PROJECTION_SLACK_BITS = 8


def _plain_exponent(replies: Sequence[Message]) -> int | None:
    """E = max_p ceil(log2 ||X_p||_F) from the plain setup replies: their ``x_sqnorm`` (what
    secure aggregation's E_p announce), else their projection ``Vproj`` (a lower estimate of
    ||X_p||_F, given :data:`PROJECTION_SLACK_BITS` more); None when a reply carries neither."""
    exps = []
    for rep in replies:
        slack = 0
        try:
            if rep.scalars.get("x_sqnorm") is not None:
                norm = float(np.sqrt(max(float(rep.scalars["x_sqnorm"]), 0.0)))
            elif "Vproj" in rep.arrays:
                norm, slack = float(np.sqrt(sqnorm(np.asarray(rep.arrays["Vproj"], dtype=np.float64)))), \
                    PROJECTION_SLACK_BITS
            else:
                return None
        except (TypeError, ValueError):
            return None
        if not np.isfinite(norm):
            return None  # the non-finite value itself is refused by check_plain_bounds
        exps.append((int(np.frexp(norm)[1]) if norm > 0 else 0) + slack)
    return max(exps) if exps else None


def check_plain_bounds(replies: Sequence[Message], clients, spec: dict, kind: str, round: int, exp: int | None,
                       vnorm: float) -> None:
    """The server's check of plain uploads, client by client, before any is summed.

    Every float array and scalar of a reply must be finite, and every item the server sums
    within the public bound ``2^e > 2^16 (2^E + ||V^s||_F)^degree`` (the bound secure
    aggregation's fixed point assumes, :func:`fedsonmf.federation.secagg.upload_limit`; an honest
    upload stays 2^16 below it).  Raises :class:`~fedsonmf.federation.secagg.UploadBoundError`
    naming the client, the item and the round ("an upload out of bounds in round k").
    """
    where = "the setup exchange" if kind == "setup" else f"round {int(round)}"
    for p, rep in zip(clients, replies):
        for field in ("arrays", "scalars", "diagnostics"):
            for key, v in getattr(rep, field).items():
                a = np.asarray(v) if not isinstance(v, (str, bytes)) else None
                if a is not None and a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
                    raise secagg.UploadBoundError(f"an upload out of bounds in {where}: client {p}'s {field} {key!r} "
                                                  "holds NaN/Inf; the round fails and no model is updated from it")
        if exp is None:
            continue
        for key, (field, deg) in spec.items():
            v = getattr(rep, field).get(key)
            if v is None:
                continue
            limit = float(2.0 ** np.frexp(secagg.item_bound(deg, 2.0 ** int(exp), vnorm))[1])
            peak = float(np.max(np.abs(np.asarray(v, dtype=np.float64)))) if np.size(v) else 0.0
            if peak > limit:
                raise secagg.UploadBoundError(
                    f"an upload out of bounds in {where}: client {p}'s {field} {key!r} reaches |x| = {peak:.3g}, "
                    f"beyond its public bound {limit:.3g} (2^16 (L + ||V||_F)^{deg} with L = 2^{int(exp)}, "
                    f"||V||_F = {vnorm:.3g}), 2^16 beyond an honest upload's size: a dishonest or broken client, "
                    "or a run that blew up within one round; the round fails and no model is updated from it")


def _check_secure(alg: FederatedAlgorithm, m: int, participation: Participation | None,
                  cfg: FedConfig | None = None) -> None:
    """Refuse, before any message, a run that secure aggregation cannot protect."""
    if participation is not None and cfg is not None:
        secagg.threshold(cfg.secagg_threshold, participation.n_asked(m))  # a threshold the cohorts cannot use
    secagg.generate_keypair()  # the cryptography package is there (a clear error otherwise)
    if m < 2:
        raise ParameterError(f"secure_aggregation=True needs at least 2 clients (got {m}): the sum of one "
                             "client's uploads is its upload")
    missing = set(alg.uplink_keys) - set(alg.summed_uplink_keys)
    if missing:
        raise ParameterError(f"secure_aggregation=True: algorithm {alg.name!r} uses its uploads {sorted(missing)} "
                             "for more than their mean")
    if participation is not None and participation.rejoin == "server" and "dG" not in alg.summed_items(
            FedConfig(), "round", kept_sum=True):
        raise ParameterError(
            f"secure_aggregation=True cannot run rejoin='server' with algorithm {alg.name!r}: its server-kept "
            "correction rebuilds every client's own G_p from its own upload, which secure aggregation hides; use "
            "rejoin='refresh', 'drop' or 'stale', or secure_aggregation=False")


def _secure_init(transport, spec: dict, replies: Sequence[Message], m: int, shape):
    """The key-agreement exchange before round 1: relay the public keys (with their signatures,
    when the clients signed them), collect the masked setup items and the clients' signed echoes
    of the key list.  Returns their aggregate, the run's public exponent E (L = 2^E) and the
    echoes (None when no client signed), which every masked round message relays."""
    try:
        pks = [str(rep.scalars["secagg_pk"]) for rep in replies]
        exps = [int(rep.scalars["secagg_exp"]) for rep in replies]
    except KeyError:
        raise ProtocolError("secure aggregation: a setup reply carries no public key (is the client's "
                            "secure_aggregation off?)") from None
    exp = max(exps)
    bits = secagg.server_bits(spec, exp, 0.0, m)
    sigs = [str(rep.scalars.get(secagg.SIG_KEY, "")) for rep in replies]
    extra = {"signatures": sigs} if any(sigs) else {}
    init = with_secagg(Message("init", 0), range(m), bits, public_keys=pks, **extra)
    replies, agg = exchange_sum(transport, [init] * m, bits)
    echoes = [{"digest": str(rep.scalars.get(secagg.DIGEST_KEY, "")), "sig": str(rep.scalars.get(secagg.ECHO_KEY, ""))}
              for rep in replies]
    return Aggregate("setup", 0, agg.sums, agg.clients), exp, (echoes if any(e["sig"] for e in echoes) else None)


def _below_threshold(s: int, what: str, missing: list, t: int) -> NoReturn:
    """Fail round ``s`` of a secure partial run that fell below the threshold ``t`` (``what`` happened,
    ``missing`` did not answer): no sum is decoded and no upload revealed."""
    raise FederationError(
        f"round {s}: {what} (missing {missing}), below the secure-aggregation threshold secagg_threshold = {t}: the "
        "masks cannot be removed, no sum is decoded and no upload revealed; the round fails -- resume from the last "
        "checkpoint", client=missing[0] if len(missing) == 1 else None, round=s)
