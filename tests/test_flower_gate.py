"""The attacks on a deployment (only our app runs on the nodes; faults and files) on a real
loopback deployment, and the gate's checks and the file helpers without processes.

Deploy-marked tests share one gated deployment (a SuperLink, 3 SuperNodes, their gate
executors); the SuperLink kill -9 test starts its own through :func:`run_flower`.
The outsider is a ``flwr`` CLI with a fresh, credential-less FLWR_HOME that only knows
the SuperLink's address.
"""

import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from _waits import STALL, join, status_progress, wait_until  # noqa: E402
from fedsonmf._io import PrivateFileError, check_private_file, write_atomic, write_json_atomic  # noqa: E402
from fedsonmf.datasets import make_synthetic  # noqa: E402
from fedsonmf.exceptions import FlowerRunError, InputError  # noqa: E402
from fedsonmf.federation import checkpoint as ckpt  # noqa: E402
from fedsonmf.federation.flower import (  # noqa: E402
    LoopbackDeployment,
    gate,  # noqa: E402
    load_result,
    write_app_dir,
    write_views,
)
from fedsonmf.federation.flower.deployment import _bin, flower_env, superlink_exit_report  # noqa: E402
from fedsonmf.federation.flower.launcher import run_flower  # noqa: E402
from fedsonmf.federation.flower.server_app import _write_json, resolve_out_dir, stopped_status  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402
from fedsonmf.protocol.history import FitResult, History  # noqa: E402

R, N = 4, 60
CFG = FedConfig(n_components=R, tau=3)
deploy = [pytest.mark.slow, pytest.mark.deploy]

EVIL_CLIENT = '''
import os
from pathlib import Path
import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def steal(msg: Message, context: Context) -> Message:
    marker = Path(str(context.run_config["marker-dir"])) / f"client-ran-{os.getpid()}"
    marker.write_text(str(dict(context.node_config)))
    X = np.load(str(context.node_config["data-path"]), allow_pickle=False)
    return Message(RecordDict({"loot": ArrayRecord({"row0": Array(np.asarray(X[0]))})}), reply_to=msg)
'''

EVIL_SERVER = '''
import time
from pathlib import Path
import numpy as np
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    out = Path(str(context.run_config["marker-dir"]))
    (out / "server-ran").write_text("yes")
    nodes = []
    for _ in range(100):
        nodes = list(grid.get_node_ids())
        if nodes:
            break
        time.sleep(0.1)
    msgs = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]
    reps = grid.send_and_receive(msgs, timeout=60)
    np.save(out / "loot.npy", np.array([r.content["loot"]["row0"].numpy() for r in reps if not r.has_error()]))
'''


def write_evil_app(dest: Path, marker_dir: Path) -> Path:
    """A tiny foreign Flower app: its ClientApp reads the node's view (data-path), drops a marker
    file and sends row 0 back; its ServerApp collects the rows."""
    pkg = dest / "evilapp"
    pkg.mkdir(parents=True)
    (dest / "LICENSE").write_text("MIT\n")
    (dest / "pyproject.toml").write_text(f'''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "evilapp"
version = "1.0.0"
description = "copies every node's view"
license = {{ file = "LICENSE" }}
dependencies = ["flwr>=1.42.0,<1.43"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "mallory"
fab-format-version = 1
flwr-version-target = "1.42.0"

[tool.flwr.app.components]
serverapp = "evilapp.server_app:app"
clientapp = "evilapp.client_app:app"

[tool.flwr.app.config]
marker-dir = "{marker_dir}"
''')
    (pkg / "__init__.py").write_text("")
    (pkg / "client_app.py").write_text(EVIL_CLIENT)
    (pkg / "server_app.py").write_text(EVIL_SERVER)
    return dest


# ----------------------------------------------------------------------------- no processes


