"""Separate hosts, really: the SuperLink and each SuperNode in its own Linux network
namespace with its own address (198.18.0.1 link, 198.18.0.2/.3 nodes, on a bridge in the
link's namespace), each node with only its own view file in its own folder, TLS and
SuperNode authentication on, running exactly the recipe of docs/flower.md
("Real multiple machines"), which this test reads from the page.  The result equals the
in-process run.  Every daemon runs under its host's gate: a foreign app submitted with
stock ``flwr run`` from the link's namespace runs on no host, and each daemon command
stops its gate executor when it stops (also checked on loopback, without root).

Needs root and ``ip netns``; the namespaces (unique names per run) are removed at the
end, also on failure.
"""

import json
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

from _waits import STALL  # noqa: E402
from fedsonmf._validation import check_views  # noqa: E402
from fedsonmf.datasets import make_synthetic  # noqa: E402
from fedsonmf.estimators import FedMultiViewClustering  # noqa: E402
from fedsonmf.estimators.options import PrivacyOptions
from fedsonmf.federation.flower import load_result  # noqa: E402
from fedsonmf.federation.flower import security as sec  # noqa: E402
from fedsonmf.federation.flower.clustering import read_labels_csv  # noqa: E402
from fedsonmf.federation.flower.deployment import _free_port  # noqa: E402
from fedsonmf.federation.inprocess import run_inprocess  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402
from test_flower_gate import write_evil_app  # noqa: E402

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
    submits = [s[2] for s in runs if s[2][2] == "submit"]  # a factorisation, a clustering, a predict run
    assert "--rank" in submits[0] and "--clusters" not in submits[0] and "--clusters" in submits[1]
    assert submits[2][submits[2].index("--predict-from") + 1] == submits[1][submits[1].index("--out") + 1]
    # the gate on every daemon: the hosts trust the coordinator's public key, the submitter signs with its private one
    for s in runs:
        if s[3] or s[2][2] == "submit":
            key = s[2][s[2].index("--coordinator-key") + 1]
            assert key.endswith(".key" if s[2][2] == "submit" else ".pub"), s


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


