"""The gate: our own executor on every SuperNode and on the SuperLink host, so
that only fedsonmf's code runs there, and only for runs the coordinator authorised.

Why.  Flower OSS runs whatever app any client of the SuperLink port submits
(``flwr run``), with the node's config (its view's path) in hand.  FAB
verification (``--trusted-entities``) only accepts Flower-Hub-signed bundles and
Control-API authentication is Flower Enterprise.  So the launcher starts the
SuperLink and the SuperNodes with ``--isolation process`` (they spawn no app
process) and ``--superexec-auth-secret-file`` (only a process that holds the
secret may acquire tasks), and runs this executor in place of
``flower-superexec``.  For every task it pulls the task input over Flower's
Runtime (AppIo) API and:

(a) refuses any app bundle (FAB) whose sha256 is not pinned in its 0600 pin
    file (the launcher builds the FAB itself, hashes it and pins it);
(b) never installs or imports code from the FAB: it runs the installed
    ``fedsonmf`` ClientApp / ServerApp objects (or the node operator's own
    ``--app module:attr``);
(c) checks the run's authorisation, our choice: a ``gate-token`` run-config
    value, signed (Ed25519) by the coordinator's per-deployment key, binding the
    job id, the FAB hash and a digest of the whole run config, used by exactly
    one run id (a node-local ledger binds its nonce to the first run id that
    presents it) and fresh when first seen.  A re-submission of our own FAB,
    with or without a copied token, is refused; so is any change of the run
    config (out-dir, diagnostics, ...).

A refused task gets an error reply (ClientApp) or a failed task status
(ServerApp) whose text names the reason; nothing of the node's data is read.

ClientApp tasks run *in this long-lived process*, one after the other: no
process spawn and no imports per round (1.2-2.5 s/round saved; docs/flower.md, "Flower behaviours").
That is safe for fedsonmf because the ClientApp keeps its private state in
node-local files with a round check (module state is never used), and tasks
are sequential: the context is pushed (PushTaskOutput) before the next task
is acquired, so the next PullTaskInput sees it (no stale-state race, §3.5).
ServerApp tasks (one per run, long) run in a child process, so that this
executor keeps refusing foreign runs meanwhile, and so that an external
``flwr stop`` ends that run only (reported as :class:`RunStopped`).

A simulation SuperLink (:class:`~fedsonmf.federation.flower.simulation.SimulationSuperLink`)
gets the same executor with the role ``simulation``: the same checks, then Flower's own
simulation runtime in a child process (:func:`run_simulation_task`).  There (b) reads: the
runtime installs the FAB, which the pin makes our shim, which imports the installed apps.

Command line (started by :class:`~fedsonmf.federation.flower.launcher.LoopbackDeployment`)::

    python -m fedsonmf.federation.flower.gate --role clientapp|serverapp|simulation \\
        --runtime-api HOST:PORT --pin PIN.json --secret SECRET --ledger LEDGER.json \\
        [--parent-pid PID] [--root-certificates CA.pem] [--app module:attr]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fedsonmf._io import check_private_file, private_dir, write_atomic, write_json_atomic
from fedsonmf.exceptions import InputError, RunStopped

__all__ = [
    "MESSAGE_PULL_SECONDS", "pull_task_input",
    "TOKEN_KEY", "DEFAULT_CLIENT_APP", "DEFAULT_SERVER_APP", "Authority", "Pin", "Gate", "Refused",
    "fab_sha256", "build_fab", "config_digest", "write_pin", "write_secret", "serve",
    "read_public_key", "installed_fab_sha256", "sign_run_config", "prepare_host", "executor_argv",
]

#: run-config key of the coordinator's signed authorisation
TOKEN_KEY = "gate-token"
#: the executor's roles: a SuperNode's (ClientApp tasks), a SuperLink's (ServerApp tasks), a
#: simulation SuperLink's (one simulation per run: ServerApp and every virtual node's ClientApp)
ROLES = ("clientapp", "serverapp", "simulation")
DEFAULT_CLIENT_APP = "fedsonmf.federation.flower.client_app:app"
DEFAULT_SERVER_APP = "fedsonmf.federation.flower.server_app:app"
#: seconds a token may be old when a node first sees it (our choice: generous for slow starts)
TOKEN_MAX_AGE = 900.0
_ACQUIRE = "/flwr.proto.Runtime/AcquireTask"


class Refused(Exception):
    """A task the gate does not run; the message is the reason sent back."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def fab_sha256(content: bytes) -> str:
    """sha256 (hex) of a FAB's bytes: computed here, never taken from the bundle's own claim."""
    return hashlib.sha256(content).hexdigest()