def _signed(tmp_path, fab=b"our-fab-bytes", **config):
    auth = gate.Authority.create(tmp_path / "coordinator.key")
    gate.write_pin(tmp_path / "pin.json", [gate.fab_sha256(fab)], auth.public_key)
    conf = {"job-id": "j1", "out-dir": "/runs/x", "num-rounds": 3, **config}
    conf[gate.TOKEN_KEY] = auth.token(job_id="j1", fab_hash=gate.fab_sha256(fab), run_config=conf)
    return auth, gate.Gate(tmp_path / "pin.json", tmp_path / "ledger.json"), conf


def test_gate_refuses_foreign_fab_missing_or_forged_token_changed_config_and_replay(tmp_path):
    auth, g, conf = _signed(tmp_path)
    with pytest.raises(gate.Refused, match="is not the fedsonmf app pinned"):
        g.check(b"evil-fab-bytes", 7, conf)
    with pytest.raises(gate.Refused, match="carries no coordinator authorisation"):
        g.check(b"our-fab-bytes", 7, {k: v for k, v in conf.items() if k != gate.TOKEN_KEY})
    other = gate.Authority.create(tmp_path / "mallory.key")  # a key the hosts did not pin
    forged = {**conf, gate.TOKEN_KEY: other.token(job_id="j1", fab_hash=gate.fab_sha256(b"our-fab-bytes"),
                                                  run_config=conf)}
    with pytest.raises(gate.Refused, match="not signed by this deployment's coordinator"):
        g.check(b"our-fab-bytes", 7, forged)
    with pytest.raises(gate.Refused, match="run config differs"):
        g.check(b"our-fab-bytes", 7, {**conf, "out-dir": "/tmp/stolen"})
    payload = g.check(b"our-fab-bytes", 7, conf)  # the authorised run, as often as it asks
    assert payload["job-id"] == "j1" and g.check(b"our-fab-bytes", 7, conf) == payload
    with pytest.raises(gate.Refused, match="issued for run 7 \\(a re-submission\\)"):
        g.check(b"our-fab-bytes", 8, conf)
    assert stat.S_IMODE((tmp_path / "ledger.json").stat().st_mode) == 0o600


def test_gate_refuses_a_stale_token(tmp_path):
    _, g, conf = _signed(tmp_path)
    g.max_age = -100.0  # every token is too old
    with pytest.raises(gate.Refused, match="s old"):
        g.check(b"our-fab-bytes", 7, conf)


def test_key_secret_and_pin_files_readable_by_others_are_refused(tmp_path):
    auth, g, conf = _signed(tmp_path)
    for name in ("coordinator.key", "pin.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    os.chmod(tmp_path / "pin.json", 0o644)
    with pytest.raises(PermissionError, match=r"pin.json is readable or writable by group/others \(mode 0644\)"):
        g.check(b"our-fab-bytes", 7, conf)
    os.chmod(tmp_path / "coordinator.key", 0o640)
    with pytest.raises(PermissionError, match="chmod 600"):
        gate.Authority.load(tmp_path / "coordinator.key")
    secret = gate.write_secret(tmp_path / "superexec.secret")
    assert check_private_file(secret) == secret and len(secret.read_bytes()) == 32
    with pytest.raises(PrivateFileError, match="does not exist") as caught:
        check_private_file(tmp_path / "nope.key")
    assert isinstance(caught.value, InputError) and isinstance(caught.value, FileNotFoundError)  # one type, both roles


def test_write_atomic_failure_mid_write_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "result.json"
    write_json_atomic(target, {"ok": 1})

    def half_then_disk_full(fh):
        fh.write(b'{"ok": 2, "trunc')
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, half_then_disk_full)
    assert json.loads(target.read_text()) == {"ok": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no temporary file left

    # FitResult.save_json (the CLI's --json): a failing fsync (disk full) keeps the old, valid file
    res = FitResult(V=np.ones((2, 3)), bases=None, history=History([]), n_rounds=0, stopping_reason="x",
                    converged=False, seed=0, config={}, seconds=0.0)
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(OSError):
        res.save_json(target)
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"ok": 1}
    res.save_json(target)
    assert json.loads(target.read_text())["stopping_reason"] == "x"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_an_idle_executor_backs_off_its_polls_and_a_task_brings_them_back(tmp_path, monkeypatch):
    """The Runtime API is polled every ``poll`` s right after a task; every empty poll doubles the wait
    up to ``max_poll`` (an idle deployment's polls were most of its CPU)."""
    _, g, _ = _signed(tmp_path)
    ex = gate.Executor("clientapp", "127.0.0.1:1", g, b"s" * 32, poll=0.05, max_poll=0.4, log=lambda text: None)
    answers = iter([False] * 6 + [True] + [False] * 3)  # a task after six empty polls
    handled, waits = [], []

    class Reply:
        def __init__(self, task):
            self.task, self.token = task, "tok" if task else ""

        def HasField(self, name):  # noqa: N802 - protobuf's name
            return self.task

    class Client:
        def AcquireTask(self, request):  # noqa: N802 - Flower's RPC name
            return Reply(next(answers))

    def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 9:
            raise StopIteration  # ends serve_forever

    ex.client = Client()
    monkeypatch.setattr(ex, "handle_client_task", handled.append)
    monkeypatch.setattr(gate.time, "sleep", sleep)
    with pytest.raises(StopIteration):
        ex.serve_forever()
    assert handled == ["tok"]
    assert waits == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.4, 0.4, 0.05, 0.1, 0.2])


