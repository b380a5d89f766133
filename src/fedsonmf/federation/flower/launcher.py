"""Loopback launcher: one SuperLink and one SuperNode per view as separate
processes on 127.0.0.1, a ``flwr run`` of the shipped app, and the result.

Everything lives in one run folder::

    <run_dir>/flwr-home/      FLWR_HOME (config.toml with the "fedsonmf" connection, installed FABs)
    <run_dir>/app/            the shim Flower app (written fresh; nothing else goes here)
    <run_dir>/nodes/p<i>/     node-local state of SuperNode i (state files), its log
    <run_dir>/server/         the ServerApp's out-dir: status.json, result.json, V.npy, checkpoint/
    <run_dir>/logs/           superlink.log, flwr-run-<k>.log
    <run_dir>/job.json        job id and run config (reused by ``resume``)

Telemetry, update checks and run-time dependency installation are switched off,
BLAS is pinned to one thread (bit-identical results across engines), and
:meth:`LoopbackDeployment.stop` stops exactly the process groups it started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedsonmf.exceptions import FlowerRunError, InputError, ParameterError
from fedsonmf.federation.flower.template import (
    RUN_CONFIG_DEFAULTS,
    _toml_value,
    write_app_dir,
)
from fedsonmf.protocol.history import FitResult, History, json_default
from fedsonmf.protocol.params import default

__all__ = ["LoopbackDeployment", "RunOutcome", "FlowerRunError", "flower_env", "run_flower", "load_result",
           "write_views", "write_masks", "check_inputs", "predict_flower", "PredictOutcome", "CLUSTERING_DEFAULTS"]

CONNECTION = "fedsonmf"


def flower_env(flwr_home, *, pin_threads: bool = True, log_level: str = "WARNING",
               superexec_poll: float = 0.05) -> dict:
    """Environment of every process the launcher starts."""
    env = dict(os.environ)
    env.update({
        "FLWR_HOME": str(flwr_home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(superexec_poll),
        "FLWR_LOG_LEVEL": log_level,
        "PYTHONUNBUFFERED": "1",
    })
    if pin_threads:
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[k] = "1"
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


@dataclass
class RunOutcome:
    """What one ``flwr run`` left behind: the ServerApp's status and where its outputs are."""

    status: dict
    out_dir: Path
    wall_seconds: float
    log: Path
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status.get("status") == "completed"