def build_fab(app_dir) -> bytes:
    """The FAB ``flwr run APP_DIR`` submits (Flower's own builder: fixed zip dates, sorted files)."""
    import warnings

    from fedsonmf.federation.flower.compat import build_fab_from_disk

    with warnings.catch_warnings():  # pathspec's 'gitwildmatch' deprecation, inside Flower's builder
        warnings.simplefilter("ignore", DeprecationWarning)
        return build_fab_from_disk(Path(app_dir))


def config_digest(run_config: dict) -> str:
    """sha256 of the run config (every key but the token), as canonical JSON."""
    items = {str(k): v for k, v in run_config.items() if k != TOKEN_KEY}
    return hashlib.sha256(json.dumps(items, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_secret(path, nbytes: int = 32) -> Path:
    """A fresh random SuperExec auth secret, 0600."""
    return write_atomic(path, secrets.token_bytes(nbytes))


def installed_fab_sha256() -> str:
    """sha256 of the FAB of the installed fedsonmf's app (``fedsonmf flower app`` / ``write_app_dir``).

    Flower's builder is deterministic (fixed zip dates, sorted files) and the shim app holds
    no path, so every host with the same fedsonmf version computes the same hash: the one
    each host pins, and the one ``fedsonmf flower submit`` submits."""
    import tempfile

    from fedsonmf.federation.flower.template import write_app_dir

    with tempfile.TemporaryDirectory(prefix="fedsonmf-fab-") as tmp:
        return fab_sha256(build_fab(write_app_dir(Path(tmp) / "app")))


# ----------------------------------------------------------------------------- coordinator


class Authority:
    """The coordinator's Ed25519 key (per deployment, 0600) and the tokens it signs."""

    def __init__(self, private_key):
        self._key = private_key

    @classmethod
    def create(cls, path) -> Authority:
        """A fresh coordinator key pair; the private key written to ``path`` (0600)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.generate()
        write_atomic(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
        return cls(key)

    @classmethod
    def load(cls, path) -> Authority:
        """The coordinator key at ``path`` (refused unless private: :func:`fedsonmf._io.check_private_file`)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        check_private_file(path, "coordinator key file")
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} holds a {type(key).__name__}, not the coordinator's Ed25519 key")
        return cls(key)

    @property
    def public_key(self) -> str:
        """The raw 32-byte public key, base64url (what the pin files hold)."""
        from cryptography.hazmat.primitives import serialization

        return _b64(self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))

    def write_public(self, path) -> Path:
        """The public key file nodes trust (one base64url line; not secret; 0600 like every file we
        write: the operator copies it)."""
        return write_atomic(path, self.public_key + "\n", mode=0o600)

    def token(self, *, job_id: str, fab_hash: str, run_config: dict) -> str:
        """Authorise one run: ``base64url(payload) . base64url(signature)``."""
        payload = {"v": 1, "job-id": str(job_id), "fab-sha256": fab_hash, "config-sha256": config_digest(run_config),
                   "nonce": secrets.token_hex(16), "issued": time.time()}
        body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return f"{_b64(body)}.{_b64(self._key.sign(body))}"


def sign_run_config(authority: Authority, fab_hash: str, conf: dict) -> dict:
    """``conf`` plus the gate token that authorises it for the FAB ``fab_hash``.

    The token signs exactly what the executors will see: the values as ``flwr`` parses the
    ``--run-config`` overrides file (written with the template's TOML formatting).

    Parameters
    ----------
    authority : Authority
        The coordinator's key.
    fab_hash : str
        The sha256 of the bundle ``flwr run`` will submit (:func:`fab_sha256` of :func:`build_fab`).
    conf : dict
        The run config.

    Returns
    -------
    dict
        ``conf`` with ``gate-token`` set.
    """
    import tomllib

    from fedsonmf.federation.flower.template import _toml_value

    conf = {k: v for k, v in conf.items() if k != TOKEN_KEY}
    parsed = tomllib.loads("".join(f"{k} = {_toml_value(v)}\n" for k, v in conf.items()))
    token = authority.token(job_id=str(conf.get("job-id", "")), fab_hash=fab_hash, run_config=parsed)
    return {**conf, TOKEN_KEY: token}


