"""The Flower ServerApp: runs :func:`fedsonmf.federation.run_federation` over a
:class:`~fedsonmf.federation.flower.transport.FlowerTransport`.

It owns the round loop (no Flower ``Strategy``): waits for one node per view,
maps node -> view with a handshake, aggregates in view order, checkpoints the
server state after every round, and writes its outputs to ``out-dir`` on the
SuperLink host:

``status.json``      {"status": "running"|"completed"|"failed", "error", "client", "round", ...}
``result.json``      config, seed, per-round history, stopping reason, timings, wire bytes
``V.npy``            the final V (r x n)
``checkpoint/``      server state + history after the last completed round (resume)
``wire.jsonl``       every message that crossed the wire (``record-wire = true``)

Run-config keys are those of the shipped app template (:mod:`.template`).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import RunNotRunningException

from fedsonmf._io import private_dir, save_npy_atomic, write_json_atomic
from fedsonmf.algorithms import get_algorithm
from fedsonmf.exceptions import FederationError, RunStopped
from fedsonmf.federation import checkpoint as ckpt
from fedsonmf.federation.flower.security import read_pins, read_retired
from fedsonmf.federation.flower.transport import (
    FlowerTransport,
    WireRecorder,
    check_views_at_handshake,
    handshake,
)
from fedsonmf.federation.loop import run_federation
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import json_default
from fedsonmf.protocol.params import FLOWER_SECURE_AGGREGATION, default
from fedsonmf.protocol.participation import Participation

__all__ = ["app", "make_server_app", "server_main", "config_from_run_config"]


def config_from_run_config(rc) -> FedConfig:
    """The run's FedConfig: ``config-json`` when set, else the individual keys."""
    text = str(rc.get("config-json", "") or "")
    if text:
        cfg = ckpt.config_from_dict(json.loads(text))
    else:
        mu = rc.get("mu", default("mu"))
        cfg = FedConfig(
            n_components=int(rc.get("rank", default("n_components"))),
            mu=mu if isinstance(mu, str) else float(mu), mu_scale=float(rc.get("mu-scale", default("mu_scale"))),
            alpha=float(rc.get("alpha", default("alpha"))), tau=int(rc.get("tau", default("tau"))),
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
    return Participation(min_clients=mc, sample=sc, rejoin=str(rc.get("rejoin", "server")))


def _write_json(path: Path, obj) -> None:
    write_json_atomic(_inside(path, path.parent), obj, default=json_default)


#: set by the launcher for the SuperLink host's executor: out-dirs must lie below it
OUT_ROOT_ENV = "FEDSONMF_OUT_ROOT"


def _inside(path: Path, root: Path) -> Path:
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


def server_main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    out = str(rc.get("out-dir", "") or "")
    if not out:
        raise ValueError("run config 'out-dir' is empty: give an absolute directory on the SuperLink host")
    out = resolve_out_dir(out)
    status_path = out / "status.json"
    cfg = config_from_run_config(rc)
    alg = get_algorithm(str(rc.get("algorithm", "fedsonmf")))
    m = int(rc["num-clients"])
    job_id = str(rc.get("job-id", "") or "") or f"run{context.run_id}"
    seed = int(rc.get("seed", 0))
    max_rounds, tol = int(rc.get("num-rounds", 10)), float(rc.get("tol", 0.0))
    round_timeout, poll = float(rc.get("round-timeout", 300.0)), float(rc.get("poll-interval", 0.02))
    node_timeout = float(rc.get("node-timeout", 120.0))
    # node start-up (handshake + the setup exchange) has its own timeout, separate from the round timeout
    startup_timeout = float(rc.get("startup-timeout", 0.0) or 0.0) or node_timeout
    participation = participation_from_run_config(rc)
    ckpt_dir = _inside(out / "checkpoint", out)
    run_info = {"algorithm": alg.name, "config": cfg.to_dict(), "seed": seed, "n_clients": m, "job_id": job_id}
    recorder = None
    if bool(rc.get("record-wire", False)):
        recorder = WireRecorder(_inside(out / "wire.jsonl", out),
                                arrays_dir=_inside(out / "wire-arrays", out) if bool(rc.get("record-wire-arrays", False))
                                else None)
    status = {"status": "running", "run_id": int(context.run_id), "job_id": job_id, "pid": os.getpid()}
    _write_json(status_path, status)
    t0 = time.perf_counter()
    last_round = {"completed": 0}
    try:
        resume = None
        if bool(rc.get("resume", False)):
            saved = ckpt.load_server_checkpoint(ckpt_dir)
            ckpt.check_resume_matches(saved, run_info)
            if not str(rc.get("job-id", "") or ""):  # the clients' state files are named by the job id
                job_id = run_info["job_id"] = status["job_id"] = str(saved.run["job_id"])
            resume = (saved.state, saved.history)
            last_round["completed"] = saved.completed_rounds
        view_info: dict = {}
        pins_path = str(rc.get("node-pins", "") or "") or None  # the launcher's pins file (node auth)
        node_ids = handshake(grid, m, job_id=job_id, timeout=node_timeout, poll=max(poll, 0.05), recorder=recorder,
                             info=view_info, pins=read_pins(pins_path) if pins_path else None,
                             retired=read_retired(pins_path) if pins_path else frozenset())
        check_views_at_handshake(view_info, node_ids, cfg.n_components)  # r <= d_p, before round 1
        t_hs = time.perf_counter() - t0
        transport = FlowerTransport(grid, node_ids, job_id=job_id, round_timeout=round_timeout, poll=poll,
                                    recorder=recorder, startup_timeout=startup_timeout, pins_path=pins_path)

        def on_round_end(state, history):
            ckpt.save_server_checkpoint(ckpt_dir, state, history, run_info)
            last_round["completed"] = state.round - 1

        res = run_federation(transport, alg, cfg, max_rounds=max_rounds, tol=tol, seed=seed,
                             on_round_end=on_round_end, resume=resume, participation=participation)
        save_npy_atomic(_inside(out / "V.npy", out), res.V)
        res.extra["flower"] = {
            "node_ids": node_ids, "job_id": job_id, "run_id": int(context.run_id),
            "handshake_seconds": t_hs, "wire_bytes": transport.wire_bytes,
            "resumed_from_round": resume[0].round if resume else None,
        }
        if participation is not None:
            res.extra["flower"]["dropped"] = transport.dropped
        _write_json(out / "result.json", res.to_json_dict())
        _write_json(status_path, {**status, "status": "completed", "n_rounds": res.n_rounds,
                                  "seconds": time.perf_counter() - t0})
    except BaseException as exc:
        info = {**status, "status": "failed", "error": f"{type(exc).__name__}: {exc}",
                "last_completed_round": last_round["completed"], "checkpoint": str(ckpt_dir),
                "traceback": traceback.format_exc(limit=5)}
        if isinstance(exc, FederationError):
            info.update(client=exc.client, round=exc.round, node_id=exc.node_id)
        if (isinstance(exc, RunStopped) and exc.external) or isinstance(exc, RunNotRunningException):
            info.update(stopped_status(last_round["completed"]))
        _write_json(status_path, info)
        raise


def make_server_app() -> ServerApp:
    """A fresh ServerApp whose main is :func:`server_main`."""
    server = ServerApp()
    server.main()(server_main)
    return server


app = make_server_app()