class LoopbackDeployment:
    """A SuperLink and one SuperNode per view on loopback, each its own process group.

    Parameters
    ----------
    run_dir : path
        The run folder (created).
    view_paths : list of path
        View p's file (``.npy`` (n_samples, d_p) or sparse ``.npz``) for SuperNode p.
    pin_threads : bool
        OMP/OpenBLAS/MKL threads = 1 in every process.
    log_level : str
        FLWR_LOG_LEVEL of the daemons.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, run_dir, view_paths, *, pin_threads: bool = True, log_level: str = "WARNING",
                 superexec_poll: float = 0.05, tls: tuple | None = None, mask_paths=None, predict_paths=None):
        #: (ca.crt, server.pem, server.key) for TLS on loopback (the certificate must name 127.0.0.1)
        self.tls = tuple(str(Path(t).resolve()) for t in tls) if tls else None
        self.run_dir = Path(run_dir).resolve()
        self.view_paths = [Path(p).resolve() for p in view_paths]
        #: optional per-view availability masks (node config ``mask-path``, §15.1)
        self.mask_paths = [None if m is None else Path(m).resolve() for m in (mask_paths or [None] * len(view_paths))]
        #: optional per-view files of new samples (node config ``predict-path``; a predict run reads them)
        self.predict_paths = [None if q is None else Path(q).resolve()
                              for q in (predict_paths or [None] * len(view_paths))]
        self.flwr_home = self.run_dir / "flwr-home"
        self.env = flower_env(self.flwr_home, pin_threads=pin_threads, log_level=log_level,
                              superexec_poll=superexec_poll)
        self.superlink: subprocess.Popen | None = None
        self.nodes: dict[int, subprocess.Popen] = {}
        self.port: int | None = None
        self._node_ports: dict[int, int] = {}
        self._runs = 0
        self.startup_seconds: float | None = None

    # ------------------------------------------------------------------ processes
    def _spawn(self, args: list[str], log: Path) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(log, "ab")
        try:
            return subprocess.Popen(args, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.run_dir)
        finally:
            fh.close()

    def start(self, timeout: float = 60.0) -> "LoopbackDeployment":
        t0 = time.perf_counter()
        for p in self.view_paths:
            if not p.is_file():
                raise FileNotFoundError(f"view file {p} does not exist")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        (self.flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\n'
            + (f'root-certificates = "{self.tls[0]}"\n' if self.tls else "insecure = true\n"))
        security = (["--ssl-ca-certfile", self.tls[0], "--ssl-certfile", self.tls[1], "--ssl-keyfile", self.tls[2]]
                    if self.tls else ["--insecure"])
        self.superlink = self._spawn(
            [_bin("flower-superlink"), *security, "--host", "127.0.0.1", "--port", str(self.port),
             "--disable-runtime-dependency-installation"],
            self.run_dir / "logs" / "superlink.log")
        self._wait_health(timeout)
        for p in range(len(self.view_paths)):
            self.start_node(p)
        self.startup_seconds = time.perf_counter() - t0
        return self

    def _wait_health(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/health"
        ctx = None
        if self.tls:
            import ssl

            ctx = ssl.create_default_context(cafile=self.tls[0])
        while time.monotonic() < deadline:
            if self.superlink.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with code {self.superlink.returncode}; "
                                   f"see {self.run_dir / 'logs' / 'superlink.log'}")
            try:
                with urllib.request.urlopen(url, timeout=1.0, context=ctx) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"SuperLink not healthy at {url} after {timeout:g} s")

    def node_dir(self, p: int) -> Path:
        return self.run_dir / "nodes" / f"p{p}"

    def start_node(self, p: int) -> subprocess.Popen:
        """Start (or restart) the SuperNode of view ``p``."""
        if p in self.nodes and self.nodes[p].poll() is None:
            raise RuntimeError(f"SuperNode {p} is already running")
        port = self._node_ports.get(p) or _free_port()
        self._node_ports[p] = port
        ndir = self.node_dir(p)
        (ndir / "state").mkdir(parents=True, exist_ok=True)
        node_config = (f'partition-id={p} num-partitions={len(self.view_paths)} '
                       f'data-path="{self.view_paths[p]}" state-dir="{ndir / "state"}"'
                       + (f' mask-path="{self.mask_paths[p]}"' if self.mask_paths[p] is not None else "")
                       + (f' predict-path="{self.predict_paths[p]}"' if self.predict_paths[p] is not None else ""))
        self.nodes[p] = self._spawn(
            [_bin("flower-supernode"), *(["--root-certificates", self.tls[0]] if self.tls else ["--insecure"]),
             "--superlink", f"127.0.0.1:{self.port}",
             "--port", str(port), "--node-config", node_config],
            ndir / "supernode.log")
        return self.nodes[p]

    def kill_node(self, p: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to SuperNode ``p``'s process group (its ClientApp processes too)."""
        proc = self.nodes[p]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop exactly the process groups this object started (TERM, then KILL)."""
        procs = [p for p in list(self.nodes.values()) + [self.superlink] if p is not None]
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            # the group may still hold children (flwr-clientapp) after the leader exits
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if proc.poll() is None:
                proc.wait(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ runs
    def run(self, run_config: dict, *, out_dir=None, app_dir=None, timeout: float = 1800.0,
            progress=None, poll: float = 0.5) -> RunOutcome:
        """``flwr run`` the app with ``run_config`` (keys of the app template) and wait for it.

        ``out_dir`` defaults to ``<run_dir>/server``; ``app_dir`` to a freshly
        written shim app in ``<run_dir>/app``.  Returns the ServerApp's status;
        raises only when the run could not be submitted or did not end in ``timeout``.
        ``progress(status)`` is called with the ServerApp's ``status.json`` (see
        :class:`~fedsonmf.federation.flower.server_app.StatusFile`) whenever it changed,
        polled every ``poll`` seconds while the run goes on.
        """
        self._runs += 1
        out_dir = Path(out_dir or self.run_dir / "server").resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
        status_path = out_dir / "status.json"
        if status_path.exists():
            status_path.unlink()
        if app_dir is None:
            app_dir = write_app_dir(self.run_dir / "app")
        conf = {"num-clients": len(self.view_paths), **run_config, "out-dir": str(out_dir)}
        unknown = sorted(set(conf) - set(RUN_CONFIG_DEFAULTS) - set(_app_config_keys(app_dir)))
        if unknown:
            raise ValueError(f"unknown run-config keys {unknown}; known: {sorted(RUN_CONFIG_DEFAULTS)}")
        overrides = self.run_dir / "logs" / f"run-config-{self._runs}.toml"
        overrides.parent.mkdir(parents=True, exist_ok=True)
        overrides.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in conf.items()))
        log = self.run_dir / "logs" / f"flwr-run-{self._runs}.log"
        t0 = time.perf_counter()
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream", "--run-config", str(overrides)],
                env=self.env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.run_dir)
            try:
                _wait_polling(proc, timeout, status_path, progress, poll)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise TimeoutError(f"flwr run did not finish within {timeout:g} s; see {log}") from None
        # --stream exits 0 even when the ServerApp fails: the status file is the truth
        status = _read_status(status_path)
        deadline = time.monotonic() + 10
        while status.get("status") in (None, "running") and time.monotonic() < deadline:
            time.sleep(0.2)
            status = _read_status(status_path)
        if not status:
            status = {"status": "failed",
                      "error": f"the ServerApp wrote no status (flwr run exit code {proc.returncode}); see {log}"}
        if progress is not None:
            progress(status)
        return RunOutcome(status, out_dir, time.perf_counter() - t0, log)


def _wait_polling(proc: subprocess.Popen, timeout: float, status_path: Path, progress, poll: float) -> None:
    """Wait for ``proc``; meanwhile hand every new ``status.json`` to ``progress``."""
    if progress is None:
        proc.wait(timeout=timeout)
        return
    deadline, last = time.monotonic() + timeout, None
    while True:
        st = _read_status(status_path)
        if st and st.get("updated_at") != last:
            last = st.get("updated_at")
            progress(st)
        try:
            proc.wait(timeout=max(0.0, min(poll, deadline - time.monotonic())))
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise


def _app_config_keys(app_dir) -> list[str]:
    import tomllib

    data = tomllib.loads((Path(app_dir) / "pyproject.toml").read_text())
    return list(data["tool"]["flwr"]["app"]["config"])


def _read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def load_result(out_dir) -> FitResult:
    """The FitResult of a completed Flower run from its out-dir (V.npy + result.json)."""
    out_dir = Path(out_dir)
    d = json.loads((out_dir / "result.json").read_text())
    hist = History(d["history"], R0=d.get("R0"))
    extra = {k: v for k, v in d.items() if k not in
             ("config", "seed", "n_rounds", "converged", "stopping_reason", "seconds", "R0", "history")}
    return FitResult(V=np.load(out_dir / "V.npy"), bases=None, history=hist, n_rounds=d["n_rounds"],
                     stopping_reason=d["stopping_reason"], converged=d["converged"], seed=d["seed"],
                     config=d["config"], seconds=d["seconds"], extra=extra)


def write_masks(masks, directory) -> list[Path | None]:
    """Save availability masks (bool, length n; None = complete) beside the views: ``view<p>.mask.npy``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for p, mk in enumerate(masks):
        if mk is None:
            out.append(None)
            continue
        path = directory / f"view{p}.mask.npy"
        np.save(path, np.asarray(mk))
        out.append(path)
    return out


