"""Bounded contributions: one dishonest organisation cannot end a run `completed` with a poisoned V.

Each attack comes from a hostile client (a :class:`ClientRuntime` that tampers with what it
sends, bypassing its own checks) among honest ones, on the in-process engine:

* secure aggregation: random masked values, masked values + 2^62, a NaN (a float where a ring
  element belongs), an upload x 1e12 masked with a wrapping encoder, the round-1 reply
  renumbered as round 3 -- the server's check of the decoded sum against what m bounded
  uploads can sum to fails the round ("an upload out of bounds in round k");
* plain: NaN, x 1e12 and + 2^62 fail the round naming the client;
* an honest client refuses to mask its own item beyond the public bound;
* honest runs keep every upload far inside the bound (the bound's headroom, measured).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest

from fedsonmf._validation import check_views
from fedsonmf.federation import secagg
from fedsonmf.federation.inprocess import InProcessTransport
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.config import FedConfig

R = 4
PLAIN = FedConfig(n_components=R, tau=3)
SECURE = PLAIN.replace(secure_aggregation=True)
ATTACK_ROUND = 2


@pytest.fixture(scope="module")
def views(small_problem):
    return check_views(small_problem.views[:3], R)


def _wrapping_encode(x, bits, m, name="item"):
    """A dishonest client's encoder: no range check, values wrapped into the ring."""
    q = np.fmod(np.rint(np.ldexp(np.asarray(x, dtype=np.float64), int(bits))), 2.0 ** 64)
    return np.mod(q, 2.0 ** 64).astype(np.uint64)


class Hostile(ClientRuntime):
    """A client that sends ``attack`` from round :data:`ATTACK_ROUND` on (the renumbering: in round 3)."""

    def __init__(self, X, cfg, attack: str):
        super().__init__(X, "fedsonmf", cfg)
        self.attack, self.kept = attack, None
        self.rng = np.random.default_rng(0)

    def _scale(self, reply, msg, runtime):
        if msg.kind == "round" and msg.round >= ATTACK_ROUND:
            return dataclasses.replace(reply, arrays={k: 1e12 * np.asarray(v) for k, v in reply.arrays.items()})
        return reply

    def handle(self, msg):
        hit = msg.kind == "round" and msg.round >= ATTACK_ROUND
        secure = self.cfg.secure_aggregation
        with contextlib.ExitStack() as stack:
            if self.attack == "x1e12":
                self.upload_hook = self._scale
                if secure:  # its own bound check and range check bypassed
                    mp = stack.enter_context(pytest.MonkeyPatch.context())
                    mp.setattr(secagg, "check_upload_bound", lambda *a, **k: None)
                    mp.setattr(secagg, "encode", _wrapping_encode)
            reply = super().handle(msg)
        if msg.kind == "round" and msg.round == 1:
            self.kept = reply
        if not hit or self.attack == "x1e12":
            return reply
        if self.attack == "renumbered":
            return dataclasses.replace(self.kept, round=msg.round) if msg.round == 3 else reply
        arrays = dict(reply.arrays)
        for k, a in arrays.items():
            if secure and not k.startswith(secagg.MASKED_PREFIX):
                continue
            if self.attack == "random":
                arrays[k] = self.rng.integers(0, 2 ** 64 - 1, size=np.shape(a), dtype=np.uint64, endpoint=True)
            elif self.attack == "plus2^62":
                arrays[k] = np.asarray(a) + (np.uint64(2 ** 62) if secure else 2.0 ** 62)
            elif self.attack == "nan":
                arrays[k] = np.full(np.shape(a), np.nan)
        return dataclasses.replace(reply, arrays=arrays)


def _run(views, cfg, attack, hostile=1, rounds=4):
    clients = [Hostile(X, cfg, attack) if p == hostile else ClientRuntime(X, "fedsonmf", cfg)
               for p, X in enumerate(views)]
    return run_federation(InProcessTransport(clients), "fedsonmf", cfg, max_rounds=rounds, seed=7)


