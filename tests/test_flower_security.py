"""Attacks on a loopback deployment, each of which must fail and say why.

Fast part (no processes): key files 0600 and refused when group/world-readable,
the certificate names its hosts, the pins file's mode is checked, and the handshake
refuses a node that claims a view pinned to another key, or any unknown node.

Deploy part (``deploy``; one secure deployment of 2 SuperNodes shared by the tests):
(a) a rogue SuperNode with no key, or with a key nobody registered, cannot connect;
(b) an outsider registers a key through the unauthenticated Control API (it works:
    Flower OSS has no Control API authentication), runs a SuperNode claiming view 0
    before the real node 0 is up: the run fails at the handshake naming the rogue;
    with the real node alone the run completes with the in-process V;
(c) ``flwr ls``, ``flwr supernode ls``, ``flwr log`` and ``flwr stop`` from a fresh
    FLWR_HOME without the deployment's CA certificate fail;
and the ``tls=False, auth=False`` opt-out warns and lets a keyless node in.
"""

import json
import os
import signal
import subprocess
import time
import uuid

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from _waits import STALL  # noqa: E402
from fedsonmf._validation import check_views  # noqa: E402
from fedsonmf.datasets import make_synthetic  # noqa: E402
from fedsonmf.exceptions import FederationError, InputError  # noqa: E402
from fedsonmf.federation.flower import LoopbackDeployment, load_result, write_views  # noqa: E402
from fedsonmf.federation.flower import security as sec  # noqa: E402
from fedsonmf.federation.flower.client_app import make_client_app  # noqa: E402
from fedsonmf.federation.flower.deployment import InsecureDeploymentWarning, _bin, _free_port, flower_env  # noqa: E402
from fedsonmf.federation.flower.transport import handshake  # noqa: E402
from fedsonmf.federation.inprocess import run_inprocess  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402

R, N = 3, 40
CFG = FedConfig(n_components=R, tau=2)
ROUNDS, SEED = 2, 3
deploy = pytest.mark.deploy


# =============================================================================== fast: files and pins
def test_node_keys_are_created_0600_and_are_what_flower_accepts(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = sec.make_node_key(tmp_path / "k", "node0")
    assert key.private.stat().st_mode & 0o777 == 0o600
    assert key.public.read_text().startswith("ecdsa-sha2-nistp384 ")
    priv = serialization.load_ssh_private_key(key.private.read_bytes(), None)  # what flower-supernode does
    assert isinstance(priv, ec.EllipticCurvePrivateKey) and priv.curve.name == "secp384r1"
    assert sec.load_node_key(key.private) == key
    assert key.fingerprint.startswith("SHA256:") and key.fingerprint == sec.key_fingerprint(key.public.read_text())
    tls = sec.make_tls(tmp_path / "tls")
    assert tls.server_key.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "tls" / "ca.key").exists()  # the CA key is never written


def test_group_or_world_readable_keys_are_refused(tmp_path):
    key = sec.make_node_key(tmp_path, "node0")
    os.chmod(key.private, 0o640)
    with pytest.raises(InputError, match=r"is readable or writable by group/others \(mode 0640\).* chmod 600"):
        sec.load_node_key(key.private)
    tls = sec.make_tls(tmp_path / "tls")
    os.chmod(tls.server_key, 0o644)
    with pytest.raises(InputError, match=r"TLS server key .*server.key is readable .*\(mode 0644\)"):
        LoopbackDeployment(tmp_path / "run", [], tls=tls.as_tuple())
    other = sec.make_node_key(tmp_path, "node1")
    os.replace(other.public, key.public)  # someone else's public key beside our private key
    os.chmod(key.private, 0o600)
    with pytest.raises(InputError, match="does not belong to the private key"):
        sec.load_node_key(key.private)


def test_ed25519_keys_are_refused_with_the_reason(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    k = ed25519.Ed25519PrivateKey.generate()
    sec.write_private(tmp_path / "ed", k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                       serialization.NoEncryption()))
    with pytest.raises(InputError, match="accepts only ECDSA keys on a NIST curve"):
        sec.load_node_key(tmp_path / "ed")