# ----------------------------------------------------------------------------- node side


@dataclass(frozen=True)
class Pin:
    """What one host accepts: the app bundles' sha256 and the coordinator's public key."""

    fab_sha256: frozenset
    public_key: str

    @classmethod
    def load(cls, path) -> Pin:
        """The pin file at ``path`` (refused unless private)."""
        check_private_file(path, "gate pin file")
        d = json.loads(Path(path).read_text())
        return cls(frozenset(d["fab-sha256"]), str(d["coordinator-public-key"]))


def write_pin(path, fab_hashes, public_key: str) -> Path:
    """Write (replace) a pin file, 0600."""
    return write_json_atomic(path, {"fab-sha256": sorted(set(fab_hashes)), "coordinator-public-key": public_key})


def read_public_key(path) -> str:
    """The coordinator's public key from its file (``Authority.write_public``), checked to be
    a raw 32-byte Ed25519 key; a private key file is refused (it must not travel).  Raises
    :class:`~fedsonmf.exceptions.InputError` (a ValueError) naming the file."""
    path = Path(path)
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise InputError(f"coordinator public key {path}: {exc.strerror or exc}") from None
    if "PRIVATE KEY" in text:
        raise InputError(f"{path} is the coordinator's private key; give the nodes and the SuperLink the "
                         "public key (coordinator.pub)")
    try:
        ok = len(_unb64(text)) == 32
    except ValueError:
        ok = False
    if not ok:
        raise InputError(f"{path} is not a coordinator public key (one base64url line of a 32-byte Ed25519 key, "
                         "from `fedsonmf flower keys coordinator`)")
    return text


def prepare_host(gate_dir, fab_hashes, public_key: str) -> tuple[Path, Path]:
    """One host's gate folder (0700): a fresh SuperExec secret and the pin (both 0600).

    Parameters
    ----------
    gate_dir : path
        The folder; its ledger (``ledger.json``) is kept across restarts.
    fab_hashes : iterable of str
        The sha256 of every app bundle this host may run.
    public_key : str
        The coordinator's public key (base64url), whose signature every run needs.

    Returns
    -------
    pin_path, secret_path : Path
    """
    d = private_dir(gate_dir)
    secret = write_secret(d / "superexec.secret")
    return write_pin(d / "pin.json", fab_hashes, public_key), secret


def executor_argv(role: str, runtime_api: str, gate_dir, *, parent_pid: int, root_certificates=None,
                  app: str | None = None) -> list[str]:
    """The command line of one host's gate executor.

    Parameters
    ----------
    role : {"serverapp", "clientapp", "simulation"}
        The SuperLink's executor, a SuperNode's, or a simulation SuperLink's.
    runtime_api : str
        ``HOST:PORT`` of its daemon's runtime API.
    gate_dir : path
        The files of :func:`prepare_host` (pin, SuperExec secret, ledger).
    parent_pid : int
        The daemon's pid: the executor exits when it is gone.
    root_certificates : path or None, default=None
        The CA certificate the SuperLink's executor verifies its daemon with.
    app : str or None, default=None
        ``module:attr`` of an installed ClientApp (None: fedsonmf's).

    Returns
    -------
    list of str
    """
    d = Path(gate_dir)
    args = [sys.executable, "-m", "fedsonmf.federation.flower.gate", "--role", role, "--runtime-api", runtime_api,
            "--pin", str(d / "pin.json"), "--secret", str(d / "superexec.secret"),
            "--ledger", str(d / "ledger.json"), "--parent-pid", str(int(parent_pid))]
    if root_certificates:
        args += ["--root-certificates", str(root_certificates)]
    if app:
        args += ["--app", app]
    return args