@pytest.mark.parametrize("attack", ["random", "plus2^62", "nan", "x1e12", "renumbered"])
def test_a_hostile_masked_upload_fails_the_round_and_no_run_completes(views, attack):
    k = 3 if attack == "renumbered" else ATTACK_ROUND
    with pytest.raises(secagg.UploadBoundError, match=f"an upload out of bounds in round {k}"):
        _run(views, SECURE, attack)


@pytest.mark.parametrize("attack", ["nan", "x1e12", "plus2^62"])
def test_a_hostile_plain_upload_fails_the_round_naming_the_client(views, attack):
    with pytest.raises(secagg.UploadBoundError,
                       match=f"an upload out of bounds in round {ATTACK_ROUND}: client 1's arrays"):
        _run(views, PLAIN, attack)


def test_garbage_in_the_setup_exchange_is_refused_too(views):
    class SetupGarbage(ClientRuntime):
        def handle(self, msg):
            reply = super().handle(msg)
            if msg.kind == "init":
                reply = dataclasses.replace(reply, arrays={k: np.asarray(a) + np.uint64(2 ** 62)
                                                           for k, a in reply.arrays.items()})
            return reply

    clients = [SetupGarbage(X, "fedsonmf", SECURE) if p == 2 else ClientRuntime(X, "fedsonmf", SECURE)
               for p, X in enumerate(views)]
    with pytest.raises(secagg.UploadBoundError, match="an upload out of bounds in the setup exchange"):
        run_federation(InProcessTransport(clients), "fedsonmf", SECURE, max_rounds=2, seed=7)


def test_an_honest_client_refuses_to_mask_an_item_beyond_the_bound(views):
    def scale(reply, msg, runtime):
        if msg.kind == "round" and msg.round == ATTACK_ROUND:
            return dataclasses.replace(reply, arrays={k: 1e12 * np.asarray(v) for k, v in reply.arrays.items()})
        return reply

    clients = [ClientRuntime(X, "fedsonmf", SECURE, upload_hook=scale if p == 0 else None)
               for p, X in enumerate(views)]
    with pytest.raises(secagg.SecAggRangeError, match="beyond its public bound .* not masked, not sent"):
        run_federation(InProcessTransport(clients), "fedsonmf", SECURE, max_rounds=3, seed=7)


@pytest.mark.parametrize("cfg", [PLAIN, SECURE, PLAIN.replace(init_v="random"), SECURE.replace(diagnostics=False)])
def test_honest_uploads_stay_far_inside_the_bound(views, cfg):
    """The largest honest upload over its bound, every item and round (headroom 2^16 by design)."""
    worst = []

    def watch(reply, msg, runtime):
        if msg.kind == "round":
            V = np.asarray(msg.arrays.get("V", msg.arrays.get("Vbar")))
            for key, (field, deg) in runtime.algorithm.summed_items(cfg, "round").items():
                v = np.asarray(getattr(reply, field)[key], dtype=np.float64)
                L = 2.0 ** np.frexp(np.sqrt(max(runtime.x_sqnorm, 0.0)))[1]
                worst.append(float(np.max(np.abs(v))) / secagg.item_bound(deg, L, float(np.linalg.norm(V))))
        return reply

    clients = [ClientRuntime(X, "fedsonmf", cfg, upload_hook=watch) for X in views]
    res = run_federation(InProcessTransport(clients), "fedsonmf", cfg, max_rounds=6, seed=7)
    assert res.n_rounds == 6 and worst
    assert max(worst) < 2.0 ** -10  # measured 2^-19.9 to 2^-19.1 here: far inside