def test_server_app_writes_only_inside_its_out_dir(tmp_path, monkeypatch):
    root = tmp_path / "run"
    monkeypatch.setenv("FEDSONMF_OUT_ROOT", str(root))
    with pytest.raises(PermissionError, match="writes only inside"):
        resolve_out_dir(str(tmp_path / "elsewhere"))
    assert not (tmp_path / "elsewhere").exists()
    with pytest.raises(ValueError, match="absolute"):
        resolve_out_dir("relative/out")
    out = resolve_out_dir(str(root / "server"))
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    (tmp_path / "victim.json").write_text("{}")
    (out / "status.json").symlink_to(tmp_path / "victim.json")  # a planted link out of the folder
    with pytest.raises(PermissionError, match="resolves to"):
        _write_json(out / "status.json", {"status": "running"})
    assert (tmp_path / "victim.json").read_text() == "{}"


class _StaleTaskClient:
    """A SuperNode's Runtime API for a task whose message content never arrives: what a SuperNode
    keeps of a message it pulled as its run was stopped (Flower 1.42)."""

    def __init__(self):
        from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
        from flwr.supercore.fab import Fab
        from flwr.supercore.run import Run

        msg = Message(RecordDict({"a": ArrayRecord({"x": Array(np.arange(3.0))})}), dst_node_id=7,
                      message_type="query")
        self.msg, self.pulls = msg, 0
        self.context = Context(run_id=5, node_id=7, node_config={}, state=RecordDict(), run_config={})
        self.run, self.fab = Run.create_empty(5), Fab("0" * 64, b"fab", {})

    def PullTaskInput(self, _req):
        from flwr.common.serde import context_to_proto, fab_to_proto, run_to_proto
        from flwr.proto.runtime_pb2 import PullTaskInputResponse

        return PullTaskInputResponse(context=context_to_proto(self.context), run=run_to_proto(self.run),
                                     fab=fab_to_proto(self.fab), task_id=3)

    def PullMessages(self, _req):
        from flwr.app.message import remove_content_from_message
        from flwr.common.serde import message_to_proto
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse
        from flwr.supercore.inflatable.inflatable_object import get_object_tree

        self.msg.metadata.__dict__["_message_id"] = self.msg.object_id
        return PullAppMessagesResponse(messages_list=[message_to_proto(remove_content_from_message(self.msg))],
                                       message_object_trees=[get_object_tree(self.msg)])

    def PullObject(self, _req):
        from flwr.proto.message_pb2 import PullObjectResponse

        self.pulls += 1
        return PullObjectResponse(object_found=True, object_available=False)

    def ConfirmMessageReceived(self, _req):  # never reached
        raise AssertionError("confirmed a message that never arrived")


