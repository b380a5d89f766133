"""The Flower ServerApp: runs :func:`fedsonmf.federation.run_federation` over a
:class:`~fedsonmf.federation.flower.transport.FlowerTransport`.

It owns the round loop (no Flower ``Strategy``): waits for one node per view,
maps node -> view with a handshake, aggregates in view order, checkpoints the
server state after every round, and writes its outputs to ``out-dir`` on the
SuperLink host:

``status.json``      {"status": "running"|"completed"|"failed", "error", "client", "round", ...} and the
                     progress (:class:`StatusFile`): phase, current round, rounds done, seconds per
                     round, time stamps (round 1's start among them)
``result.json``      config, seed, per-round history, stopping reason, timings, wire bytes
                     (+ ``clustering``: options, r, cluster sizes)
``V.npy``            the final V (r x n)
``labels.csv``       clustering runs: ``sample_id,cluster`` (ids 0..n-1), ``centers.npy`` the k-means centres
``checkpoint/``      server state + history after the last completed round (resume)
``restart-<i>/``     a clustering run of ``n-init`` > 1 fits: fit i's ``V.npy``, ``result.json`` and
                     ``checkpoint/`` (the kept fit's V, labels and result are the ones above);
                     ``restarts.json`` the fits' seeds and the job id (a resume continues at the
                     first unfinished fit)
``wire.jsonl``       every message that crossed the wire (``record-wire = true``)

Run-config keys are those of the shipped app template (:mod:`.template`).  A clustering
run (``n-clusters`` > 0) and a ``predict`` run are described in :mod:`.clustering`.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import RunNotRunningException

from fedsonmf._io import private_dir, save_npy_atomic, write_json_atomic
from fedsonmf.algorithms import get_algorithm
from fedsonmf.core.init import resolve_init_u
from fedsonmf.exceptions import CheckpointError, FederationError, ParameterError, ProtocolError, RunStopped
from fedsonmf.federation import checkpoint as ckpt
from fedsonmf.federation.flower import clustering as fclust
from fedsonmf.federation.flower import codec, nodeconfig
from fedsonmf.federation.flower.security import read_pins, read_retired
from fedsonmf.federation.flower.template import RUN_CONFIG_DEFAULTS
from fedsonmf.federation.flower.transport import (
    FIT_KINDS,
    BatchingGrid,
    FlowerTransport,
    WireRecorder,
    check_same_ids,
    check_views_at_handshake,
    exchange_counts,
    handshake,
)
from fedsonmf.federation.loop import run_federation
from fedsonmf.pipeline.refine import refine_stages
from fedsonmf.pipeline.restarts import final_objective, resolve_n_init, restart_seeds
from fedsonmf.pipeline.stages import cluster_fits
from fedsonmf.pipeline.steps import assign_to_centers, stop_rule, warn_unsettled
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import json_default
from fedsonmf.protocol.messages import Message
from fedsonmf.protocol.params import FLOWER_SECURE_AGGREGATION, default
from fedsonmf.protocol.participation import Participation

__all__ = ["app", "make_server_app", "server_main", "config_from_run_config", "StatusFile"]


def _rc(rc, key: str):
    """Run-config value ``key``, or the app template's default (declared once, in :mod:`.template`)."""
    return rc.get(key, RUN_CONFIG_DEFAULTS[key])


def _budget(cfg: FedConfig, rc) -> tuple[int, float]:
    """``(max_rounds, tol)`` of a run: ``num-rounds`` and ``tol`` of the run config.

    A run config always holds both (Flower fills in the app's defaults), so the app
    cannot tell a default from a choice; our rule: a run whose clients send no
    diagnostics has no residual to stop on (``tol`` is not used), and a
    differentially private run lasts at most ``dp_rounds`` rounds.  The launcher
    (``run_flower``) resolves and validates both before it starts anything.
    """
    max_rounds, tol = int(_rc(rc, "num-rounds")), float(_rc(rc, "tol"))
    if cfg.dp_enabled:
        return min(max_rounds, int(cfg.dp_rounds)), 0.0
    return max_rounds, tol if cfg.diagnostics else 0.0