def write_views(views, directory) -> list[Path]:
    """Save views (each (n_samples, d_p), dense or sparse) as one file per view."""
    import scipy.sparse as sp

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for p, X in enumerate(views):
        if sp.issparse(X):
            path = directory / f"view{p}.npz"
            sp.save_npz(path, sp.csr_matrix(X))
        else:
            path = directory / f"view{p}.npy"
            np.save(path, np.asarray(X, dtype=np.float64))
        paths.append(path)
    return paths


def _view_file_shape(path) -> tuple[int, int]:
    """(n_samples, n_features) of a view file, read from its header (no data loaded for .npy)."""
    path = Path(path)
    try:
        if path.suffix == ".npz":
            import scipy.sparse as sp

            shape = sp.load_npz(path).shape
        else:
            shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
    except FileNotFoundError:
        raise FileNotFoundError(f"view file {path} does not exist") from None
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"view file {path} cannot be read: {type(exc).__name__}: {exc}") from None
    if len(shape) != 2:
        raise InputError(f"view file {path} holds an array of shape {shape}, expected (n_samples, n_features)")
    return int(shape[0]), int(shape[1])


#: options of a clustering run (``run_flower(..., clustering=...)``) and their defaults (the estimator's)
CLUSTERING_DEFAULTS = {"rank": "auto", "preprocess": default("preprocess"),
                       "normalize_views": default("normalize_views"),
                       "normalize_embedding": default("normalize_embedding"),
                       "kmeans_n_init": default("kmeans_n_init"), "kmeans_max_iter": default("kmeans_max_iter")}


