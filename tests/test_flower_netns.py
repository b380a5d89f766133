"""Separate hosts, really: the SuperLink and each SuperNode in its own Linux network
namespace with its own address (198.18.0.1 link, 198.18.0.2/.3 nodes, on a bridge in the
link's namespace), each node with only its own view file in its own folder, TLS and
SuperNode authentication on, running exactly the recipe of docs/flower.md
("Separate machines"), which this test reads from the page.  The result equals the
in-process run.

Needs root and ``ip netns``; the namespaces (unique names per run) are removed at the
end, also on failure.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from threadpoolctl import threadpool_limits  # noqa: E402

from fedsonmf._validation import check_views  # noqa: E402
from fedsonmf.datasets import make_synthetic  # noqa: E402
from fedsonmf.federation.flower import load_result  # noqa: E402
from fedsonmf.federation.inprocess import run_inprocess  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

DOCS = Path(__file__).resolve().parents[1] / "docs" / "flower.md"
ADDRESSES = {"link": "198.18.0.1", "node0": "198.18.0.2", "node1": "198.18.0.3"}


def _netns_available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (creates network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip`"
    name = f"fsprobe{uuid.uuid4().hex[:6]}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return "`ip netns add` is not permitted here"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def parse_recipe(text: str) -> list[tuple]:
    """The recipe block of docs/flower.md as steps: ("run", host, argv, background) or ("copy", src, dst)."""
    block = text.split("<!-- recipe:begin -->", 1)[1].split("<!-- recipe:end -->", 1)[0]
    steps = []
    for line in block.splitlines():
        line = line.strip()
        if m := re.fullmatch(r"# copy (\w+):(\S+) -> (\w+):(\S+)", line):
            steps.append(("copy", (m[1], m[2]), (m[3], m[4])))
        elif m := re.fullmatch(r"\[(\w+)\]\$ (.+)", line):
            cmd, bg = m[2], m[2].endswith(" &")
            steps.append(("run", m[1], shlex.split(cmd[:-2] if bg else cmd), bg))
    return steps


def test_recipe_is_parsed_from_the_docs():
    steps = parse_recipe(DOCS.read_text())
    runs = [s for s in steps if s[0] == "run"]
    assert {s[1] for s in runs} == set(ADDRESSES)
    assert [s[2][2] for s in runs if s[3]] == ["superlink", "supernode", "supernode"]  # the daemons
    assert all(s[2][0] == "fedsonmf" for s in runs) and runs[-1][2][2] == "submit"


class Hosts:
    """Network namespaces link, node0, node1 on one bridge (inside link's namespace)."""

    def __init__(self):
        self.tag = f"fs{uuid.uuid4().hex[:6]}"
        self.ns = {h: f"{self.tag}-{h}" for h in ADDRESSES}
        self.procs: list[subprocess.Popen] = []

    def _ip(self, *args):
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def up(self):
        for ns in self.ns.values():
            self._ip("netns", "add", ns)
            self._ip("-n", ns, "link", "set", "lo", "up")
        link = self.ns["link"]
        self._ip("-n", link, "link", "add", "br0", "type", "bridge")
        self._ip("-n", link, "addr", "add", f"{ADDRESSES['link']}/24", "dev", "br0")
        self._ip("-n", link, "link", "set", "br0", "up")
        for i, host in enumerate(("node0", "node1")):
            a, b = f"{self.tag}v{i}a", f"{self.tag}v{i}b"
            self._ip("link", "add", a, "type", "veth", "peer", "name", b)
            self._ip("link", "set", a, "netns", self.ns[host])
            self._ip("link", "set", b, "netns", link)
            self._ip("-n", link, "link", "set", b, "master", "br0")
            self._ip("-n", link, "link", "set", b, "up")
            self._ip("-n", self.ns[host], "addr", "add", f"{ADDRESSES[host]}/24", "dev", a)
            self._ip("-n", self.ns[host], "link", "set", a, "up")

    def run(self, host, argv, cwd, log, *, background, env, timeout=600):
        cmd = ["ip", "netns", "exec", self.ns[host], *argv]  # `ip netns exec` execs: the pid is the command's
        with open(log, "ab") as fh:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        if background:
            self.procs.append(proc)
            return proc
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"{shlex.join(argv)} on {host} did not finish in {timeout} s; see {log}") from None
        return proc

    def reaches(self, host, address, port) -> bool:
        """Can a process on ``host`` open a TCP connection to ``address:port``?"""
        probe = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close()\n"
                 "except OSError: sys.exit(1)")
        return subprocess.run(["ip", "netns", "exec", self.ns[host], sys.executable, "-c", probe,
                               address, str(port)], capture_output=True).returncode == 0

    def down(self):
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:  # children (flower-superexec, flwr-clientapp) of the group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if proc.poll() is None:
                proc.wait(timeout=10)
        for ns in self.ns.values():  # deleting a namespace removes its veth ends and the bridge
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def hosts():
    why = _netns_available()
    if why:
        pytest.skip(why)
    h = Hosts()
    try:
        h.up()
        yield h
    finally:
        h.down()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert h.tag not in listed


def test_docs_recipe_on_separate_network_namespaces(hosts, tmp_path):
    R, rounds, seed = 3, 3, 0  # as in the recipe's submit line
    data = make_synthetic(n_clients=2, n_samples=40, n_features=10, rank=R, heterogeneity=0.5, random_state=2)
    dirs = {h: tmp_path / h for h in ADDRESSES}
    for d in dirs.values():
        d.mkdir()
    for i, X in enumerate(data.views):  # each node holds only its own view
        np.save(dirs[f"node{i}"] / f"view{i}.npy", np.asarray(X, dtype=np.float64))
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    logs = tmp_path / "logs"
    logs.mkdir()
    steps = parse_recipe(DOCS.read_text())
    last = None
    for k, step in enumerate(steps):
        if step[0] == "copy":
            (sh, sp), (dh, dp) = step[1], step[2]
            shutil.copyfile(dirs[sh] / sp, dirs[dh] / dp)
            continue
        _, host, argv, background = step
        log = logs / f"{k:02d}-{host}-{argv[2]}.log"
        proc = hosts.run(host, argv, dirs[host], log, background=background, env=env)
        if background:
            if argv[2] == "superlink":
                port = int(argv[argv.index("--port") + 1])
                deadline = time.monotonic() + 120
                while not hosts.reaches(host, ADDRESSES[host], port):
                    assert proc.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, f"the SuperLink never listened; {log.read_text()}"
                    time.sleep(0.3)
        else:
            assert proc.returncode == 0, f"{shlex.join(argv)} on {host} failed:\n{log.read_text()}"
            last = log
    assert "completed 3 rounds" in last.read_text()
    # the security actually in force: key files 0600, nodes only on their own address
    assert (dirs["node0"] / "key" / "node0").stat().st_mode & 0o777 == 0o600
    assert (dirs["link"] / "pins.json").stat().st_mode & 0o777 == 0o600
    superlink_log = next(logs.glob("*-link-superlink.log")).read_text()
    assert "--enable-supernode-auth" in superlink_log and "--ssl-certfile" in superlink_log
    # separate hosts: a node reaches the SuperLink only at the link's address, not on its own loopback
    assert hosts.reaches("node0", ADDRESSES["link"], 9092) and not hosts.reaches("node0", "127.0.0.1", 9092)
    res = load_result(dirs["link"] / "run1")
    with threadpool_limits(1):
        ref = run_inprocess(check_views(data.views, R), FedConfig(n_components=R), max_rounds=rounds, seed=seed)
    assert res.n_rounds == rounds
    assert np.array_equal(res.V, ref.V)

