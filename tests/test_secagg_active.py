"""Secure aggregation against an active server: signed keys and the key-list consistency check.

* every client signs its X25519 key (bound to the session, the seed, its slot and the cohort
  size) with its own Ed25519 key; every client verifies every relayed key against the slot's
  pinned signing key before deriving any mask;
* a hostile server (a transport wrapper around the honest clients) that swaps a key, moves a
  signed key into another slot, or replays one from another run is refused, naming the slot;
* a server that shows different key lists to different clients is refused at the round-1
  consistency check, the error naming who received which list;
* honest runs: the same V bit for bit with and without signing (the decoded sums do not
  depend on the masks);
* the Flower apps (fake grid): nodes that hold signing keys pinned in the run config agree, and
  a grid that swaps a key in the init message fails the run.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from fedsonmf._validation import check_views
from fedsonmf.federation import secagg
from fedsonmf.federation.inprocess import InProcessTransport, run_inprocess
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import Message

R = 4
CFG = FedConfig(n_components=R, tau=3, secure_aggregation=True)


@pytest.fixture(scope="module")
def views(small_problem):
    return check_views(small_problem.views[:3], R)


def _clients(views, signers, cfg=CFG):
    return [ClientRuntime(X, "fedsonmf", cfg, signer=sg) for X, sg in zip(views, signers)]


def _params(msg: Message) -> dict:
    return json.loads(str(msg.scalars[secagg.SECAGG_KEY]))


def _with_params(msg: Message, params: dict) -> Message:
    return dataclasses.replace(msg, scalars={**msg.scalars, secagg.SECAGG_KEY: json.dumps(params, sort_keys=True)})


class HostileServer(InProcessTransport):
    """The honest clients behind a server that rewrites the init message (``rewrite(p, params)``
    returns the parameters client ``p`` is shown)."""

    def __init__(self, clients, rewrite):
        super().__init__(clients)
        self.rewrite = rewrite

    def exchange(self, messages):
        if messages and messages[0].kind == "init":
            messages = [_with_params(msg, self.rewrite(p, _params(msg))) for p, msg in enumerate(messages)]
        return super().exchange(messages)


def _no_pair_keys(clients) -> bool:
    return all(c.state is None or secagg.STATE_PAIRS not in c.state.arrays for c in clients)


# ----------------------------------------------------------------------------- signatures


def test_a_swapped_key_is_refused_before_any_mask_is_derived(views):
    attacker_sk, attacker_pk = secagg.generate_keypair()

    def swap(p, params):
        params["public_keys"][1] = attacker_pk.hex()  # the server's own key in client 1's slot
        return params

    clients = _clients(views, secagg.KeySigner.group(3))
    with pytest.raises(secagg.KeyAgreementError, match="relayed for client 1 .* not signed by client 1's pinned"):
        run_federation(HostileServer(clients, swap), "fedsonmf", CFG, max_rounds=2, seed=7)
    assert _no_pair_keys(clients)  # refused before any pair key (hence any mask) existed


def test_a_signed_key_moved_to_another_slot_is_refused(views):
    def move(p, params):
        for field in ("public_keys", "signatures"):
            params[field][1], params[field][2] = params[field][2], params[field][1]
        return params

    clients = _clients(views, secagg.KeySigner.group(3))
    with pytest.raises(secagg.KeyAgreementError, match="client 1"):
        run_federation(HostileServer(clients, move), "fedsonmf", CFG, max_rounds=2, seed=7)
    assert _no_pair_keys(clients)


def test_a_signed_key_of_another_run_is_refused(views):
    signers = secagg.KeySigner.group(3)  # the same long-term keys and session in both runs
    seen = {}

    def record(p, params):
        seen.setdefault("keys", (params["public_keys"][1], params["signatures"][1]))
        return params

    run_federation(HostileServer(_clients(views, signers), record), "fedsonmf", CFG, max_rounds=1, seed=7)

    def replay(p, params):
        params["public_keys"][1], params["signatures"][1] = seen["keys"]
        return params

    clients = _clients(views, signers)
    with pytest.raises(secagg.KeyAgreementError, match="client 1"):
        run_federation(HostileServer(clients, replay), "fedsonmf", CFG, max_rounds=1, seed=8)
    assert _no_pair_keys(clients)


def test_a_server_that_drops_the_signatures_is_refused(views):
    def drop(p, params):
        params.pop("signatures")
        return params

    with pytest.raises(secagg.KeyAgreementError, match="no signatures"):
        run_federation(HostileServer(_clients(views, secagg.KeySigner.group(3)), drop), "fedsonmf", CFG,
                       max_rounds=1, seed=7)


def test_a_pinned_key_that_is_not_the_clients_own_is_refused():
    a, b = secagg.KeySigner.group(2)
    with pytest.raises(Exception, match="not the public half"):
        secagg.KeySigner(a._key, [secagg.KeySigner.public_bytes(b._key)] * 2, "s", 0)


# ----------------------------------------------------------------------------- consistency check


def test_different_key_lists_for_different_clients_fail_the_run_naming_what_each_saw(views):
    """Client 2 signed two keys in one session (the server sent it the setup twice); the server
    shows client 0 the first and the others the second.  Every signature verifies; the round-1
    echoes show the split.  The server hides the broken set-up sum from its own loop (it makes one
    up), so the clients' check is what stops the run."""
    cfg = CFG.replace(init_v="random")
    clients = _clients(views, secagg.KeySigner.group(3), cfg)
    first = {}

    class Equivocating(InProcessTransport):
        def exchange(self, messages):
            if messages and messages[0].kind == "setup":
                first["reply"] = self.clients[2].handle(messages[2])  # a first key pair of client 2, signed
            if messages and messages[0].kind == "init":
                params = _params(messages[0])
                alt = dict(params, public_keys=list(params["public_keys"]), signatures=list(params["signatures"]))
                alt["public_keys"][2] = str(first["reply"].scalars["secagg_pk"])
                alt["signatures"][2] = str(first["reply"].scalars[secagg.SIG_KEY])
                messages = [_with_params(messages[0], alt), *messages[1:]]
                replies = super().exchange(messages)
                # the masks no longer cancel; the server feeds its own loop a sum it makes up (ones)
                bits = params["bits"]
                return [dataclasses.replace(rep, arrays={
                    k: (secagg.encode(np.ones(np.shape(a)), bits[k[len(secagg.MASKED_PREFIX):]], 3) if p == 0
                        else np.zeros(np.shape(a), dtype=np.uint64)) for k, a in rep.arrays.items()})
                    for p, rep in enumerate(replies)]
            return super().exchange(messages)
    with pytest.raises(secagg.KeyAgreementError, match=r"different key lists to different clients: client 0 received "
                                                       r"key list [0-9a-f]{16}\.\.\., but client 1 received"):
        run_federation(Equivocating(clients), "fedsonmf", cfg, max_rounds=2, seed=7)
    # every client verified every signature: the split shows only in the digests
    assert all(secagg.STATE_DIGEST in c.state.arrays for c in clients)
    assert len({bytes(c.state.arrays[secagg.STATE_DIGEST]) for c in clients}) == 2