class Gate:
    """The checks of one host: pinned FAB hash, signed single-use run authorisation.

    ``pin_path`` is re-read for every task (the launcher pins each app it
    submits); ``ledger_path`` is this host's record {nonce: run id} (0600).
    """

    def __init__(self, pin_path, ledger_path, *, max_age: float = TOKEN_MAX_AGE):
        self.pin_path = Path(pin_path)
        self.ledger_path = Path(ledger_path)
        self.max_age = max_age

    def _ledger(self) -> dict:
        try:
            check_private_file(self.ledger_path, "gate ledger")
            return json.loads(self.ledger_path.read_text())
        except FileNotFoundError:
            return {}

    def check(self, fab_content: bytes, run_id: int, run_config: dict) -> dict:
        """Raise :class:`Refused` naming the reason, else return the token's payload."""
        pin = Pin.load(self.pin_path)
        sha = fab_sha256(fab_content)
        if sha not in pin.fab_sha256:
            raise Refused(f"app bundle sha256 {sha[:16]}... is not the fedsonmf app pinned for this deployment")
        token = str(run_config.get(TOKEN_KEY, "") or "")
        if not token:
            raise Refused(f"run {run_id} carries no coordinator authorisation ('{TOKEN_KEY}')")
        payload = self._verify(token, pin.public_key)
        if payload.get("fab-sha256") != sha:
            raise Refused(f"run {run_id}: the authorisation is for another app bundle")
        if payload.get("config-sha256") != config_digest(run_config):
            raise Refused(f"run {run_id}: the run config differs from the one the coordinator authorised")
        ledger = self._ledger()
        nonce = str(payload.get("nonce"))
        bound = ledger.get(nonce)
        if bound is None:
            age = time.time() - float(payload.get("issued", 0.0))
            if not (-60.0 <= age <= self.max_age):
                raise Refused(f"run {run_id}: the authorisation is {age:.0f} s old (limit {self.max_age:.0f} s)")
            ledger[nonce] = int(run_id)
            write_json_atomic(self.ledger_path, ledger)
        elif int(bound) != int(run_id):
            raise Refused(f"run {run_id}: the authorisation was issued for run {bound} (a re-submission)")
        return payload

    @staticmethod
    def _verify(token: str, public_key: str) -> dict:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            body_b64, sig_b64 = token.split(".")
            body, sig = _unb64(body_b64), _unb64(sig_b64)
            Ed25519PublicKey.from_public_bytes(_unb64(public_key)).verify(sig, body)
            return json.loads(body)
        except (ValueError, InvalidSignature):
            raise Refused("the run's authorisation is not signed by this deployment's coordinator") from None