def _flower_run_with_a_hostile_node(tmp_path, small_problem, tamper) -> dict:
    """A secure fit of the Flower apps over the fake grid in which node 202 (view 1) passes each of
    its replies through ``tamper(message, meta) -> (message, meta)``; the ServerApp's status."""
    pytest.importorskip("flwr")
    import json

    from flwr.supercore.task_identity import TaskIdentity

    from fedsonmf.federation.flower import codec
    from fedsonmf.federation.flower.client_app import make_client_app
    from test_flower_apps import FakeGrid, _nodes, _run_config, _server

    class HostileNode(FakeGrid):
        def push_messages(self, messages):
            ids = super().push_messages(messages)
            for mid, msg in zip(ids, messages):
                rep = self.replies.get(mid)
                if msg.metadata.dst_node_id != 202 or rep is None or rep.has_error():
                    continue
                fed, meta = codec.decode(rep.content)
                if fed.kind != "round":  # the hello/setup replies carry more metadata: left as they are
                    continue
                fed, meta = tamper(fed, meta)
                rep.content = codec.encode(fed, client=int(meta["client"]), job_id=str(meta["job-id"]))
            return ids

    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1
    try:
        cfg = FedConfig(n_components=R, tau=3, mu=1.0, secure_aggregation=True)
        rc = _run_config(tmp_path, **{"config-json": json.dumps(cfg.to_dict()), "secure-aggregation": True})
        grid = HostileNode(make_client_app(), _nodes(tmp_path, small_problem.views[:3]))
        with pytest.raises(Exception):  # noqa: B017 - the ServerApp fails the run; its status names why
            _server(grid, rc)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old
    assert not (tmp_path / "server" / "V.npy").exists()
    return json.loads((tmp_path / "server" / "status.json").read_text())


def test_a_flower_node_that_shifts_its_masked_upload_fails_the_run(tmp_path, small_problem):
    """Node 202 adds 2^62 to its masked round-2 upload: failed, with the bound's message."""
    def shift(fed, meta):
        if fed.kind == "round" and fed.round == ATTACK_ROUND:
            fed = dataclasses.replace(fed, arrays={k: np.asarray(a) + np.uint64(2 ** 62)
                                                   if k.startswith(secagg.MASKED_PREFIX) else a
                                                   for k, a in fed.arrays.items()})
        return fed, meta

    status = _flower_run_with_a_hostile_node(tmp_path, small_problem, shift)
    assert status["status"] == "failed"
    assert f"an upload out of bounds in round {ATTACK_ROUND}" in status["error"]


def test_a_flower_reply_bound_to_another_job_is_refused(tmp_path, small_problem):
    """Node 202 labels its round-2 reply as another job's: refused, naming both jobs."""
    def relabel(fed, meta):
        if fed.kind == "round" and fed.round == ATTACK_ROUND:
            meta = {**meta, "job-id": "another-job"}
        return fed, meta

    status = _flower_run_with_a_hostile_node(tmp_path, small_problem, relabel)
    assert status["status"] == "failed"
    assert "of job 'another-job'" in status["error"] and "of job 'job-test'" in status["error"]


def test_a_fit_that_lost_a_view_for_most_rounds_says_so(views):
    """Partial participation, min_clients=2: view 2 is down in rounds 2-7 of 8.  The run completes
    (the quorum held) but its result, stopping reason and a DataWarning name the absent view; a
    view down for one round only is not reported."""
    from fedsonmf.exceptions import DataWarning
    from fedsonmf.federation.inprocess import run_inprocess
    from fedsonmf.protocol.participation import Participation

    part = Participation(min_clients=2, rejoin="refresh")
    with pytest.warns(DataWarning, match="view 2 absent from 6 of 8 rounds"):
        res = run_inprocess(views, PLAIN, max_rounds=8, tol=0.0, seed=1, participation=part,
                            available=lambda s: [0, 1] if 2 <= s <= 7 else [0, 1, 2])
    assert res.extra["absent_views"] == {"2": 6}
    assert "view 2 absent from 6 of 8 rounds" in res.stopping_reason
    once = run_inprocess(views, PLAIN, max_rounds=8, tol=0.0, seed=1, participation=part,
                         available=lambda s: [0, 1] if s == 3 else [0, 1, 2])
    assert "absent_views" not in once.extra
