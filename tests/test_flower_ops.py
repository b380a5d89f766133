"""Operating the Flower commands: progress off a terminal, daemons on one host, run-folder hygiene.

* ``flower run/cluster/submit`` with a stderr that is not a terminal (``nohup``, CI, ``2> log``)
  print plain timestamped lines at a bounded rate (:class:`PlainProgress`);
* the docs' multi-machine recipe rehearsed on one host: two ``flower supernode`` commands against
  one SuperLink both register (the node loop opens no port), and a port that is taken is named
  with its option before any daemon starts;
* a run folder keeps no copy of the views after a completed run unless ``--keep-views``, says its
  size, and a non-empty ``--out`` is refused without ``--resume`` or ``--overwrite``.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from typer.testing import CliRunner  # noqa: E402

from _waits import STALL  # noqa: E402
from fedsonmf.cli.app import app  # noqa: E402
from fedsonmf.cli.flower import PlainProgress, _claim_out_folder, _submit_with_progress  # noqa: E402
from fedsonmf.federation.flower import security as sec  # noqa: E402
from fedsonmf.federation.flower.deployment import _free_port  # noqa: E402
from fedsonmf.federation.flower.launcher import drop_view_copies  # noqa: E402

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


# ----------------------------------------------------------------------------- progress off a terminal
def test_plain_progress_writes_a_line_per_change_and_few_per_round():
    lines, now = [], [0.0]
    prog = PlainProgress(200, every=5.0, write=lines.append, clock=lambda: now[0])
    prog.update({"status": "running", "phase": "handshake"})
    prog.update({"status": "running", "phase": "handshake"})  # nothing new: no line
    for k in range(1, 101):  # 100 rounds in 40 s: a line on entering the phase, then one per 5 s
        now[0] += 0.4
        prog.update({"status": "running", "phase": "round", "round": k + 1, "rounds_done": k,
                     "seconds_per_round": 0.4})
    assert 8 <= len(lines) <= 11, lines
    assert all(re.match(STAMP, line) for line in lines), lines
    assert lines[0].endswith("waiting for the SuperNodes (handshake)")
    assert re.search(r"round 2 of 200, 0\.4 s/round, ETA 80 s$", lines[1]), lines[1]
    now[0] += 0.1  # a new stage is shown at once
    prog.update({"status": "running", "phase": "clustering", "rounds_done": 100, "stage": "refine", "exchanges": 1})
    assert lines[-1].endswith("clustering: k-means refinement, exchange 1")
    now[0] += 6
    prog.update({"status": "running", "phase": "clustering", "rounds_done": 100, "stage": "refine",
                 "exchanges": 9, "seconds_per_exchange": 0.51})
    assert lines[-1].endswith("clustering: k-means refinement, exchange 9, 0.51 s/exchange")
    prog.update({"status": "completed", "phase": "done", "rounds_done": 100, "n_rounds": 100, "exchanges": 9})
    assert lines[-1].endswith("done: 100 rounds (of at most 200), 9 clustering exchanges")
    prog.update({"status": "failed", "error": "client 1 timed out in round 3"})
    assert lines[-1].endswith("failed: client 1 timed out in round 3")


STAND_IN = """
import json, sys, time
from pathlib import Path
path = Path(sys.argv[1])
print("Successfully started run 7", flush=True)
for k in (1, 2, 3):
    time.sleep(0.6)
    st = {"status": "running", "phase": "round", "round": k + 1, "rounds_done": k, "seconds_per_round": 0.6,
          "updated_at": time.time()}
    path.write_text(json.dumps(st))
time.sleep(0.6)
path.write_text(json.dumps({"status": "completed", "phase": "done", "rounds_done": 3, "n_rounds": 3,
                            "updated_at": time.time()}))