def test_the_echo_check_names_every_client_whose_list_differs():
    signers = secagg.KeySigner.group(3, "sess")
    mine, other = "a" * 64, "b" * 64
    echoes = [{"digest": d, "sig": sg.sign(secagg.echo_statement("sess", 5, q, d))}
              for q, (sg, d) in enumerate(zip(signers, [mine, other, other]))]
    with pytest.raises(secagg.KeyAgreementError, match="client 1 received bbbb.*client 2 received bbbb"):
        signers[0].check_echoes(5, mine, echoes)
    agreed = [{"digest": other, "sig": sg.sign(secagg.echo_statement("sess", 5, q, other))}
              for q, sg in enumerate(signers)]
    signers[1].check_echoes(5, other, agreed)  # every client saw the same list: passes
    forged = [dict(e) for e in echoes]
    forged[0]["digest"] = other  # the server rewrites what client 0 said it saw
    with pytest.raises(secagg.KeyAgreementError, match="echo relayed for client 0 is not signed"):
        signers[1].check_echoes(5, other, forged)
    with pytest.raises(secagg.KeyAgreementError, match="no key-list echoes"):
        signers[1].check_echoes(5, other, None)


# ----------------------------------------------------------------------------- honest runs


def test_signed_key_agreement_leaves_the_decoded_v_bit_for_bit(views):
    unsigned = run_federation(InProcessTransport(_clients(views, [None] * 3)), "fedsonmf", CFG, max_rounds=3, seed=7)
    signed = run_federation(InProcessTransport(_clients(views, secagg.KeySigner.group(3))), "fedsonmf", CFG,
                            max_rounds=3, seed=7)
    assert np.array_equal(signed.V, unsigned.V)
    engine = run_inprocess(views, CFG, max_rounds=3, seed=7)  # the engine gives every client a signing key
    assert np.array_equal(engine.V, unsigned.V)
    assert signed.server_state.arrays[secagg_echoes_key()].size > 0


