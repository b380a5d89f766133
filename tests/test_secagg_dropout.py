"""Dropout-tolerant secure aggregation: threshold recovery with Shamir shares.

* Shamir sharing over GF(2^256 + 297) (federation/shamir.py): any t shares give the secret,
  fewer are refused, and t - 1 shares are consistent with every secret (and uniform);
* in process, 5 masked clients, threshold 4 (the default ceil(2 * 5 / 3)): a client that
  uploads and then drops before the unmask step lets the round complete, with V bit for bit
  the V of the run in which it did not drop (the decoded sums are exact ring sums); a client
  that drops before uploading gives the V of the plain run whose round had only the 4
  survivors (to the fixed point's exactness, <= 1e-9); two of five lost with threshold 4 fail
  the round, naming the threshold, before any sum is decoded;
* a holder refuses an unmask request below the threshold and shares that do not authenticate;
* the Flower apps (fake grid): a node lost at the unmask step, V bit for bit the in-process run.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedsonmf._validation import check_views
from fedsonmf.datasets import make_synthetic
from fedsonmf.exceptions import FederationError, ParameterError, ProtocolError
from fedsonmf.federation import secagg, shamir
from fedsonmf.federation.inprocess import InProcessTransport
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import Message
from fedsonmf.protocol.participation import Participation

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

R = 4
CFG = FedConfig(n_components=R, tau=3)
SECURE = CFG.replace(secure_aggregation=True)


# ----------------------------------------------------------------------------- Shamir


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), data=st.data(), secret=st.binary(min_size=32, max_size=32))
def test_any_t_shares_reconstruct_the_secret(n, data, secret):
    t = data.draw(st.integers(1, n))
    xs = data.draw(st.lists(st.integers(1, 10 ** 6), min_size=n, max_size=n, unique=True))
    ys = shamir.split(secret, t, xs)
    pick = data.draw(st.lists(st.sampled_from(range(n)), min_size=t, max_size=n, unique=True))
    assert shamir.reconstruct({xs[i]: ys[i] for i in pick}, t) == secret
    # the shares travel as 33 bytes each
    assert all(shamir.from_bytes(shamir.to_bytes(y)) == y for y in ys)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 10), data=st.data(), secret=st.binary(min_size=32, max_size=32),
       other=st.binary(min_size=32, max_size=32))
def test_fewer_than_t_shares_are_consistent_with_every_secret(n, data, secret, other):
    """t - 1 shares say nothing: for any other secret there is exactly one polynomial of degree
    t - 1 through them with that constant term, so every secret is equally likely given them
    (the random coefficients are uniform); and the reconstruction refuses them."""
    t = data.draw(st.integers(2, n))
    xs = list(range(1, n + 1))
    ys = shamir.split(secret, t, xs)
    seen = {xs[i]: ys[i] for i in range(t - 1)}
    with pytest.raises(ProtocolError, match="threshold"):
        shamir.reconstruct(seen, t)
    # interpolate through (0, other) and the t - 1 seen shares: a polynomial of degree <= t - 1 ...
    pts = [(0, int.from_bytes(other, "big"))] + sorted(seen.items())
    P = shamir.PRIME

    def at(x):
        acc = 0
        for i, (xi, yi) in enumerate(pts):
            num = den = 1
            for j, (xj, _) in enumerate(pts):
                if j != i:
                    num, den = num * (x - xj) % P, den * (xi - xj) % P
            acc = (acc + yi * num * pow(den, -1, P)) % P
        return acc

    # ... that gives the same seen shares and the other secret: the seen shares fit both secrets
    assert all(at(x) == y for x, y in seen.items()) and at(0) == int.from_bytes(other, "big")


def test_a_single_share_is_uniform_whatever_the_secret():
    """t = 2: one share of a fixed secret, over many splits, is uniform on the field (chi-square
    on its low 6 bits, for the all-zero and the all-one secret)."""
    from scipy import stats

    for secret in (bytes(32), b"\xff" * 32):
        low = np.array([shamir.split(secret, 2, [1, 2, 3])[0] % 64 for _ in range(3000)])
        counts = np.bincount(low, minlength=64)
        assert stats.chisquare(counts).pvalue > 1e-4


def test_bad_sharing_parameters_are_refused():
    with pytest.raises(ValueError, match="distinct nonzero"):
        shamir.split(bytes(32), 2, [0, 1, 2])
    with pytest.raises(ValueError, match="threshold"):
        shamir.split(bytes(32), 4, [1, 2, 3])
    with pytest.raises(ProtocolError, match="33 bytes"):
        shamir.from_bytes(b"\0" * 32)


def test_the_default_threshold_and_its_bounds():
    assert [secagg.threshold(None, c) for c in (2, 3, 4, 5, 6, 9, 10)] == [2, 2, 3, 4, 4, 6, 7]
    assert all(2 * secagg.threshold(None, c) > c for c in range(1, 50))
    for bad in (2, 6):  # 2 * 2 <= 5: two disjoint groups of 2 exist; 6 > 5
        with pytest.raises(ParameterError, match="secagg_threshold"):
            secagg.threshold(bad, 5)


# ----------------------------------------------------------------------------- in process, 5 clients


@pytest.fixture(scope="module")
def views5():
    prob = make_synthetic(n_clients=5, n_samples=40, n_features=12, rank=R, n_zero_rows=1, heterogeneity=0.6,
                          random_state=3)
    return check_views(prob.views, R)


class LosingTransport(InProcessTransport):
    """The in-process transport with clients lost at the unmask step: ``lost_at_unmask[s]`` are
    the clients that uploaded their masked reply of round s and are gone before its unmask
    request (a crash between the two); ``available`` (the base class) loses clients before
    they upload."""

    def __init__(self, clients, lost_at_unmask=None, **kw):
        super().__init__(clients, **kw)
        self.lost_at_unmask = lost_at_unmask or {}

    def exchange_some(self, messages):
        first = next(iter(messages.values()), None)
        if first is not None and first.kind == "unmask":
            gone = set(self.lost_at_unmask.get(first.round, ()))
            messages = {p: msg for p, msg in messages.items() if p not in gone}
        return super().exchange_some(messages)


def _run(views, cfg, part, rounds=4, available=None, lost_at_unmask=None):
    clients = [ClientRuntime(X, "fedsonmf", cfg) for X in views]
    transport = LosingTransport(clients, lost_at_unmask=lost_at_unmask, available=available)
    transport.log = []
    res = run_federation(transport, "fedsonmf", cfg, max_rounds=rounds, seed=11, participation=part)
    return res, transport.log


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("rule", ["refresh", "server"])
def test_a_client_lost_after_uploading_its_masked_reply_does_not_fail_the_round(views5, rule):
    """Client 3 uploads in round 2 and is gone before the unmask step: 4 of 5 holders (the
    threshold) rebuild every mask key, the round completes with all five uploads, and V is bit
    for bit the V of the run in which nobody dropped (rule "server": the lost client commits
    its counted correction at its next round, told by the server's "counted")."""
    part = Participation(min_clients=4, rejoin=rule)
    # client 0 misses round 3 and rejoins in round 4 from the kept corrections (rule "server": their
    # sum, which holds client 3's correction counted in round 2)
    down = lambda s: [p for p in range(5) if not (s == 3 and p == 0)]  # noqa: E731
    honest, _ = _run(views5, SECURE, part, rounds=5, available=down)
    lost, log = _run(views5, SECURE, part, rounds=5, available=down, lost_at_unmask={2: {3}})
    assert [r["n_participants"] for r in lost.history.rows] == [5, 5, 4, 5, 5]
    assert np.array_equal(lost.V, honest.V)
    plain, _ = _run(views5, CFG, part, rounds=5, available=down)
    assert _rel(honest.V, plain.V) < 1e-9
    asked = sorted(p for d, p, msg in log if d == "down" and msg.kind == "unmask" and msg.round == 2)
    answered = sorted(p for d, p, msg in log if d == "up" and msg.kind == "unmask" and msg.round == 2)
    assert asked == [0, 1, 2, 4] and answered == [0, 1, 2, 4]  # client 3 was lost before its request
    params = json.loads(next(msg for d, p, msg in log if d == "down" and msg.kind == "round").scalars[
        secagg.SECAGG_KEY])
    assert params["threshold"] == 4 == math.ceil(2 * 5 / 3)


def test_a_client_lost_before_uploading_gives_the_survivors_v(views5):
    """Client 1 is down in round 3: the round completes with the 4 survivors, and V equals the
    plain run whose round 3 had only those 4 (to the fixed point: <= 1e-9)."""
    part = Participation(min_clients=4, rejoin="refresh")
    down = lambda s: [p for p in range(5) if not (s == 3 and p == 1)]  # noqa: E731
    secure, log = _run(views5, SECURE, part, available=down)
    plain, _ = _run(views5, CFG, part, available=down)
    assert [r["participants"] for r in secure.history.rows][2] == [0, 2, 3, 4]
    assert [r["participants"] for r in secure.history.rows] == [r["participants"] for r in plain.history.rows]
    assert _rel(secure.V, plain.V) < 1e-9
    # each holder revealed, per survivor, a share of its self key and of its pair key with client 1 only
    revealed = [msg.arrays[secagg.REVEALED_KEY] for d, p, msg in log
                if d == "up" and msg.kind == "unmask" and msg.round == 3]
    assert len(revealed) == 4 and all(a.shape == (4, 2, shamir.SHARE_BYTES) for a in revealed)


def test_one_lost_before_and_one_after_uploading_with_threshold_3(views5):
    part = Participation(min_clients=3, rejoin="refresh")
    cfg = SECURE.replace(secagg_threshold=3)
    down = lambda s: [p for p in range(5) if not (s == 2 and p == 0)]  # noqa: E731
    res, _ = _run(views5, cfg, part, available=down, lost_at_unmask={2: {4}})
    plain, _ = _run(views5, CFG, part, available=down)
    assert res.history.rows[1]["participants"] == [1, 2, 3, 4]  # client 4's upload was counted
    assert _rel(res.V, plain.V) < 1e-9


@pytest.mark.parametrize("where", ["one before, one after uploading", "both after uploading",
                                   "both before uploading"])
def test_two_of_five_lost_with_threshold_4_fail_cleanly_naming_the_threshold(views5, where):
    part = Participation(min_clients=3, rejoin="refresh")
    down = {"one before, one after uploading": {1}, "both after uploading": set(),
            "both before uploading": {1, 2}}[where]
    at_unmask = {"one before, one after uploading": {2}, "both after uploading": {1, 2},
                 "both before uploading": set()}[where]
    available = lambda s: [p for p in range(5) if not (s == 2 and p in down)]  # noqa: E731
    with pytest.raises(FederationError, match=r"round 2: .*below the secure-aggregation threshold "
                                              r"secagg_threshold = 4.*no sum is decoded and no upload revealed"):
        _run(views5, SECURE, part, available=available, lost_at_unmask={2: at_unmask})


def test_a_threshold_the_cohort_cannot_use_is_refused_before_any_message(views5):
    part = Participation(min_clients=3)
    with pytest.raises(ParameterError, match="secagg_threshold = 2 does not fit a cohort of 5"):
        _run(views5, SECURE.replace(secagg_threshold=2), part)
    with pytest.raises(ParameterError, match="secagg_threshold"):
        FedConfig(secagg_threshold=0)


def _one_round(views5, lost_at_unmask=None):
    part = Participation(min_clients=4, rejoin="refresh")
    clients = [ClientRuntime(X, "fedsonmf", SECURE) for X in views5]
    transport = LosingTransport(clients, lost_at_unmask=lost_at_unmask)
    transport.log = []
    run_federation(transport, "fedsonmf", SECURE, max_rounds=1, seed=7, participation=part)
    req = {p: msg for d, p, msg in transport.log if d == "down" and msg.kind == "unmask"}
    return clients, req


def test_a_holder_refuses_a_survivor_list_below_the_threshold(views5):
    clients, req = _one_round(views5, lost_at_unmask={1: {0}})  # client 0 has answered no unmask request
    params = json.loads(req[1].scalars[secagg.SECAGG_KEY])
    few = Message("unmask", req[1].round, {secagg.SHARES_IN_KEY: req[1].arrays[secagg.SHARES_IN_KEY][:3]},
                  {secagg.SECAGG_KEY: json.dumps({**params, "survivors": [0, 1, 2]})})
    with pytest.raises(ProtocolError, match="3 survivors, below the threshold 4: refused, nothing revealed"):
        clients[0].handle(few)
    lowered = Message("unmask", req[1].round, few.arrays,
                      {secagg.SECAGG_KEY: json.dumps({**params, "survivors": [0, 1, 2], "threshold": 3})})
    with pytest.raises(ProtocolError, match="threshold 3, the exchange was masked with 4"):
        clients[0].handle(lowered)


def test_a_holder_refuses_shares_that_do_not_authenticate(views5):
    clients, req = _one_round(views5)
    msg = req[2]
    box = np.array(msg.arrays[secagg.SHARES_IN_KEY], copy=True)
    box[1, 5] ^= 1  # one bit of the shares dealt by client 1
    bad = Message("unmask", msg.round, {secagg.SHARES_IN_KEY: box}, msg.scalars)
    with pytest.raises(ProtocolError, match="shares relayed from client 1 to client 2 do not authenticate"):
        clients[2].handle(bad)
    swapped = Message("unmask", msg.round, {secagg.SHARES_IN_KEY: box[[1, 0, 2, 3, 4]]}, msg.scalars)
    with pytest.raises(ProtocolError, match="do not authenticate"):
        clients[2].handle(swapped)


def test_the_revealed_shares_rebuild_exactly_the_survivors_keys_and_nothing_of_the_dropped(views5):
    """The holders' shares of a round with client 1 dropped rebuild each survivor's self key and
    its pair key with client 1 -- the keys its masks derive from -- and hold no share of client
    1's self key (client 1 dealt nothing: its upload never arrived)."""
    part = Participation(min_clients=4, rejoin="refresh")
    clients = [ClientRuntime(X, "fedsonmf", SECURE) for X in views5]
    transport = InProcessTransport(clients, available=lambda s: [0, 2, 3, 4])
    transport.log = []
    run_federation(transport, "fedsonmf", SECURE, max_rounds=1, seed=7, participation=part)
    ups = {p: msg for d, p, msg in transport.log if d == "up" and msg.kind == "unmask"}
    self_keys, pairs = secagg.reconstruct_keys(ups, [0, 2, 3, 4], range(5), 4, 1)
    down = next(msg for d, p, msg in transport.log if d == "down" and msg.kind == "round")
    params = json.loads(down.scalars[secagg.SECAGG_KEY])
    for p in (0, 2, 3, 4):
        stt = clients[p].state.arrays
        label = secagg.exchange_label(str(int(stt[secagg.STATE_SEED])), "round", 1, params["cohort"],
                                      params["nonce"])
        mine = secagg.exchange_secrets(stt[secagg.STATE_PAIRS], bytes(stt[secagg.STATE_SELF].tobytes()), p,
                                       params["cohort"], label)
        assert self_keys[p] == mine[0]
        assert pairs[(p, 1)] == mine[1 + [q for q in range(5) if q != p].index(1)]
    assert set(self_keys) == {0, 2, 3, 4} and {q for _, q in pairs} == {1}


# ----------------------------------------------------------------------------- Flower apps (fake grid)




def _kinds(flw_msg) -> set[tuple[str, int]]:
    """The (kind, round) of every fedsonmf message a Flower message carries (batched ones too)."""
    from fedsonmf.federation.flower import codec

    out = set()
    for name, rec in flw_msg.content.items():
        if name.endswith(codec.META):
            out.add((str(rec["kind"]), int(rec["round"])))
    return out


def test_flower_apps_survive_a_node_lost_at_the_unmask_step(tmp_path, small_problem, task_identity):
    """Over the Flower apps (fake grid, 3 nodes, t = 2): node 303 uploads its round-2 reply and
    never answers that round's unmask request; the round completes with all three uploads and V
    is bit for bit the in-process secure run in which nobody was lost."""
    from fedsonmf.federation.flower.audit import audit_wire
    from fedsonmf.federation.flower.client_app import make_client_app
    from fedsonmf.federation.inprocess import run_inprocess
    from test_flower_apps import FakeGrid, _nodes, _run_config, _server, _wire

    class LostAtUnmask(FakeGrid):
        def push_messages(self, messages):
            ids = []
            for msg in messages:
                lost = msg.metadata.dst_node_id == 303 and ("unmask", 2) in _kinds(msg)
                if lost:
                    self.drop.add(303)
                ids += super().push_messages([msg])
                self.drop.discard(303)
            return ids

    views = check_views(small_problem.views[:3], R)
    cfg = FedConfig(n_components=R, tau=3, mu=1.0, secure_aggregation=True)
    grid = LostAtUnmask(make_client_app(), _nodes(tmp_path, small_problem.views[:3]))
    rc = _run_config(tmp_path, **{"config-json": json.dumps(cfg.to_dict()), "secure-aggregation": True,
                                  "num-rounds": 4, "round-timeout": 0.3, "min-clients": 2.0, "rejoin": "refresh"})
    V, result = _server(grid, rc)
    assert [r["participants"] for r in result["history"]] == [[0, 1, 2]] * 4
    ref = run_inprocess(views, cfg, max_rounds=4, seed=9, participation=Participation(min_clients=2,
                                                                                       rejoin="refresh"))
    assert np.array_equal(V, ref.V)
    summary = audit_wire(_wire(rc), "fedsonmf", cfg, views[0].shape[1], partial=True)
    assert summary["up unmask"]["messages"] == 3 * 4 - 1  # node 303's round-2 answer never came