print("run 7 finished", flush=True)
"""


def test_submit_shows_the_status_file_as_timestamped_lines_off_a_terminal(tmp_path, capsys):
    """``flower submit``'s wait: a stand-in for ``flwr run --stream`` (a real process) writes the
    ServerApp's status file as a run does; stderr is not a terminal here, so the command passes the
    stream's lines on and adds timestamped progress lines, not a bar.  A status file left in the
    out-dir by an earlier run is not shown."""
    status = tmp_path / "status.json"
    status.write_text(json.dumps({"status": "completed", "n_rounds": 99, "updated_at": 1.0}))  # an earlier run's
    os.utime(status, ns=(1, 1))
    proc = _submit_with_progress([sys.executable, "-c", STAND_IN, str(status)], dict(os.environ), status, 3,
                                 poll=0.1)
    assert proc.returncode == 0
    err = capsys.readouterr().err
    assert "Successfully started run 7" in err and "run 7 finished" in err
    progress = [line for line in err.splitlines() if re.match(STAMP, line)]
    assert any(re.search(r"round \d of 3, 0\.6 s/round", line) for line in progress), err
    assert progress[-1].endswith("done: 3 rounds") and "99" not in err, err


# ----------------------------------------------------------------------------- one host, two nodes
def _listening(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_taken_port_is_named_with_its_option_before_a_daemon_starts(tmp_path, monkeypatch):
    from fedsonmf.federation.flower import gate

    sec.make_tls(tmp_path / "tls", ["127.0.0.1"])
    gate.Authority.create(tmp_path / "c.key").write_public(tmp_path / "c.pub")
    key = sec.make_node_key(tmp_path / "key", "n0")
    np.save(tmp_path / "v.npy", np.ones((4, 3)))
    port = _free_port()
    with _listening(port):
        r = CliRunner().invoke(app, ["flower", "superlink", "--host", "127.0.0.1", "--port", str(port), "--tls",
                                     str(tmp_path / "tls"), "--coordinator-key", str(tmp_path / "c.pub"), "--home",
                                     str(tmp_path / "h")])
        assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
        assert f"port {port} on 127.0.0.1 is not free" in r.output and "choose another with --port" in r.output
        monkeypatch.setenv("FEDSONMF_NODE_LOOP", "flower")  # Flower's loop: a Runtime API port per node
        r = CliRunner().invoke(app, ["flower", "supernode", "--superlink", f"127.0.0.1:{_free_port()}", "--view",
                                     str(tmp_path / "v.npy"), "--partition", "0", "--partitions", "2", "--key",
                                     str(key.private), "--ca", str(tmp_path / "tls" / "ca.crt"), "--coordinator-key",
                                     str(tmp_path / "c.pub"), "--home", str(tmp_path / "h"), "--runtime-port",
                                     str(port)])
        errors = [line for line in r.output.splitlines() if line.startswith("error:")]
        assert r.exit_code == 2 and len(errors) == 1 and "Traceback" not in r.output, r.output
        assert "choose another with --runtime-port" in errors[0]
    assert not (tmp_path / "h").exists()  # nothing started


def _wait_for_text(path: Path, text: str, proc, timeout: float = STALL) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None, f"exited {proc.returncode}:\n{path.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{path.read_text()}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.deploy
def test_two_supernode_commands_on_one_host_both_register(tmp_path):
    """The docs' recipe rehearsed on one host (127.0.0.1 for every address, each host's commands in a
    folder of its own): the SuperLink and two ``flower supernode`` commands with their default options
    (the node loop: no port of their own), both nodes connected with their registered keys."""
    from fedsonmf.federation.flower import gate

    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.pop("FEDSONMF_NODE_LOOP", None)
    exe = str(Path(sys.executable).parent / "fedsonmf")
    link = tmp_path / "link"
    link.mkdir()
    sec.make_tls(link / "tls", ["127.0.0.1"])
    gate.Authority.create(link / "c.key").write_public(link / "c.pub")
    port, control = _free_port(), _free_port()  # the Fleet API (the nodes') and the Control API (loopback)
    procs = []

    def start(argv, cwd, log):
        with open(log, "wb") as fh:
            proc = subprocess.Popen([exe, "flower", *argv], cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(proc)
        return proc

    try:
        sl_log = tmp_path / "superlink.log"
        sl = start(["superlink", "--host", "127.0.0.1", "--port", str(port), "--control-port", str(control), "--tls",
                    "tls", "--coordinator-key", "c.pub", "--home", "superlink-home"], link, sl_log)
        _wait_for_text(sl_log, "gate executor:", sl)
        deadline = time.monotonic() + STALL
        while True:  # the port answers (an event)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert sl.poll() is None and time.monotonic() < deadline, sl_log.read_text()
                time.sleep(0.2)
        nodes = []
        for i in (0, 1):
            host = tmp_path / f"node{i}"
            host.mkdir()
            np.save(host / f"view{i}.npy", np.random.default_rng(i).random((20, 5)))
            key = sec.make_node_key(host / "key", f"node{i}")
            r = CliRunner().invoke(app, ["flower", "register", str(key.public), "--partition", str(i), "--superlink",
                                         f"127.0.0.1:{control}", "--ca", str(link / "tls" / "ca.crt"), "--pins",
                                         str(link / "pins.json"), "--home", str(link / "coordinator-home")],
                                   env=env)
            assert r.exit_code == 0, r.output
            log = tmp_path / f"node{i}.log"
            nodes.append((start(["supernode", "--superlink", f"127.0.0.1:{port}", "--ca", str(link / "tls" / "ca.crt"),
                                 "--key", f"key/node{i}", "--coordinator-key", str(link / "c.pub"), "--view",
                                 f"view{i}.npy", "--partition", str(i), "--partitions", "2", "--state-dir", "state",
                                 "--home", "supernode-home"], host, log), log))
        for proc, log in nodes:
            _wait_for_text(log, f"connected to 127.0.0.1:{port} as node", proc)
        pins = sec.read_pins(link / "pins.json")
        for (proc, log), i in zip(nodes, (0, 1)):
            assert f"as node {pins[i].node_id}" in log.read_text()
            assert "address already in use" not in log.read_text() and proc.poll() is None
    finally:
        for proc in reversed(procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=STALL)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0, 0]


# ----------------------------------------------------------------------------- run-folder hygiene
def test_a_non_empty_out_is_refused_without_resume_or_overwrite(tmp_path):
    for i in (0, 1):
        np.save(tmp_path / f"v{i}.npy", np.random.default_rng(i).random((10, 4)))
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.json").write_text("{}")
    (out / "server").mkdir()
    (out / "server" / "V.npy").write_bytes(b"x")
    r = CliRunner().invoke(app, ["flower", "run", str(tmp_path / "v0.npy"), str(tmp_path / "v1.npy"), "--out",
                                 str(out), "--rank", "2", "--insecure"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "is not empty" in r.output and "--resume" in r.output and "--overwrite" in r.output
    r = CliRunner().invoke(app, ["flower", "cluster", str(tmp_path / "v0.npy"), str(tmp_path / "v1.npy"), "--out",
                                 str(out), "--clusters", "2", "--insecure"])
    assert r.exit_code == 2 and "is not empty" in r.output and "--resume" not in r.output, r.output  # no resume
    assert sorted(e.name for e in out.iterdir()) == ["job.json", "server"]  # untouched
    # --overwrite removes only a run's own entries, and refuses a folder with anything else in it
    (out / "notes.txt").write_text("mine")
    with pytest.raises(Exception) as exc:
        _claim_out_folder(out, resume=False, overwrite=True)
    assert getattr(exc.value, "exit_code", None) == 2
    assert (out / "server" / "V.npy").exists()
    (out / "notes.txt").unlink()
    _claim_out_folder(out, resume=False, overwrite=True)
    assert [e.name for e in out.iterdir() if e.name != ".lock"] == []
    _claim_out_folder(tmp_path / "new", resume=False, overwrite=False)  # absent: fine
    (out / "job.json").write_text("{}")
    _claim_out_folder(out, resume=True, overwrite=False)  # --resume: the run in it goes on
    assert (out / "job.json").exists()


def test_drop_view_copies_removes_only_the_views_copies(tmp_path):
    state = tmp_path / "nodes" / "p1" / "state"
    kept = [state / "job-a-restart-0" / "client-1-r3.npz", state / "job-a-restart-0" / "preprocessing-1.npz",
            state / "job-a-restart-0" / "graph-1.npz", state / "view-facts-1.json", tmp_path / "server" / "V.npy"]
    gone = [state / "job-a-restart-0" / "view-1.npy", state / "job-a-restart-1" / "view-1.npz",
            state / "view-copy-1.npy", state / "view-copy-1.json"]
    for f in kept + gone:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"0123456789")
    assert drop_view_copies(tmp_path, 2) == 10 * len(gone)
    assert all(f.exists() for f in kept) and not any(f.exists() for f in gone)


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.filterwarnings("ignore::fedsonmf.exceptions.PrivacyWarning")
def test_flower_cluster_off_a_terminal_keeps_no_view_copies(tmp_path):
    """``flower cluster`` with stderr not a terminal (CliRunner): timestamped progress lines on stderr,
    no copy of the views left in the run folder (the prepared view of each fit, the binary copy of a
    CSV view), one line with the folder's size; ``--keep-views`` keeps them."""
    from fedsonmf.datasets import make_synthetic

    data = make_synthetic(n_clients=2, n_samples=40, n_features=8, rank=3, heterogeneity=0.5, random_state=1)
    views = []
    for i, X in enumerate(data.views):
        views.append(tmp_path / f"v{i}.csv")
        np.savetxt(views[-1], np.asarray(X), delimiter=",")
    for keep in (False, True):
        out = tmp_path / f"out-{keep}"
        r = CliRunner().invoke(app, ["flower", "cluster", *map(str, views), "--out", str(out),
                                     "--clusters", "2", "--rounds", "3", "--n-init", "2",
                                     *(["--keep-views"] if keep else [])])
        assert r.exit_code == 0, r.stdout + r.stderr
        stamped = [line for line in r.stderr.splitlines() if re.match(STAMP, line)]
        assert any("round" in line and "of 3" in line for line in stamped), r.stderr
        assert stamped[-1].split(" ", 2)[2].startswith("done: 3 rounds"), r.stderr
        copies = sorted(out.glob("nodes/p*/state/*/view-*.np[yz]")) + sorted(out.glob("nodes/p*/state/view-copy-*"))
        size = re.search(rf"run folder {re.escape(str(out.resolve()))}: (\d+\.\d) MB", r.stdout)
        assert size, r.stdout
        if keep:
            assert len(copies) >= 2 * 2, copies  # a prepared view per fit per node, the CSV's binary copies
        else:
            assert copies == [] and "--keep-views keeps them" in r.stdout
            assert (out / "server" / "labels.csv").is_file()
