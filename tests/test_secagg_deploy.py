"""Secure aggregation on a real loopback deployment (a SuperLink + 3 SuperNodes as processes).

One secure run of a few rounds with the wire recorded (the arrays the server received saved):
V equals the in-process secure run bit for bit and the plain run to <= 1e-6 relative, the wire
passes the audit of the secure protocol, and the transcript holds no client's upload (masked
arrays uniform on the ring, uncorrelated with every plain upload, summing exactly to the plain
sums).  ``run_flower`` runs with secure aggregation by default.  Slow (~1 min).
"""

import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from threadpoolctl import threadpool_limits  # noqa: E402

from _waits import STALL  # noqa: E402
from fedsonmf._validation import check_views  # noqa: E402
from fedsonmf.datasets import make_synthetic  # noqa: E402
from fedsonmf.federation.flower import LoopbackDeployment, load_result, write_views  # noqa: E402
from fedsonmf.federation.flower.audit import audit_wire  # noqa: E402
from fedsonmf.federation.flower.template import RUN_CONFIG_DEFAULTS  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402
from test_secagg import Recorder, _rel, _run, check_transcript, wire_transcript  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

R, N, ROUNDS, SEED = 4, 60, 3, 7
CFG = FedConfig(n_components=R, tau=3, secure_aggregation=True)


def test_flower_deployment_defaults_to_secure_aggregation():
    from fedsonmf.federation.flower.server_app import config_from_run_config

    assert RUN_CONFIG_DEFAULTS["secure-aggregation"] is True
    assert config_from_run_config(dict(RUN_CONFIG_DEFAULTS)).secure_aggregation is True


def test_secure_deployment_equals_inprocess_and_its_wire_holds_no_upload(tmp_path):
    data = make_synthetic(n_clients=3, n_samples=N, n_features=12, rank=R, heterogeneity=0.5, random_state=1).views
    views = check_views(data, R)
    rec = Recorder()
    with threadpool_limits(1):  # like the launched processes
        ref, _ = _run(views, CFG, rounds=ROUNDS, hook=rec)
        plain, _ = _run(views, CFG.replace(secure_aggregation=False), rounds=ROUNDS)
    paths = write_views(data, tmp_path / "views")
    with LoopbackDeployment(tmp_path / "run", paths) as dep:
        out = dep.run_dir / "secure"
        rc = {"num-rounds": ROUNDS, "seed": SEED, "config-json": json.dumps(CFG.to_dict()), "job-id": "sa",
              "round-timeout": STALL, "node-timeout": STALL, "record-wire": True, "record-wire-arrays": True}
        outcome = dep.run(rc, out_dir=out)  # secure-aggregation: the deployment default
        assert outcome.ok, outcome.status
    res = load_result(out)
    assert res.config["secure_aggregation"] is True and res.n_rounds == ROUNDS
    assert np.array_equal(res.V, ref.V)  # the same code path as in-process
    assert _rel(res.V, plain.V) <= 1e-6
    rows = [json.loads(line) for line in open(out / "wire.jsonl")]
    summary = audit_wire(rows, "fedsonmf", CFG, N)
    assert summary["up round"]["messages"] == 3 * ROUNDS and summary["up init"]["messages"] == 3
    # the launcher pinned every view's signing key in the signed run config: the keys were signed and
    # every node echoed the key list it verified (tests/test_secagg_active.py: the refusals)
    assert sum("secagg_sig" in json.dumps(r) for r in rows) == 3
    assert sum("secagg_echo" in json.dumps(r) for r in rows) == 3
    received, downs = wire_transcript(rows, out / "wire-arrays")
    assert len(received) == 3 * (ROUNDS + 2)  # setup, init and every round, from every client
    check_transcript(received, rec.plain, downs, 3)


HOSTILE_SERVER = '''
"""A ServerApp that swaps client 1's secure-aggregation key in every init message for its own."""
import dataclasses
import json

from flwr.serverapp import ServerApp

from fedsonmf.federation import secagg
from fedsonmf.federation.flower import codec
from fedsonmf.federation.flower.server_app import server_main

ATTACKER = secagg.generate_keypair()[1].hex()


class SwappingGrid:
    def __init__(self, grid):
        self._grid = grid

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            if codec.META in msg.content and str(msg.content[codec.META]["kind"]) == "init":
                fed, meta = codec.decode(msg.content)
                params = json.loads(str(fed.scalars[secagg.SECAGG_KEY]))
                params["public_keys"][1] = ATTACKER
                fed = dataclasses.replace(fed, scalars={**fed.scalars,
                                                        secagg.SECAGG_KEY: json.dumps(params, sort_keys=True)})
                msg.content = codec.encode(fed, client=int(meta["client"]), job_id=str(meta["job-id"]))
        return self._grid.push_messages(messages)


app = ServerApp()


@app.main()
def main(grid, context):
    server_main(SwappingGrid(grid), context)
'''


def test_a_deployed_serverapp_that_swaps_a_key_is_refused(tmp_path):
    """The SuperLink host runs a hostile ServerApp (the server is the party the nodes need not
    trust); the nodes verify the relayed keys against the signing keys pinned in the run config
    the coordinator signed, and refuse: the run fails naming the slot, no V is written."""
    import os

    data = make_synthetic(n_clients=3, n_samples=N, n_features=12, rank=R, heterogeneity=0.5, random_state=1).views
    paths = write_views(data, tmp_path / "views")
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fedsonmf_hostile_server.py").write_text(HOSTILE_SERVER)
    dep = LoopbackDeployment(tmp_path / "run", paths, server_app="fedsonmf_hostile_server:app")
    dep.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(mods), dep.env.get("PYTHONPATH", "")) if p)
    with dep:
        out = dep.run_dir / "hostile"
        rc = {"num-rounds": ROUNDS, "seed": SEED, "config-json": json.dumps(CFG.to_dict()), "job-id": "swap",
              "round-timeout": STALL, "node-timeout": STALL}
        outcome = dep.run(rc, out_dir=out)
    assert not outcome.ok
    assert outcome.status["status"] == "failed"
    assert "not signed by client 1's pinned signing key" in outcome.status["error"], outcome.status
    assert not (out / "V.npy").exists()
