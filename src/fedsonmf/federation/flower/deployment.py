"""The loopback deployment: one SuperLink and one SuperNode per view as separate
processes on 127.0.0.1, and a ``flwr run`` of the shipped app on them.

:func:`~.launcher.run_flower` and :func:`~.launcher.predict_flower` drive it; the view
files it serves are checked by :mod:`.viewfiles`.

The run folder's layout is described in :mod:`.launcher`.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsonmf._io import private_dir, write_atomic, write_json_atomic
from fedsonmf.exceptions import FlowerRunError, InputError
from fedsonmf.federation.flower import security as sec
from fedsonmf.federation.flower.supervisor import Supervisor
from fedsonmf.federation.flower.template import (
    RUN_CONFIG_DEFAULTS,
    _toml_value,
    write_app_dir,
)

__all__ = ["LoopbackDeployment", "RunOutcome", "InsecureDeploymentWarning", "flower_env", "superlink_exit_report",
           "failure_message", "CONNECTION"]

CONNECTION = "fedsonmf"
#: the node loops a deployment can run (see :class:`LoopbackDeployment`)
NODE_LOOPS = ("fedsonmf", "flower")
#: ceiling (s) of the wait for the SuperLink's ``/health`` (an event; a dead SuperLink fails at once)
STARTUP_TIMEOUT = 600.0
#: ceiling (s) of the wait for the ServerApp's final status after ``flwr run`` returned
FINAL_STATUS_TIMEOUT = 120.0

InsecureDeploymentWarning = sec.InsecureDeploymentWarning


def flower_env(flwr_home, *, pin_threads: bool = True, log_level: str = "WARNING",
               superexec_poll: float = 0.05) -> dict:
    """Environment of every process the launcher starts.

    Parameters
    ----------
    flwr_home : path
        ``FLWR_HOME`` (the connection config and the installed FABs).
    pin_threads : bool, default=True
        OMP/OpenBLAS/MKL threads = 1 (bit-identical results across engines).
    log_level : str, default="WARNING"
        ``FLWR_LOG_LEVEL``.
    superexec_poll : float, default=0.05
        ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` in seconds.

    Returns
    -------
    dict
        This process's environment with telemetry, update checks and run-time installs off,
        and this interpreter's ``bin`` first on ``PATH``.
    """
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


def _gate():
    # imported on use: ``python -m fedsonmf.federation.flower.gate`` must not find it imported already
    from fedsonmf.federation.flower import gate

    return gate


def wait_health(proc: subprocess.Popen, port: int, timeout: float, log, *, ca_cert=None,
                what: str = "flower-superlink") -> None:
    """Poll the loopback SuperLink's ``/health`` on ``port`` until it answers 200 (an event): over
    HTTPS verified against ``ca_cert`` when given, else plain HTTP.  Fail at once when ``proc`` (the
    SuperLink) exits, and with TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    url = f"{'https' if ca_cert else 'http'}://127.0.0.1:{int(port)}/health"
    context = ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=1.0, context=context) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} not healthy at {url}; see {log}")


def exit_on_sigterm():
    """While a deployment runs, SIGTERM raises :class:`SystemExit` in the launching process's main thread,
    so that its ``with`` block (or ``try/finally``) stops the daemons it started.

    The SuperLink, the SuperNodes and their executors lead their own sessions (a Ctrl-C in the terminal
    reaches only the launcher, which then stops them), so a launcher ended by TERM with the default
    action left them all running.  Returns the handler to restore (:func:`restore_sigterm`), or None
    when nothing was installed: off the main thread, or when TERM already has a handler of its own
    (or is ignored), which is kept."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    return signal.SIG_DFL


def restore_sigterm(previous) -> None:
    """Undo :func:`exit_on_sigterm` (``previous``: what it returned)."""
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


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
        """The ServerApp reported ``completed``."""
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
    tls : True, False or (ca.crt, server.pem, server.key), default=True
        True (or None): a fresh per-deployment CA and a certificate for 127.0.0.1
        (``<run_dir>/security/tls``); a tuple: your own files (the certificate must
        name 127.0.0.1; the key must be mode 0600); False: plain HTTP (warns).
    auth : bool, default=True
        SuperNode authentication: one ECDSA key pair per node (created 0600),
        registered with ``flwr supernode register``; each view pinned to its node's
        key (the ServerApp refuses other nodes).  Needs TLS (Flower refuses
        authentication over plain HTTP).  False warns.
    require_secure_aggregation : bool, default=True
        Every node's policy (node config ``require-secure-aggregation``): True refuses runs
        whose uploads are not masked, as a real organisation's node does by default; False for a
        plain run (``run_flower`` passes the run's own choice).
    server_app : str or None, default=None
        ``module:attr`` of an installed ServerApp the SuperLink host's gate runs instead of
        fedsonmf's (the nodes do not trust it: tests run a hostile one).
    node_loop : {"fedsonmf", "flower"} or None, default=None
        What serves each view: ``"fedsonmf"``, the project's node loop (one process per node,
        :mod:`.nodeloop`: Flower's Fleet connection, the gate's checks, the ClientApp in
        process, pulls that wait on the SuperLink rather than fixed sleeps; a trivial exchange in
        0.3-0.7 s on a loaded 2-core machine); ``"flower"``, Flower's ``flower-supernode`` with the gate executor
        (its loop sleeps 3 s after every empty pull: ≈ 4.5 s per exchange).  None: the
        environment's ``FEDSONMF_NODE_LOOP``, else ``"fedsonmf"``.  Both keep every security
        property (TLS, node keys and pins, the gate, signed single-use tokens).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, run_dir, view_paths, *, pin_threads: bool = True, log_level: str = "WARNING",
                 superexec_poll: float = 0.05, tls: tuple | bool | None = True, auth: bool = True, mask_paths=None,
                 client_app: str | None = None, predict_paths=None, require_secure_aggregation: bool = True,
                 server_app: str | None = None,
                 node_loop: str | None = None):
        node_loop = node_loop or os.environ.get("FEDSONMF_NODE_LOOP") or "fedsonmf"
        if node_loop not in NODE_LOOPS:
            raise InputError(f"node_loop must be one of {', '.join(NODE_LOOPS)}, got {node_loop!r}")
        #: "fedsonmf" (the project's node loop) or "flower" (flower-supernode + the gate executor)
        self.node_loop = node_loop
        #: (ca.crt, server.pem, server.key) as strings, or None (plain HTTP)
        self.tls: tuple[str, str, str] | None
        if tls is None:
            tls = True
        if auth and tls is False:
            raise InputError("SuperNode authentication needs TLS (flower-superlink refuses --enable-supernode-auth "
                             "with --insecure): pass auth=False with tls=False")
        if isinstance(tls, (tuple, list)):
            if len(tls) != 3:
                raise InputError(f"tls must be (ca.crt, server.pem, server.key), got {len(tls)} paths")
            ca, cert = (Path(t).expanduser().resolve() for t in tls[:2])
            for what, f in (("TLS CA certificate", ca), ("TLS server certificate", cert)):
                if not f.is_file():
                    raise InputError(f"{what} {f} does not exist")
            key = sec.check_private_file(tls[2], "TLS server key")
            self.tls = (str(ca), str(cert), str(key))
            self._make_tls = False
        else:
            self.tls = None
            self._make_tls = bool(tls)
        self.auth = bool(auth)
        self.run_dir = Path(run_dir).resolve()
        self.security_dir = self.run_dir / "security"
        #: the pins file named in every run config (``node-pins``) when ``auth``
        self.pins_path = self.security_dir / "pins.json" if self.auth else None
        self.view_paths = [Path(p).resolve() for p in view_paths]
        #: optional per-view availability masks (node config ``mask-path``, §15.1)
        self.mask_paths = [None if m is None else Path(m).resolve() for m in (mask_paths or [None] * len(view_paths))]
        #: optional per-view files of new samples (node config ``predict-path``; a predict run reads them)
        self.predict_paths = [None if q is None else Path(q).resolve()
                              for q in (predict_paths or [None] * len(view_paths))]
        self.require_secure_aggregation = bool(require_secure_aggregation)
        self.flwr_home = self.run_dir / "flwr-home"
        self.env = flower_env(self.flwr_home, pin_threads=pin_threads, log_level=log_level,
                              superexec_poll=superexec_poll)
        self.superlink: subprocess.Popen | None = None
        self.nodes: dict[int, subprocess.Popen] = {}
        self.port: int | None = None
        self._node_ports: dict[int, int] = {}
        #: view -> its node's key and registration (node id, fingerprint); a restart re-keys
        self.node_keys: dict[int, sec.NodeKey] = {}
        self.pins: dict[int, sec.Pin] = {}
        #: node ids of replaced keys (restarts): ignored by the handshake while the SuperLink still lists them
        self.retired: set[int] = set()
        self._key_generation: dict[int, int] = {}
        self._runs = 0
        self.startup_seconds: float | None = None
        #: the node operator's ClientApp (``module:attr``, installed); None = fedsonmf's
        self.client_app = client_app
        #: the SuperLink host's ServerApp (``module:attr``, installed); None = fedsonmf's.  The server
        #: is the party the nodes need not trust: the attack tests run a hostile one here
        self.server_app = server_app
        self.executors: dict[object, subprocess.Popen] = {}  # "superlink" / view index -> gate executor
        self._authority: Any = None  # the coordinator key (gate.Authority), made by start()
        self._pinned: set[str] = set()
        self._lock: _RunDirLock | None = None
        #: starts and stops every process of this deployment (:mod:`.supervisor`)
        self.supervisor = Supervisor()
        self._run_lock = threading.Lock()
        #: seconds spent on certificates, keys and registration at start-up (part of startup_seconds)
        self.security_seconds: float = 0.0

    # ------------------------------------------------------------------ processes
    def _spawn(self, args: list[str], log: Path, env: dict | None = None, log_mode: str = "ab") -> subprocess.Popen:
        return self.supervisor.start(args, log=log, env=self.env if env is None else env, cwd=self.run_dir,
                                     log_mode=log_mode)

    @property
    def secure(self) -> bool:
        """TLS and SuperNode authentication both on."""
        return self.tls is not None and self.auth

    def start(self, timeout: float = STARTUP_TIMEOUT) -> LoopbackDeployment:
        """Start the SuperLink (waiting until it answers ``/health``, at most ``timeout`` s;
        a SuperLink that exits fails at once), the gate executors and every SuperNode."""
        self._term = exit_on_sigterm()  # until stop(): a TERMed launcher stops these daemons too
        atexit.register(self.stop)
        t0 = time.perf_counter()
        for path in self.view_paths:
            if not path.is_file():
                raise FileNotFoundError(f"view file {path} does not exist")
        private_dir(self.run_dir)
        self._lock = _lock_run_dir(self.run_dir)
        private_dir(self.flwr_home)
        self._setup_gate()
        if self._make_tls or self.auth:
            private_dir(self.security_dir)
        if self._make_tls:
            self.tls = sec.make_tls(self.security_dir / "tls", ["127.0.0.1"]).as_tuple()
        if self.tls is None or not self.auth:
            what = "TLS" if self.tls is None else "SuperNode authentication"
            warnings.warn(f"insecure Flower deployment in {self.run_dir}: no {what}; any process that can reach "
                          "127.0.0.1 can join as a SuperNode" + (" or read the traffic" if self.tls is None else ""),
                          InsecureDeploymentWarning, stacklevel=2)
        t_sec = time.perf_counter() - t0
        self.port = _free_port()
        sec.write_connection(self.flwr_home, CONNECTION, f"127.0.0.1:{self.port}", self.tls[0] if self.tls else None)
        self.superlink = self._spawn(
            [_bin("flower-superlink"), *sec.superlink_args("127.0.0.1", self.port, self.tls, auth=self.auth),
             *self._gate_superlink_args()],
            self.run_dir / "logs" / "superlink.log")
        assert self.superlink is not None and self.port is not None  # just started
        wait_health(self.superlink, self.port, timeout, self.run_dir / "logs" / "superlink.log",
                    ca_cert=self.tls[0] if self.tls else None)
        self._start_executor("superlink")
        if self.auth:
            t1 = time.perf_counter()
            self._register(list(range(len(self.view_paths))))
            t_sec += time.perf_counter() - t1
        for p in range(len(self.view_paths)):
            self.start_node(p)
        self.security_seconds = t_sec
        self.startup_seconds = time.perf_counter() - t0
        return self

    def node_dir(self, p: int) -> Path:
        """SuperNode ``p``'s folder: its state, key, gate files and log."""
        return self.run_dir / "nodes" / f"p{p}"

    def _register(self, views: list[int]) -> None:
        """Give each of ``views`` a fresh key pair, register it with the SuperLink (from the
        launcher's own FLWR_HOME), pin the view to the node id it got and rewrite the pins file.

        A restart gets a new key because a SIGKILLed node stays "online" for the heartbeat
        patience (~60 s), during which its key cannot re-activate.  The old node id stays
        registered, pinned to nothing and listed as retired (the handshake ignores it, and refuses
        it a view); it is not unregistered,
        because the SuperLink refuses (``None`` message id) any message still addressed to an
        unregistered node, which a round in flight may do."""
        keys = {}
        for p in views:
            gen = self._key_generation.get(p, -1) + 1
            self._key_generation[p] = gen
            kdir = self.node_dir(p) / "key"
            kdir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(kdir, 0o700)
            keys[p] = sec.make_node_key(kdir, f"node{p}-{gen}")
        # the registrations are independent: run the `flwr` CLIs side by side (each ~1 s of imports)
        node_ids = sec.register_node_keys(_bin("flwr"), [keys[p].public for p in views], CONNECTION, env=self.env,
                                          cwd=self.run_dir)
        for p, nid in zip(views, node_ids):
            if p in self.pins:
                self.retired.add(self.pins[p].node_id)
            self.node_keys[p] = keys[p]
            self.pins[p] = sec.Pin(nid, keys[p].fingerprint)
        sec.write_pins(self.pins_path, self.pins, self.retired)

    def _signing_key(self, p: int) -> Path:
        """View ``p``'s secure-aggregation signing key (Ed25519, 0600), made once per deployment
        and kept across node restarts; its public half is pinned in every run config the
        coordinator signs (``secagg-peers``, :meth:`peer_keys`)."""
        path = self.node_dir(p) / "key" / "secagg-signing.pem"
        if not path.is_file():
            sec.make_signing_key(path)
        return path

    def peer_keys(self) -> str:
        """The run config's ``secagg-peers``: every view's public signing key, by view (JSON)."""
        return json.dumps([sec.signing_public_key(self._signing_key(p)) for p in range(len(self.view_paths))])

    def start_node(self, p: int) -> subprocess.Popen:
        """Start (or restart) the SuperNode of view ``p`` (a restart gets a new key and node id)."""
        if p in self.nodes and self.nodes[p].poll() is None:
            raise RuntimeError(f"SuperNode {p} is already running")
        if self.auth and p in self.nodes:
            self._register([p])
        ndir = self.node_dir(p)
        private_dir(ndir / "state")
        node_config = sec.node_config(p, len(self.view_paths), self.view_paths[p], ndir / "state", self.mask_paths[p],
                                      require_secure=self.require_secure_aggregation,
                                      signing_key=self._signing_key(p))
        if self.predict_paths[p] is not None:  # new samples for a predict run: named by the node config only
            node_config += f' predict-path="{self.predict_paths[p]}"'
        if self.node_loop == "fedsonmf":  # one process: connection, gate, ClientApp (no Runtime API port)
            from fedsonmf.federation.flower.nodeloop import node_argv

            gdir = self._gate_dir(p)
            self.nodes[p] = self._spawn(
                node_argv(f"127.0.0.1:{self.port}", ca_cert=self.tls[0] if self.tls else None,
                          private_key=self.node_keys[p].private if self.auth else None, node_config=node_config,
                          gate_dir=gdir, app=self.client_app, gate_log=gdir / "gate.log"),
                ndir / "supernode.log")
            return self.nodes[p]
        port = self._node_ports.get(p) or _free_port()  # the node's Runtime API, which its executor dials
        self._node_ports[p] = port
        self.nodes[p] = self._spawn(
            [_bin("flower-supernode"),
             *sec.supernode_args(f"127.0.0.1:{self.port}", self.tls[0] if self.tls else None,
                                 self.node_keys[p].private if self.auth else None, node_config, port=port),
             *self._gate_node_args(p)],
            ndir / "supernode.log")
        self._start_executor(p)
        return self.nodes[p]

    def kill_node(self, p: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to SuperNode ``p``'s process group (its ClientApp processes too)."""
        proc = self.nodes[p]
        if p in self.executors:  # the node's executor dies with it (as Flower's own SuperExec would)
            self.supervisor.kill(self.executors[p])
        if sig == signal.SIGKILL:
            self.supervisor.kill(proc)
        else:  # TERM (or ``sig`` first), the grace period, then KILL
            if sig != signal.SIGTERM:
                self.supervisor.signal(proc, sig)
            self.supervisor.stop([proc])

    def stop(self) -> None:
        """Stop exactly the process groups this object started, in parallel (TERM to all, one grace
        period, then KILL; :class:`~.supervisor.Supervisor`)."""
        self.supervisor.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        atexit.unregister(self.stop)
        restore_sigterm(getattr(self, "_term", None))
        self._term = None

    # ------------------------------------------------------------------ the gate (see .gate)
    def _gate_dir(self, who) -> Path:
        return self.run_dir / "gate" if who == "superlink" else self.node_dir(who) / "gate"

    def _setup_gate(self) -> None:
        """A fresh coordinator key and, per SuperLink/SuperNode, a SuperExec secret and a pin (all 0600)."""
        private_dir(self._gate_dir("superlink"))
        self._authority = _gate().Authority.create(self._gate_dir("superlink") / "coordinator.key")
        for who in ["superlink", *range(len(self.view_paths))]:
            d = private_dir(self._gate_dir(who))
            _gate().write_secret(d / "superexec.secret")
            _gate().write_pin(d / "pin.json", self._pinned, self._authority.public_key)

    def _gate_superlink_args(self) -> list[str]:
        return sec.gate_daemon_args(self._gate_dir("superlink") / "superexec.secret")

    def _gate_node_args(self, p: int) -> list[str]:
        return sec.gate_daemon_args(self._gate_dir(p) / "superexec.secret")

    def _start_executor(self, who) -> subprocess.Popen:
        """Start the gate executor of the SuperLink (``who="superlink"``) or of SuperNode ``who``,
        in a process group of its own (its ServerApp children too; a group cannot join another
        session's), stopped with its daemon; it also exits within 0.2 s when its daemon dies."""
        leader = self.superlink if who == "superlink" else self.nodes[who]
        assert leader is not None  # its daemon runs
        d = self._gate_dir(who)
        if who == "superlink":
            role, api, certs, log = "serverapp", f"127.0.0.1:{self.port}", self.tls[0] if self.tls else None, \
                self.run_dir / "logs" / "gate-superlink.log"
        else:
            role, api, certs, log = "clientapp", f"127.0.0.1:{self._node_ports[who]}", None, d / "gate.log"
        args = _gate().executor_argv(role, api, d, parent_pid=leader.pid, root_certificates=certs,
                                     app=self.client_app if role == "clientapp" else self.server_app)
        env = dict(self.env)
        if role == "serverapp":  # the ServerApp writes only below the run folder
            env["FEDSONMF_OUT_ROOT"] = str(self.run_dir)
        proc = self._spawn(args, log, env=env)
        self.executors[who] = proc
        return proc

    def _gate_run_config(self, app_dir, conf: dict) -> dict:
        """Pin the FAB that ``flwr run app_dir`` will submit (built here with Flower's builder,
        which is deterministic) on every host, and sign the run: ``conf`` + the gate token."""
        out = Path(str(conf.get("out-dir", ""))).resolve()
        if out != self.run_dir and self.run_dir not in out.parents:
            raise ValueError(f"out_dir {out} must lie inside the run folder {self.run_dir} "
                             "(the ServerApp writes only there)")
        fab_hash = _gate().fab_sha256(_gate().build_fab(app_dir))
        if fab_hash not in self._pinned:
            self._pinned.add(fab_hash)
            for who in ["superlink", *range(len(self.view_paths))]:
                _gate().write_pin(self._gate_dir(who) / "pin.json", self._pinned, self._authority.public_key)
        return _gate().sign_run_config(self._authority, fab_hash, conf)

    # ------------------------------------------------------------------ faults
    def _wait_flwr_run(self, proc: subprocess.Popen, timeout: float, log: Path, *, status_path: Path | None = None,
                       progress=None, poll: float = 0.5) -> None:
        """Wait for ``flwr run``; stop waiting (and end it) as soon as the SuperLink dies.

        ``timeout`` is a limit on *stalls*, not on the run: it restarts whenever the
        ServerApp's ``status.json`` changes (a phase or a round completed), so a loaded
        machine makes a run slower, never a failure.  Every new status is handed to
        ``progress`` (the file is polled every ``poll`` s).  Returns as soon as the status is final
        (``completed``, ``failed``, ``stopped``), ending ``flwr run``, which would still stream the
        run's teardown for seconds.
        """
        deadline = time.monotonic() + timeout
        last, next_status = None, 0.0
        while proc.poll() is None:
            if status_path is not None and last is None and self._gate_refused(log):
                self.supervisor.stop([proc], grace=1.0)  # the gate refused the run: no ServerApp will write a status
                return
            if status_path is not None and _read_status(status_path).get("status") not in (None, "running"):
                # the ServerApp's status is final (written after its last output): what `flwr run --stream`
                # still does is the run's teardown and its own exit (seconds); end it, do not wait
                self.supervisor.stop([proc], grace=1.0)
                return
            if self.superlink is not None and self.superlink.poll() is not None:
                self.supervisor.kill(proc)
                return
            if status_path is not None and time.monotonic() >= next_status:
                st = _read_status(status_path)
                if st and st.get("updated_at") != last:
                    last = st.get("updated_at")
                    deadline = time.monotonic() + timeout  # progress: the stall limit starts again
                    if progress is not None:
                        progress(st)
                next_status = time.monotonic() + poll
            if time.monotonic() >= deadline:
                self.supervisor.kill(proc)
                raise TimeoutError(f"flwr run made no progress (status.json unchanged) for {timeout:g} s; see {log}")
            time.sleep(0.1)

    def _gate_refused(self, run_log: Path) -> str | None:
        """The SuperLink gate's refusal of the run ``flwr run`` started (its id in ``run_log``), or None."""
        try:
            run_id = started_run_id(run_log.read_text(errors="replace"))
        except OSError:
            return None
        if run_id is None:
            return None
        return refusal_in_log(self.run_dir / "logs" / "gate-superlink.log", run_id)

    def _flower_failure(self, run_log: Path) -> dict:
        """A failed status for a run whose ServerApp wrote none: the gate refused it (its token is
        stale, forged or copied; the app is not pinned) or it died before its first status --
        with Flower's own status details as the reason.  {} while the run is not over."""
        try:
            run_id = started_run_id(run_log.read_text(errors="replace"))
        except OSError:
            return {}
        if run_id is None:
            return {}
        runs = flower_runs(self.env, run_id=run_id, cwd=self.run_dir)
        status = failed_run_status(runs[0]) if runs else {}
        if not status and (line := self._gate_refused(run_log)):
            status = {"status": "failed", "run_id": run_id, "refused": True, "error": f"Flower run {run_id}: {line}"}
        return status

    def _failure_report(self, status: dict, status_path: Path) -> dict:
        """The status of a run whose SuperLink died: signal, round, last checkpoint; also
        written to ``status.json`` (atomically) so that the folder says failed."""
        if self.superlink is None or self.superlink.poll() is None:
            return status
        # the ServerApp child must not overwrite the report: end its group (with its executor) first
        if "superlink" in self.executors:
            self.supervisor.kill(self.executors["superlink"])  # returns once its group is gone
        report = superlink_exit_report(self.superlink.returncode, status_path.parent)
        status = {**status, **report}
        write_json_atomic(status_path, status)
        return status

    def __deepcopy__(self, memo):
        # a handle to running processes: copies (scikit-learn's clone of an estimator whose
        # Flower(deployment=...) names it) share the deployment, they do not start another
        return self

    def __copy__(self):
        return self

    def __enter__(self):
        try:
            return self.start()
        except BaseException:  # a start that fails half-way must not leave its daemons running
            self.stop()
            raise

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

        Runs on one deployment go one at a time (a lock): each is its own ``flwr run`` with its own
        Flower run id, job id (the nodes' state files) and out-dir, on the same daemons, keys and
        pins (docs/flower.md, "One deployment, many fits").
        """
        with self._run_lock:
            return self._run(run_config, out_dir=out_dir, app_dir=app_dir, timeout=timeout, progress=progress,
                             poll=poll)

    def _run(self, run_config: dict, *, out_dir, app_dir, timeout: float, progress, poll: float) -> RunOutcome:
        self._runs += 1
        out_dir = Path(out_dir or self.run_dir / "server").resolve()
        private_dir(out_dir)
        status_path = out_dir / "status.json"
        if status_path.exists():
            status_path.unlink()
        if app_dir is None:
            app_dir = write_app_dir(self.run_dir / "app")
        conf = {"num-clients": len(self.view_paths), **run_config, "out-dir": str(out_dir)}
        if self.pins_path is not None:
            conf["node-pins"] = str(self.pins_path)  # ours, not the caller's: every run of this deployment is pinned
        # the views' signing keys, under the coordinator's signature: the nodes verify each other's
        # secure-aggregation keys with them, whatever the server relays
        conf["secagg-peers"] = self.peer_keys()
        unknown = sorted(set(conf) - set(RUN_CONFIG_DEFAULTS) - set(_app_config_keys(app_dir)))
        if unknown:
            raise ValueError(f"unknown run-config keys {unknown}; known: {sorted(RUN_CONFIG_DEFAULTS)}")
        conf = self._gate_run_config(app_dir, conf)
        overrides = self.run_dir / "logs" / f"run-config-{self._runs}.toml"
        private_dir(overrides.parent)
        write_atomic(overrides, "".join(f"{k} = {_toml_value(v)}\n" for k, v in conf.items()))
        log = self.run_dir / "logs" / f"flwr-run-{self._runs}.log"
        t0 = time.perf_counter()
        proc = self._spawn([_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream", "--run-config", str(overrides)],
                           log, log_mode="wb")
        try:
            self._wait_flwr_run(proc, timeout, log, status_path=status_path, progress=progress, poll=poll)
        finally:
            self.supervisor.stop([proc], grace=1.0)  # reaped (and its group gone) on every path
        # --stream exits 0 even when the ServerApp fails: the status file is the truth (the
        # ServerApp may still be writing its last status: wait for it, returning as soon as it is there)
        status = _read_status(status_path)
        deadline = time.monotonic() + FINAL_STATUS_TIMEOUT
        next_ask = time.monotonic()
        while status.get("status") in (None, "running") and time.monotonic() < deadline:
            if not status and time.monotonic() >= next_ask:  # refused or dead before its first status?
                status = self._flower_failure(log)
                if status:
                    break
                next_ask = time.monotonic() + 2.0
            time.sleep(0.2)
            status = _read_status(status_path)
        if not status:
            status = {"status": "failed",
                      "error": f"the ServerApp wrote no status (flwr run exit code {proc.returncode}); see {log}"}
        status = self._failure_report(status, status_path)
        if progress is not None:
            progress(status)
        return RunOutcome(status, out_dir, time.perf_counter() - t0, log)


class _RunDirLock:
    """An exclusive ``fcntl.flock`` on ``<run_dir>/.lock``, shared (counted) within this process."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd, self.count = path, fd, 1

    def release(self) -> None:
        self.count -= 1
        if self.count == 0:
            _HELD_LOCKS.pop(self.path, None)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


_HELD_LOCKS: dict[Path, _RunDirLock] = {}


def _lock_run_dir(run_dir) -> _RunDirLock:
    """Hold the run folder for this launch; a second launch on it fails at once naming the first.

    The lock file records who holds it (pid, command line, start time); the lock
    itself is the kernel's, so it goes with the process that held it (no stale locks).
    """
    path = Path(run_dir).resolve() / ".lock"
    held = _HELD_LOCKS.get(path)
    if held is not None:
        held.count += 1
        return held
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            holder = {}
        os.close(fd)
        who = (f"pid {holder.get('pid')}, started {holder.get('started')}: {holder.get('command')}"
               if holder else "another process")
        raise FlowerRunError(f"run folder {path.parent} is in use by a running launch ({who}); lock {path}. "
                             "Wait for it to finish, or give another --out") from None
    info = json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "command": " ".join(sys.argv)}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, info, 0)
    lock = _RunDirLock(path, fd)
    _HELD_LOCKS[path] = lock
    return lock


def _signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def superlink_exit_report(returncode: int | None, out_dir) -> dict:
    """Status fields for a run whose SuperLink exited.

    Parameters
    ----------
    returncode : int or None
        The SuperLink's return code (negative: the signal).
    out_dir : path
        The ServerApp's out-dir (its ``checkpoint/`` names the last completed round).

    Returns
    -------
    dict
        ``status="failed"``, ``error`` and ``report`` (one line: the signal or exit code, the
        round that was running, the last checkpointed round, what to do), ``superlink_exit``,
        ``last_completed_round``, ``round``.
    """
    from fedsonmf.federation import checkpoint as ckpt

    try:
        last = ckpt.load_server_checkpoint(Path(out_dir) / "checkpoint").completed_rounds
    except Exception:  # noqa: BLE001 - no (readable) checkpoint: nothing completed
        last = 0
    how = _signal_name(returncode)
    text = (f"SuperLink exited ({how}) during round {last + 1}; last checkpointed round {last}; "
            + ("resume with --resume" if last else "nothing to resume, start again"))
    return {"status": "failed", "error": text, "report": text, "superlink_exit": how,
            "last_completed_round": last, "round": last + 1}


def failure_message(status: dict) -> str:
    """One line for a failed or stopped run (the CLI prints it).

    Parameters
    ----------
    status : dict
        The ServerApp's ``status.json`` (or :func:`superlink_exit_report`'s fields).

    Returns
    -------
    str
    """
    if status.get("report"):
        return str(status["report"])
    return (f"Flower run failed: {status.get('error')} (last completed round "
            f"{status.get('last_completed_round')}; resume with --resume)")


def _app_config_keys(app_dir) -> list[str]:
    import tomllib

    data = tomllib.loads((Path(app_dir) / "pyproject.toml").read_text())
    return list(data["tool"]["flwr"]["app"]["config"])


def _read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


#: what ``flwr run`` prints once the SuperLink accepted the run (Flower 1.42, ``flwr/cli/run/run.py``)
_STARTED_RUN = re.compile(r"Successfully started run (\d+)")
#: how the gate words a refused run (:meth:`.gate.Executor.handle_server_task`)
GATE_REFUSAL = "refused by the fedsonmf gate: "


def started_run_id(text: str) -> int | None:
    """The run id ``flwr run`` printed in ``text`` (its output), or None before it did."""
    found = _STARTED_RUN.search(text)
    return int(found.group(1)) if found else None


def flower_runs(env: dict, *, run_id: int | None = None, cwd=None, timeout: float = 60.0) -> list[dict]:
    """Flower's own record of the runs (``flwr ls CONNECTION --format json [--run-id N]``):
    dicts with ``run-id``, ``status`` (``finished:failed`` ...), ``status-details``, ``fab-hash``,
    ``pending-at``; [] when the Control API cannot be read."""
    args = [_bin("flwr"), "ls", CONNECTION, "--format", "json", *(["--run-id", str(run_id)] if run_id else [])]
    try:
        p = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        return list(json.loads(p.stdout[p.stdout.index("{"):]).get("runs") or [])
    except (OSError, subprocess.TimeoutExpired, ValueError, AttributeError):
        return []


def failed_run_status(run: dict) -> dict:
    """A ``status.json``-like failure for a run Flower records as finished but whose ServerApp
    wrote no status (the gate refused its token or app, or the ServerApp died before its first
    status): Flower's status details are the reason.  {} for a run not finished."""
    if not str(run.get("status", "")).startswith("finished"):
        return {}
    details = str(run.get("status-details") or "no details")
    return {"status": "failed", "run_id": run.get("run-id"), "refused": GATE_REFUSAL in details,
            "error": f"Flower run {run.get('run-id')} ended {run.get('status')} before the ServerApp wrote a status: "
                     f"{details}"}


def refusal_in_log(log: Path, run_id: int) -> str | None:
    """The gate's refusal line for ``run_id`` in its log ``log`` (``run N: refused by ...``), or None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    mark = f"run {run_id}: {GATE_REFUSAL}"
    at = text.find(mark)
    return text[at + len(f"run {run_id}: "):].splitlines()[0] if at >= 0 else None