def config_from_run_config(rc) -> FedConfig:
    """The run's FedConfig from a Flower run config.

    Parameters
    ----------
    rc : mapping
        The run config: ``config-json`` (a full ``FedConfig.to_dict()``) when set, else the
        individual keys (``rank``, ``mu``, ...; defaults: :data:`.template.RUN_CONFIG_DEFAULTS`).

    Returns
    -------
    FedConfig
        With ``diagnostics`` and ``secure-aggregation`` from their own keys.
    """
    text = str(rc.get("config-json", "") or "")
    if text:
        cfg = ckpt.config_from_dict(json.loads(text))
    else:
        mu = rc.get("mu", default("mu"))
        cfg = FedConfig(
            n_components=int(rc.get("rank", default("n_components"))),
            mu=mu if isinstance(mu, str) else float(mu), mu_scale=float(rc.get("mu-scale", default("mu_scale"))),
            alpha=rc.get("alpha", default("alpha")), tau=int(rc.get("tau", default("tau"))),
            eta_g=float(rc.get("eta-g", default("eta_g"))), rho1=float(rc.get("rho1", default("rho1"))),
            correction=bool(rc.get("correction", default("correction"))),
            init_u=str(rc.get("init-u", default("init_u"))), init_v=str(rc.get("init-v", default("init_v"))),
        )
    # the diagnostics and secure-aggregation switches always come from their own keys
    return cfg.replace(diagnostics=bool(rc.get("diagnostics", cfg.diagnostics)),
                       secure_aggregation=bool(rc.get("secure-aggregation", FLOWER_SECURE_AGGREGATION)))


def participation_from_run_config(rc) -> Participation | None:
    """``min-clients`` / ``sample-clients`` (0 = off; >= 1 a count, else a fraction) and ``rejoin``."""
    def num(key):
        v = float(rc.get(key, 0) or 0)
        return None if v <= 0 else (int(v) if v >= 1 and v == int(v) else v)

    mc, sc = num("min-clients"), num("sample-clients")
    if mc is None and sc is None:
        return None
    return Participation(min_clients=mc, sample=sc, rejoin=str(_rc(rc, "rejoin")))


def _write_json(path: Path, obj) -> None:
    write_json_atomic(_inside(path, path.parent), obj, default=json_default)


#: set by the launcher for the SuperLink host's executor: out-dirs must lie below it
OUT_ROOT_ENV = "FEDSONMF_OUT_ROOT"


def _inside(path: Path | str, root: Path | str) -> Path:
    """``path`` resolved (symlinks followed); refused unless it lies in ``root`` (resolved)."""
    real, base = Path(path).resolve(), Path(root).resolve()
    if real != base and base not in real.parents:
        raise PermissionError(f"the ServerApp writes only inside {base}; {path} resolves to {real}")
    return real


def resolve_out_dir(out: str) -> Path:
    """The run's out-dir: absolute, below ``$FEDSONMF_OUT_ROOT`` when set, created 0700."""
    path = Path(out)
    if not path.is_absolute():
        raise ValueError(f"run config 'out-dir' must be an absolute path on the SuperLink host, got {out!r}")
    root = os.environ.get(OUT_ROOT_ENV)
    if root:
        _inside(path, root)  # before anything is created
    private_dir(path)
    return _inside(path, root) if root else path.resolve()


def stopped_status(last_completed_round: int) -> dict:
    """Status fields of a run stopped from outside (``flwr stop``): where it was and where to resume."""
    k = int(last_completed_round) + 1
    text = f"stopped externally at round {k}; resume with --resume from round {k}"
    return {"status": "stopped", "error": text, "report": text, "round": k}