def test_a_client_absent_from_round_1_checks_the_echoes_in_its_first_round(views):
    """Partial rounds: client 1 misses round 1; the echoes go with the rounds until every client
    has taken part, and it checks them in round 2 (V as without signing)."""
    from fedsonmf.protocol.participation import Participation

    part = Participation(min_clients=2, rejoin="refresh")
    down = lambda s: [p for p in range(3) if not (s == 1 and p == 1)]  # noqa: E731
    runs = []
    for signers in ([None] * 3, secagg.KeySigner.group(3)):
        clients = _clients(views, signers)
        transport = InProcessTransport(clients, available=down)
        transport.log = []
        runs.append(run_federation(transport, "fedsonmf", CFG, max_rounds=3, seed=7, participation=part))
    assert np.array_equal(runs[0].V, runs[1].V)
    assert all(secagg.STATE_CHECKED in c.state.arrays for c in clients)
    with_echoes = sorted({msg.round for d, p, msg in transport.log
                          if d == "down" and msg.kind == "round" and "echoes" in _params(msg)})
    assert with_echoes == [1, 2]  # until client 1 has taken part


def secagg_echoes_key() -> str:
    from fedsonmf.federation.loop import ECHOES_STATE

    return ECHOES_STATE


# ----------------------------------------------------------------------------- Flower apps (fake grid)




def _signed_flower_run(tmp_path, small_problem, grid_cls):
    """A secure fit over the fake grid: every node holds its signing key (node config), the run
    config pins all three public halves (what the coordinator signs)."""
    from fedsonmf.federation.flower import security as sec
    from fedsonmf.federation.flower.client_app import make_client_app
    from test_flower_apps import _nodes, _run_config, _server

    nodes = _nodes(tmp_path, small_problem.views[:3])
    peers = []
    for nc in nodes.values():
        p = nc["partition-id"]
        peers.append(sec.make_signing_key(tmp_path / "keys" / f"node{p}.pem"))
        nc[sec.SIGNING_KEY] = str(tmp_path / "keys" / f"node{p}.pem")
    cfg = FedConfig(n_components=R, tau=3, mu=1.0, secure_aggregation=True)
    rc = _run_config(tmp_path, **{"config-json": json.dumps(cfg.to_dict()), "secure-aggregation": True,
                                  sec.PEERS_KEY: json.dumps(peers)})
    grid = grid_cls(make_client_app(), nodes)
    for ctx in grid.contexts.values():
        ctx.run_config = rc
    return grid, rc, cfg, _server


def test_flower_nodes_sign_and_verify_their_keys(tmp_path, small_problem, views, task_identity):
    from test_flower_apps import FakeGrid

    grid, rc, cfg, server = _signed_flower_run(tmp_path, small_problem, FakeGrid)
    V, _ = server(grid, rc)
    ref = run_inprocess(views, cfg, max_rounds=3, seed=9)
    assert np.array_equal(V, ref.V)  # authentication changes no decoded sum
    ups = [json.loads(line) for line in open(f"{rc['out-dir']}/wire.jsonl")]
    assert any("secagg_sig" in json.dumps(row) for row in ups) and any("secagg_echo" in json.dumps(row) for row in ups)