def _load_object(ref: str):
    """``module:attr`` from the installed environment (never from a FAB)."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ValueError(f"--app must be 'module:attribute', got {ref!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# ----------------------------------------------------------------------------- executor


def _runtime_client(address: str, root_certificates: str | None, interceptors):
    from fedsonmf.federation.flower.compat import (
        RuntimeHttpClient,
        make_simple_http_retry_invoker,
        validate_and_resolve_root_certificates,
    )

    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=root_certificates is None,
        root_certificates=validate_and_resolve_root_certificates(root_certificates, root_certificates is None),
        interceptors=interceptors, retry_invoker=make_simple_http_retry_invoker())


def _task_client(address: str, root_certificates: str | None, token: str, component: str):
    from fedsonmf.federation.flower.compat import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor

    interceptors = [RuntimeVersionHttpInterceptor(component_name=component), RuntimeTokenHttpInterceptor(token)]
    return _runtime_client(address, root_certificates, interceptors)


def _heartbeat_fn(client, stopped: threading.Event):
    """Flower's task heartbeat, except that a stopped run sets ``stopped`` instead of
    signalling the whole process (which would end this long-lived executor)."""
    import httpx

    from fedsonmf.federation.flower.compat import SendTaskHeartbeatRequest

    def fn() -> bool:
        try:
            res = client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
        except httpx.HTTPError:
            return False
        if not res.success:
            stopped.set()
        return True

    return fn


#: seconds a ClientApp task waits for its message's content to reach the SuperNode, our choice
#: (Flower's own pull waits up to 2 h): on loopback it is there in milliseconds, and 120 s carry
#: hundreds of MB over a slow link; see :func:`pull_task_input`
MESSAGE_PULL_SECONDS = 120.0


def pull_task_input(client, max_time: float = MESSAGE_PULL_SECONDS):
    """Flower's ``run_clientapp.pull_task_input`` (the task's message, context, run and FAB), with
    a bound on the wait for the message's content.

    Why the bound: a Flower 1.42 SuperNode that pulls a message at the moment its run is stopped
    (``flwr stop``) has already stored the message and created its task when the SuperLink refuses
    the content; it catches that ``RunNotRunningException`` (a ``BaseException``) without removing
    either, so the content never arrives.  Flower's own pull retries for up to 2 h, and this
    executor, which runs tasks one after the other, would serve no later run meanwhile (the next
    run's handshake found no view: the CI flake of two sessions).  After ``max_time`` the pull
    raises ``ObjectPullError``: the task fails and no reply is pushed (the SuperNode is not
    waiting for one).
    """
    from flwr.app import Message

    from fedsonmf.federation.flower.compat import (
        Node,
        PullAppMessagesRequest,
        PullTaskInputRequest,
        TaskIdentity,
        context_from_proto,
        fab_from_proto,
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
        pull_and_inflate_object_from_tree,
        run_from_proto,
    )

    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = res.task_id, res.run.run_id, res.context.node_id
    context, run, fab = context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree, make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message, max_time=max_time)
    message.metadata.__dict__["_message_id"] = tree.object_id  # the deflated message lacks its own id
    return message, context, run, fab


#: the longest wait between two polls of an idle executor, seconds (see :meth:`Executor.serve_forever`)
MAX_POLL = 0.5


class Executor:
    """Poll the Runtime API for tasks of one role and handle them (see the module docstring).

    ``poll`` is the wait after a task and after the first empty poll; each further empty poll doubles
    it, up to ``max_poll``."""

    def __init__(self, role: str, runtime_api: str, gate: Gate, secret: bytes, *, app_ref: str | None = None,
                 root_certificates: str | None = None, parent_pid: int | None = None, poll: float = 0.05,
                 max_poll: float = MAX_POLL, log=None):
        from fedsonmf.federation.flower.compat import (
            RuntimeVersionHttpInterceptor,
            SuperExecAuthHttpInterceptor,
            TaskType,
        )

        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(map(repr, ROLES))}, got {role!r}")
        self.role, self.runtime_api, self.gate = role, runtime_api, gate
        self.root_certificates, self.parent_pid, self.poll = root_certificates, parent_pid, poll
        self.max_poll = max(float(max_poll), float(poll))
        self.task_type = {"clientapp": TaskType.CLIENT_APP, "serverapp": TaskType.SERVER_APP,
                          "simulation": TaskType.SIMULATION}[role]
        self.app_ref = app_ref or (DEFAULT_CLIENT_APP if role == "clientapp" else DEFAULT_SERVER_APP)
        # the app is imported once, here, from the installed environment
        self.app = _load_object(self.app_ref) if role == "clientapp" else None
        self.log = log or (lambda text: print(f"[fedsonmf-gate {role}] {text}", file=sys.stderr, flush=True))
        self.client = _runtime_client(runtime_api, root_certificates, [
            RuntimeVersionHttpInterceptor(component_name="SuperExec"),
            SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods={_ACQUIRE})])
        self.children: list[subprocess.Popen] = []
        self.timings: list[float] = []

    def serve_forever(self) -> None:
        """Acquire and run tasks until the daemon goes away (checked every poll).

        The polls back off while no task comes: every poll is an authenticated HTTP request to the
        daemon's Runtime API, and at a fixed 0.05 s the executors of an idle 5-node loopback
        deployment kept 0.68 of a core busy (0.08 at 0.5 s; docs/flower.md, "What runs on a node").
        A task never waits more than ``max_poll`` for its executor, which is what a SuperNode's own
        wait for the reply adds to every message anyway (it checks every 0.5 s).
        """
        import httpx

        from fedsonmf.federation.flower.compat import AcquireTaskRequest

        wait = self.poll
        while True:
            if self.parent_pid is not None and not _alive(self.parent_pid):
                self.log(f"parent process {self.parent_pid} is gone; exiting")
                return
            self.children = [c for c in self.children if c.poll() is None]
            try:
                res = self.client.AcquireTask(AcquireTaskRequest(supported_task_types=[self.task_type],
                                                                 agentapp_fab_hashes=[]))
            except httpx.HTTPError as exc:  # the Runtime API is not up yet, or going down
                self.log(f"Runtime API {self.runtime_api} not reachable ({type(exc).__name__}); retrying")
                time.sleep(max(self.poll, 0.2))
                continue
            if res.HasField("task") and res.token:
                t0 = time.perf_counter()
                if self.role == "clientapp":
                    self.handle_client_task(res.token)
                else:
                    self.handle_server_task(res.token)
                self.timings.append(time.perf_counter() - t0)
                if self.role == "clientapp":  # what a spawned flwr-clientapp would add on top: ~1.2-2.5 s
                    self.log(f"task handled in {self.timings[-1]:.3f} s")
                wait = self.poll
                continue  # another task may be waiting
            time.sleep(wait)
            wait = min(2.0 * wait, self.max_poll)

    # ---------------------------------------------------------------- ClientApp, in this process
    def handle_client_task(self, token: str) -> None:
        """Run one ClientApp task in this process, after the pin and authorisation checks."""
        from flwr.app import Message
        from flwr.app.error import Error

        from fedsonmf.federation.flower.codec import error_reason
        from fedsonmf.federation.flower.compat import (
            ErrorCode,
            HeartbeatSender,
            SubStatus,
            push_message,
            push_task_output,
        )

        client = _task_client(self.runtime_api, self.root_certificates, token, "flwr-clientapp")
        stopped = threading.Event()
        heartbeat = HeartbeatSender(_heartbeat_fn(client, stopped))
        context, sub_status, details = None, SubStatus.FAILED, "task failed before its input was pulled"
        try:
            heartbeat.start()
            message, context, run, fab = pull_task_input(client)
            try:
                self.gate.check(fab.content, run.run_id, dict(run.override_config))
            except Refused as why:
                details = f"refused by the fedsonmf gate: {why}"
                self.log(f"run {run.run_id}: {details}")
                reply = Message(Error(code=ErrorCode.INVALID_FAB, reason=details), reply_to=message)
            else:
                try:
                    assert self.app is not None  # a clientapp executor loaded its app at start
                    reply = self.app(message=message, context=context)
                    sub_status, details = SubStatus.COMPLETED, ""
                except Exception as ex:  # noqa: BLE001 - becomes the error reply, as in flwr-clientapp
                    details = error_reason(ex)
                    self.log(f"run {run.run_id}: ClientApp raised {details}")
                    reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details),
                                    reply_to=message)
            if not stopped.is_set():
                push_message(client, reply, context)
        except Exception as ex:  # noqa: BLE001 - a broken task must not end the executor
            details = f"task failed: {error_reason(ex)}"
            self.log(details)
        finally:
            if heartbeat.is_running:
                heartbeat.stop()
            # the context is pushed before the next task is acquired: no stale state
            # (docs/flower.md, "Flower behaviours")
            push_task_output(client=client, context=context, sub_status=sub_status, details=details)
            client.close()

    # ------------------------------------------------ ServerApp or simulation, in a child process
    def handle_server_task(self, token: str) -> None:
        """Run one ServerApp task (role ``serverapp``) or one simulation run (role ``simulation``)
        in a child process, after the pin and authorisation checks."""
        from fedsonmf.federation.flower.compat import (
            PullTaskInputRequest,
            PushTaskOutputRequest,
            SubStatus,
            fab_from_proto,
            run_from_proto,
        )

        client = _task_client(self.runtime_api, self.root_certificates, token, "flwr-serverapp")
        try:
            res = client.PullTaskInput(PullTaskInputRequest())
            run, fab = run_from_proto(res.run), fab_from_proto(res.fab)
            try:
                self.gate.check(fab.content, run.run_id, dict(run.override_config))
            except Refused as why:
                details = f"refused by the fedsonmf gate: {why}"
                self.log(f"run {run.run_id}: {details}")
                client.PushTaskOutput(PushTaskOutputRequest(sub_status=SubStatus.FAILED, details=details))
                return
        finally:
            client.close()
        spec = {"token": token, "task_input": _b64(res.SerializeToString()), "runtime_api": self.runtime_api,
                "root_certificates": self.root_certificates, "app": self.app_ref, "parent_pid": self.parent_pid}
        # the token goes through stdin, not argv (argv is readable by every local user in /proc)
        flag = "--simulation-task" if self.role == "simulation" else "--serverapp-task"
        child = subprocess.Popen([sys.executable, "-m", "fedsonmf.federation.flower.gate", flag],
                                 stdin=subprocess.PIPE)
        assert child.stdin is not None  # stdin=PIPE
        child.stdin.write(json.dumps(spec).encode())
        child.stdin.close()
        self.children.append(child)
        what = "simulation" if self.role == "simulation" else "ServerApp"
        self.log(f"run {run.run_id}: authorised; {what} started (pid {child.pid})")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: seconds a ServerApp that has been told to stop gets to unwind (write its status, push
#: nothing) before it is told again; our choice: the unwinding takes milliseconds
STOP_GRACE_SECONDS = 30.0


class StopSignals:
    """How the ServerApp task turns signals into one :class:`RunStopped`.

    SIGINT comes from Flower's own HTTP retry logic when the SuperLink revokes the run's
    token (401: ``flwr stop``); SIGUSR1 from our watch once the heartbeat says the run is
    stopped; SIGTERM from the executor (or the watch, when the SuperLink is gone).  The
    first signal raises; later ones are ignored for :data:`STOP_GRACE_SECONDS`, because a
    second exception raised while the app writes its ``stopped`` status (the watch polls
    every 0.2 s) left ``status.json`` saying "running".  Only an app that swallowed the
    first exception and is still running after the grace is told again.
    """

    def __init__(self, run_id: int, grace: float = STOP_GRACE_SECONDS, clock=time.monotonic):
        self.run_id, self.grace, self.clock = run_id, float(grace), clock
        self.stopped = threading.Event()  # the run was stopped from outside (not a failure)
        self.raised_at: float | None = None

    def _quiet(self) -> bool:
        return self.raised_at is not None and self.clock() - self.raised_at < self.grace

    def on_signal(self, signum, _frame=None) -> None:
        """The signal handler: raise :class:`RunStopped` unless one is already unwinding the app."""
        if signum == signal.SIGINT:
            self.stopped.set()
        if self._quiet():
            return
        self.raised_at = self.clock()
        if self.stopped.is_set():
            raise RunStopped(f"run {self.run_id} was stopped externally (flwr stop)", external=True)
        raise RunStopped(f"the ServerApp got signal {signal.Signals(signum).name}")

    def due(self) -> bool:
        """Whether the watch should signal a stopped run now (not yet told, or told in vain)."""
        return self.stopped.is_set() and not self._quiet()


def run_serverapp_task(spec: dict) -> int:
    """The child of a ServerApp task: run the installed ServerApp on the pulled input."""
    from fedsonmf.federation.flower.compat import (
        HeartbeatSender,
        PullTaskInputResponse,
        PushTaskOutputRequest,
        ReplyGrid,
        SubStatus,
        TaskIdentity,
        context_from_proto,
        context_to_proto,
        fab_from_proto,
        get_fused_config_from_fab,
        run_from_proto,
    )

    res = PullTaskInputResponse.FromString(_unb64(spec["task_input"]))
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = res.task_id, res.run.run_id, res.context.node_id
    context, run, fab = context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)
    # the FAB's bytes were checked by the parent; only its declared default config is read (no code)
    context.run_config = get_fused_config_from_fab(fab.content, run)
    certs = Path(spec["root_certificates"]).read_bytes() if spec.get("root_certificates") else None
    grid = ReplyGrid(runtime_api_address=spec["runtime_api"], insecure=certs is None, root_certificates=certs,
                     token=spec["token"])
    grid.set_run(run)
    client = _task_client(spec["runtime_api"], spec.get("root_certificates"), spec["token"], "flwr-serverapp")
    stop = StopSignals(run.run_id)
    stopped = stop.stopped
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop.on_signal)
    parent = spec.get("parent_pid")

    def watch() -> None:  # a stopped run (heartbeat) or a dead SuperLink ends this process's main loop
        while True:
            time.sleep(0.2)
            if stop.due():  # a stopped run not yet told, or told in vain (the app swallowed RunStopped)
                os.kill(os.getpid(), signal.SIGUSR1)
            elif not stopped.is_set() and parent is not None and not _alive(int(parent)):
                os.kill(os.getpid(), signal.SIGTERM)  # the SuperLink's executor is gone: a failure, once
                return

    threading.Thread(target=watch, daemon=True).start()
    heartbeat = HeartbeatSender(_heartbeat_fn(client, stopped))
    heartbeat.start()
    sub_status, details = SubStatus.FAILED, "ServerApp failed"
    try:
        app = _load_object(spec["app"])
        app(grid=grid, context=context)
        sub_status, details = SubStatus.COMPLETED, ""
    except RunStopped as ex:
        sub_status, details = (SubStatus.STOPPED if stopped.is_set() else SubStatus.FAILED), str(ex)
    except BaseException as ex:  # noqa: BLE001 - reported as the task's status
        details = f"ServerApp failed with exception: {ex}"
    finally:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        if heartbeat.is_running:
            heartbeat.stop()
        if not stopped.is_set():  # a stopped run's token is revoked: nothing to push
            try:
                client.PushTaskOutput(PushTaskOutputRequest(context=context_to_proto(context),
                                                            sub_status=sub_status, details=details))
            except Exception:  # noqa: BLE001 - the SuperLink may be gone
                pass
        client.close()
        grid.close()
    return 0 if sub_status == SubStatus.COMPLETED else 1


def run_simulation_task(spec: dict) -> int:
    """The child of a simulation task: Flower's simulation runtime (``flwr-simulation``'s body) on
    the input the parent pulled and checked.

    A task's input can be pulled once (the pull starts the task), and Flower's runtime pulls it
    itself, so the connection it opens is given that one reply instead of a second pull.  The FAB
    it installs and loads is the pinned one (the parent checked its sha256 and the run's
    signature): the shim app that imports the installed fedsonmf objects.
    """
    from queue import Queue

    # flwr.simulation needs the simulation extra (Ray): imported here, on use, not by compat (whose
    # CONTRACT covers its two names)
    from flwr.simulation import app as sim_app

    from fedsonmf.federation.flower.compat import PullTaskInputResponse, mirror_output_to_queue, restore_output

    pulled = PullTaskInputResponse.FromString(_unb64(spec["task_input"]))

    class PrePulled(sim_app.SimulationIoConnection):
        def _connect(self) -> None:
            super()._connect()
            assert self._client is not None  # connected
            self._client.PullTaskInput = lambda request: pulled  # type: ignore[method-assign] # the task's one input

    sim_app.SimulationIoConnection = PrePulled  # type: ignore[misc]
    certs = Path(spec["root_certificates"]).read_bytes() if spec.get("root_certificates") else None
    log_queue: Queue = Queue()
    mirror_output_to_queue(log_queue)
    try:  # ends with flwr_exit (SystemExit) like flwr-simulation
        sim_app.run_simulation_process(runtime_api_address=spec["runtime_api"], log_queue=log_queue,
                                       token=spec["token"], insecure=certs is None, certificates=certs,
                                       parent_pid=spec.get("parent_pid"), runtime_dependency_install=False)
    finally:
        restore_output()
    return 0


def serve(argv=None) -> int:
    """Entry point of ``python -m fedsonmf.federation.flower.gate``."""
    ap = argparse.ArgumentParser(prog="fedsonmf-gate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=list(ROLES))
    ap.add_argument("--runtime-api")
    ap.add_argument("--pin")
    ap.add_argument("--secret")
    ap.add_argument("--ledger")
    ap.add_argument("--app", default=None)
    ap.add_argument("--parent-pid", type=int, default=None)
    ap.add_argument("--root-certificates", default=None)
    ap.add_argument("--poll", type=float, default=float(os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", 0.05)))
    ap.add_argument("--max-poll", type=float, default=MAX_POLL)
    ap.add_argument("--serverapp-task", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--simulation-task", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serverapp_task:
        return run_serverapp_task(json.loads(sys.stdin.read()))
    if args.simulation_task:
        return run_simulation_task(json.loads(sys.stdin.read()))
    missing = [f"--{k}" for k in ("role", "runtime_api", "pin", "secret", "ledger") if getattr(args, k) is None]
    if missing:
        ap.error(f"missing {', '.join(m.replace('_', '-') for m in missing)}")
    secret = Path(check_private_file(args.secret, "SuperExec auth secret")).read_bytes()
    check_private_file(args.pin, "gate pin file")
    ex = Executor(args.role, args.runtime_api, Gate(args.pin, args.ledger), secret, app_ref=args.app,
                  root_certificates=args.root_certificates, parent_pid=args.parent_pid, poll=args.poll,
                  max_poll=args.max_poll)

    def bye(signum, _frame):
        for c in ex.children:  # the ServerApp children go with us
            if c.poll() is None:
                c.terminate()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, bye)
    signal.signal(signal.SIGINT, bye)
    if args.parent_pid is not None:  # our daemon died (e.g. kill -9): exit, even in the middle of a task
        def watch() -> None:
            while _alive(args.parent_pid):
                time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, daemon=True).start()
    ex.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