def test_a_task_whose_message_never_arrives_fails_after_the_bound_instead_of_hours():
    """Before: Flower's pull retried for up to 2 h while the executor served nothing else; the next
    run's handshake found no view (CI, after an external ``flwr stop``)."""
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1  # Message(...) outside a runtime
    try:
        client = _StaleTaskClient()
        t0 = time.monotonic()
        with pytest.raises(ObjectPullError):
            gate.pull_task_input(client, max_time=1.0)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old
    assert client.pulls >= 2 and time.monotonic() - t0 < 60  # retried, then gave up (backoff 1 s, jitter)
    assert gate.MESSAGE_PULL_SECONDS <= 300  # well inside the node timeouts of a run's handshake


def test_failure_and_stop_reports_name_the_signal_and_rounds(tmp_path):
    from fedsonmf.protocol.messages import ServerState

    out = tmp_path / "server"
    st = ServerState(round=4, arrays={"V": np.zeros((2, 3))})
    ckpt.save_server_checkpoint(out / "checkpoint", st, History([{"round": s} for s in (1, 2, 3)]), {"job_id": "j"})
    rep = superlink_exit_report(-signal.SIGKILL, out)
    assert rep["status"] == "failed" and rep["last_completed_round"] == 3
    assert rep["error"] == "SuperLink exited (SIGKILL) during round 4; last checkpointed round 3; resume with --resume"
    assert stopped_status(2)["error"] == "stopped externally at round 3; resume with --resume from round 3"


def test_a_stop_raises_once_while_the_app_unwinds_then_again_only_if_ignored():
    """Before: Flower's SIGINT (token revoked) raised RunStopped, and 0.2 s later our watch's
    SIGUSR1 raised a second one inside the app's ``status.write`` of 'stopped': status.json
    said 'running' (CI, a loaded machine).  After: one exception per grace period."""
    now = [100.0]
    stop = gate.StopSignals(7, grace=30.0, clock=lambda: now[0])
    assert not stop.due()
    with pytest.raises(gate.RunStopped, match="run 7 was stopped externally") as first:
        stop.on_signal(signal.SIGINT)
    assert first.value.external and stop.stopped.is_set()
    now[0] += 0.2
    assert not stop.due()  # the watch does not signal an app that is unwinding
    assert stop.on_signal(signal.SIGUSR1) is None and stop.on_signal(signal.SIGTERM) is None  # nor do late signals
    now[0] += 30.0
    assert stop.due()  # still running after the grace: it swallowed the stop; told again
    with pytest.raises(gate.RunStopped, match="stopped externally"):
        stop.on_signal(signal.SIGUSR1)
    term = gate.StopSignals(8, clock=lambda: 0.0)
    with pytest.raises(gate.RunStopped, match="got signal SIGTERM") as other:
        term.on_signal(signal.SIGTERM)
    assert not other.value.external and not term.due()  # a dead SuperLink: a failure, not a stop


# ----------------------------------------------------------------------------- deployment


@pytest.fixture(scope="module")
def views(tmp_path_factory):
    d = make_synthetic(n_clients=3, n_samples=N, n_features=12, rank=R, heterogeneity=0.5, random_state=1)
    return write_views(d.views, tmp_path_factory.mktemp("views"))


@pytest.fixture(scope="module")
def gated(tmp_path_factory, views):
    dep = LoopbackDeployment(tmp_path_factory.mktemp("gated") / "run", views)
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()
        assert not _processes_of(dep.run_dir)