class StatusFile:
    """``status.json``, rewritten atomically at every phase change and round start / end.

    Progress fields (time stamps are ``time.time()`` seconds): ``phase`` (handshake |
    setup | round | clustering | done), ``round`` (the current round, 0 before round 1),
    ``rounds_done``, ``max_rounds``, ``started_at`` (the ServerApp's start),
    ``round1_started_at``, ``round_started_at``, ``last_round_seconds``,
    ``seconds_per_round`` (mean of the completed rounds), ``updated_at``.  In the clustering
    phase (the refinement exchanges after the rounds, as many as the refinement needs):
    ``stage`` (the kind of the current exchange: refine | graph | spectral),
    ``exchanges`` (clustering exchanges started so far), ``exchange_started_at`` and,
    once two have started, ``seconds_per_exchange`` (mean time between their starts).
    At the end: ``n_rounds`` (rounds run; fewer than ``max_rounds`` after an early stop)
    and ``seconds``.  A launcher polls it for a progress display (round k of K, s/round, ETA).
    A clustering run of several fits adds ``n_restarts``; its fits run at once
    (:func:`server_main`), with ``fit_rounds`` ({fit: rounds done}) and ``fits_running``, and
    ``rounds_done`` is then the rounds of the slowest fit still running.  Every method may be
    called from the fits' threads.
    """

    #: the exchanges of the clustering phase (:mod:`.clustering`)
    CLUSTERING_KINDS = frozenset({"refine", "graph", "spectral"})

    def __init__(self, path: Path, **fields):
        self.path = Path(path)
        now = time.time()
        self.data = {"status": "running", "phase": "handshake", "round": 0, "rounds_done": 0,
                     "started_at": now, "round1_started_at": None, **fields}
        self._secs: list[float] = []
        self._n_exchanges, self._first_exchange_at = 0, 0.0  # the clustering phase's exchanges
        self._fit_rounds: dict[int, int] = {}  # fits at once: {fit: rounds done}
        self._running: set[int] = set()
        self._lock = threading.RLock()
        self.write()

    def write(self, **fields) -> None:
        """Update ``fields`` and ``updated_at`` and rewrite the file atomically."""
        with self._lock:
            self.data.update(fields, updated_at=time.time())
            _write_json(self.path, self.data)

    def exchange_started(self, kind: str, s: int) -> None:
        """The transport's hook: an exchange of ``kind`` (round or counter ``s``) is about to be pushed."""
        with self._lock:
            self._exchange_started(kind, s)

    def _exchange_started(self, kind: str, s: int) -> None:
        if kind == "setup":
            self.write(phase="setup")
        elif kind == "round":
            now = time.time()
            extra = {"round1_started_at": now} if self.data.get("round1_started_at") is None else {}
            self.write(phase="round", round=int(s), round_started_at=now, **extra)
        elif kind in self.CLUSTERING_KINDS or self.data.get("phase") == "clustering":
            self._clustering_exchange(kind)

    def _clustering_exchange(self, kind: str) -> None:
        """One more exchange of the clustering phase: its stage, the count, the mean s/exchange."""
        # counted here: ``s`` restarts at 1 for every stage (each has its own counter)
        now = time.time()
        self._n_exchanges += 1
        if self._n_exchanges == 1:
            self._first_exchange_at = now
        extra = {}
        if self._n_exchanges >= 2:  # the mean of the gaps between successive starts
            extra["seconds_per_exchange"] = (now - self._first_exchange_at) / (self._n_exchanges - 1)
        self.write(phase="clustering", stage=kind, exchanges=self._n_exchanges, exchange_started_at=now, **extra)

    def round_done(self, s: int, seconds: float) -> None:
        """Round ``s`` completed in ``seconds``: the counters and the mean seconds per round."""
        with self._lock:
            self._secs.append(float(seconds))
            self.write(rounds_done=int(s), last_round_seconds=float(seconds),
                       seconds_per_round=float(sum(self._secs) / len(self._secs)))

    def fits_started(self, rounds: dict[int, int]) -> None:
        """Fits at once: ``rounds`` = {fit: rounds it has already done (a resume)} of the fits to run."""
        with self._lock:
            self._fit_rounds.update({int(i): int(k) for i, k in rounds.items()})
            self._running |= {int(i) for i in rounds}
            self._write_fits()

    def fit_round_done(self, fit: int, s: int, seconds: float) -> None:
        """Fits at once: fit ``fit`` completed its round ``s`` in ``seconds``."""
        with self._lock:
            self._secs.append(float(seconds))
            self._fit_rounds[int(fit)] = int(s)
            self._write_fits(last_round_seconds=float(seconds),
                             seconds_per_round=float(sum(self._secs) / len(self._secs)))

    def fit_finished(self, fit: int) -> None:
        """Fits at once: fit ``fit`` has ended (its V and result are saved)."""
        with self._lock:
            self._running.discard(int(fit))
            self._write_fits()

    def _write_fits(self, **fields) -> None:
        slowest = min((self._fit_rounds[i] for i in self._running), default=max(self._fit_rounds.values(), default=0))
        self.write(fit_rounds={str(i): k for i, k in sorted(self._fit_rounds.items())},
                   fits_running=sorted(self._running), rounds_done=int(slowest), **fields)


class _FitCancelled(Exception):
    """A fit that stopped at the end of a round because another fit of the run failed (it resumes)."""


def _fit_finished(folder: Path) -> bool:
    """Whether a restart's fit finished in an earlier attempt of this run (its V and result are saved)."""
    return (folder / "V.npy").is_file() and (folder / "result.json").is_file()


def _read_fit(folder: Path):
    """A finished restart's :class:`FitResult`, read back from its folder (a resumed run)."""
    from fedsonmf.federation.flower.launcher import load_result

    return load_result(folder)


def _setup_spec(cfg: FedConfig, copts: dict | None, algorithm: str, seed: int) -> dict | None:
    """The setup scalars (all but ``client``) the hellos carry, so that the nodes set up at the
    handshake (one exchange less before round 1).  None when r is not known before the nodes
    report their widths (a clustering rank rule other than "auto", which is r = 2c)."""
    if copts is not None:
        if copts["rank_rule"] != "auto":
            return None
        cfg = cfg.replace(n_components=2 * copts["n_clusters"])
    spec = {"seed": int(seed), "algorithm": algorithm, "config": json.dumps(cfg.to_dict())}
    return {**spec, **(fclust.setup_scalars(copts) if copts else {})}


