"""Partial participation (docs/algorithm.md §15.2): quorum, sampling, dropouts and rejoins."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsonmf._validation import check_views
from fedsonmf.datasets import make_synthetic
from fedsonmf.exceptions import FederationError, ParameterError
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.participation import Participation

R, N, M = 3, 40, 4
CFG = FedConfig(n_components=R, tau=3, mu=1.0)
RULES = ["refresh", "server", "drop", "stale"]


@pytest.fixture(scope="module")
def views():
    d = make_synthetic(n_clients=M, n_samples=N, n_features=10, rank=R, heterogeneity=0.6, random_state=5)
    return check_views(d.views, R)


@settings(max_examples=6, deadline=None)
@given(rule=st.sampled_from(RULES), seed=st.integers(0, 2**16), masked=st.booleans())
def test_full_participation_is_bit_identical_to_todays_method(views, rule, seed, masked):
    masks = None
    if masked:
        mk = np.random.default_rng(seed).random((M, N)) > 0.3
        mk[0] |= ~mk.any(axis=0)
        masks = list(mk)
    a = run_inprocess(views, CFG, max_rounds=4, seed=seed, masks=masks)
    b = run_inprocess(views, CFG, max_rounds=4, seed=seed, masks=masks,
                      participation=Participation(min_clients=1, rejoin=rule))
    assert np.array_equal(a.V, b.V)
    assert [r["participants"] for r in b.history.rows] == [list(range(M))] * 4
    for ra, rb in zip(a.history.rows, b.history.rows):
        assert ra["R"] == rb["R"] and ra["bytes_up"] == rb["bytes_up"] and ra["bytes_down"] == rb["bytes_down"]


def down(schedule):
    """available(round) from {round: clients down}."""
    return lambda s: [p for p in range(M) if p not in schedule.get(s, ())]


@pytest.mark.parametrize("rule", RULES)
def test_dropped_client_rejoins_and_history_records_participants(views, rule):
    sched = {3: {2}, 4: {2}, 5: {2, 0}}
    res = run_inprocess(views, CFG, max_rounds=8, seed=1, available=down(sched),
                        participation=Participation(min_clients=2, rejoin=rule))
    parts = [r["participants"] for r in res.history.rows]
    assert parts[2] == [0, 1, 3] and parts[4] == [1, 3] and parts[5] == [0, 1, 2, 3]
    assert [r["n_participants"] for r in res.history.rows] == [len(p) for p in parts]
    assert res.n_rounds == 8 and np.isfinite(res.V).all()
    # uplink: one r x n block per participant
    assert all(r["bytes_up"] == 8 * R * N * len(p) for r, p in zip(res.history.rows, parts))


def test_quorum_failure_is_a_federation_error(views):
    with pytest.raises(FederationError,
                       match=r"round 3: only 2 of the 4 asked clients replied.*quorum min_clients is 3") as ei:
        run_inprocess(views, CFG, max_rounds=5, seed=1, available=down({3: {1, 2}}),
                      participation=Participation(min_clients=0.75))
    assert ei.value.round == 3
    with pytest.raises(FederationError):  # default quorum: every asked client
        run_inprocess(views, CFG, max_rounds=5, seed=1, available=down({2: {0}}), participation=Participation())
    with pytest.raises(ParameterError):
        Participation(min_clients=3, sample=2).check(M)
    with pytest.raises(ParameterError):
        Participation(rejoin="nope")


def test_sampling_is_seeded(views):
    p = Participation(sample=0.5, min_clients=2)
    a = run_inprocess(views, CFG, max_rounds=5, seed=3, participation=p)
    b = run_inprocess(views, CFG, max_rounds=5, seed=3, participation=p)
    pa = [r["participants"] for r in a.history.rows]
    assert pa == [r["participants"] for r in b.history.rows] and np.array_equal(a.V, b.V)
    assert all(len(x) == 2 for x in pa) and len({tuple(x) for x in pa}) > 1


def test_server_kept_gradients_make_the_corrections_sum_to_zero(views):
    """Rule (b): after a partial round every client's correction is mean_q G_q - G_p over the
    kept G's, so the corrections of all clients sum to zero (SCAFFOLD)."""
    from fedsonmf.federation.inprocess import InProcessTransport
    from fedsonmf.federation.loop import ClientRuntime, run_federation

    clients = [ClientRuntime(X, "fedsonmf", CFG) for X in views]
    res = run_federation(InProcessTransport(clients, available=down({2: {1}, 3: {1, 3}})), "fedsonmf", CFG,
                         max_rounds=3, seed=2, participation=Participation(min_clients=1, rejoin="server"))
    st_ = res.server_state
    Gk = st_.arrays["G_kept"]
    for p, c in enumerate(clients):  # the server's G_p is bit for bit the client's own
        assert np.array_equal(Gk[p], c.state.arrays["G_prev"])
    Gmean = res.server_state.arrays["G_kept"].mean(axis=0)
    C = [Gmean - c.state.arrays["G_prev"] for c in clients]
    assert np.abs(sum(C)).max() <= 1e-9 * np.abs(Gk).max()


def test_partial_run_resumes_from_checkpoint_to_the_same_v(views, tmp_path):
    sched = down({2: {1}, 3: {1}, 5: {3}})
    p = Participation(min_clients=2, rejoin="refresh")
    full = run_inprocess(views, CFG, max_rounds=6, seed=9, participation=p, available=sched)
    run_inprocess(views, CFG, max_rounds=3, seed=9, participation=p, available=sched, checkpoint_dir=tmp_path)
    res = run_inprocess(views, CFG, max_rounds=6, seed=9, participation=p, available=sched, checkpoint_dir=tmp_path,
                        resume=True)
    assert np.array_equal(res.V, full.V)
    assert [r["participants"] for r in res.history.rows] == [r["participants"] for r in full.history.rows]


def test_baselines_refuse_partial_participation(views):
    with pytest.raises(ParameterError, match="partial participation"):
        run_inprocess(views, CFG, "fedmavg", max_rounds=1, seed=0, participation=Participation(min_clients=1))