def check_inputs(view_paths, n_components: int | None = None, *, n_clusters: int | None = None,
                 mask_paths=None, predict_paths=None) -> list[tuple[int, int]]:
    """Check the view files before any process starts; their ``(n_samples, d_p)`` shapes.

    Raises :class:`~fedsonmf.exceptions.InputError` naming the file for a missing or
    unreadable file, an array that is not 2-D, views with different n, a rank above a
    view's width (``n_components``; a clustering run's rank rule pads or caps instead)
    or more clusters than samples.
    """
    if not view_paths:
        raise InputError("no view files given: one file per client (view)")
    for kind, paths in (("view", view_paths), ("mask", mask_paths or []), ("new-sample", predict_paths or [])):
        for path in paths:
            if path is not None and not Path(path).is_file():
                raise InputError(f"{kind} file {path} does not exist")
    try:
        shapes = [_view_file_shape(p) for p in view_paths]
    except FileNotFoundError as exc:
        raise InputError(str(exc)) from None
    if n_components is not None:
        _check_view_files(view_paths, n_components)
    ns = {s[0] for s in shapes}
    if len(ns) > 1:
        raise InputError(f"the view files hold different numbers of samples (rows): {[s[0] for s in shapes]}")
    if n_clusters is not None and not 1 <= int(n_clusters) <= min(ns):
        raise InputError(f"n_clusters={n_clusters} must be between 1 and the number of samples ({min(ns)})")
    return shapes


def _check_view_files(view_paths, n_components: int) -> None:
    shapes = [_view_file_shape(p) for p in view_paths]
    ns = [s[0] for s in shapes]
    if len(set(ns)) > 1:
        raise InputError(f"the view files hold different numbers of samples (rows): {ns}")
    for p, (path, (_, d)) in enumerate(zip(view_paths, shapes)):
        if d < n_components:
            raise InputError(
                f"n_components={n_components} is larger than view {p}'s number of features ({d}, file {path}); "
                "a nonnegative orthonormal basis needs n_features >= n_components"
            )


def _clustering_run_config(n_clusters: int, clustering: dict | None) -> dict:
    opts = {**CLUSTERING_DEFAULTS, **(clustering or {})}
    unknown = sorted(set(opts) - set(CLUSTERING_DEFAULTS))
    if unknown:
        raise ParameterError(f"unknown clustering options {unknown}; known: {sorted(CLUSTERING_DEFAULTS)}")
    rank = opts["rank"]
    if not (rank in ("auto", "auto-cap", "paper") or (isinstance(rank, int) and not isinstance(rank, bool)
                                                         and rank >= 1)):
        raise ParameterError(f"clustering rank must be 'auto', 'auto-cap', 'paper' or a positive integer, got {rank!r}")
    return {"n-clusters": int(n_clusters), "rank-rule": str(rank), "preprocess": str(opts["preprocess"]),
            "normalize-views": bool(opts["normalize_views"]), "normalize-embedding": bool(opts["normalize_embedding"]),
            "kmeans-n-init": int(opts["kmeans_n_init"]), "kmeans-max-iter": int(opts["kmeans_max_iter"])}


def _update_result_json(out_dir: Path, extra: dict) -> None:
    path = out_dir / "result.json"
    d = json.loads(path.read_text())
    d.update(extra)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(d, indent=1, default=json_default))
    os.replace(tmp, path)