def _our_run(dep, job, rounds=1, **kw):
    rc = {"num-rounds": rounds, "seed": 5, "config-json": json.dumps(CFG.to_dict()), "job-id": job,
          "round-timeout": STALL, "node-timeout": STALL, **kw}  # ceilings of event waits (a loaded machine)
    return dep.run(rc, out_dir=dep.run_dir / job)


class Outsider:
    """``flwr`` with a fresh FLWR_HOME that knows only the SuperLink's address (no credentials)."""

    def __init__(self, home: Path, port: int, ca: str | None = None):
        # ca: the deployment's CA certificate (public; TLS is the default since the security merge)
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(f'[superlink]\ndefault = "x"\n\n[superlink.x]\n'
                                          f'address = "127.0.0.1:{port}"\n'
                                          + (f'root-certificates = "{ca}"\n' if ca else "insecure = true\n"))
        self.env, self.home = flower_env(home), home

    def flwr(self, *args, check=True) -> subprocess.CompletedProcess:
        p = subprocess.run([_bin("flwr"), *args], env=self.env, capture_output=True, text=True, timeout=180,
                           cwd=self.home)
        assert not check or p.returncode == 0, p.stdout + p.stderr
        return p

    def submit(self, app_dir, *extra) -> int:
        p = self.flwr("run", str(app_dir), "x", "--format", "json", *extra)
        return int(json.loads(p.stdout[p.stdout.index("{"):])["run-id"])

    def wait_finished(self, run_id: int, timeout: float = STALL) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.flwr("ls", "x", "--format", "json", "--run-id", str(run_id))
            runs = json.loads(p.stdout[p.stdout.index("{"):])["runs"]
            if runs and str(runs[0]["status"]).startswith("finished"):
                return runs[0]
            time.sleep(0.5)
        raise AssertionError(f"run {run_id} did not finish in {timeout} s")


