"""The multi-machine recipe's Control API and signing keys, without a deployment.

* ``fleetproxy``: the nodes' address forwards only the Fleet API (the SuperLink itself listens on
  the coordinator host's loopback); the deployment side is ``tests/test_flower_netns.py``.
* ``keys node`` / ``supernode`` make each node's secure-aggregation signing key (0600) beside its
  node key; ``register --signing-key`` records the public half; ``submit`` pins every view's key in
  the run config it signs, and refuses a masked run while a view has none.
"""

from __future__ import annotations

import json
import subprocess
import tomllib

import pytest

pytest.importorskip("flwr")

from typer.testing import CliRunner  # noqa: E402

from fedsonmf.cli.app import app  # noqa: E402
from fedsonmf.federation.flower import fleetproxy  # noqa: E402
from fedsonmf.federation.flower import security as sec  # noqa: E402


def test_the_nodes_address_forwards_only_the_fleet_api():
    for path in ("/v1/fleet/pull-messages", "/v1/fleet/register-node", "/v1/fleet/push-messages"):
        assert fleetproxy.allowed("POST", path)
    assert fleetproxy.allowed("GET", "/health")
    for method, path in (("POST", "/v1/control/start-run"), ("POST", "/v1/control/stop-run"),
                         ("POST", "/v1/control/unregister-node"), ("POST", "/v1/runtime/pull-app-inputs"),
                         ("POST", "/health"), ("GET", "/v1/fleetx"), ("GET", "/docs")):
        assert not fleetproxy.allowed(method, path), (method, path)


def test_keys_node_makes_a_private_signing_key_kept_across_calls(tmp_path):
    r = CliRunner().invoke(app, ["flower", "keys", "node", str(tmp_path / "key"), "--name", "node0"])
    assert r.exit_code == 0, r.output
    private, public = tmp_path / "key" / "node0-secagg.pem", tmp_path / "key" / "node0-secagg.pub"
    assert private.stat().st_mode & 0o777 == 0o600 and (tmp_path / "key").stat().st_mode & 0o777 == 0o700
    line = public.read_text().strip()
    assert f"secure-aggregation signing key {line}" in r.output
    assert sec.read_signing_public(public) == line == sec.signing_public_key(private)
    again = sec.node_signing_key(tmp_path / "key" / "node0")  # what `supernode` does at every start
    assert again == (private, public, line)  # kept: the peers pin it for the deployment's lifetime
    with pytest.raises(sec.InputError, match="is a private key"):
        sec.read_signing_public(private)


def _submit(tmp_path, monkeypatch, *extra):
    """``flower submit`` with a stand-in for ``flwr run`` (the ServerApp's completed status)."""
    from fedsonmf.federation.flower import gate

    if not (tmp_path / "c.key").exists():
        gate.Authority.create(tmp_path / "c.key")
    out = tmp_path / "run"

    def flwr_run(argv, *args, **kw):
        out.mkdir(exist_ok=True)
        (out / "status.json").write_text(json.dumps({"status": "completed", "n_rounds": 1}))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr("fedsonmf.cli.flower._submit_with_progress", flwr_run)
    tls = sec.make_tls(tmp_path / "tls")
    return CliRunner().invoke(app, ["flower", "submit", "--superlink", "127.0.0.1:9093", "--ca", str(tls.ca_cert),
                                    "--pins", str(tmp_path / "pins.json"), "--out", str(out), "--clients", "2",
                                    "--rounds", "1", "--home", str(tmp_path / "h"), "--coordinator-key",
                                    str(tmp_path / "c.key"), *extra])


def test_submit_refuses_a_masked_run_while_a_view_has_no_signing_key(tmp_path, monkeypatch):
    r = _submit(tmp_path, monkeypatch)
    assert r.exit_code == 2 and "no secure-aggregation signing keys are recorded" in r.output, r.output
    keys = [sec.node_signing_key(sec.make_node_key(tmp_path / f"n{p}", f"node{p}").private) for p in (0, 1)]
    sec.add_peer_key(tmp_path / "pins.json", 0, sec.read_signing_public(keys[0][1]))
    assert sec.peers_file(tmp_path / "pins.json").stat().st_mode & 0o777 == 0o600
    r = _submit(tmp_path, monkeypatch)
    assert r.exit_code == 2 and "views [1] have no secure-aggregation signing key" in r.output, r.output
    assert not (tmp_path / "h" / "run-config.toml").exists()  # nothing submitted
    sec.add_peer_key(tmp_path / "pins.json", 1, sec.read_signing_public(keys[1][1]))
    r = _submit(tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    conf = tomllib.loads((tmp_path / "h" / "run-config.toml").read_text())
    assert json.loads(conf[sec.PEERS_KEY]) == [keys[0][2], keys[1][2]]  # by view, under the coordinator's signature
    assert "gate-token" in conf