def test_server_certificate_names_its_hosts_and_is_signed_by_the_ca(tmp_path):
    from cryptography import x509

    tls = sec.make_tls(tmp_path, ["198.18.0.1", "link.example.org"])
    cert = x509.load_pem_x509_certificate(tls.server_cert.read_bytes())
    ca = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["198.18.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["link.example.org"]
    cert.verify_directly_issued_by(ca)
    other = x509.load_pem_x509_certificate(sec.make_tls(tmp_path / "other").ca_cert.read_bytes())
    with pytest.raises(ValueError):  # a per-deployment CA: another deployment's CA does not vouch for it
        cert.verify_directly_issued_by(other)


def test_pins_file_is_0600_and_a_writable_one_is_refused(tmp_path):
    pins = {0: sec.Pin(11, "SHA256:a"), 1: sec.Pin(22, "SHA256:b")}
    path = sec.write_pins(tmp_path / "pins.json", pins)
    assert path.stat().st_mode & 0o777 == 0o600
    assert sec.read_pins(path) == pins
    os.chmod(path, 0o666)
    with pytest.raises(FederationError, match="writable by no one else"):
        sec.read_pins(path)
    with pytest.raises(FederationError, match="does not exist"):
        sec.read_pins(tmp_path / "nope.json")


@pytest.fixture
def _task_identity():
    """Outside a Flower runtime, Message(...) needs the task identity set (internal API)."""
    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old


def _fake_nodes(tmp_path, ids):
    from test_flower_apps import FakeGrid  # the in-process Grid of the apps' tests

    d = make_synthetic(n_clients=2, n_samples=N, n_features=8, rank=R, random_state=0)
    paths = write_views(d.views, tmp_path / "views")
    configs = {nid: {"partition-id": p, "data-path": str(paths[p]), "state-dir": str(tmp_path / f"s{nid}")}
               for nid, p in ids.items()}
    return lambda **kw: FakeGrid(make_client_app(), configs, **kw)


def test_handshake_leaves_out_a_node_with_no_pinned_key(tmp_path, _task_identity, caplog):
    """A rogue with a registered key (Flower OSS's Control API lets anyone with the CA do that)
    is never asked and never sent a view's messages: it neither takes a view nor blocks the run."""
    pins = {0: sec.Pin(101, "SHA256:real0"), 1: sec.Pin(202, "SHA256:real1")}
    grid = _fake_nodes(tmp_path, {101: 0, 202: 1})
    assert handshake(grid(), 2, job_id="j", timeout=2.0, poll=0.001, pins=pins) == [101, 202]
    # a rogue claiming view 0, and one that never answers: both left out, logged once each
    rogue = _fake_nodes(tmp_path, {666: 0, 101: 0, 202: 1, 777: 0})(drop={777})
    sent: list[int] = []
    push = rogue.push_messages
    rogue.push_messages = lambda msgs: (sent.extend(m.metadata.dst_node_id for m in msgs), push(msgs))[1]
    with caplog.at_level("WARNING", logger="fedsonmf.federation.flower.transport"):
        assert handshake(rogue, 2, job_id="j", timeout=2.0, poll=0.001, pins=pins) == [101, 202]
    notes = [r.getMessage() for r in caplog.records]
    assert sorted(notes) == [f"node {n} is online but holds no pinned key (registered with the SuperLink by someone "
                             "else): left out of the run" for n in (666, 777)]
    assert sorted(sent) == [101, 202]  # nothing reached the rogues
    # the rogue alone, with view 0's real node down: view 0 is missing, and the error names the rogue
    grid = _fake_nodes(tmp_path, {666: 0, 202: 1})
    with pytest.raises(FederationError, match=r"views \[0\] did not answer .*left out, holding no pinned key: "
                                              r"nodes \[666\]"):
        handshake(grid(), 2, job_id="j", timeout=0.3, poll=0.001, pins=pins)
    # a pinned node claiming the other view is still refused, naming both
    grid = _fake_nodes(tmp_path, {101: 1, 202: 0})
    with pytest.raises(FederationError, match=r"node 101 \(pinned to view 0\) claims view 1, which is pinned to "
                                              r"node 202"):
        handshake(grid(), 2, job_id="j", timeout=2.0, poll=0.001, pins=pins)
    # without pins (an unauthenticated deployment) the old rules hold: the first answer wins a view
    grid = _fake_nodes(tmp_path, {101: 0, 202: 1, 777: 0})
    assert handshake(grid(drop={777}), 2, job_id="j", timeout=2.0, poll=0.001) == [101, 202]


def test_auth_without_tls_is_refused():
    with pytest.raises(InputError, match="SuperNode authentication needs TLS"):
        LoopbackDeployment("unused", [], tls=False)


# =============================================================================== deploy: the attacks
@pytest.fixture(scope="module")
def data():
    return make_synthetic(n_clients=2, n_samples=N, n_features=10, rank=R, heterogeneity=0.5, random_state=4).views


@pytest.fixture(scope="module")
def secure(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("secure")
    dep = LoopbackDeployment(root / "run", write_views(data, root / "views"))
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()
        assert not [p for p in list(dep.nodes.values()) + [dep.superlink] if p.poll() is None]


def _outsider_home(tmp_path, dep, *, ca: bool) -> dict:
    """A fresh FLWR_HOME that knows only the deployment's address (and, with ``ca``, its public CA certificate)."""
    home = tmp_path / f"outsider-{uuid.uuid4().hex[:6]}"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "x"\n\n[superlink.x]\naddress = "127.0.0.1:{dep.port}"\n'
        + (f'root-certificates = "{dep.tls[0]}"\n' if ca else ""))
    return flower_env(home)


def _flwr(env, *args, timeout=60):
    return subprocess.run([_bin("flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _online(dep) -> set[int]:
    out = _flwr(dep.env, "supernode", "ls", "fedsonmf", "--format", "json").stdout
    nodes = json.loads(out[out.index("{"):])["nodes"]
    return {int(n["node-id"]) for n in nodes if n["status"] == "online"}


def _wait(pred, what, timeout=STALL):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _supernode(dep, tmp_path, name, node_config, *extra):
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([_bin("flower-supernode"), "--root-certificates", dep.tls[0], "--superlink",
                                 f"127.0.0.1:{dep.port}", "--port", str(_free_port()), "--node-config", node_config,
                                 *extra], env=dep.env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return proc, log


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:  # its flower-superexec child, if any is left
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _config(job):
    return {"num-rounds": ROUNDS, "seed": SEED, "config-json": json.dumps(CFG.to_dict()), "job-id": job,
            "round-timeout": STALL, "node-timeout": STALL}  # ceilings of event waits (a loaded machine)


@deploy
def test_a_rogue_supernode_without_a_registered_key_cannot_connect(secure, tmp_path):
    pinned = {secure.pins[p].node_id for p in range(2)}
    _wait(lambda: _online(secure) == pinned, "the real nodes to come online")
    assert secure.secure
    cfg = f'partition-id=0 num-partitions=2 data-path="{tmp_path / "x.npy"}"'
    keyless, log1 = _supernode(secure, tmp_path, "keyless", cfg)
    stranger = sec.make_node_key(tmp_path / "k", "stranger")  # a valid key nobody registered
    unregistered, log2 = _supernode(secure, tmp_path, "unregistered", cfg, "--auth-supernode-private-key",
                                    str(stranger.private))
    try:
        assert keyless.wait(timeout=120) != 0 and unregistered.wait(timeout=120) != 0
    finally:
        _stop(keyless)
        _stop(unregistered)
    assert "SuperNode authentication is enabled. All SuperNodes must be registered" in log1.read_text()
    assert "Failed to activate SuperNode" in log2.read_text()  # Flower hides the reason (no such key)
    assert _online(secure) == pinned


@deploy
def test_b_rogue_with_a_registered_key_claiming_a_taken_view_is_left_out(secure, tmp_path, data):
    # an outsider with the (public) CA certificate registers its own key: the Control API has no authentication
    outsider = _outsider_home(tmp_path, secure, ca=True)
    rogue_key = sec.make_node_key(tmp_path / "rogue", "rogue")
    reg = _flwr(outsider, "supernode", "register", str(rogue_key.public), "x", "--format", "json")
    assert reg.returncode == 0, reg.stdout + reg.stderr
    rogue_id = int(json.loads(reg.stdout[reg.stdout.index("{"):])["node-id"])
    fake = write_views([np.abs(np.random.default_rng(0).normal(size=(N, 10)))], tmp_path / "fake")[0]
    secure.kill_node(0, signal.SIGTERM)  # the real node 0 is down; the rogue comes up first
    rogue, log = _supernode(secure, tmp_path, "rogue",
                            f'partition-id=0 num-partitions=2 data-path="{fake}" state-dir="{tmp_path / "rs"}"',
                            "--auth-supernode-private-key", str(rogue_key.private))
    try:
        _wait(lambda: rogue_id in _online(secure), "the rogue to come online")
        secure.start_node(0)  # the real node 0 again (re-keyed: a new key, node id and pin)
        real0 = secure.pins[0].node_id
        _wait(lambda: real0 in _online(secure), "the real node 0 to come online")
        outcome = secure.run(_config("rogue"), out_dir=secure.run_dir / "rogue")
    finally:
        _stop(rogue)
    st = outcome.status
    assert outcome.ok, st  # the rogue neither took view 0 nor blocked the run
    node_ids = load_result(outcome.out_dir).extra["flower"]["node_ids"]
    assert node_ids[0] == real0 and rogue_id not in node_ids, node_ids
    note = f"node {rogue_id} is online but holds no pinned key (registered with the SuperLink by someone else)"
    assert note in (secure.run_dir / "logs" / "gate-superlink.log").read_text()

@deploy
def test_b_with_the_real_nodes_alone_the_run_completes(secure, data):
    _wait(lambda: _online(secure) == {secure.pins[p].node_id for p in range(2)}, "only the pinned nodes online")
    out = secure.run_dir / "alone"
    outcome = secure.run(_config("alone"), out_dir=out)
    assert outcome.ok, outcome.status
    with threadpool_limits(1):
        # deployments use secure aggregation by default (whatever config-json says): so does the reference
        ref = run_inprocess(check_views(data, R), CFG.replace(secure_aggregation=True), max_rounds=ROUNDS, seed=SEED)
    res = load_result(out)
    assert np.array_equal(res.V, ref.V)
    assert res.extra["flower"]["node_ids"] == [secure.pins[0].node_id, secure.pins[1].node_id]


@deploy
def test_c_credential_less_cli_commands_fail(secure, tmp_path):
    ok = _flwr(secure.env, "ls", "fedsonmf", "--format", "json")  # the launcher's own FLWR_HOME works
    assert ok.returncode == 0 and '"success": true' in ok.stdout, ok.stdout + ok.stderr
    runs = json.loads(ok.stdout[ok.stdout.index("{"):])["runs"]
    run_id = runs[0]["run-id"] if runs else 1  # a run of the tests above, when they ran
    for env in (_outsider_home(tmp_path, secure, ca=False), _insecure_home(tmp_path, secure)):
        for args in (["ls", "x"], ["supernode", "ls", "x"], ["log", str(run_id), "x"], ["stop", str(run_id), "x"]):
            res = _flwr(env, *args)
            text = " ".join((res.stdout + res.stderr).replace("│", " ").split())
            assert res.returncode != 0, (args, text)
            # how the stock CLI reports a failed TLS handshake (unknown CA) or plain HTTP to the TLS port
            assert "Connection to the SuperLink is unavailable" in text, (args, text)
    # the runs are untouched: nothing was stopped
    again = _flwr(secure.env, "ls", "fedsonmf", "--format", "json")
    assert [r["status"] for r in json.loads(again.stdout[again.stdout.index("{"):])["runs"]] == \
        [r["status"] for r in runs]


def _insecure_home(tmp_path, dep):
    """A fresh FLWR_HOME that tries plain HTTP (``insecure = true``) against the TLS port."""
    home = tmp_path / f"plain-{uuid.uuid4().hex[:6]}"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "x"\n\n[superlink.x]\naddress = "127.0.0.1:{dep.port}"\ninsecure = true\n')
    return flower_env(home)


@deploy
def test_insecure_opt_out_warns_and_lets_a_keyless_node_in(tmp_path):
    """What ``--insecure`` means (the state of main before this work): any node joins."""
    dep = LoopbackDeployment(tmp_path / "run", [], tls=False, auth=False)
    with pytest.warns(InsecureDeploymentWarning, match="no TLS"):
        dep.start()
    try:
        assert dep.pins_path is None
        log = tmp_path / "keyless.log"
        with open(log, "wb") as fh:
            rogue = subprocess.Popen([_bin("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{dep.port}",
                                      "--port", str(_free_port()), "--node-config", "partition-id=0"], env=dep.env,
                                     stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        try:
            _wait(lambda: len(_online(dep)) == 1, "the keyless node to join the insecure deployment")
        finally:
            _stop(rogue)
    finally:
        dep.stop()


# =============================================================================== fast: the machine commands
def test_keys_commands_write_0600_private_files(tmp_path):
    from typer.testing import CliRunner

    from fedsonmf.cli.app import app

    r = CliRunner().invoke(app, ["flower", "keys", "tls", str(tmp_path / "tls"), "--host", "198.18.0.1"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "tls" / "server.key").stat().st_mode & 0o777 == 0o600
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((tmp_path / "tls" / "server.pem").read_bytes())
    ips = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
    assert [str(a) for a in ips] == ["198.18.0.1", "127.0.0.1"]
    r = CliRunner().invoke(app, ["flower", "keys", "node", str(tmp_path / "k"), "--name", "n0"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "k" / "n0").stat().st_mode & 0o777 == 0o600 and "fingerprint SHA256:" in r.output


def test_machine_commands_refuse_readable_keys_and_missing_credentials(tmp_path):
    from typer.testing import CliRunner

    from fedsonmf.cli.app import app

    key = sec.make_node_key(tmp_path, "n0")
    os.chmod(key.private, 0o644)
    np.save(tmp_path / "v.npy", np.ones((4, 3)))
    base = ["flower", "supernode", "--superlink", "198.18.0.1:9092", "--view", str(tmp_path / "v.npy"),
            "--partition", "0", "--partitions", "2", "--home", str(tmp_path / "h")]
    r = CliRunner().invoke(app, [*base, "--key", str(key.private), "--ca", str(tmp_path / "ca.crt")])
    assert r.exit_code == 2 and "(mode 0644)" in r.output, r.output  # bad input
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 2 and "give --key and --ca, or --insecure" in r.output, r.output
    r = CliRunner().invoke(app, ["flower", "superlink", "--host", "198.18.0.1", "--home", str(tmp_path / "h")])
    assert r.exit_code == 2 and "--tls DIR" in r.output, r.output
    tls = sec.make_tls(tmp_path / "tls")
    os.chmod(tls.server_key, 0o640)
    r = CliRunner().invoke(app, ["flower", "superlink", "--host", "198.18.0.1", "--tls", str(tmp_path / "tls"),
                                 "--home", str(tmp_path / "h")])
    assert r.exit_code == 2 and "server.key is readable or writable by group/others (mode 0640)" in r.output, r.output


def test_a_second_pin_on_a_view_is_refused(tmp_path):
    path = tmp_path / "pins.json"
    sec.add_pin(path, 0, sec.Pin(1, "SHA256:a"))
    with pytest.raises(InputError, match=r"view 0 is already pinned to node 1 \(key SHA256:a\)"):
        sec.add_pin(path, 0, sec.Pin(2, "SHA256:b"))
    assert sec.add_pin(path, 0, sec.Pin(2, "SHA256:b"), replace=True) == {0: sec.Pin(2, "SHA256:b")}


@pytest.mark.parametrize("repinned", [True, False])
def test_a_returning_node_is_adopted_only_if_the_launcher_repinned_its_view(tmp_path, _task_identity, repinned):
    """Partial rounds: a restarted node (new key, new node id) takes its view back once the
    launcher has rewritten the pins file; an unpinned newcomer claiming it is left out."""
    import test_flower_apps as apps

    views = make_synthetic(n_clients=3, n_samples=N, n_features=8, rank=R, random_state=1).views
    pins_path = tmp_path / "pins.json"
    sec.write_pins(pins_path, {p: sec.Pin(nid, f"SHA256:k{nid}") for p, nid in enumerate((101, 202, 303))})

    class Restart(apps.FlakyGrid):
        def get_node_ids(self):
            ids = super().get_node_ids()
            if self.new in ids and repinned:  # what LoopbackDeployment.start_node does on a restart
                sec.add_pin(pins_path, 2, sec.Pin(self.new, "SHA256:k404"), replace=True)
            return ids

    grid = Restart(make_client_app(), apps._nodes(tmp_path, views), dead=303, new=404, k=2, back=4)
    rc = apps._run_config(tmp_path, **{"num-rounds": 5, "round-timeout": 0.3, "min-clients": 2.0,
                                       "rejoin": "refresh", "node-pins": str(pins_path)})
    if repinned:
        _, result = apps._server(grid, rc)
        assert [r["participants"] for r in result["history"]][-1] == [0, 1, 2]
        assert result["flower"]["node_ids"] == [101, 202, 303]  # the handshake's nodes
    else:  # the unpinned newcomer is left out: view 2 stays out, the run goes on with the others
        _, result = apps._server(grid, rc)
        assert [r["participants"] for r in result["history"]][-1] == [0, 1]
        assert result["flower"]["node_ids"] == [101, 202, 303]


def test_handshake_ignores_the_deployments_retired_nodes(tmp_path, _task_identity):
    """A SIGKILLed node restarted with a new key: the SuperLink lists the dead old node id as
    online for ~1 min; it is this deployment's own (retired in the pins file), so a resume
    right away must not be refused for it."""
    path = tmp_path / "pins.json"
    sec.write_pins(path, {0: sec.Pin(101, "SHA256:a"), 1: sec.Pin(202, "SHA256:b")})
    sec.add_pin(path, 1, sec.Pin(909, "SHA256:c"), replace=True)  # node 202 restarted as 909
    assert sec.read_retired(path) == {202}
    grid = _fake_nodes(tmp_path, {101: 0, 202: 1, 909: 1})(drop={202})
    assert handshake(grid, 2, job_id="j", timeout=2.0, poll=0.001, pins=sec.read_pins(path),
                     retired=sec.read_retired(path)) == [101, 909]
    # not given as retired: an unpinned node, left out all the same
    assert handshake(grid, 2, job_id="j", timeout=2.0, poll=0.001, pins=sec.read_pins(path)) == [101, 909]


def test_flower_run_insecure_and_tls_exclude_each_other(tmp_path):
    from typer.testing import CliRunner

    from fedsonmf.cli.app import app

    np.save(tmp_path / "v.npy", np.ones((5, 3)))
    r = CliRunner().invoke(app, ["flower", "run", str(tmp_path / "v.npy"), "--out", str(tmp_path / "run"), "--rank",
                                 "2", "--insecure", "--tls", "a", "--tls", "b", "--tls", "c"])
    assert r.exit_code == 2 and "--insecure and --tls exclude each other" in r.output, r.output


def test_a_nodes_config_states_its_policies_as_flower_parses_them(tmp_path):
    """The node config the launcher and ``fedsonmf flower supernode`` write: the secure-aggregation
    policy always spelled out (on unless allowed off), the cluster-size policy when above 1, both
    read back by the ClientApp's own rules from Flower's parse."""
    from types import SimpleNamespace

    from flwr.common.config import parse_config_args

    from fedsonmf.federation.flower.nodeconfig import min_cluster_size, requires_secure_aggregation

    for kw, secure, size in (({}, True, 1), ({"require_secure": False}, False, 1),
                             ({"min_cluster_size": 3}, True, 3)):
        nc = parse_config_args([sec.node_config(0, 2, tmp_path / "v.npy", **kw)])
        ctx = SimpleNamespace(node_config=nc)
        assert requires_secure_aggregation(ctx) is secure and min_cluster_size(ctx) == size, nc