def server_main(grid: Grid, context: Context) -> None:
    """The ServerApp's main: a fit (or a predict run) over the grid, reported in ``status.json``.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The ServerApp's grid.
    context : flwr.app.Context
        Its context; the run config holds the keys of :data:`.template.RUN_CONFIG_DEFAULTS`
        (``out-dir`` required).
    """
    rc = context.run_config
    out_text = str(rc.get("out-dir", "") or "")
    if not out_text:
        raise ValueError("run config 'out-dir' is empty: give an absolute directory on the SuperLink host")
    out = resolve_out_dir(out_text)
    if str(rc.get("mode", "fit") or "fit") == "predict":
        return _predict_main(grid, context, out)
    status_path = out / "status.json"
    cfg = config_from_run_config(rc)
    alg = get_algorithm(str(_rc(rc, "algorithm")))
    m = int(rc["num-clients"])
    job_id = str(rc.get("job-id", "") or "") or f"run{context.run_id}"
    seed = int(_rc(rc, "seed"))
    max_rounds, tol = _budget(cfg, rc)
    round_timeout, poll = float(_rc(rc, "round-timeout")), float(_rc(rc, "poll-interval"))
    node_timeout = float(_rc(rc, "node-timeout"))
    # node start-up (handshake + the setup exchange) has its own timeout, separate from the round timeout
    startup_timeout = float(rc.get("startup-timeout", 0.0) or 0.0) or node_timeout
    participation = participation_from_run_config(rc)
    copts = fclust.clustering_options(rc)
    if copts:  # init-u "auto" starts a clustering run's fits as the estimator's: from the singular vectors
        cfg = cfg.replace(init_u=resolve_init_u(cfg.init_u, clustering=True))
    ckpt_dir = _inside(out / "checkpoint", out)
    recorder = None
    if bool(rc.get("record-wire", False)):
        arrays_dir = _inside(out / "wire-arrays", out) if bool(rc.get("record-wire-arrays", False)) else None
        recorder = WireRecorder(_inside(out / "wire.jsonl", out), arrays_dir=arrays_dir)
    status = StatusFile(status_path, run_id=int(context.run_id), job_id=job_id, pid=os.getpid(),
                        max_rounds=max_rounds)
    t0 = time.perf_counter()
    last_round = {"completed": 0}
    last_state: dict = {"state": None}  # the server's state after the last round (who holds which sample)
    current = {"checkpoint": ckpt_dir}  # the checkpoint of the fit running (a restart's own)
    try:
        # the refinement stages, checked before any round (a run config's value is unchecked so far)
        stages = refine_stages(copts["refine"], dp=cfg.dp_enabled) if copts else ()
        resuming = bool(rc.get("resume", False))
        # a clustering run fits n_init times from the estimator's seeds and keeps the medoid fit (as the
        # in-process estimator does); restart i is job "<job>-restart-<i>" on the nodes, so the kept
        # fit's bases stay there for its refinement and for predict runs
        n_init, seeds = 1, [seed]
        if copts:
            try:
                n_init = resolve_n_init(copts["n_init"], dp=cfg.dp_enabled, diagnostics=cfg.diagnostics)
            except ParameterError as exc:
                raise ProtocolError(f"run config 'n-init': {exc}") from None
            if n_init > 1 and cfg.dp_enabled:
                raise ProtocolError(f"run config 'n-init' = {n_init} under differential privacy: each fit would "
                                    "spend the run's budget again; use n-init = 1 (the default under DP)")
            seeds = restart_seeds(seed, n_init)
        plan_path = out / "restarts.json"
        plan = json.loads(plan_path.read_text()) if n_init > 1 and resuming and plan_path.is_file() else None
        if n_init > 1 and resuming and plan is None:
            raise CheckpointError(f"cannot resume: {plan_path} does not exist (no run of {n_init} fits started "
                                  "in this out-dir)")
        if plan is not None and [int(x) for x in plan["seeds"]] != seeds:
            raise CheckpointError(f"cannot resume: this run's fits have the seeds {seeds}, the interrupted run's "
                                  f"{plan['seeds']} (another seed or n-init)")
        if plan is not None and not str(rc.get("job-id", "") or ""):
            job_id = str(plan["job_id"])  # the nodes' state files are named by the job id
        restart_dirs = [out] if n_init == 1 else [_inside(out / f"restart-{i}", out) for i in range(n_init)]
        done = [n_init > 1 and resuming and _fit_finished(d) for d in restart_dirs]  # restarts a resume skips
        first = done.index(False) if False in done else n_init - 1
        job_ids = [job_id] if n_init == 1 else [f"{job_id}-restart-{i}" for i in range(n_init)]
        ckpt_dirs = [_inside(d / "checkpoint", out) for d in restart_dirs]

        def checkpoint_of(i: int):
            """Fit i's checkpoint to resume from, or None.  One fit: it must be there (the error names
            it); several: a fit interrupted before its first round has none and starts again."""
            if not resuming or done[i] or (n_init > 1 and not ckpt.has_server_checkpoint(ckpt_dirs[i])):
                return None
            return ckpt.load_server_checkpoint(ckpt_dirs[i])

        saved = checkpoint_of(first)  # before the handshake: it names the job, and decides the hello's setup
        if saved is not None and n_init == 1 and not str(rc.get("job-id", "") or ""):
            job_id = job_ids[0] = str(saved.run["job_id"])  # the clients' state files are named by the job id
        status.write(job_id=job_id, **({"n_restarts": n_init} if n_init > 1 else {}))
        if n_init > 1:
            _write_json(plan_path, {"job_id": job_id, "seeds": seeds, "n_init": n_init})
        spec = None
        if saved is None and not done[first] and bool(_rc(rc, "setup-at-handshake")):
            spec = _setup_spec(cfg, copts, alg.name, seeds[first])  # None when r depends on the views' widths
        view_info: dict = {}
        pins_path = str(rc.get("node-pins", "") or "") or None  # the launcher's pins file (node auth)
        node_ids = handshake(grid, m, job_id=job_ids[first], timeout=node_timeout, poll=max(poll, 0.05),
                             recorder=recorder, info=view_info, setup=spec,
                             pins=read_pins(pins_path) if pins_path else None,
                             retired=read_retired(pins_path) if pins_path else frozenset())
        setup_extra, rank_message = {}, None
        if copts:  # the rank rule, settled from c and the d_p the nodes reported
            r, rank_message = fclust.resolve_rank_at_handshake(copts, view_info, m)
            # rank-rule "auto" pads narrow views to r on their nodes: only the other rules need r <= d_p
            check_views_at_handshake(view_info, node_ids, 1 if copts["rank_rule"] == "auto" else r)
            cfg = cfg.replace(n_components=r)
            setup_extra = fclust.setup_scalars(copts)
        else:
            check_views_at_handshake(view_info, node_ids, cfg.n_components)  # r <= d_p, before round 1
        t_hs = time.perf_counter() - t0
        at_hello = {p: (v["setup"], v["setup_bytes"]) for p, v in view_info.items() if "setup" in v}
        transport = FlowerTransport(grid, node_ids, job_id=job_ids[first], round_timeout=round_timeout, poll=poll,
                                    recorder=recorder, startup_timeout=startup_timeout, pins_path=pins_path,
                                    setup_scalars=setup_extra, on_exchange=status.exchange_started,
                                    setup_at_hello=(spec, at_hello) if spec else None,
                                    ids_digests={p: v[codec.IDS_DIGEST] for p, v in view_info.items()
                                                 if codec.IDS_DIGEST in v})
        # a clustering fit stops as the estimator's does: tol, or the server's k-means of V settled
        cancel = threading.Event()  # fits at once: set when one has failed, the others end at their next round

        def fit(i: int, tr: FlowerTransport, at_once: bool):
            """Fit i over ``tr`` (its own transport when the fits run at once); saved in its folder."""
            run_info = {"algorithm": alg.name, "config": cfg.to_dict(), "seed": seeds[i], "n_clients": m,
                        "job_id": job_ids[i]}
            resume = None
            prior = saved if i == first else checkpoint_of(i)  # an interrupted fit continues from its own
            if prior is not None:
                ckpt.check_resume_matches(prior, run_info)  # after the rank rule: r is part of the config
                resume = (prior.state, prior.history)
            if at_once:
                status.fits_started({i: prior.completed_rounds if prior is not None else 0})
            else:
                if prior is not None:
                    last_round["completed"] = prior.completed_rounds
                    last_state["state"] = prior.state
                current["checkpoint"] = ckpt_dirs[i]
                status.write(**({"restart": i, "round": 0} if n_init > 1 else {}),
                             rounds_done=prior.completed_rounds if prior is not None else 0)

            def on_round_end(state, history, ckpt_dir=ckpt_dirs[i]):
                ckpt.save_server_checkpoint(ckpt_dir, state, history, run_info)
                if at_once:
                    status.fit_round_done(i, state.round - 1, history.rows[-1]["seconds"])
                    if cancel.is_set():  # another fit failed: this one stops here, resumable
                        raise _FitCancelled
                else:
                    last_round["completed"] = state.round - 1
                    last_state["state"] = state
                    status.round_done(state.round - 1, history.rows[-1]["seconds"])

            # a clustering fit stops on the server's step (no upload for it); a factorisation on R/R1,
            # whose diagnostic arrays (as large as the upload) go up only when tol > 0
            stop = (stop_rule(copts["early_stop"], copts["n_clusters"], seed=seeds[i], tol=tol,
                              normalize_embedding=copts["normalize_embedding"]) if copts else None)
            res = run_federation(tr, alg, cfg, max_rounds=max_rounds, tol=0.0 if copts else tol, seed=seeds[i],
                                 on_round_end=on_round_end, resume=resume, participation=participation,
                                 stop_rule=stop, residuals=False)
            if copts:
                warn_unsettled(res, tol)
            res.extra["flower"] = {
                "node_ids": node_ids, "job_id": job_ids[i], "run_id": int(context.run_id),
                "handshake_seconds": t_hs, "wire_bytes": list(tr.wire_bytes),
                "resumed_from_round": resume[0].round if resume else None,
                "started_at": status.data["started_at"], "round1_started_at": status.data["round1_started_at"],
            }
            if participation is not None:
                res.extra["flower"]["dropped"] = list(tr.dropped)
            if n_init > 1:  # a finished restart: read back by a resume instead of being fitted again
                save_npy_atomic(_inside(restart_dirs[i] / "V.npy", out), res.V)
                _write_json(restart_dirs[i] / "result.json", res.to_json_dict())
            if at_once:
                status.fit_finished(i)
            else:
                last_round["completed"] = 0
            return res

        # per restart: its FitResult, run here or read back from its folder (a resume)
        fits: list = [_read_fit(restart_dirs[i]) if done[i] else None for i in range(n_init)]
        fit_rows: list = [transport.wire_bytes]  # per fit (or all fits, one after the other), its exchanges
        todo = [i for i in range(n_init) if not done[i]]
        # the fits are independent (their own seeds, jobs and node state): without partial participation
        # (whose node adoption is the run's, not a fit's) they run at once, each in a thread with its
        # own transport, and a node gets the fits' messages of a round in one batch (BatchingGrid) --
        # the rounds' fixed latency is paid once, not n_init times; each fit sends and computes exactly
        # what it would alone, so the fits, the kept one and the labels are the same
        at_once = len(todo) > 1 and participation is None
        if not at_once:
            for i in todo:
                transport.job_id = job_ids[i]
                if i > first:
                    transport.setup_at_hello = None  # the hellos set up the first fit only
                fits[i] = fit(i, transport, False)
        else:
            shared = BatchingGrid(grid, senders=len(todo))  # a node gets one message per round, not one per fit
            tps = [transport.for_fit(job_ids[i], grid=shared, share=len(todo),
                                     setup_at_hello=transport.setup_at_hello if i == first else None) for i in todo]
            status.write(n_restarts=n_init, restart=None, fits_running=todo)
            failures: list[tuple[int, BaseException]] = []  # in the order they happened

            def fit_thread(i: int, tr: FlowerTransport):
                try:
                    return fit(i, tr, True)
                except _FitCancelled:
                    raise
                except BaseException as exc:
                    failures.append((i, exc))  # list.append: atomic, no lock needed
                    cancel.set()
                    raise
                finally:
                    shared.leave()  # the other fits' pushes no longer wait for this one's

            pool = ThreadPoolExecutor(len(todo), thread_name_prefix="fedsonmf-fit")
            try:
                futures = [pool.submit(fit_thread, i, tr) for i, tr in zip(todo, tps)]
                wait(futures)  # after a failure the others end at their next round's end
            except BaseException:
                cancel.set()  # Ctrl-C in this thread: the fits' threads stop at their next round
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            pool.shutdown()
            transport.wire_bytes = [w for tr in tps for w in tr.wire_bytes]  # the fits' exchanges, in fit order
            fit_rows = [list(tr.wire_bytes) for tr in tps]
            if failures:  # the first failure is the run's; the status names its fit and checkpoint
                failed, error = failures[0]
                current["checkpoint"] = ckpt_dirs[failed]
                last_round["completed"] = int(status.data.get("fit_rounds", {}).get(str(failed), 0))
                status.write(restart=failed)
                raise error
            for i, f in zip(todo, futures):
                fits[i] = f.result()

        def keep(res) -> None:
            """The fit kept: its V saved, the wire counts of the whole run in its report."""
            res.extra["flower"]["wire_bytes"] = transport.wire_bytes  # every restart's and the refinement's
            if participation is not None:
                res.extra["flower"]["dropped"] = transport.dropped
            save_npy_atomic(_inside(out / "V.npy", out), res.V)

        if not copts:  # a factorisation: its one fit
            res = fits[0]
            keep(res)
        else:
            kept: dict = {}

            def exchanges(best: int) -> dict:
                """The kept fit saved, the nodes pointed at its bases, the stages' exchanges."""
                kept["res"] = fits[best]
                keep(fits[best])
                if n_init > 1:  # the refinement and later predict runs use the kept fit's bases
                    transport.job_id = job_ids[best]
                    last_state["state"] = ckpt.load_server_checkpoint(ckpt_dirs[best]).state
                status.write(phase="clustering")
                # the nodes' refine-min-cluster-size: as announced at their hellos, then as learnt from refusals
                announced = [int(view_info.get(p, {}).get(nodeconfig.MIN_CLUSTER_SIZE, 1)) for p in range(m)]
                for p, k in transport.min_cluster_sizes.items():  # a node adopted for view p: the stricter
                    announced[p] = max(announced[p], int(k))
                # incomplete views: each node's sample ids, as the server knows them from the masked setup
                held = None if last_state["state"] is None else alg.reply_columns(last_state["state"], range(m))
                policy = fclust.NodePolicy(copts["n_clusters"], announced, held)
                spectral = (fclust.spectral_exchange(transport, m, cfg.secure_aggregation)
                            if "graph" in stages and copts["refine_spectral_steps"] > 0 else None)
                graph, both = (fclust.graph_exchange(transport, m, copts["n_clusters"], cfg.secure_aggregation,
                                                     policy=policy, products=spectral)
                               if "graph" in stages else (None, None))
                return {"policy": policy, "graph": graph, "spectral": spectral, "both": both,
                        "refine": (fclust.refine_exchange(transport, m, copts["n_clusters"], cfg.secure_aggregation,
                                                          policy) if "kmeans" in stages else None)}

            best, labels, centers, km, report = cluster_fits([f.V for f in fits], seeds, copts["n_clusters"],
                                                             opts=copts, results=list(fits), exchanges=exchanges)
            res = kept["res"]
            restarts = None if n_init == 1 else {
                "n_init": n_init, "seeds": seeds, "best_restart": best,
                "objectives": [F if np.isfinite(F) else None  # JSON: null when not reported
                               for F in map(final_objective, fits)],
                "n_rounds": [int(f.n_rounds) for f in fits]}
            res.extra["clustering"] = {**fclust.write_outputs(out, res.V, copts, labels, centers, km, report),
                                       "rank_message": rank_message, **({"restarts": restarts} if restarts else {})}
        counts = exchange_counts(fit_rows, [w for w in transport.wire_bytes if w["kind"] not in FIT_KINDS],
                                 at_once=at_once, hellos=1 + transport.late_hellos)
        res.extra["flower"]["exchanges"] = counts
        _write_json(out / "result.json", res.to_json_dict())
        status.write(status="completed", phase="done", n_rounds=res.n_rounds, seconds=time.perf_counter() - t0,
                     exchange_counts=counts)
    except BaseException as exc:
        info = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                "last_completed_round": last_round["completed"], "checkpoint": str(current["checkpoint"]),
                "traceback": traceback.format_exc(limit=5)}
        if isinstance(exc, FederationError):
            info.update(client=exc.client, round=exc.round, node_id=exc.node_id)
        stopped = (isinstance(exc, RunStopped) and exc.external) or isinstance(exc, RunNotRunningException)
        if stopped or (isinstance(exc, FederationError) and _run_stopped(grid)):
            info.update(stopped_status(last_round["completed"]))
        status.write(**info)
        raise