def test_a_flower_server_that_swaps_a_key_is_refused(tmp_path, small_problem, task_identity):
    from fedsonmf.federation.flower import codec
    from test_flower_apps import FakeGrid

    attacker_pk = secagg.generate_keypair()[1].hex()

    class SwappingGrid(FakeGrid):
        """A SuperLink/ServerApp side that rewrites client 1's key in every init message."""

        def push_messages(self, messages):
            for msg in messages:
                if codec.META in msg.content and str(msg.content[codec.META]["kind"]) == "init":
                    fed, meta = codec.decode(msg.content)
                    params = _params(fed)
                    params["public_keys"][1] = attacker_pk
                    msg.content = codec.encode(_with_params(fed, params), client=int(meta["client"]),
                                               job_id=str(meta["job-id"]))
            return super().push_messages(messages)

    grid, rc, _, server = _signed_flower_run(tmp_path, small_problem, SwappingGrid)
    with pytest.raises(Exception):  # noqa: B017 - the ServerApp fails the run; its status names why
        server(grid, rc)
    status = json.loads(open(f"{rc['out-dir']}/status.json").read())
    assert status["status"] == "failed"
    assert "not signed by client 1's pinned signing key" in status["error"]


def test_a_flower_clustering_fit_and_its_masked_predict_sign_their_keys(tmp_path, task_identity):
    """A clustering fit and the masked predict of new samples over the fake grid, every node with
    a signing key pinned in the run config: the same V and labels as the in-process estimator,
    and a predict whose key step the server tampers with is refused."""
    from flwr.app import Context, RecordDict
    from threadpoolctl import threadpool_limits

    from fedsonmf.federation.flower import codec, write_views
    from fedsonmf.federation.flower import security as sec
    from fedsonmf.federation.flower.client_app import make_client_app
    from fedsonmf.federation.flower.clustering import read_labels_csv
    from fedsonmf.federation.flower.server_app import server_main
    from fedsonmf.federation.flower.template import RUN_CONFIG_DEFAULTS
    from test_flower_apps import FakeGrid
    from test_flower_cluster import ROUNDS, SEED, C, blobs, reference

    views, _ = blobs()
    new, _ = blobs(n_per=5, seed=3)
    paths, new_paths = write_views(views, tmp_path / "views"), write_views(new, tmp_path / "new")
    nodes, peers = {}, []
    for p, nid in enumerate((11, 22, 33)):
        key = tmp_path / "keys" / f"node{p}.pem"
        peers.append(sec.make_signing_key(key))
        nodes[nid] = {"partition-id": p, "data-path": str(paths[p]), "state-dir": str(tmp_path / f"node{p}"),
                      "predict-path": str(new_paths[p]), sec.SIGNING_KEY: str(key)}
    rc = dict(RUN_CONFIG_DEFAULTS)
    rc.update({"num-clients": 3, "num-rounds": ROUNDS, "seed": SEED, "tol": 0.0,
               "config-json": json.dumps(FedConfig().to_dict()), "out-dir": str(tmp_path / "server"),
               "job-id": "job-c", "round-timeout": 30.0, "node-timeout": 5.0, "poll-interval": 0.001,
               "n-clusters": C, "n-init": "1", sec.PEERS_KEY: json.dumps(peers)})

    class Grid(FakeGrid):
        swap = False

        def push_messages(self, messages):
            for msg in messages:
                if self.swap and codec.META in msg.content and str(msg.content[codec.META]["kind"]) == "embed-sum":
                    fed, meta = codec.decode(msg.content)
                    params = _params(fed)
                    params["public_keys"][2] = secagg.generate_keypair()[1].hex()
                    msg.content = codec.encode(_with_params(fed, params), client=int(meta["client"]),
                                               job_id=str(meta["job-id"]))
            return super().push_messages(messages)

    grid = Grid(make_client_app(), nodes)

    def run(conf):
        for ctx in grid.contexts.values():
            ctx.run_config = conf
        with threadpool_limits(1):
            server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=conf))

    run(rc)
    ref = reference(views)
    assert np.array_equal(np.load(tmp_path / "server" / "V.npy"), ref.result_.V)
    predict = {**rc, "mode": "predict", "model-dir": rc["out-dir"], "out-dir": str(tmp_path / "predict")}
    run(predict)
    assert np.array_equal(read_labels_csv(tmp_path / "predict" / "labels.csv"), ref.predict(new))
    grid.swap = True
    with pytest.raises(Exception):  # noqa: B017 - the ServerApp fails the run; its status names why
        run({**predict, "out-dir": str(tmp_path / "predict2")})
    status = json.loads((tmp_path / "predict2" / "status.json").read_text())
    assert status["status"] == "failed" and "not signed by client 2's pinned signing key" in status["error"]