def _processes_of(run_dir: Path) -> list[str]:
    """Live processes whose command line mentions the run folder or whose FLWR_HOME is in it."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (d / "environ").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        home = [e for e in env if e.startswith(b"FLWR_HOME=")]
        if str(run_dir) in cmd or (home and str(run_dir).encode() in home[0]):
            found.append(f"{d.name}: {cmd[:200]}")
    return found


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its socket inodes matched in /proc/net/tcp{,6})."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.slow
@pytest.mark.deploy
def test_foreign_app_runs_on_no_node_and_reads_no_file(gated, tmp_path):
    """(a) Before: the app ran on all three nodes and sent row 0 of each view back.
    After: refused by the SuperLink host's gate (FAB not pinned); no marker, no loot; our run completes."""
    markers = tmp_path / "markers"
    markers.mkdir()
    mallory = Outsider(tmp_path / "mallory", gated.port, gated.tls[0])
    run_id = mallory.submit(write_evil_app(tmp_path / "evil", markers))
    info = mallory.wait_finished(run_id)
    assert info["status"] == "finished:failed"
    assert "refused by the fedsonmf gate" in info["status-details"] and "is not the fedsonmf app" in info[
        "status-details"]
    if gated.node_loop == "fedsonmf":
        # the project's node loop opens no Runtime API: nothing on the node's host can acquire its tasks
        assert all(_listening_ports(proc.pid) == set() for proc in gated.nodes.values())
        outcome = _our_run(gated, "after-evil")
        assert outcome.ok, outcome.status
    else:
        # a stock flower-superexec on the node's host, without the node's SuperExec secret, acquires nothing
        rogue_log = tmp_path / "rogue.log"
        with open(rogue_log, "wb") as fh:
            rogue = subprocess.Popen([_bin("flower-superexec"), "--insecure", "--runtime-api-address",
                                      f"127.0.0.1:{gated._node_ports[0]}"],
                                     env={**gated.env, "FLWR_LOG_LEVEL": "INFO"},
                                     stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            outcome = _our_run(gated, "after-evil")
            assert outcome.ok, outcome.status
            rogue.wait(timeout=STALL)  # its first AcquireTask is refused (401) and it shuts down
        finally:
            if rogue.poll() is None:
                os.killpg(rogue.pid, signal.SIGKILL)
                rogue.wait()
        assert "flwr-clientapp" not in rogue_log.read_text()  # it launched no task
    assert load_result(outcome.out_dir).n_rounds == 1
    assert list(markers.iterdir()) == []  # neither its ServerApp nor any ClientApp ran
    log = (gated.run_dir / "logs" / "gate-superlink.log").read_text()
    assert f"run {run_id}: refused" in log
    for p in range(3):  # no node ran a task of it
        assert str(run_id) not in (gated.node_dir(p) / "gate" / "gate.log").read_text()


@pytest.mark.slow
@pytest.mark.deploy
def test_a_node_that_has_not_pinned_the_app_refuses_its_tasks_with_the_reason(gated):
    """The node's own gate, not only the SuperLink's: node 0's pin holds no app, so it answers every
    task with an error reply naming the reason, and reads nothing of its view."""
    gated._gate_run_config(write_app_dir(gated.run_dir / "app"), {"out-dir": str(gated.run_dir / "x")})  # pinned
    pin = gated.node_dir(0) / "gate" / "pin.json"
    saved = gate.Pin.load(pin)
    gate.write_pin(pin, [], saved.public_key)
    try:
        outcome = _our_run(gated, "unpinned", **{"node-timeout": 15.0, "record-wire": True})
    finally:
        gate.write_pin(pin, saved.fab_sha256, saved.public_key)
    assert outcome.status["status"] == "failed" and "views [0] did not answer" in outcome.status["error"]
    errors = [r for r in map(json.loads, open(outcome.out_dir / "wire.jsonl")) if r["direction"] == "up"
              and "error" in r and r["message_type"] == "query"]  # (the rest: the SuperLink's re-pull notices)
    assert errors and all("refused by the fedsonmf gate: app bundle sha256" in r["error"]["reason"]
                          and "is not the fedsonmf app pinned" in r["error"]["reason"] for r in errors)
    assert "refused by the fedsonmf gate" in (gated.node_dir(0) / "gate" / "gate.log").read_text()
    assert not (gated.node_dir(0) / "state" / "unpinned").exists()  # no state, no view read for this job


@pytest.mark.slow
@pytest.mark.deploy
def test_a_run_the_superlink_gate_refuses_is_reported_with_the_reason(gated, tmp_path):
    """The SuperLink host trusts another coordinator key: the gate refuses our token, and the
    launcher reports the gate's reason (Flower's status details of the run) as soon as Flower
    records the run as failed, instead of waiting for a status the ServerApp never writes."""
    gated._gate_run_config(write_app_dir(gated.run_dir / "app"), {"out-dir": str(gated.run_dir / "x")})  # pinned
    pin = gated.run_dir / "gate" / "pin.json"
    saved = gate.Pin.load(pin)
    gate.write_pin(pin, saved.fab_sha256, gate.Authority.create(tmp_path / "other.key").public_key)
    seen: list[dict] = []
    try:
        rc = {"num-rounds": 1, "seed": 5, "config-json": json.dumps(CFG.to_dict()), "job-id": "refused",
              "round-timeout": STALL, "node-timeout": STALL}
        # without the reason, the wait would end after FINAL_STATUS_TIMEOUT with "wrote no status"
        outcome = gated.run(rc, out_dir=gated.run_dir / "refused", progress=seen.append)
    finally:
        gate.write_pin(pin, saved.fab_sha256, saved.public_key)
    st = outcome.status
    assert st["status"] == "failed" and st["refused"], st
    assert "refused by the fedsonmf gate: the run's authorisation is not signed by this deployment's coordinator" \
        in st["error"], st
    assert f"Flower run {st['run_id']}" in st["error"] and "wrote no status" not in st["error"]
    assert seen and seen[-1] == st  # the progress callback got the reason too
    assert _our_run(gated, "after-refused").ok  # the deployment is unharmed


@pytest.mark.slow
@pytest.mark.deploy
def test_outsider_resubmitting_our_own_app_is_refused(gated, tmp_path):
    """(b) Our FAB (anyone can write the same shim: same sha256) without, or with a copied, token."""
    first = _our_run(gated, "own")
    assert first.ok, first.status
    mallory = Outsider(tmp_path / "mallory", gated.port, gated.tls[0])
    copy = write_app_dir(tmp_path / "copy")  # `fedsonmf flower app` output: byte-identical FAB
    assert gate.fab_sha256(gate.build_fab(copy)) in gate.Pin.load(gated.run_dir / "gate" / "pin.json").fab_sha256
    stolen = gated.run_dir / "stolen"
    plain = mallory.submit(copy, "--run-config", f'out-dir="{stolen}" num-clients=3')
    ours = gated.run_dir / "logs" / f"run-config-{gated._runs}.toml"  # what the launcher submitted for "own"
    assert str(gated.run_dir / "own") in ours.read_text()
    replay = mallory.submit(copy, "--run-config", str(ours))  # our exact config and token
    edited = ours.read_text().replace(str(gated.run_dir / "own"), str(stolen))
    (tmp_path / "edited.toml").write_text(edited)
    changed = mallory.submit(copy, "--run-config", str(tmp_path / "edited.toml"))
    expected = {plain: "carries no coordinator authorisation", replay: "(a re-submission)",
                changed: "the run config differs"}
    for run_id, why in expected.items():
        info = mallory.wait_finished(run_id)
        assert info["status"] == "finished:failed" and why in info["status-details"], info
    assert not stolen.exists()


@pytest.mark.slow
@pytest.mark.deploy
def test_second_launch_on_the_same_out_fails_at_once_naming_the_lock(gated, views):
    """(d) Before: the second launch shared the first's SuperLink and returned its result with exit 0."""
    proc = subprocess.run([sys.executable, "-c", "from fedsonmf.cli.app import main; main()", "flower", "run",
                           *map(str, views), "--out", str(gated.run_dir), "--rounds", "1"],
                          capture_output=True, text=True, timeout=STALL, env={**os.environ})
    assert proc.returncode == 2, proc.stdout + proc.stderr  # refused before anything starts
    assert f"lock {gated.run_dir / '.lock'}" in proc.stderr and f"pid {os.getpid()}" in proc.stderr
    assert "in use by a running launch" in proc.stderr
    assert gated.superlink.poll() is None and _our_run(gated, "still-mine").ok  # the first launch is untouched


@pytest.mark.slow
@pytest.mark.deploy
def test_every_folder_of_a_run_is_0700_and_every_file_0600(gated):
    """(e) Before: results, wire logs and view fingerprints were 0644."""
    outcome = _our_run(gated, "modes", **{"record-wire": True})
    assert outcome.ok, outcome.status
    assert (outcome.out_dir / "wire.jsonl").is_file() and (gated.node_dir(0) / "state").is_dir()
    bad = []
    for path in [gated.run_dir, *gated.run_dir.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            continue
        want = 0o700 if path.is_dir() else 0o600  # public key material too: the operator copies it
        if mode != want:
            bad.append(f"{path.relative_to(gated.run_dir)}: {mode:04o}")
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.deploy
def test_external_stop_is_reported_with_the_round_to_resume_from(gated, tmp_path):
    """Before: ``SystemExit: 0``.  After: 'stopped externally at round k; resume with --resume from round k'.

    The last test on the module's deployment: after an external ``flwr stop`` a SuperNode may keep
    waiting for the reply to a message of the stopped run and serve no later run (a Flower 1.42
    behaviour, docs/flower.md "A SuperNode serves one message at a time"); a test after it on the
    same deployment then waited at its handshake until the 600 s ceiling (seen in a clean-clone CI)."""
    out = gated.run_dir / "stopme"
    got = {}
    # rounds enough that the stop lands mid-run: a trivial round takes about a tenth of a second
    th = threading.Thread(target=lambda: got.setdefault("o", _our_run(gated, "stopme", rounds=3000, tol=0.0)))
    th.start()
    wait_until((out / "checkpoint" / "server.npz").exists, "round 1's checkpoint", progress=status_progress(out),
               alive=th.is_alive)
    run_id = json.loads((out / "status.json").read_text())["run_id"]
    Outsider(tmp_path / "mallory", gated.port, gated.tls[0]).flwr("stop", str(run_id), "x")
    join(th, progress=status_progress(out))
    st = got["o"].status
    k = ckpt.load_server_checkpoint(out / "checkpoint").completed_rounds + 1
    assert st["status"] == "stopped", st
    assert st["error"] == f"stopped externally at round {k}; resume with --resume from round {k}"
    assert json.loads((out / "status.json").read_text())["status"] == "stopped"


@pytest.mark.slow
@pytest.mark.deploy
def test_superlink_kill9_is_reported_and_leaves_no_process(tmp_path, views):
    """(c) Before: 'Flower run failed: None (last completed round None ...)', status.json 'running',
    a flwr-serverapp outliving the CLI.  After: the signal, the round, the checkpoint; failed; nothing left."""
    run_dir = tmp_path / "run"
    got = {}

    def go():
        try:
            run_flower(views, CFG, run_dir=run_dir, max_rounds=3000, tol=0, seed=5, round_timeout=STALL,
                       node_timeout=STALL)
        except FlowerRunError as exc:
            got["error"] = exc

    th = threading.Thread(target=go)
    th.start()
    ckpt_file = run_dir / "server" / "checkpoint" / "server.npz"
    wait_until(ckpt_file.exists, "round 1's checkpoint", progress=status_progress(run_dir / "server"),
               alive=th.is_alive)
    assert ckpt_file.exists(), "round 1 never completed"
    links = [int(p.split(":")[0]) for p in _processes_of(run_dir) if "flower-superlink" in p]
    assert len(links) == 1, _processes_of(run_dir)
    assert any("fedsonmf.federation.flower.gate --serverapp-task" in p for p in _processes_of(run_dir))
    os.kill(links[0], signal.SIGKILL)
    join(th, progress=status_progress(run_dir / "server"))
    msg = str(got["error"])
    m = re.fullmatch(r"SuperLink exited \(SIGKILL\) during round (\d+); last checkpointed round (\d+); "
                     r"resume with --resume", msg)
    assert m, msg
    assert int(m.group(1)) == int(m.group(2)) + 1 and int(m.group(2)) >= 1
    assert int(m.group(2)) == ckpt.load_server_checkpoint(run_dir / "server" / "checkpoint").completed_rounds
    st = json.loads((run_dir / "server" / "status.json").read_text())
    assert st["status"] == "failed" and st["superlink_exit"] == "SIGKILL"
    assert not _processes_of(run_dir)  # SuperNodes, gate executors, the ServerApp child: all gone


def test_a_reader_keeps_a_live_writers_temporary_file(tmp_path):
    """A monitor polling the server checkpoint must not delete a write in progress (the temp file
    names its writer's pid); a killed writer's leftover is removed."""
    from fedsonmf.protocol.messages import ServerState

    d = tmp_path / "checkpoint"
    ckpt.save_server_checkpoint(d, ServerState(round=1, arrays={"V": np.zeros((2, 3))}), History([]), {})
    live = d / f".server.npz.{os.getpid()}-abc123.tmp"
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
    dead = d / f".server.npz.{dead_pid}-def456.tmp"
    live.write_bytes(b"in progress")
    dead.write_bytes(b"torn")
    assert ckpt.load_server_checkpoint(d).completed_rounds == 0
    assert live.exists() and not dead.exists()