def _run_stopped(grid) -> bool:
    """Whether the run was stopped from outside (``flwr stop``): the SuperLink deletes a stopped run's
    objects, so a reply being pulled at that moment comes back unavailable and the exchange fails
    naming its client; one more request tells the two apart (Flower's client raises
    ``RunNotRunningException`` once the run is not running)."""
    try:
        grid.get_node_ids()
    except RunNotRunningException:
        return True
    except Exception:  # noqa: BLE001 - no answer: the failure stands as it was
        return False
    return False


def _predict_main(grid: Grid, context: Context, out: Path) -> None:
    """A ``predict`` run: one ``embed`` exchange with the fitted bases held fixed (:mod:`.clustering`).

    Reads the fit's ``result.json`` and ``centers.npy`` from ``model-dir``; writes
    ``labels.csv``, ``V.npy`` (r x n_new) and ``result.json`` to ``out-dir``.
    """
    from fedsonmf.core.server import embed_new_samples

    rc = context.run_config
    status = StatusFile(out / "status.json", run_id=int(context.run_id), pid=os.getpid(), mode="predict",
                        max_rounds=0)
    t0 = time.perf_counter()
    try:
        model = Path(str(rc.get("model-dir", "") or ""))
        if not (model / "result.json").is_file() or not (model / "centers.npy").is_file():
            raise ValueError(f"run config 'model-dir' = {str(model)!r} holds no fitted clustering "
                             "(result.json + centers.npy of a clustering run)")
        fit = json.loads((model / "result.json").read_text())
        opts, job_id = fit["clustering"], str(fit["flower"]["job_id"])
        centers = np.load(model / "centers.npy")
        m = int(fit["config"]["n_clients"])
        poll = float(_rc(rc, "poll-interval"))
        recorder = WireRecorder(_inside(out / "wire.jsonl", out)) if bool(rc.get("record-wire", False)) else None
        pins_path = str(rc.get("node-pins", "") or "") or None  # the launcher's pins file (node auth)
        node_ids = handshake(grid, m, job_id=job_id, timeout=float(_rc(rc, "node-timeout")),
                             poll=max(poll, 0.05), recorder=recorder,
                             pins=read_pins(pins_path) if pins_path else None,
                             retired=read_retired(pins_path) if pins_path else frozenset())
        transport = FlowerTransport(grid, node_ids, job_id=job_id, round_timeout=float(_rc(rc, "round-timeout")),
                                    poll=poll, recorder=recorder,
                                    startup_timeout=float(rc.get("startup-timeout", 0.0) or 0.0) or None)
        status.write(phase="embed")
        mu = float(fit["config"]["mu_value"])
        secure = bool(fit["config"].get("secure_aggregation", False))
        # under secure aggregation (the fit's setting) the server learns only the sum of the
        # nodes' U_p^T X_p^new, which is all the embedding needs: a key step, then the masked sum
        first = Message("embed", 0, {}, {fclust.EMBED_SECAGG_SEED: secrets.randbits(31)} if secure else {})
        replies = transport.exchange([first for _ in range(m)])
        ns = {int(rep.scalars["n"]) for rep in replies}
        if len(ns) != 1:
            raise FederationError(f"the nodes' new-sample files hold different numbers of samples: {sorted(ns)}")
        check_same_ids({p: {k: v for k, v in rep.scalars.items() if k == codec.IDS_DIGEST}
                        for p, rep in enumerate(replies)}, transport.node_ids, "new-sample file")
        if secure:
            V = _masked_embedding(transport, replies, m, mu)
        else:
            V = embed_new_samples([rep.arrays["UtX"] for rep in replies], mu)
        labels = assign_to_centers(V.T, centers, normalize_embedding=bool(opts["normalize_embedding"]))
        save_npy_atomic(_inside(out / "V.npy", out), V)
        fclust.write_labels_csv(out / "labels.csv", labels)
        _write_json(out / "result.json", {"mode": "predict", "model_dir": str(model), "job_id": job_id,
                                          "n_samples": int(V.shape[1]), "n_components": int(V.shape[0]),
                                          "wire_bytes": transport.wire_bytes, "seconds": time.perf_counter() - t0,
                                          "exchanges": exchange_counts([], transport.wire_bytes)})
        status.write(status="completed", phase="done", seconds=time.perf_counter() - t0,
                     exchange_counts=exchange_counts([], transport.wire_bytes))
    except BaseException as exc:
        status.write(status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=5))
        raise