def run_flower(view_paths, cfg, *, run_dir, algorithm: str = "fedsonmf", max_rounds: int = 10, tol: float = 0.0,
               seed: int = 0, resume: bool = False, round_timeout: float = 300.0, node_timeout: float = 120.0,
               record_wire: bool = False, pin_threads: bool = True, timeout: float = 3600.0,
               tls: tuple | None = None, startup_timeout: float | None = None, mask_paths=None,
               participation=None, n_clusters: int | None = None, clustering: dict | None = None,
               labels=None, progress=None) -> FitResult:
    """Run a federation on a loopback Flower deployment and return its result.

    Starts a SuperLink and one SuperNode per file in ``view_paths``, runs
    ``max_rounds`` rounds of ``algorithm`` with ``cfg`` (a FedConfig; its
    ``diagnostics`` switch is honoured), and stops every process it started.
    ``resume=True`` continues the run saved in ``run_dir`` (same job id) and
    ends with the same V as an uninterrupted run.  Raises
    :class:`FlowerRunError` naming the client and round when the run fails.
    The result's ``extra["flower"]`` holds start-up and wire numbers, among them
    ``time_to_round1`` (seconds from this call to the start of round 1).
    ``tls = (ca.crt, server.pem, server.key)`` runs the loopback deployment over TLS.
    ``startup_timeout``: seconds for the nodes' start-up (the setup exchange),
    separate from ``round_timeout``; None uses ``node_timeout``.

    The views' files are checked (:func:`check_inputs`: present, 2-D, equal n, r <= d_p)
    before any process starts (:class:`~fedsonmf.exceptions.InputError`); the ServerApp
    checks them again at the handshake.

    ``mask_paths`` (one per view, None = complete; see :func:`write_masks`) are the
    nodes' availability masks (§15.1); ``participation`` (a
    :class:`~fedsonmf.protocol.participation.Participation`) enables partial rounds (§15.2).
    ``progress(status)`` is called with the ServerApp's ``status.json`` as the run goes
    (phase, round k of K, seconds per round; :class:`.server_app.StatusFile`).

    Clustering (``n_clusters = c``): the pipeline of
    :class:`~fedsonmf.estimators.clustering.FedMultiViewClustering` with its options
    ``clustering = {"rank": "auto"|"auto-cap"|"paper"|int, "preprocess", "normalize_views",
    "normalize_embedding", "kmeans_n_init", "kmeans_max_iter"}`` (defaults: the
    estimator's).  ``cfg.n_components`` is replaced by the rank rule (settled at the
    handshake from c and the nodes' d_p); each node preprocesses its own view; the
    ServerApp runs k-means on the final V with ``seed`` and writes ``labels.csv``
    (``sample_id,cluster``, ids 0..n-1 = the rows of the view files) and ``centers.npy``.
    The result then also holds ``extra["labels"]`` (n,), ``extra["cluster_centers"]``
    (c, r) and ``extra["clustering"]`` (options, r, sizes); with ``labels`` (the true
    classes, length n) ``extra["scores"]`` = ACC/NMI/purity, also written to result.json.
    Our choice: the true labels never enter the federation -- this function (the
    submitting side) scores the labels the server wrote.  Same seed and rounds: labels
    and V equal the in-process estimator's (BLAS pinned, as here).
    """
    import warnings

    t_launch = time.time()
    if mask_paths is not None and n_clusters is not None:
        raise ParameterError("clustering over Flower does not support incomplete views (mask_paths)")
    check_inputs(view_paths, None if n_clusters is not None else cfg.n_components, n_clusters=n_clusters,
                 mask_paths=mask_paths)
    if labels is not None and n_clusters is None:
        raise ParameterError("labels (to score against) need n_clusters")
    cluster_rc = _clustering_run_config(n_clusters, clustering) if n_clusters is not None else {}
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file = run_dir / "job.json"
    if resume:
        if not job_file.is_file():
            raise FlowerRunError(f"nothing to resume in {run_dir} (no job.json)")
        job_id = json.loads(job_file.read_text())["job-id"]
    else:
        job_id = f"job-{uuid.uuid4().hex[:12]}"
    run_config = {
        "algorithm": algorithm, "num-rounds": int(max_rounds), "tol": float(tol), "seed": int(seed),
        "config-json": json.dumps(cfg.to_dict()), "diagnostics": bool(cfg.diagnostics), "job-id": job_id,
        "resume": bool(resume), "round-timeout": float(round_timeout), "node-timeout": float(node_timeout),
        "startup-timeout": float(startup_timeout or 0.0),
        "record-wire": bool(record_wire), **cluster_rc,
    }
    if participation is not None:
        run_config.update({"min-clients": float(participation.min_clients or 0),
                           "sample-clients": float(participation.sample or 0), "rejoin": participation.rejoin})
    job_file.write_text(json.dumps({"job-id": job_id, "run-config": run_config,
                                    "views": [str(Path(p).resolve()) for p in view_paths]}, indent=1))
    t0 = time.perf_counter()
    with LoopbackDeployment(run_dir, view_paths, pin_threads=pin_threads, tls=tls, mask_paths=mask_paths) as dep:
        outcome = dep.run(run_config, timeout=timeout, progress=progress)
    wall = time.perf_counter() - t0
    if not outcome.ok:
        st = outcome.status
        raise FlowerRunError(f"Flower run failed: {st.get('error')} (last completed round "
                             f"{st.get('last_completed_round')}; resume with resume=True)", st)
    res = load_result(outcome.out_dir)
    fl = res.extra.setdefault("flower", {})
    fl.update({"startup_seconds": dep.startup_seconds, "flwr_run_seconds": outcome.wall_seconds,
               "wall_seconds": wall, "run_dir": str(run_dir), "launched_at": t_launch})
    if fl.get("round1_started_at") is not None:
        fl["time_to_round1"] = float(fl["round1_started_at"]) - t_launch
    if n_clusters is not None:
        from fedsonmf.federation.flower.clustering import read_labels_csv

        found = read_labels_csv(outcome.out_dir / "labels.csv")
        res.extra["labels"] = found
        res.extra["cluster_centers"] = np.load(outcome.out_dir / "centers.npy")
        message = res.extra.get("clustering", {}).get("rank_message")
        if message:
            warnings.warn(message, UserWarning, stacklevel=2)
        if labels is not None:
            from fedsonmf.metrics import clustering_scores

            y = np.asarray(labels).ravel()
            if y.size != found.size:
                raise InputError(f"{y.size} labels for {found.size} samples")
            res.extra["scores"] = clustering_scores(y, found)
            _update_result_json(outcome.out_dir, {"scores": res.extra["scores"]})
    return res


