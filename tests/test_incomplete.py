"""Incomplete views (docs/algorithm.md §15.1): masks, per-column aggregation and correction."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsonmf._validation import check_views
from fedsonmf.core.masks import held_columns
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.datasets import make_synthetic
from fedsonmf.exceptions import InputError
from fedsonmf.federation.inprocess import InProcessTransport, run_inprocess
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import History

R, N, M = 3, 40, 3
CFG = FedConfig(n_components=R, tau=3, mu=1.0)


@pytest.fixture(scope="module")
def views():
    d = make_synthetic(n_clients=M, n_samples=N, n_features=10, rank=R, heterogeneity=0.5, random_state=3)
    return check_views(d.views, R)


def random_masks(seed, frac=0.35):
    rng = np.random.default_rng(seed)
    mk = rng.random((M, N)) >= frac
    orphan = ~mk.any(axis=0)
    mk[rng.integers(0, M, orphan.sum()), np.flatnonzero(orphan)] = True
    return mk


def strip(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**16), init_v=st.sampled_from(["projection", "random"]))
def test_all_true_masks_are_bit_identical_to_no_masks(views, seed, init_v):
    cfg = CFG.replace(init_v=init_v)
    a = run_inprocess(views, cfg, max_rounds=3, seed=seed)
    b = run_inprocess(views, cfg, max_rounds=3, seed=seed, masks=[np.ones(N, bool)] * M)
    c = run_inprocess(views, cfg, max_rounds=3, seed=seed, masks=[np.arange(N)] * M)
    assert np.array_equal(a.V, b.V) and np.array_equal(a.V, c.V)
    assert strip(a.history.rows) == strip(b.history.rows)


def test_sample_ids_equal_boolean_masks_and_missing_columns_are_never_read(views):
    mk = random_masks(1)
    a = run_inprocess(views, CFG, max_rounds=3, seed=2, masks=list(mk))
    b = run_inprocess(views, CFG, max_rounds=3, seed=2, masks=[np.flatnonzero(x) for x in mk])
    garbage = [X.copy() for X in views]
    for X, x in zip(garbage, mk):
        X[:, ~x] = 7.0  # content of the samples a client does not hold
    c = run_inprocess(garbage, CFG, max_rounds=3, seed=2, masks=list(mk))
    assert np.array_equal(a.V, b.V) and np.array_equal(a.V, c.V)


def test_uploads_only_the_held_columns(views):
    mk = random_masks(2)
    res = run_inprocess(views, CFG, max_rounds=2, seed=0, masks=list(mk))
    for row in res.history.rows:
        assert row["bytes_up"] == 8 * R * int(mk.sum())
    full = run_inprocess(views, CFG, max_rounds=2, seed=0)
    assert full.history.rows[0]["bytes_up"] == 8 * R * N * M


def test_a_sample_no_client_holds_is_an_error_naming_it(views):
    mk = random_masks(3)
    mk[:, [5, 17]] = False
    with pytest.raises(InputError, match=r"sample index 5, 17"):
        run_inprocess(views, CFG, max_rounds=1, seed=0, masks=list(mk))
    with pytest.raises(InputError, match="length"):
        held_columns(np.ones(N + 1, bool), N)


def _rounds(views, cfg, masks, n_rounds, seed=4):
    clients = [ClientRuntime(X, "fedsonmf", cfg, mask=mk) for X, mk in zip(views, masks)]
    res = run_federation(InProcessTransport(clients), "fedsonmf", cfg, max_rounds=n_rounds, seed=seed)
    return clients, res.server_state


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**16), tau=st.integers(1, 4))
def test_correction_sums_to_zero_per_column_and_server_step_is_prox_gradient(views, seed, tau):
    """Invariant 4 of §6, column-wise: sum_{p holds j} C_{p,j} = 0, and
    Vbar^{s+1}_j = V^s_j - eta~ (1/c_j) sum_{p holds j} G_{p,j} (a prox-gradient step on the weighted objective)."""
    cfg = CFG.replace(tau=tau)
    mk = random_masks(seed)
    counts = mk.sum(axis=0)
    clients, state = _rounds(views, cfg, list(mk), 3, seed=seed)
    Vbar, V = state.arrays["Vbar"], state.arrays["V"]  # round 4's broadcast, and V^4
    eta = cfg.eta_tilde
    S = np.zeros((R, N))
    Gsum = np.zeros((R, N))
    for c, x in zip(clients, mk):
        cols = np.flatnonzero(x)
        Cp = (c.state.arrays["V_prev"] - Vbar[:, cols]) / eta - c.state.arrays["G_prev"]
        S[:, cols] += Cp
        Gsum[:, cols] += c.state.arrays["G_prev"]
    scale = np.abs(Gsum).max()
    assert np.abs(S).max() <= 1e-9 * max(scale, 1.0)
    V3 = clients[0].state.arrays["V_prev"]  # V^3 on the columns of client 0
    cols0 = np.flatnonzero(mk[0])
    np.testing.assert_allclose(Vbar[:, cols0], (V3 - eta * Gsum[:, cols0] / counts[cols0]), atol=1e-9 * max(scale, 1))
    np.testing.assert_array_equal(V, prox_l21_nonneg(Vbar, eta * cfg.mu))


def test_tau_one_equivalence_column_wise(views):
    """Invariant 5 of §6 per column: at tau = 1 the correction is irrelevant and the server does
    V^{s+1} = P(V^s - eta_g alpha mean_{p holds j} grad_{p,j}) with grad = 2 (V^s - U^{s+1 T} X)."""
    cfg = CFG.replace(tau=1)
    mk = random_masks(7)
    a = run_inprocess(views, cfg, max_rounds=4, seed=1, masks=list(mk))
    b = run_inprocess(views, cfg.replace(correction=False), max_rounds=4, seed=1, masks=list(mk))
    np.testing.assert_allclose(a.V, b.V, atol=1e-10)
    clients, state = _rounds(views, cfg, list(mk), 2, seed=1)
    V2 = state.arrays["V"]
    clients3 = clients
    # one more round by hand: V^3 = P(V^2 - eta_g alpha mean grad)
    res3 = run_federation(InProcessTransport(clients3), "fedsonmf", cfg, max_rounds=3, seed=1,
                          resume=(state, History()))
    g = np.zeros((R, N))
    for c, x in zip(clients3, mk):
        cols = np.flatnonzero(x)
        g[:, cols] += 2.0 * (V2[:, cols] - c.state.arrays["UtX"])
    g /= mk.sum(axis=0)
    step = cfg.eta_g * cfg.alpha
    np.testing.assert_allclose(res3.V, prox_l21_nonneg(V2 - step * g, step * cfg.mu), atol=1e-10)


def test_masks_are_refused_by_algorithms_without_support(views):
    from fedsonmf.exceptions import ParameterError

    with pytest.raises(ParameterError, match="incomplete views"):
        run_inprocess(views, CFG, "fedmavg", max_rounds=1, seed=0, masks=list(random_masks(0)))


def test_federated_sonmf_takes_masks(views):
    from fedsonmf.estimators.sonmf import federated_sonmf

    Xs = [X.T for X in views]
    mk = random_masks(4)
    a = federated_sonmf(Xs, R, tau=3, mu=CFG.mu, max_rounds=2, tol=0, random_state=0, masks=list(mk))
    b = run_inprocess(views, CFG, max_rounds=2, seed=0, masks=list(mk))
    assert np.array_equal(a.V, b.V)