def _masked_embedding(transport: FlowerTransport, key_replies: list[Message], m: int, mu: float) -> np.ndarray:
    """The embedding of new samples from the masked sum of the nodes' ``U_p^T X_p^new``:
    ``P_{mu/2}(sum / m)`` (:func:`fedsonmf.core.server.embed_new_samples` on the mean)."""
    from fedsonmf.core.server import embed_new_samples
    from fedsonmf.federation import secagg

    try:
        pks = [str(rep.scalars["secagg_pk"]) for rep in key_replies]
        exp = max(int(rep.scalars["secagg_exp"]) for rep in key_replies)
    except KeyError:
        raise ProtocolError("secure predict: a node answered the key step without a public key") from None
    bits = secagg.server_bits(fclust.EMBED_SPEC, exp, 0.0, m)
    sigs = [str(rep.scalars.get(secagg.SIG_KEY, "")) for rep in key_replies]  # nodes with pinned signing keys
    params = secagg.params_json(list(range(m)), bits, nonce=secrets.token_hex(8), public_keys=pks,
                                **({"signatures": sigs} if any(sigs) else {}))
    replies = transport.exchange([Message("embed-sum", 0, {}, {secagg.SECAGG_KEY: params}) for _ in range(m)])
    agg = secagg.aggregate_masked(replies, range(m), "embed", 0, bits)
    return embed_new_samples([np.asarray(agg.sums["UtX"]) / m], mu)


def make_server_app() -> ServerApp:
    """A fresh ServerApp whose main is :func:`server_main`."""
    server = ServerApp()

    def main(grid: Grid, context: Context) -> None:
        server_main(grid, context)

    server.main()(main)
    return server


# the installed app (what the gate's executors run, and the shim app imports)
app = make_server_app()
