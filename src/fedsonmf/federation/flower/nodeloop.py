"""fedsonmf's own SuperNode: one process that holds the node's Fleet connection, checks every
task at the gate and runs the installed ClientApp, waiting on the SuperLink, not on fixed sleeps.

Why.  flwr 1.42's ``flower-supernode`` sleeps a hard-coded 3 s after every empty pull of the
SuperLink (``flwr/supernode/start_client_internal.py``), and it pulls right after each reply,
before the next round's message exists; it then checks for the reply every 0.5 s.  A trivial
exchange of a deployment cost ≈ 4.5 s there, whatever the network (docs/flower.md, "The node
loop").  This loop is composed from the same connection Flower's SuperNode uses
(``flwr.supernode.fleet_http_connection.http_request_response``: TLS, the node's
authentication key, node registration, the heartbeat), through :mod:`.compat`, and from the
gate's checks (:class:`.gate.Gate`); no Flower module is patched.

What it does for every message pulled:

1. the run's info and app bundle (FAB) from the SuperLink (once per run);
2. the gate's checks, on every message, as the gate executor does for every task: the FAB's
   sha256 pinned on this host, the run's coordinator-signed single-use authorisation
   (:meth:`.gate.Gate.check`).  A refused message gets an error reply naming the reason, and its
   content is not even pulled;
3. the message's content, then the installed ClientApp (``fedsonmf``'s, or the operator's
   ``--app``) on it, in this process, with the run series' context (``context.state`` kept
   in memory per series, as Flower's SuperNode keeps it);
4. the reply pushed before the next pull: tasks are sequential, as in the gate executor.  The
   message's receipt is confirmed to the SuperLink beside the ClientApp's work, not before it.

Against the stock pair (``flower-supernode`` + the gate executor over the node's Runtime API)
it has one process fewer per node and no Runtime API port at all: nothing on the node's host can
acquire a task, with or without the SuperExec secret.

The waits (:mod:`.waits`).  The Fleet API has no server push: a node learns of a message by
pulling.  After its reply the node first waits half the shortest recent time the next message took
to come, then each wait is :data:`~.waits.IDLE_FRACTION` of the time since the reply, between
:data:`~.waits.MIN_IDLE_WAIT` and :data:`~.waits.MAX_IDLE_WAIT`.  A message thus waits at most a
quarter of the node's idle time (never more than 0.5 s) beyond the expected time, the pulls of an
idle node fall to two a second, and a stop (SIGTERM) ends the wait at once.

Command line (started by :class:`~fedsonmf.federation.flower.deployment.LoopbackDeployment`)::

    python -m fedsonmf.federation.flower.nodeloop --superlink HOST:PORT \\
        (--root-certificates CA.pem | --insecure) [--auth-supernode-private-key KEY] \\
        --node-config 'partition-id=0 ...' --pin PIN.json --ledger LEDGER.json \\
        [--app module:attr] [--gate-log FILE]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fedsonmf._io import check_private_file, open_private
from fedsonmf.exceptions import InputError
from fedsonmf.federation.flower import compat
from fedsonmf.federation.flower.gate import (
    DEFAULT_CLIENT_APP,
    MESSAGE_PULL_SECONDS,
    Gate,
    Refused,
    _load_object,
)
from fedsonmf.federation.flower.waits import MAX_IDLE_WAIT, IdleWait

__all__ = ["NodeLoop", "node_argv", "main"]


class NodeLoop:
    """The node's message handling (see the module docstring); :meth:`serve` runs it on a connection.

    Parameters
    ----------
    gate : Gate
        This host's pin and ledger.
    app : callable
        The ClientApp object (``app(message=..., context=...)``).
    node_config : dict
        The node config (``partition-id``, ``data-path``, ...), as ``--node-config`` parses.
    log : callable or None
        ``log(text)`` for the gate's events (refusals, task times); default: stderr.
    """

    def __init__(self, gate: Gate, app, node_config: dict, *, log=None):
        self.gate, self.app, self.node_config = gate, app, dict(node_config)
        self.log = log or (lambda text: print(f"[fedsonmf-node] {text}", file=sys.stderr, flush=True))
        self._runs: dict[int, tuple] = {}  # run id -> (Run, Fab)
        self._contexts: dict[int, object] = {}  # run series -> Context (its state persists across runs)
        self._context_run: dict[int, int] = {}  # run series -> the run its context was made for
        self.timings: list[float] = []  # seconds per handled message (pull of content to reply pushed)
        self.pulls: tuple[int, float] = (0, 0.0)  # empty pulls before the message in hand, their mean seconds
        self._confirms = compat.Confirmations(self.log)  # in the background, in the order of the messages

    def serve(self, conn, stop: threading.Event, idle: IdleWait | None = None) -> None:
        """Pull and handle messages on ``conn`` (the tuple ``compat.fleet_connection`` yields)
        until ``stop`` is set."""
        calls = dict(zip(compat.FLEET_CALLBACKS, conn))
        idle = idle or IdleWait(stop)
        empty, empty_s = 0, 0.0  # empty pulls since the last message, and their seconds
        while not stop.is_set():
            tp = time.perf_counter()
            got = calls["receive"]()
            if got is None:
                empty, empty_s = empty + 1, empty_s + time.perf_counter() - tp
                if not idle.wait():
                    return
                continue
            t0 = time.perf_counter()
            idle.arrived(first_pull=empty == 0)
            self.pulls = (empty, empty_s / max(empty, 1))
            self.handle(calls, *got)
            self.timings.append(time.perf_counter() - t0)
            idle.activity()
            empty, empty_s = 0, 0.0

    def _run_and_fab(self, calls, run_id: int):
        if run_id not in self._runs:
            run = calls["get_run"](run_id)
            self._runs[run_id] = (run, calls["get_fab"](run.fab_hash, run_id))
        return self._runs[run_id]

    def _context(self, run, fab, node_id: int):
        """The run series' context, made (with the fused run config) when a run is first seen."""
        from flwr.app import Context, RecordDict

        series = int(run.series_id)
        if self._context_run.get(series) != run.run_id:
            old = self._contexts.get(series)
            self._contexts[series] = Context(
                run_id=run.run_id, node_id=node_id, node_config=dict(self.node_config),
                state=old.state if old is not None else RecordDict(),  # type: ignore[attr-defined]
                run_config=compat.get_fused_config_from_fab(fab.content, run), series_id=series)
            self._context_run[series] = run.run_id
        return self._contexts[series]

    def handle(self, calls, message, tree) -> None:
        """One message: gate, content, ClientApp, reply (see the module docstring)."""
        from flwr.app import Error, Message

        from fedsonmf.federation.flower.codec import error_reason

        run_id = int(message.metadata.run_id)
        t0 = time.perf_counter()
        parts = {}  # seconds per step, for the log line
        pulled = pushed = 0
        try:
            run, fab = self._run_and_fab(calls, run_id)
            try:
                self.gate.check(fab.content, run_id, dict(run.override_config))
            except Refused as why:
                details = f"refused by the fedsonmf gate: {why}"
                self.log(f"run {run_id}: {details}")
                reply = Message(Error(code=compat.ErrorCode.INVALID_FAB, reason=details), reply_to=message)
            else:
                contents = compat.pull_objects(
                    [t.object_id for t in compat.iterate_object_tree(tree)],
                    lambda oid: calls["pull_object"](run_id, oid), max_time=MESSAGE_PULL_SECONDS,
                    initial_backoff=compat.OBJECT_BACKOFF, backoff_cap=compat.OBJECT_BACKOFF_CAP)
                self._confirm(calls, run_id, tree.object_id)
                full = compat.inflate_object_from_contents(tree.object_id, contents)
                if not isinstance(full, Message):
                    raise TypeError(f"the message's object tree holds a {type(full).__name__}, not a Message")
                full.metadata.__dict__["_message_id"] = tree.object_id  # the deflated message lacks its own id
                parts["pull"] = time.perf_counter() - t0
                pulled = sum(1 for _ in compat.iterate_object_tree(tree))
                node_id = int(calls["node_id"])
                context = self._context(run, fab, node_id)
                ident = compat.TaskIdentity  # what a message made by the app is stamped with
                ident.task_id, ident.run_id, ident.node_id = 0, run_id, node_id
                t1 = time.perf_counter()
                try:
                    reply = self.app(message=full, context=context)
                except Exception as ex:  # noqa: BLE001 - becomes the error reply, as in flwr-clientapp
                    details = error_reason(ex)
                    self.log(f"run {run_id}: ClientApp raised {details}")
                    reply = Message(Error(code=compat.ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details),
                                    reply_to=full)
                parts["app"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            pushed = self._push(calls, run_id, reply, t2 - t0)
            parts["push"] = time.perf_counter() - t2
        except compat.RunNotRunningException:  # the run was stopped or finished meanwhile: nothing to answer
            self.log(f"run {run_id} is not running; message {message.metadata.message_id} ignored")
        except Exception as ex:  # noqa: BLE001 - a broken message must not end the node
            self.log(f"run {run_id}: message {message.metadata.message_id} failed: {error_reason(ex)}")
        else:
            steps = ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
            steps += (f"; {pulled} objects in, {pushed} out; {self.pulls[0]} empty pulls before it, "
                      f"{1e3 * self.pulls[1]:.1f} ms each")
            self.log(f"task handled in {time.perf_counter() - t0:.3f} s ({steps})")

    def _confirm(self, calls, run_id: int, message_id: str) -> None:
        """Tell the SuperLink the message is here (it may drop its objects), beside the ClientApp's
        work rather than before it (:class:`.compat.Confirmations`)."""
        self._confirms.submit(lambda: calls["confirm_message_received"](run_id, message_id),
                              f"run {run_id}: message {message_id}")

    @staticmethod
    def _push(calls, run_id: int, reply, runtime: float) -> int:
        """Push ``reply`` and the objects the SuperLink asks for (Flower's own SuperNode sequence);
        return the number of objects pushed."""
        reply.metadata.__dict__["_message_id"] = reply.object_id
        with compat.no_object_id_recompute():
            tree = compat.get_object_tree(reply)
            to_push, session = calls["send"](reply, tree, runtime)
            wanted = set(to_push)
            items = [(oid, obj) for oid, obj in compat.get_all_nested_objects(reply).items() if oid in wanted]
        if items:  # side by side: each object is one HTTPS request (Flower's helper: 2 at a time on 2 cores)
            with ThreadPoolExecutor(max_workers=min(len(items), compat.OBJECT_PUSH_WORKERS)) as pool:
                for done in [pool.submit(lambda it: calls["push_object"](run_id, session, it[0], it[1].deflate()),
                                         item) for item in items]:
                    done.result()
        return len(items)


def node_argv(superlink: str, *, ca_cert, private_key, node_config: str, gate_dir, app: str | None = None,
              gate_log=None) -> list[str]:
    """The command line of one node's loop (``python -m fedsonmf.federation.flower.nodeloop``).

    Parameters
    ----------
    superlink : str
        ``HOST:PORT`` of the SuperLink's Fleet API.
    ca_cert : path or None
        The CA certificate; None: plain HTTP.
    private_key : path or None
        The node's authentication key (OpenSSH, 0600); None: no node authentication.
    node_config : str
        The ``--node-config`` string (:func:`.security.node_config`).
    gate_dir : path
        The node's gate folder (``pin.json``, ``ledger.json``).
    app : str or None
        ``module:attr`` of an installed ClientApp (None: fedsonmf's).
    gate_log : path or None
        Where the gate's events go (appended, 0600); None: stderr.

    Returns
    -------
    list of str
    """
    d = Path(gate_dir)
    args = [sys.executable, "-m", "fedsonmf.federation.flower.nodeloop", "--superlink", str(superlink)]
    args += ["--root-certificates", str(ca_cert)] if ca_cert else ["--insecure"]
    if private_key:
        args += ["--auth-supernode-private-key", str(private_key)]
    args += ["--node-config", node_config, "--pin", str(d / "pin.json"), "--ledger", str(d / "ledger.json")]
    if app:
        args += ["--app", app]
    if gate_log:
        args += ["--gate-log", str(gate_log)]
    return args


def _auth_keys(path):
    """The node's key pair from its OpenSSH private key file (as ``flower-supernode`` reads it)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = compat.load_ssh_private_key(Path(check_private_file(path, "SuperNode private key")).read_bytes(), None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InputError(f"{path} holds a {type(key).__name__}, not a SuperNode's elliptic-curve key")
    return key, key.public_key()


def main(argv=None) -> int:
    """Entry point of ``python -m fedsonmf.federation.flower.nodeloop``."""
    ap = argparse.ArgumentParser(prog="fedsonmf-node", description=__doc__.split("\n\n")[0])
    ap.add_argument("--superlink", required=True)
    ap.add_argument("--root-certificates", default=None)
    ap.add_argument("--insecure", action="store_true")
    ap.add_argument("--auth-supernode-private-key", default=None)
    ap.add_argument("--node-config", default="")
    ap.add_argument("--pin", required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--app", default=DEFAULT_CLIENT_APP)
    ap.add_argument("--gate-log", default=None)
    ap.add_argument("--max-idle-wait", type=float, default=MAX_IDLE_WAIT)
    args = ap.parse_args(argv)
    if bool(args.insecure) == bool(args.root_certificates):
        ap.error("give exactly one of --root-certificates and --insecure")
    if args.insecure and args.auth_supernode_private_key:
        ap.error("SuperNode authentication needs TLS (--root-certificates), as Flower's SuperNode requires")
    check_private_file(args.pin, "gate pin file")
    keys = _auth_keys(args.auth_supernode_private_key) if args.auth_supernode_private_key else None
    node_config = compat.parse_config_args([args.node_config] if args.node_config else None)
    gate_log = open_private(args.gate_log, "ab") if args.gate_log else sys.stderr.buffer

    def log(text: str) -> None:
        gate_log.write(f"[fedsonmf-node] {time.strftime('%H:%M:%S')} {text}\n".encode())
        gate_log.flush()

    loop = NodeLoop(Gate(args.pin, args.ledger), _load_object(args.app), node_config, log=log)
    stop = threading.Event()

    def bye(signum, _frame):  # leaves the connection's context: the node deactivates itself at the SuperLink
        stop.set()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, bye)
    signal.signal(signal.SIGINT, bye)
    with compat.fleet_connection(args.superlink, insecure=bool(args.insecure), root_certificates=args.root_certificates,
                                 authentication_keys=keys) as conn:
        log(f"connected to {args.superlink} as node {conn[0]}")
        loop.serve(conn, stop, IdleWait(stop, max_wait=args.max_idle_wait))
    return 0


if __name__ == "__main__":
    sys.exit(main())