@dataclass
class PredictOutcome:
    """What :func:`predict_flower` returns: the new samples' ``labels`` (n_new,), their
    embedding ``V`` (r, n_new) and the out-dir (``labels.csv``, ``V.npy``, ``result.json``)."""

    labels: np.ndarray
    V: np.ndarray
    out_dir: Path
    wall_seconds: float


def predict_flower(view_paths, new_view_paths, *, run_dir, out_dir=None, round_timeout: float = 300.0,
                   node_timeout: float = 120.0, record_wire: bool = False, pin_threads: bool = True,
                   timeout: float = 1800.0, tls: tuple | None = None, progress=None) -> PredictOutcome:
    """Assign new samples to the clusters of the clustering run saved in ``run_dir`` (one exchange).

    Starts the loopback deployment again on the same node folders (each node keeps its
    fitted transform and basis there), with ``new_view_paths[p]`` as node p's
    ``predict-path`` (the node config names the file a node reads, never the run config).
    Each node sends ``U_p^T X_p^new`` (r x n_new) of its preprocessed new samples; the
    server embeds them with the bases fixed and picks the nearest fitted centre -- the
    in-process ``FedMultiViewClustering.predict``, bit for bit.  ``out_dir`` defaults to
    ``<run_dir>/predict``.
    """
    run_dir = Path(run_dir).resolve()
    model = run_dir / "server"
    if not (model / "centers.npy").is_file():
        raise InputError(f"{run_dir} holds no clustering run (no server/centers.npy): fit with n_clusters first")
    if len(new_view_paths) != len(view_paths):
        raise InputError(f"{len(new_view_paths)} files of new samples for {len(view_paths)} views")
    fitted = [d for _, d in check_inputs(view_paths)]
    widths = [d for _, d in check_inputs(new_view_paths)]
    if widths != fitted:
        raise InputError(f"the new samples' files have {widths} features per view, the fitted views {fitted}")
    out_dir = Path(out_dir or run_dir / "predict").resolve()
    rc = {"mode": "predict", "model-dir": str(model), "round-timeout": float(round_timeout),
          "node-timeout": float(node_timeout), "record-wire": bool(record_wire)}
    with LoopbackDeployment(run_dir, view_paths, pin_threads=pin_threads, tls=tls,
                            predict_paths=new_view_paths) as dep:
        outcome = dep.run(rc, out_dir=out_dir, timeout=timeout, progress=progress)
    if not outcome.ok:
        raise FlowerRunError(f"Flower predict run failed: {outcome.status.get('error')}", outcome.status)
    from fedsonmf.federation.flower.clustering import read_labels_csv

    return PredictOutcome(read_labels_csv(out_dir / "labels.csv"), np.load(out_dir / "V.npy"), out_dir,
                          outcome.wall_seconds)