def _processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line mentions ``text`` (e.g. a test's tmp folder)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and text in cmd:
            found.append(f"{d.name}: {cmd}")
    return found


def _wait_for(predicate, what: str, timeout: float = STALL, proc=None, log=None):
    deadline = time.monotonic() + timeout
    while not (got := predicate()):
        if proc is not None:
            assert proc.poll() is None, f"exited {proc.returncode} before {what}:\n{log.read_text() if log else ''}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s" + (f":\n{log.read_text()}" if log else "")
        time.sleep(0.2)
    return got


class Outsider:
    """Stock ``flwr`` on a host with a fresh FLWR_HOME that knows only the SuperLink's address and the
    (public) CA certificate: no coordinator key, no node key."""

    def __init__(self, hosts, host: str, home: Path, address: str, ca: Path, env: dict):
        home.mkdir(parents=True)
        sec.write_connection(home, "x", address, ca)
        self.hosts, self.host, self.home = hosts, host, home
        self.env = {**env, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}

    def flwr(self, *args, check: bool = True) -> str:
        p = subprocess.run(["ip", "netns", "exec", self.hosts.ns[self.host], str(Path(sys.executable).parent / "flwr"),
                            *args], env=self.env, cwd=self.home, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0 or not check, p.stdout + p.stderr
        return p.stdout if check else p.stdout + p.stderr + f"\n(exit {p.returncode})"

    def submit(self, app_dir) -> int:
        out = self.flwr("run", str(app_dir), "x", "--format", "json")
        return int(json.loads(out[out.index("{"):])["run-id"])

    def wait_finished(self, run_id: int, timeout: float = STALL) -> dict:
        def finished():
            out = self.flwr("ls", "x", "--format", "json", "--run-id", str(run_id))
            runs = json.loads(out[out.index("{"):])["runs"]
            return runs[0] if runs and str(runs[0]["status"]).startswith("finished") else None

        return _wait_for(finished, f"end of run {run_id}", timeout)


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


@pytest.mark.slow
@pytest.mark.deploy
def test_docs_recipe_on_separate_network_namespaces(hosts, tmp_path):
    R, rounds, seed, c = 3, 3, 0, 2  # as in the recipe's submit lines
    data = make_synthetic(n_clients=2, n_samples=40, n_features=10, rank=R, heterogeneity=0.5, random_state=2)
    dirs = {h: tmp_path / h for h in ADDRESSES}
    for d in dirs.values():
        d.mkdir()
    new = make_synthetic(n_clients=2, n_samples=12, n_features=10, rank=R, heterogeneity=0.5, random_state=5)
    for i, (X, Xn) in enumerate(zip(data.views, new.views)):  # each node holds only its own view (and new samples)
        np.save(dirs[f"node{i}"] / f"view{i}.npy", np.asarray(X, dtype=np.float64))
        np.save(dirs[f"node{i}"] / f"new{i}.npy", np.asarray(Xn, dtype=np.float64))
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
                deadline = time.monotonic() + STALL  # an event (the port answers) with a generous ceiling
                while not hosts.reaches(host, ADDRESSES[host], port):
                    assert proc.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, f"the SuperLink never listened; {log.read_text()}"
                    time.sleep(0.3)
        else:
            assert proc.returncode == 0, f"{shlex.join(argv)} on {host} failed:\n{log.read_text()}"
            last = log
    assert "assigned 12 new samples" in last.read_text()
    fits = sorted(logs.glob("*-link-submit.log"))[:2]
    assert "completed 3 rounds" in fits[1].read_text() and f"{c} clusters of sizes" in fits[1].read_text()
    # the Control API from another host, with the CA certificate: its port is closed there, and the
    # nodes' port answers only the Fleet API (403), so an outsider can neither list, stop nor register
    assert not hosts.reaches("node0", ADDRESSES["link"], 9093) and hosts.reaches("node0", ADDRESSES["link"], 9092)
    eve = Outsider(hosts, "node0", tmp_path / "eve", f"{ADDRESSES['link']}:9092", dirs["node0"] / "ca.crt", env)
    for args in (("ls", "x", "--format", "json"), ("stop", "1", "x"),
                 ("supernode", "register", str(dirs["node0"] / "key" / "node0.pub"), "x")):
        said = eve.flwr(*args, check=False)
        assert '"success": true' not in said and ("403 Forbidden" in said or "(exit 0)" not in said), said
    # a foreign app, submitted with stock `flwr run` by a local user of the SuperLink host, runs on no host
    markers = tmp_path / "markers"  # one folder every namespace sees: a marker from any host would land here
    markers.mkdir(mode=0o777)
    mallory = Outsider(hosts, "link", tmp_path / "mallory", "127.0.0.1:9093", dirs["link"] / "tls" / "ca.crt", env)
    run_id = mallory.submit(write_evil_app(tmp_path / "evil", markers))
    info = mallory.wait_finished(run_id)
    assert info["status"] == "finished:failed", info
    assert "refused by the fedsonmf gate" in info["status-details"] and "is not the fedsonmf app pinned" in info[
        "status-details"], info
    # our own app (anyone can write the byte-identical shim) without the coordinator's signature: refused too
    from fedsonmf.federation.flower.template import write_app_dir

    stolen = dirs["link"] / "stolen"
    plain = mallory.flwr("run", str(write_app_dir(tmp_path / "copy")), "x", "--format", "json", "--run-config",
                         f'out-dir="{stolen}" num-clients=2')
    info = mallory.wait_finished(int(json.loads(plain[plain.index("{"):])["run-id"]))
    assert info["status"] == "finished:failed" and "carries no coordinator authorisation" in info["status-details"]
    assert not stolen.exists()
    time.sleep(3)  # a node that (wrongly) got a task would have written by now: nodes pull every ~3 s
    assert list(markers.iterdir()) == []  # neither its ServerApp nor any ClientApp ran
    # the security actually in force: key files 0600, nodes only on their own address
    assert (dirs["node0"] / "key" / "node0").stat().st_mode & 0o777 == 0o600
    assert (dirs["link"] / "pins.json").stat().st_mode & 0o777 == 0o600
    # each node's secure-aggregation signing key (0600, beside its node key) pinned in the runs submit signs
    import tomllib

    assert (dirs["node0"] / "key" / "node0-secagg.pem").stat().st_mode & 0o777 == 0o600
    peers = json.loads(tomllib.loads((dirs["link"] / "coordinator-home" / "run-config.toml").read_text())[
        sec.PEERS_KEY])
    assert peers == [(dirs[f"node{p}"] / "key" / f"node{p}-secagg.pub").read_text().strip() for p in (0, 1)]
    superlink_log = next(logs.glob("*-link-superlink.log")).read_text()
    assert "--enable-supernode-auth" in superlink_log and "--ssl-certfile" in superlink_log
    assert f"run {run_id}: refused by the fedsonmf gate" in superlink_log  # the SuperLink host's gate said no
    for log in logs.glob("*-node*-supernode.log"):  # every node is the node loop under its gate; none saw it
        text = log.read_text()
        assert "-m fedsonmf.federation.flower.nodeloop" in text and "--pin" in text and "gate: only" in text
        assert "--runtime-port" not in text and f"run {run_id}" not in text
    for h in ("node0", "node1"):
        assert (dirs[h] / "supernode-home" / "gate" / "pin.json").stat().st_mode & 0o777 == 0o600
    # separate hosts: a node reaches the SuperLink only at the link's address, not on its own loopback
    assert hosts.reaches("node0", ADDRESSES["link"], 9092) and not hosts.reaches("node0", "127.0.0.1", 9092)
    res = load_result(dirs["link"] / "run1")
    with threadpool_limits(1):
        # the deployment default is secure aggregation (its masks cancel exactly, as in-process)
        ref = run_inprocess(check_views(data.views, R), FedConfig(n_components=R, secure_aggregation=True),
                            max_rounds=rounds, seed=seed)
    assert res.n_rounds == rounds and res.config["secure_aggregation"] is True
    assert np.array_equal(res.V, ref.V)
    # the clustering run (`submit --clusters`): the in-process estimator's labels and V -- its five fits
    # (n_init="auto") ran in the one ServerApp run, which kept the medoid fit and refined it
    with threadpool_limits(1):
        est = FedMultiViewClustering(c, max_rounds=rounds, random_state=seed,
                                     privacy=PrivacyOptions(secure_aggregation=True)).fit(data.views)
    kept = json.loads((dirs["link"] / "run2" / "result.json").read_text())["clustering"]["restarts"]
    assert kept["n_init"] == est.n_init_ == 5 and kept["best_restart"] == est.best_restart_
    assert np.array_equal(read_labels_csv(dirs["link"] / "run2" / "labels.csv"), est.labels_)
    assert np.array_equal(np.load(dirs["link"] / "run2" / "V.npy"), est.result_.V)
    # the predict run (`submit --predict-from run2`): the estimator's predict on the nodes' new samples
    with threadpool_limits(1):
        want = est.predict(new.views)
    assert np.array_equal(read_labels_csv(dirs["link"] / "run2-new" / "labels.csv"), want)
    # stopping the daemon commands stops their gate executors (and everything else they started)
    hosts.down()
    assert _processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
@pytest.mark.deploy
def test_daemon_command_stops_its_gate_executor_with_it(tmp_path):
    """On loopback (no root): `fedsonmf flower superlink` runs flower-superlink with --isolation process
    and its gate executor; SIGTERM to the command stops both; a daemon that dies (kill -9) takes the
    executor and the command with it (exit code 1)."""
    from fedsonmf.federation.flower import gate

    sec.make_tls(tmp_path / "tls", ["127.0.0.1"])
    gate.Authority.create(tmp_path / "c.key").write_public(tmp_path / "c.pub")
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")

    def start(name):
        home, log = tmp_path / name, tmp_path / f"{name}.log"
        argv = [str(Path(sys.executable).parent / "fedsonmf"), "flower", "superlink", "--host", "127.0.0.1", "--port",
                str(_free_port()), "--control-port", str(_free_port()), "--tls", str(tmp_path / "tls"),
                "--coordinator-key", str(tmp_path / "c.pub"),
                "--home", str(home), "--out-root", str(tmp_path)]
        with open(log, "wb") as fh:
            cmd = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, cwd=tmp_path)
        try:
            def both():
                mine = _processes_mentioning(str(home / "gate"))
                ex = [p for p in mine if "-m fedsonmf.federation.flower.gate --role serverapp" in p]
                daemon = [p for p in mine if "/flower-superlink " in p and "--isolation process" in p]
                return (int(daemon[0].split(":")[0]), int(ex[0].split(":")[0])) if ex and daemon else None

            return cmd, log, home, _wait_for(both, "SuperLink + gate executor", proc=cmd, log=log)
        except BaseException:
            os.killpg(cmd.pid, signal.SIGKILL)
            cmd.wait()
            raise

    cmd, log, home, (daemon, executor) = start("a")
    assert gate.Pin.load(home / "gate" / "pin.json").fab_sha256 == {gate.installed_fab_sha256()}
    os.kill(cmd.pid, signal.SIGTERM)
    assert cmd.wait(timeout=STALL) == 0, log.read_text()
    assert _processes_mentioning(str(home)) == []
    cmd, log, home, (daemon, executor) = start("b")
    os.kill(daemon, signal.SIGKILL)
    assert cmd.wait(timeout=STALL) == 1, log.read_text()
    assert "flower-superlink exited with code -9" in log.read_text()
    assert _processes_mentioning(str(home)) == []


# ----------------------------------------------------------------------------- fast: the gate options
def test_keys_coordinator_writes_a_private_key_and_a_public_key_the_hosts_accept(tmp_path):
    from typer.testing import CliRunner

    from fedsonmf.cli.app import app
    from fedsonmf.federation.flower import gate

    r = CliRunner().invoke(app, ["flower", "keys", "coordinator", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    key, pub = tmp_path / "c" / "coordinator.key", tmp_path / "c" / "coordinator.pub"
    assert key.stat().st_mode & 0o777 == 0o600 and (tmp_path / "c").stat().st_mode & 0o777 == 0o700
    authority = gate.Authority.load(key)
    assert gate.read_public_key(pub) == authority.public_key
    # a token signed with it passes a host's gate pinned to the installed app and this public key
    fab = gate.installed_fab_sha256()
    gate.write_pin(tmp_path / "pin.json", [fab], gate.read_public_key(pub))
    conf = gate.sign_run_config(authority, fab, {"out-dir": "/runs/a", "job-id": "j", "num-rounds": 2})
    assert gate.Gate(tmp_path / "pin.json", tmp_path / "ledger.json").check(
        gate.build_fab(gate_app(tmp_path)), 1, conf)["fab-sha256"] == fab
    r = CliRunner().invoke(app, ["flower", "keys", "coordinator", str(tmp_path / "c")])
    assert r.exit_code == 1 and "coordinator.key exists" in r.output, r.output
    with pytest.raises(ValueError, match="is the coordinator's private key"):
        gate.read_public_key(key)
    (tmp_path / "junk.pub").write_text("not a key\n")
    with pytest.raises(ValueError, match="is not a coordinator public key"):
        gate.read_public_key(tmp_path / "junk.pub")


def gate_app(tmp_path):
    from fedsonmf.federation.flower.template import write_app_dir

    return write_app_dir(tmp_path / "app")


def test_daemon_and_submit_commands_require_the_coordinator_key(tmp_path):
    from typer.testing import CliRunner

    from fedsonmf.cli.app import app

    tls = sec.make_tls(tmp_path / "tls")
    key = sec.make_node_key(tmp_path, "n0")
    np.save(tmp_path / "v.npy", np.ones((4, 3)))
    r = CliRunner().invoke(app, ["flower", "superlink", "--host", "198.18.0.1", "--tls", str(tmp_path / "tls"),
                                 "--home", str(tmp_path / "h")])
    assert r.exit_code == 2 and "give --coordinator-key PUB" in r.output, r.output
    r = CliRunner().invoke(app, ["flower", "supernode", "--superlink", "198.18.0.1:9092", "--view",
                                 str(tmp_path / "v.npy"), "--partition", "0", "--partitions", "2", "--key",
                                 str(key.private), "--ca", str(tls.ca_cert), "--home", str(tmp_path / "h"),
                                 "--coordinator-key", str(tmp_path / "missing.pub")])
    assert r.exit_code == 2 and "missing.pub" in r.output, r.output  # bad input
    r = CliRunner().invoke(app, ["flower", "submit", "--superlink", "198.18.0.1:9092", "--ca", str(tls.ca_cert),
                                 "--pins", str(tmp_path / "pins.json"), "--out", str(tmp_path / "run"),
                                 "--clients", "2", "--home", str(tmp_path / "h")])
    assert r.exit_code == 2 and "give --coordinator-key coordinator.key" in r.output, r.output
    (tmp_path / "open.key").write_text("x")
    os.chmod(tmp_path / "open.key", 0o644)
    r = CliRunner().invoke(app, ["flower", "submit", "--superlink", "198.18.0.1:9092", "--ca", str(tls.ca_cert),
                                 "--pins", str(tmp_path / "pins.json"), "--out", str(tmp_path / "run"),
                                 "--clients", "2", "--home", str(tmp_path / "h"), "--coordinator-key",
                                 str(tmp_path / "open.key")])
    assert r.exit_code == 2 and "(mode 0644); run: chmod 600" in r.output, r.output  # bad input
    r = CliRunner().invoke(app, ["flower", "submit", "--superlink", "198.18.0.1:9092", "--ca", str(tls.ca_cert),
                                 "--pins", str(tmp_path / "pins.json"), "--out", str(tmp_path / "run"),
                                 "--clients", "2", "--home", str(tmp_path / "h"), "--coordinator-key",
                                 str(key.private)])  # a node's key is not the coordinator's
    assert r.exit_code == 1 and "is not the coordinator's private key" in r.output, r.output
    assert not (tmp_path / "h" / "run-config.toml").exists()  # nothing submitted


def test_superlink_runtime_api_dials_loopback_for_a_wildcard_listen_address():
    assert sec.superlink_runtime_api("198.18.0.1", 9092) == "198.18.0.1:9092"
    assert sec.superlink_runtime_api("0.0.0.0", 9092) == "127.0.0.1:9092"
    assert sec.superlink_runtime_api("::", 9092) == "[::1]:9092"



def test_submit_clusters_signs_the_clustering_options_and_scores_the_labels(tmp_path, monkeypatch, capsys):
    """``flower submit --clusters c``: the signed run config carries the clustering options (a host's
    gate accepts it, and refuses it with any of them edited); after the run (here a stand-in for
    ``flwr run`` that writes what the ServerApp writes) it reports the sizes and, with ``--labels``, the
    scores, also added to result.json.  Bad clustering options end with exit 2 before anything is
    submitted."""
    import subprocess
    import tomllib

    from typer.testing import CliRunner

    from fedsonmf.cli.app import app, main
    from fedsonmf.federation.flower import gate
    from fedsonmf.federation.flower.clustering import write_labels_csv
    from fedsonmf.federation.flower.template import write_app_dir

    authority = gate.Authority.create(tmp_path / "c.key")
    out, home = tmp_path / "run", tmp_path / "h"
    found = np.array([0, 0, 1, 1, 1, 0])

    def flwr_run(argv, *args, **kw):  # what the ServerApp leaves in out-dir after a completed clustering run
        out.mkdir()
        write_labels_csv(out / "labels.csv", found)
        (out / "result.json").write_text(json.dumps({"clustering": {"cluster_sizes": [3, 3], "n_components": 4}}))
        (out / "status.json").write_text(json.dumps({"status": "completed", "n_rounds": 3}))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr("fedsonmf.cli.flower._submit_with_progress", flwr_run)
    (tmp_path / "y.txt").write_text("a\na\nb\nb\nb\nb\n")
    base = ["flower", "submit", "--superlink", "198.18.0.1:9092", "--insecure", "--out", str(out),
            "--home", str(home), "--coordinator-key", str(tmp_path / "c.key"), "--seed", "0"]
    r = CliRunner().invoke(app, [*base, "--clients", "2", "--clusters", "2", "--rank", "paper", "--preprocess", "l2",
                                 "--labels", str(tmp_path / "y.txt")])
    assert r.exit_code == 0, r.output
    assert "2 clusters of sizes [3, 3] (rank r = 4)" in r.output and "ACC 83.3 %" in r.output, r.output
    scores = json.loads((out / "result.json").read_text())["scores"]  # as `fedsonmf score` reports them
    assert scores["acc"] == pytest.approx(5 / 6) and f"ARI {scores['ari']:.4f}" in r.output
    conf = tomllib.loads((home / "run-config.toml").read_text())
    assert (conf["n-clusters"], conf["rank-rule"], conf["preprocess"]) == (2, "paper", "l2")
    assert {"refine", "refine-starts", "early-stop", "kmeans-n-init", "n-init"} <= set(conf)
    fab = gate.fab_sha256(gate.build_fab(write_app_dir(home / "fedsonmf-app")))
    gate.write_pin(tmp_path / "pin.json", [fab], authority.public_key)
    host = gate.Gate(tmp_path / "pin.json", tmp_path / "ledger.json")
    content = gate.build_fab(home / "fedsonmf-app")
    with pytest.raises(gate.Refused, match="differs"):  # an edited clustering option breaks the signature
        host.check(content, 7, {**conf, "n-clusters": 3})
    assert host.check(content, 7, conf)["fab-sha256"] == fab
    # --predict-from: a signed predict run config naming the fit's out-dir, then the new samples' report
    out = tmp_path / "new"
    np.save(tmp_path / "run" / "centers.npy", np.eye(2))
    r = CliRunner().invoke(app, [*base[:base.index("--out")], "--out", str(out), *base[base.index("--out") + 2:],
                                 "--predict-from", str(tmp_path / "run"), "--labels", str(tmp_path / "y.txt")])
    assert r.exit_code == 0, r.output
    assert "assigned 6 new samples, per cluster [3, 3]" in r.output, r.output
    assert "ACC 83.3 %" in r.output and "ARI" in r.output, r.output
    conf = tomllib.loads((home / "run-config.toml").read_text())
    assert (conf["mode"], conf["model-dir"]) == ("predict", str(tmp_path / "run"))
    assert "n-clusters" not in conf and "num-rounds" not in conf
    assert host.check(content, 8, conf)["fab-sha256"] == fab
    for args, why in ((["--clients", "2", "--labels", str(tmp_path / "y.txt")], "give --clusters too"),
                      (["--predict-from", str(tmp_path / "run"), "--clusters", "2"], "a predict run fits nothing"),
                      (["--predict-from", str(tmp_path)], "holds no clustering run (no centers.npy)"),
                      (["--clusters", "2"], "give the number of views"),
                      (["--clients", "2", "--rank", "auto"], "a rank rule needs --clusters"),
                      (["--clients", "2", "--clusters", "2", "--rank", "two"],
                       "must be auto, paper or a positive number"),
                      (["--clients", "2", "--clusters", "2", "--labels", str(tmp_path / "no.txt")], "does not exist")):
        with pytest.raises(SystemExit) as exit_:
            main([*base, "--out", str(tmp_path / "other"), *args])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and why in err and err.count("error:") == 1, (args, err)
    assert not (tmp_path / "other").exists()
