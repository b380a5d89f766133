"""Baselines and ablation variants (docs/algorithm.md §9): interface, invariants, behaviour."""

import numpy as np
import pytest

from fedsonmf import FedConfig, federated_sonmf
from fedsonmf._validation import check_views
from fedsonmf.algorithms import (
    ABLATIONS,
    ALGORITHMS,
    BASELINES,
    FedMAvg,
    FedMGS,
    FedVRA,
    LocalCopy,
    get_algorithm,
)
from fedsonmf.algorithms._local import resolve_step
from fedsonmf.core.ustep import stiefel_residual
from fedsonmf.datasets import make_synthetic
from fedsonmf.federation.inprocess import InProcessTransport
from fedsonmf.federation.loop import ClientRuntime, run_federation

OTHERS = sorted(set(ALGORITHMS) - {"fedsonmf"})


def _medium(h, seed):
    """5 clients, n = 60, d = 20, r = 6: big enough for the paper's trends, ~1 s per run."""
    return make_synthetic(n_clients=5, n_samples=60, n_features=20, rank=6, heterogeneity=h, random_state=seed)


def _run(data, algorithm, rounds, **kw):
    kw = {"tau": 10, "random_state": 0, **kw}
    return federated_sonmf(data.views, 6, max_rounds=rounds, tol=0, algorithm=algorithm, **kw)


def test_registry_names_round_trip():
    """Every entry builds an instance whose .name is its key (a remote driver rebuilds it from the name)."""
    for name in ALGORITHMS:
        alg = get_algorithm(name)
        assert alg.name == name
        assert alg.uplink_keys and alg.downlink_keys
    assert set(BASELINES) | set(ABLATIONS) <= set(ALGORITHMS)
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        get_algorithm("nope")


def test_bad_constructor_arguments_raise():
    with pytest.raises(ValueError, match="schedule"):
        FedMAvg("sometimes")
    with pytest.raises(ValueError, match="gradient"):
        FedMGS("first")
    with pytest.raises(ValueError, match="dual_step"):
        FedVRA(dual_step=0.0)
    with pytest.raises(ValueError, match="local_steps"):
        LocalCopy(0)
    with pytest.raises(ValueError, match="unknown step"):
        resolve_step("eta", FedConfig(n_components=2))


def test_decreasing_schedule():
    alg = FedMAvg("decreasing")
    assert [alg.local_steps(10, s) for s in (1, 2, 4, 25, 100, 400)] == [10, 8, 5, 2, 1, 1]
    assert FedMAvg().local_steps(10, 50) == 10


@pytest.mark.parametrize("name", OTHERS)
def test_every_iterate_feasible_and_messages_declared(small_problem, name):
    """U_p >= 0, U_p^T U_p = I after every round, V >= 0, and each message holds exactly the declared keys."""
    cfg = FedConfig(n_components=4, tau=3, alpha=0.02, mu=0.5)
    clients = [ClientRuntime(X, name, cfg) for X in check_views(small_problem.views, 4)]
    transport = InProcessTransport(clients)
    transport.log = []
    alg = get_algorithm(name)
    seen = []

    def on_round_end(state, history):
        for c in clients:
            U = c.state.arrays["U"]
            assert U.min() >= 0 and stiefel_residual(U) < 1e-10
        assert alg.current_v(state).min() >= 0
        seen.append(state.round)

    res = run_federation(transport, name, cfg, max_rounds=4, seed=0, on_round_end=on_round_end)
    assert seen == [2, 3, 4, 5]
    assert np.isfinite(res.history.column("R")).all() and res.V.min() >= 0
    for direction, _, msg in transport.log:
        if msg.kind == "round":
            keys = alg.downlink_keys if direction == "down" else alg.uplink_keys
            assert tuple(msg.arrays) == keys
            assert all(a.shape == (4, 40) for a in msg.arrays.values())
            if direction == "up":  # the same diagnostics as the proposed method
                assert set(msg.diagnostics) == {"f0", "grad0", "rU0", "rU"}


@pytest.mark.parametrize("name", BASELINES + ("server_update",))
def test_baselines_selectable_from_estimator_and_deterministic(small_problem, name):
    a = federated_sonmf(small_problem.views, 4, tau=3, max_rounds=3, tol=0, algorithm=name, random_state=2)
    b = federated_sonmf(small_problem.views, 4, tau=3, max_rounds=3, tol=0, algorithm=name, random_state=2)
    assert a.config["algorithm"] == name
    np.testing.assert_array_equal(a.V, b.V)


def test_tau_one_variants_coincide(small_problem):
    """§6 test 5: with tau = 1 (and server step a_S = eta_g alpha) the proposed method,
    the uncorrected one, the local-copy tau = 1 one and the server update of V coincide."""
    kw = dict(tau=1, alpha=0.05, mu=0.3, max_rounds=8, tol=0, random_state=1)
    runs = {n: federated_sonmf(small_problem.views, 4, algorithm=n, **kw)
            for n in ("fedsonmf", "no_correction", "local_tau1", "server_update_etag")}
    ref = runs["fedsonmf"]
    for name, res in runs.items():
        np.testing.assert_allclose(res.V, ref.V, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(res.history.column("R"), ref.history.column("R"), rtol=1e-8, err_msg=name)
    # the §9.4 default a_S = alpha is a different (smaller) step
    other = federated_sonmf(small_problem.views, 4, algorithm="server_update", **kw)
    assert np.abs(other.V - ref.V).max() > 1e-6


def test_fedmgs_average_gradient_equals_plain_loop(small_problem):
    """The early exit of the fixed-V U-steps does not change the result."""
    from fedsonmf.algorithms._local import alternating_steps

    cfg = FedConfig(n_components=4, tau=6)
    X = check_views(small_problem.views, 4)[0]
    rng = np.random.default_rng(0)
    V = rng.uniform(size=(4, 40))
    U0 = np.eye(12)[:, :4]
    fast = alternating_steps(X, U0, V, 6, cfg)
    slow = alternating_steps(X, U0, V, 6, cfg, v_update=lambda k, U, UtX, Vl: Vl)
    np.testing.assert_array_equal(fast.U, slow.U)
    assert fast.steps <= slow.steps == 6


def test_correction_makes_no_difference_at_h0():
    """h = 0: corrected and uncorrected tau = 10 runs reach R/R1 <= 1e-2 within two rounds of each other."""
    data = _medium(0.0, 1)
    a, b = _run(data, "fedsonmf", 20), _run(data, "no_correction", 20)
    ra, rb = a.history.rounds_to(1e-2), b.history.rounds_to(1e-2)
    assert ra is not None and rb is not None and abs(ra - rb) <= 2


def test_uncorrected_and_fedmavg_stall_at_high_h():
    """h = 0.9: the uncorrected variant and adapted FedMAvg plateau far above the proposed method."""
    data = _medium(0.9, 0)
    R = {n: _run(data, n, 20).history.column("R") for n in ("fedsonmf", "no_correction", "fedmavg")}
    assert R["fedsonmf"][-1] < 1e-2 * R["fedsonmf"][0]
    for name in ("no_correction", "fedmavg"):
        assert R[name][-1] > 100 * R["fedsonmf"][-1], name
        # a plateau: the last five rounds gain less than a factor 2
        assert R[name][-5] < 2 * R[name][-1], name
