"""Flower's simulation engine: the shipped app, many simulated clients on one machine.

:func:`run_simulation` runs the same ServerApp and ClientApp as a deployment
(:func:`~.launcher.run_flower`), but every client is a virtual node of Flower's
simulation engine (Ray actors) instead of a SuperNode process.  Simulated nodes
have only ``partition-id``/``num-partitions`` in their node config, so the run
config ``sim-data-dir`` names the folder of view files (``view<p>.<ext>``, one per
partition); :mod:`.nodeconfig` has the rule and why it cannot redirect a real node.

The route, and why: ``flwr run <app> <connection> --federation-config
"num-supernodes=N ..."`` (the CLI, as a Flower user runs it) against a simulation
SuperLink (``flower-superlink --simulation``) that :class:`SimulationSuperLink`
starts in its own session on a free loopback port, with TLS under a CA of its own, behind the gate
(:mod:`.gate`: only the pinned app, only the signed run), and stops again.  Our choice
over the two alternatives: the CLI's managed ``:local:`` SuperLink is detached and
outlives ``flwr run`` (docs/flower.md, "Flower behaviours"), and ``flwr.simulation.run_simulation`` is
deprecated in flwr 1.42 and passes an empty run config.

Everything lives in one run folder::

    <run_dir>/flwr-home/   FLWR_HOME (config.toml with the "fedsonmf-sim" connection, installed FAB)
    <run_dir>/app/         the app (written fresh by write_app_dir)
    <run_dir>/views/       the sim-data-dir: view<p>.* (written or linked), .fedsonmf-state/p<p>/ (node state)
    <run_dir>/server/      the ServerApp's out-dir: status.json, result.json, V.npy
    <run_dir>/logs/        superlink.log, gate-simulation.log, flwr-run.log, run-config.toml
    <run_dir>/gate/        the gate's files (0700): coordinator key, SuperExec secret, pin, ledger,
                           tls/ (this SuperLink's own CA certificate, server certificate and key)

Needs Ray: ``pip install ".[simulation]"`` (``flwr[simulation]``, ≈220 MB).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from fedsonmf._io import new_private_dir, write_atomic
from fedsonmf.exceptions import FlowerRunError, InputError
from fedsonmf.federation import deployment_defaults as dd
from fedsonmf.federation.budget import resolve_budget
from fedsonmf.federation.flower import security as sec
from fedsonmf.federation.flower.deployment import (
    STARTUP_TIMEOUT,
    _bin,
    _free_port,
    _gate,
    _read_status,
    exit_on_sigterm,
    flower_env,
    restore_sigterm,
    wait_health,
)
from fedsonmf.federation.flower.launcher import load_result
from fedsonmf.federation.flower.nodeconfig import SIM_DATA_DIR, sim_view_path
from fedsonmf.federation.flower.supervisor import Supervisor
from fedsonmf.federation.flower.template import RUN_CONFIG_DEFAULTS, _toml_value, write_app_dir
from fedsonmf.federation.flower.viewfiles import _check_view_files, write_views
from fedsonmf.protocol.history import FitResult

__all__ = ["SimulationSuperLink", "run_simulation", "simulation_run_config", "federation_config"]

CONNECTION = "fedsonmf-sim"
#: seconds for a simulation's handshake: it includes Ray's start-up and one message per client
#: (our choice, more than a deployment's ``node-timeout``)
SIM_NODE_TIMEOUT = 300.0


def _tail(path: Path, n: int = 25) -> str:
    """The last ``n`` lines of a log file ("" if unreadable)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class SimulationSuperLink:
    """``flower-superlink --simulation`` on a free loopback port, in its own session, behind the gate.

    Runs submitted to it execute in Flower's simulation engine, but only the runs
    :meth:`authorise` signed: the SuperLink starts with ``--isolation process`` and a fresh
    SuperExec secret (0600), and our gate executor (:mod:`.gate`, role ``simulation``) is the
    only process that can take its tasks.  It refuses any app bundle but the pinned one and any
    run config the per-run coordinator key did not sign, before anything reads a view: a
    loopback port is open to every local user, and a stock simulation SuperLink runs whatever
    app anyone submits, as the user who started it, with the views' folder in its run config.

    :meth:`stop` ends the SuperLink, the executor and every process descended from them
    (the simulation child and the Ray processes), in parallel (:class:`~.supervisor.Supervisor`).
    Telemetry, update checks, run-time dependency installation and Ray's usage statistics are off;
    Ray gets its own short temporary folder (removed by :meth:`stop`) and
    never joins another Ray instance on the machine.
    """

    def __init__(self, run_dir, *, pin_threads: bool = True, log_level: str = "WARNING"):
        self.run_dir = Path(run_dir).resolve()
        self.flwr_home = self.run_dir / "flwr-home"
        self.env = flower_env(self.flwr_home, pin_threads=pin_threads, log_level=log_level)
        self.env.update({
            "RAY_ADDRESS": "local",              # always a new Ray instance, never one started by `ray start`
            "RAY_USAGE_STATS_ENABLED": "0",      # Ray reports usage statistics to a remote server by default
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        })
        self.proc: subprocess.Popen | None = None
        #: starts and stops the SuperLink, the executor and ``flwr run`` (:mod:`.supervisor`)
        self.supervisor = Supervisor(grace=15.0)
        self.executor: subprocess.Popen | None = None
        self.port: int | None = None
        self.tls: tuple[str, str, str] | None = None  # (ca.crt, server.pem, server.key) once started
        self.ray_tmp: Path | None = None
        self.log = self.run_dir / "logs" / "superlink.log"
        self.gate_dir = self.run_dir / "gate"
        self._authority: Any = None  # gate.Authority once started
        self._pinned: set[str] = set()

    def start(self, timeout: float = STARTUP_TIMEOUT) -> SimulationSuperLink:
        """Start the SuperLink in simulation mode and wait until it answers (an event, with a ceiling)."""
        self._term = exit_on_sigterm()  # until stop(): a TERMed launcher stops these daemons too
        atexit.register(self.stop)
        for folder in (self.run_dir, self.flwr_home, self.log.parent):
            new_private_dir(folder)
        self.port = _free_port()
        gate = _gate()
        new_private_dir(self.gate_dir)
        # TLS with a CA of this SuperLink alone, in a 0700 folder: another local user's stock `flwr`
        # (ls, log, stop, run) cannot even connect to the Control API, which has no authentication
        # in Flower OSS (a client that skips certificate checks still can: the gate is the defence)
        self.tls = sec.make_tls(self.gate_dir / "tls", ["127.0.0.1"]).as_tuple()
        sec.write_connection(self.flwr_home, CONNECTION, f"127.0.0.1:{self.port}", self.tls[0])
        # Ray's unix sockets live in its temp dir: keep the path short (AF_UNIX paths are <= 107 bytes)
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="fedsonmf-ray-"))
        self.env["RAY_TMPDIR"] = str(self.ray_tmp)
        authority = self._authority = gate.Authority.create(self.gate_dir / "coordinator.key")  # 0600
        gate.write_secret(self.gate_dir / "superexec.secret")
        gate.write_pin(self.gate_dir / "pin.json", sorted(self._pinned), authority.public_key)
        self.proc = self.supervisor.start(
            [_bin("flower-superlink"), "--simulation",
             *sec.superlink_args("127.0.0.1", self.port, self.tls, auth=False),
             *sec.gate_daemon_args(self.gate_dir / "superexec.secret")],
            log=self.log, env=self.env, cwd=self.run_dir)
        try:
            wait_health(self.proc, self.port, timeout, self.log, ca_cert=self.tls[0],
                        what="flower-superlink --simulation")
            env = {**self.env, "FEDSONMF_OUT_ROOT": str(self.run_dir)}  # the ServerApp writes only there
            self.executor = self.supervisor.start(
                gate.executor_argv("simulation", f"127.0.0.1:{self.port}", self.gate_dir,
                                   parent_pid=self.proc.pid, root_certificates=self.tls[0]),
                log=self.run_dir / "logs" / "gate-simulation.log", env=env, cwd=self.run_dir)
        except BaseException:
            self.stop()  # __exit__ does not run when __enter__ raises
            raise
        return self

    def authorise(self, app_dir, run_config: dict) -> dict:
        """Pin the FAB that ``flwr run app_dir`` submits (Flower's builder is deterministic) and
        return ``run_config`` signed for it (the gate token: single-use, bound to the whole config)."""
        if self._authority is None:
            raise RuntimeError("start the SuperLink first")
        gate = _gate()
        fab_hash = gate.fab_sha256(gate.build_fab(app_dir))
        if fab_hash not in self._pinned:
            self._pinned.add(fab_hash)
            gate.write_pin(self.gate_dir / "pin.json", sorted(self._pinned), self._authority.public_key)
        return gate.sign_run_config(self._authority, fab_hash, dict(run_config))

    def stop(self) -> None:
        """Stop the SuperLink, the executor and their descendants in parallel (TERM, one grace
        period, KILL); remove Ray's temp folder."""
        atexit.unregister(self.stop)
        restore_sigterm(getattr(self, "_term", None))
        self._term = None
        self.supervisor.close()
        if self.ray_tmp is not None:
            shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def simulation_alive(self) -> bool:
        """True while a simulation (the gate's ``--simulation-task`` child) runs under this SuperLink."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        for pid in self.supervisor.descendants([p for p in (self.proc, self.executor) if p is not None]):
            try:
                if b"--simulation-task" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:
                continue
        return False

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def federation_config(n_clients: int, *, cpus_per_client: int = 1) -> str:
    """``--federation-config`` of a simulation with ``n_clients`` virtual nodes (one Ray actor per
    ``cpus_per_client`` CPUs; Flower's default is 2 CPUs per client)."""
    return (f"num-supernodes={int(n_clients)} client-resources-num-cpus={int(cpus_per_client)} "
            f'init-args-logging-level="ERROR" init-args-log-to-driver=false')


def simulation_run_config(cfg, *, n_clients: int, sim_data_dir, out_dir, algorithm: str = "fedsonmf",
                          max_rounds: int | None = None, tol: float | None = None, seed: int = dd.SEED,
                          job_id: str | None = None, round_timeout: float = dd.ROUND_TIMEOUT,
                          node_timeout: float = SIM_NODE_TIMEOUT,
                          record_wire: bool = False) -> dict:
    """The run config (keys of the app template) of a simulation run.

    Parameters
    ----------
    cfg : FedConfig
        The run's configuration (sent as ``config-json``).
    n_clients : int
        Virtual nodes, one per view.
    sim_data_dir, out_dir : path
        The folder of ``view<p>.*`` files, and the ServerApp's out-dir.
    algorithm : str, default="fedsonmf"
        A name of :data:`fedsonmf.algorithms.ALGORITHMS`.
    max_rounds, tol : int, float or None, default=None
        The budget (:func:`~fedsonmf.federation.budget.resolve_budget`).
    seed : int, default=0
        The run seed.
    job_id : str or None, default=None
        Names the nodes' state files; None = a fresh one.
    round_timeout, node_timeout : float, default=300.0, 300.0
        Seconds for a round's replies and for the handshake (which includes Ray's start-up).
    record_wire : bool, default=False
        The server writes ``wire.jsonl``.

    Returns
    -------
    dict
    """
    max_rounds, tol = resolve_budget(cfg, max_rounds, tol)
    rc = {
        "num-clients": int(n_clients), "algorithm": algorithm, "num-rounds": int(max_rounds), "tol": float(tol),
        "seed": int(seed), "config-json": json.dumps(cfg.to_dict()), "diagnostics": bool(cfg.diagnostics),
        "job-id": job_id or f"sim-{uuid.uuid4().hex[:12]}", "round-timeout": float(round_timeout),
        "node-timeout": float(node_timeout), "record-wire": bool(record_wire),
        "out-dir": str(Path(out_dir).resolve()), SIM_DATA_DIR: str(Path(sim_data_dir).resolve()),
    }
    unknown = sorted(set(rc) - set(RUN_CONFIG_DEFAULTS))
    if unknown:  # pragma: no cover - a programming error
        raise ValueError(f"unknown run-config keys {unknown}")
    return rc


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _view_dir(views, run_dir: Path) -> tuple[Path, int]:
    """The sim-data-dir for ``views`` and the number of views.

    A folder is used as it is (its ``view0.*, view1.*, ...``; state goes into it);
    arrays are written to ``<run_dir>/views``; file paths are linked there as
    ``view<p><suffix>`` (never copied).
    """
    if isinstance(views, (str, os.PathLike)):
        folder = Path(views).resolve()
        if not folder.is_dir():
            raise InputError(f"{folder} is not a folder of view files view0.*, view1.*, ...")
        found = {int(p.stem[4:]) for p in folder.iterdir() if re.fullmatch(r"view\d+", p.stem) and p.is_file()}
        if not found:
            raise InputError(f"{folder} holds no view file view0.<ext>")
        missing = sorted(set(range(max(found) + 1)) - found)
        if missing:
            raise InputError(f"{folder} has view files up to view{max(found)} but none for partitions {missing}")
        return folder, len(found)
    views = list(views)
    if not views:
        raise InputError("no views given")
    folder = new_private_dir(run_dir / "views")
    for old in folder.iterdir():  # this folder is the driver's: drop the previous run's view files
        if old.name.startswith("view") and (old.is_symlink() or old.is_file()):
            old.unlink()
    if all(isinstance(v, (str, os.PathLike)) for v in views):
        for p, src in enumerate(views):
            src = Path(src).resolve()
            if not src.is_file():
                raise FileNotFoundError(f"view file {src} does not exist")
            (folder / f"view{p}{''.join(src.suffixes[-1:])}").symlink_to(src)
    else:
        write_views(views, folder)
    return folder, len(views)


def run_simulation(views, cfg, *, run_dir, algorithm: str = "fedsonmf", max_rounds: int | None = None,
                   tol: float | None = None, seed: int = dd.SEED, cpus_per_client: int = 1,
                   round_timeout: float = dd.ROUND_TIMEOUT,
                   node_timeout: float = SIM_NODE_TIMEOUT, record_wire: bool = False, pin_threads: bool = True,
                   timeout: float = 3600.0) -> FitResult:
    """Run a federation in Flower's simulation engine, one virtual node per view, and return its result.

    Parameters
    ----------
    views : list of array-like or sparse of shape (n_samples, d_p), list of paths, or a folder
        The views: arrays are written to ``<run_dir>/views``; view files are linked there;
        a folder must hold ``view0.<ext>, view1.<ext>, ...`` (``.npy`` or sparse ``.npz``)
        and also receives the nodes' state (``.fedsonmf-state/``).
    cfg : FedConfig
        Hyper-parameters (``cfg.diagnostics`` is honoured).
    run_dir : path
        The run folder (created).
    algorithm : str, default="fedsonmf"
        A name of :data:`fedsonmf.algorithms.ALGORITHMS`.
    max_rounds, tol : int, float or None, default=None
        The budget; None = the parameter table's defaults
        (:func:`~fedsonmf.federation.budget.resolve_budget`).
    seed : int, default=0
        The run seed (a run config needs a number).
    cpus_per_client : int
        Ray CPUs per virtual node: the engine runs ``cores // cpus_per_client`` clients at a time.
    pin_threads : bool
        BLAS threads = 1 in every process: the result then equals ``run_inprocess`` under
        ``threadpool_limits(1)`` bit for bit.
    record_wire : bool
        The server writes ``<run_dir>/server/wire.jsonl`` (:func:`~.audit.audit_wire`).
    node_timeout, round_timeout, timeout : float
        Seconds for the handshake (it includes Ray's start-up and one message per client; our choice
        300 s, more than a deployment's 120 s), for one round, for the whole run.

    Returns the :class:`FitResult` of :func:`~.launcher.load_result`, the same as
    :func:`~.launcher.run_flower`; ``extra["flower"]`` holds ``engine="simulation"``,
    ``startup_seconds`` (start until round 1 begins), ``superlink_seconds``,
    ``flwr_run_seconds``, ``wall_seconds``, ``run_dir`` and ``ray_tmp`` (Ray's
    temporary folder, already removed).  Raises
    :class:`FlowerRunError` naming the client and round when the run fails.
    Every process it started (SuperLink, simulation, Ray) is stopped on return.
    """
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # else flwr-simulation exits (code 701) before any ServerApp runs
        raise ImportError("Flower's simulation engine needs Ray: pip install \"fedsonmf[simulation]\" "
                          "(from a checkout: pip install \".[simulation]\")")
    t0 = time.perf_counter()
    max_rounds, tol = resolve_budget(cfg, max_rounds, tol)
    run_dir = Path(run_dir).resolve()
    new_private_dir(run_dir)
    sim_dir, m = _view_dir(views, run_dir)
    _check_view_files([sim_view_path(sim_dir, p) for p in range(m)], cfg.n_components)
    out_dir = run_dir / "server"
    new_private_dir(out_dir)
    for stale in ("status.json", "result.json", "V.npy"):
        (out_dir / stale).unlink(missing_ok=True)
    app_dir = write_app_dir(run_dir / "app")
    rc = simulation_run_config(cfg, n_clients=m, sim_data_dir=sim_dir, out_dir=out_dir, algorithm=algorithm,
                               max_rounds=max_rounds, tol=tol, seed=seed, round_timeout=round_timeout,
                               node_timeout=node_timeout, record_wire=record_wire)
    logs = run_dir / "logs"
    new_private_dir(logs)
    overrides = logs / "run-config.toml"
    log = logs / "flwr-run.log"
    with SimulationSuperLink(run_dir, pin_threads=pin_threads) as link:
        rc = link.authorise(app_dir, rc)  # the gate runs this run, and only this one
        write_atomic(overrides, "".join(f"{k} = {_toml_value(v)}\n" for k, v in rc.items()))
        t_link = time.perf_counter() - t0
        t1 = time.perf_counter()
        proc = link.supervisor.start(
            [_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream", "--run-config", str(overrides),
             "--federation-config", federation_config(m, cpus_per_client=cpus_per_client)],
            log=log, log_mode="wb", env=link.env, cwd=run_dir)
        try:
            t_server = None  # when the ServerApp wrote its first status (it starts the handshake next)
            # ``timeout`` limits stalls, not the run: it restarts whenever status.json changes
            deadline, stamp = time.monotonic() + timeout, None
            while proc.poll() is None:
                if t_server is None and (out_dir / "status.json").exists():
                    t_server = time.perf_counter() - t0
                if _read_status(out_dir / "status.json").get("status") in ("completed", "failed"):
                    break  # final, and written after the last output: flwr run only streams teardown
                now = _mtime(out_dir / "status.json")
                if now != stamp:
                    stamp, deadline = now, time.monotonic() + timeout
                if time.monotonic() > deadline:
                    link.supervisor.kill(proc)
                    raise TimeoutError(f"flwr run made no progress (status.json unchanged) for {timeout:g} s; "
                                       f"see {log}")
                time.sleep(0.05)
        finally:
            link.supervisor.stop([proc], grace=1.0)  # ended, reaped, its group gone, on every path
        flwr_run_seconds = time.perf_counter() - t1
        # `flwr run` returning says neither that the run succeeded (--stream exits 0 when the ServerApp
        # fails) nor that it is over (the log stream can end early): the ServerApp's status file is the
        # truth, and the run is over when it is final or no flwr-simulation process is left
        status, grace = _read_status(out_dir / "status.json"), None
        while status.get("status") not in ("completed", "failed") and time.monotonic() < deadline:
            if link.simulation_alive():
                grace = None
            elif grace is None:
                grace = time.monotonic() + 10.0
            elif time.monotonic() > grace:
                break
            time.sleep(0.2)
            status = _read_status(out_dir / "status.json")
    wall = time.perf_counter() - t0
    if status.get("status") != "completed":
        why = status.get("error") or (
            f"the ServerApp {'stopped in state ' + repr(status.get('status')) if status else 'wrote no status'} "
            f"(flwr run exit code {proc.returncode})")
        status = {**status, "status": "failed", "error": why}
        raise FlowerRunError(f"Flower simulation failed: {why} (last completed round "
                             f"{status.get('last_completed_round')}); see {log} and {link.log}\n"
                             f"--- end of {log.name}:\n{_tail(log)}", status)
    res = load_result(out_dir)
    info = res.extra.setdefault("flower", {})
    setup_seconds = res.seconds - sum(float(r.get("seconds", 0.0)) for r in res.history.rows)
    info.update({
        "engine": "simulation", "num_supernodes": m, "superlink_seconds": t_link,
        "flwr_run_seconds": flwr_run_seconds, "wall_seconds": wall, "run_dir": str(run_dir),
        "server_start_seconds": t_server, "setup_seconds": setup_seconds, "ray_tmp": str(link.ray_tmp),
        # until round 1 began: SuperLink, submission, Ray and ServerApp start, handshake, setup exchange
        "startup_seconds": (t_server or 0.0) + float(info.get("handshake_seconds", 0.0)) + setup_seconds,
    })
    return res
