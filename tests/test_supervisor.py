"""The supervisor of every process the project starts (fedsonmf.federation.flower.supervisor):
children and grandchildren go when it stops and when its process is killed; N processes are
stopped in parallel (one grace period)."""

import json
import os
import signal
import stat
import subprocess
import sys
import threading

import pytest

from _waits import wait_until
from fedsonmf.federation.flower.supervisor import Supervisor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: a child that starts a grandchild in its group and records both pids
FAMILY = "sleep 300 & echo $$ $! > {out}; wait"

#: a daemon that ignores SIGTERM and, when it gets one, records which of its siblings still run
STUBBORN = r"""
import json, os, signal, sys, time
out, pidfile, ready = sys.argv[1:4]
def alive(p):
    try:
        with open(f"/proc/{p}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
def on_term(signum, frame):
    siblings = json.load(open(pidfile))
    with open(out, "a") as fh:
        fh.write(json.dumps([os.getpid(), [p for p in siblings if alive(p)]]) + "\n")
signal.signal(signal.SIGTERM, on_term)
open(ready, "w").close()
while True:
    time.sleep(1)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _family(sup: Supervisor, tmp_path, name="family"):
    out = tmp_path / f"{name}.pids"
    proc = sup.start(["sh", "-c", FAMILY.format(out=out)], log=tmp_path / "logs" / f"{name}.log")
    wait_until(lambda: out.is_file() and len(out.read_text().split()) == 2, "the grandchild started", stall=30)
    child, grandchild = map(int, out.read_text().split())
    assert child == proc.pid and _alive(grandchild)
    return proc, grandchild


def test_a_child_and_its_grandchild_stop_with_the_supervisor_and_the_log_is_private(tmp_path):
    with Supervisor(grace=5.0) as sup:
        proc, grandchild = _family(sup, tmp_path)
        assert os.getpgid(grandchild) == proc.pid  # one group: the child leads it
        sup.stop()
        assert proc.returncode is not None and not _alive(grandchild)
    log = tmp_path / "logs" / "family.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and stat.S_IMODE(log.parent.stat().st_mode) == 0o700


def test_a_child_and_its_grandchild_stop_when_the_supervising_process_is_killed(tmp_path):
    """SIGKILL to the launcher: its watcher sees the pipe close and stops the groups it knew (``start``
    tells it before returning; the launcher says when it returned)."""
    pids, started = tmp_path / "family.pids", tmp_path / "started"
    script = (
        "import sys, time\n"
        "from fedsonmf.federation.flower.supervisor import Supervisor\n"
        "sup = Supervisor(grace=5.0)\n"
        f"sup.start(['sh', '-c', {FAMILY.format(out=pids)!r}])\n"
        f"open({str(started)!r}, 'w').close()\n"
        "time.sleep(3600)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        wait_until(lambda: started.exists() and pids.is_file() and len(pids.read_text().split()) == 2,
                   "the grandchild started", stall=30, alive=lambda: launcher.poll() is None)
        child, grandchild = map(int, pids.read_text().split())
        assert _alive(child) and _alive(grandchild)
        launcher.kill()
        launcher.wait(timeout=30)
        wait_until(lambda: not _alive(child) and not _alive(grandchild), "the child and grandchild stopped", stall=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if pids.is_file():
            try:
                os.killpg(int(pids.read_text().split()[0]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_a_process_started_from_a_thread_that_ended_keeps_running_until_stopped(tmp_path):
    """Unlike PR_SET_PDEATHSIG (which fires when the forking *thread* ends), the watcher keys on the
    process: a deployment started from a worker thread keeps its daemons."""
    with Supervisor(grace=5.0) as sup:
        got = {}
        th = threading.Thread(target=lambda: got.update(zip(("proc", "gc"), _family(sup, tmp_path))))
        th.start()
        th.join(timeout=30)
        assert got and got["proc"].poll() is None and _alive(got["gc"])
        sup.stop()
        assert not _alive(got["gc"])


def test_killing_one_process_leaves_the_others_running(tmp_path):
    with Supervisor(grace=5.0) as sup:
        one, gc_one = _family(sup, tmp_path, "one")
        two, gc_two = _family(sup, tmp_path, "two")
        sup.kill(one)
        assert one.returncode == -signal.SIGKILL and not _alive(gc_one)
        assert two.poll() is None and _alive(gc_two) and sup.procs == [two]


def test_stopping_n_daemons_terms_them_all_while_all_still_run(tmp_path):
    """One shared grace period: every daemon gets SIGTERM while all of them still run (a stop one by
    one would TERM the last only after the first ones were KILLed), then all are KILLed."""
    n = 4
    out, pidfile = tmp_path / "terms.jsonl", tmp_path / "pids.json"
    with Supervisor(grace=3.0) as sup:
        procs = [sup.start([sys.executable, "-c", STUBBORN, str(out), str(pidfile), str(tmp_path / f"ready{i}")],
                           log=tmp_path / "logs" / f"d{i}.log") for i in range(n)]
        wait_until(lambda: all((tmp_path / f"ready{i}").exists() for i in range(n)), "every daemon ready", stall=30)
        pidfile.write_text(json.dumps([p.pid for p in procs]))
        sup.stop()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(pid for pid, _ in records) == sorted(p.pid for p in procs)  # one SIGTERM each
    assert all(sorted(seen) == sorted(p.pid for p in procs) for _, seen in records)
    assert all(p.returncode == -signal.SIGKILL for p in procs)
