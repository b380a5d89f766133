"""Properties of the federated method (docs/algorithm.md §6 invariants)."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment

from conftest import assert_correction_identity
from fedsonmf import FedConfig, federated_sonmf
from fedsonmf._validation import check_views
from fedsonmf.core.ustep import stiefel_residual
from fedsonmf.datasets import make_synthetic
from fedsonmf.exceptions import ProtocolError
from fedsonmf.federation.inprocess import InProcessTransport
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.messages import Message
from fedsonmf.protocol.params import SYNTHETIC_STUDY


def _run_with_clients(views, cfg, rounds, seed=0, inspect=None):
    clients = [ClientRuntime(X, "fedsonmf", cfg) for X in check_views(views, cfg.n_components)]
    transport = InProcessTransport(clients)

    def on_round_end(state, history):
        if inspect is not None:
            inspect(state, clients)

    res = run_federation(transport, "fedsonmf", cfg, max_rounds=rounds, seed=seed, on_round_end=on_round_end)
    return res, clients


@pytest.mark.parametrize("tau", [1, 5])
def test_corrections_sum_to_zero_and_server_is_prox_gradient(small_problem, tau):
    """sum_p C_p^{s+1} = 0 and Vbar^{s+1} = V^s - eta G^s in every round (§4.2, §5)."""
    cfg = FedConfig(n_components=4, tau=tau, alpha=0.02, mu=0.5)
    checked = []

    def inspect(state, clients):
        assert_correction_identity(state.arrays["Vbar"], clients, cfg.eta_tilde)
        checked.append(state.round)

    _run_with_clients(small_problem.views, cfg, 6, inspect=inspect)
    assert checked == list(range(2, 8))


def test_tau_one_correction_is_irrelevant(small_problem):
    """§6 test 5: with tau = 1 the corrected and uncorrected methods coincide."""
    kw = dict(tau=1, alpha=0.05, max_rounds=8, tol=0, random_state=1, mu=0.3)
    a = federated_sonmf(small_problem.views, 4, correction=True, **kw)
    b = federated_sonmf(small_problem.views, 4, correction=False, **kw)
    np.testing.assert_allclose(a.V, b.V, atol=1e-11)


def test_tau_one_is_centralised_prox_gradient_step(small_problem):
    """tau = 1: V^{s+1} = P_{eta_g alpha mu}(V^s - eta_g alpha mean_p grad f_p(U_p^{s+1}, V^s))."""
    cfg = FedConfig(n_components=4, tau=1, alpha=0.05, mu=0.3)
    from fedsonmf.core.prox import prox_l21_nonneg

    def inspect(state, clients):
        V_s = clients[0].state.arrays["V_prev"]
        G = np.mean([c.state.arrays["G_prev"] for c in clients], axis=0)
        step = cfg.eta_g * cfg.alpha
        np.testing.assert_allclose(state.arrays["V"], prox_l21_nonneg(V_s - step * G, step * cfg.mu), atol=1e-11)

    _run_with_clients(small_problem.views, cfg, 5, inspect=inspect)


@pytest.mark.parametrize("h", [0.0, 0.9])
def test_objective_decreases(h):
    data = make_synthetic(n_clients=5, n_samples=60, heterogeneity=h, random_state=11)
    res = federated_sonmf(data.views, 6, max_rounds=15, tol=0, random_state=0)
    F = res.history.column("objective")
    assert np.all(np.diff(F) <= 1e-9 * F[:-1])
    assert F[-1] < 0.8 * F[0]


def test_residual_falls_with_correction_and_stalls_without():
    data = make_synthetic(n_clients=10, heterogeneity=0.9, random_state=0)
    # the paper's synthetic setting (mu = rho1 = 1 at the generator's scale), as in the figures
    on = federated_sonmf(data.views, 6, max_rounds=15, tol=0, random_state=0, **SYNTHETIC_STUDY)
    off = federated_sonmf(data.views, 6, max_rounds=15, tol=0, random_state=0, correction=False, **SYNTHETIC_STUDY)
    assert on.history.rounds_to(1e-2) is not None
    assert on.history.column("R_rel")[-1] < 1e-3
    assert off.history.column("R_rel")[-1] > 1e-1


def test_planted_factorization_recovered():
    """h = 0, low noise, mu = 0: V* and every U_p* recovered up to a permutation."""
    data = make_synthetic(n_clients=4, n_samples=80, n_features=16, rank=4, n_zero_rows=0, noise=1e-4,
                          heterogeneity=0.0, random_state=5)
    res = federated_sonmf(data.views, 4, mu=0.0, rho1=0.0, max_rounds=60, tol=0, random_state=2,
                          init_u="svd")
    V, Vs = res.V, data.V
    cost = -np.abs(np.corrcoef(V, Vs)[:4, 4:])
    rows, cols = linear_sum_assignment(cost)
    perm = cols[np.argsort(rows)]
    rel = np.linalg.norm(V - Vs[perm]) / np.linalg.norm(Vs)
    assert rel < 1e-2, rel
    for U, Ustar in zip(res.bases, data.bases):
        assert np.linalg.norm(U - Ustar[:, perm]) < 1e-2


def test_dense_and_sparse_give_same_result():
    rng = np.random.default_rng(0)
    data = make_synthetic(n_clients=3, n_samples=50, n_features=15, rank=4, n_zero_rows=1, random_state=1)
    views = [np.where(rng.random(v.shape) < 0.5, v, 0.0) for v in data.views]  # genuinely sparse
    kw = dict(max_rounds=6, tol=0, random_state=4, mu=0.5)
    dense = federated_sonmf(views, 4, **kw)
    for fmt in (sp.csr_matrix, sp.csc_matrix, sp.coo_matrix):
        sparse = federated_sonmf([fmt(v) for v in views], 4, **kw)
        np.testing.assert_allclose(sparse.V, dense.V, atol=1e-10)
        np.testing.assert_allclose(sparse.history.column("R"), dense.history.column("R"), rtol=1e-8)


def test_same_seed_same_result_and_different_seed_differs(small_problem):
    kw = dict(max_rounds=4, tol=0, mu=0.5)
    a = federated_sonmf(small_problem.views, 4, random_state=7, **kw)
    b = federated_sonmf(small_problem.views, 4, random_state=7, **kw)
    c = federated_sonmf(small_problem.views, 4, random_state=8, **kw)
    assert np.array_equal(a.V, b.V)
    assert a.history.to_records()[-1]["R"] == b.history.to_records()[-1]["R"]
    assert not np.allclose(a.V, c.V)
    # no seed: one is drawn and recorded, and reusing it reproduces the run
    d = federated_sonmf(small_problem.views, 4, **kw)
    e = federated_sonmf(small_problem.views, 4, random_state=d.seed, **kw)
    assert np.array_equal(d.V, e.V)


def test_every_iterate_is_feasible(small_problem):
    cfg = FedConfig(n_components=4, tau=3, mu=2.0, alpha=0.05)

    def inspect(state, clients):
        assert np.all(state.arrays["V"] >= 0)
        for c in clients:
            U = c.state.arrays["U"]
            assert np.all(U >= 0) and stiefel_residual(U) <= 1e-10

    _run_with_clients(small_problem.views, cfg, 4, inspect=inspect)


def test_l21_weight_zeroes_rows():
    data = make_synthetic(n_clients=4, n_samples=60, rank=6, n_zero_rows=3, random_state=2)
    res = federated_sonmf(data.views, 6, mu=20.0, max_rounds=20, tol=0, random_state=0)
    assert res.history.rows[-1]["effective_rank"] < 6
    zero_rows = np.linalg.norm(res.V, axis=1) == 0
    assert zero_rows.any() and np.all(res.V[zero_rows] == 0)


def test_messages_are_exactly_the_declared_matrices(small_problem):
    """Uplink: Vhat (r x n); downlink: Vbar (r x n); diagnostics declared separately."""
    cfg = FedConfig(n_components=4, mu=1.0)
    views = check_views(small_problem.views, 4)
    clients = [ClientRuntime(X, "fedsonmf", cfg) for X in views]
    t = InProcessTransport(clients)
    t.log = []
    res = run_federation(t, "fedsonmf", cfg, max_rounds=2, seed=0)
    r, n = 4, views[0].shape[1]
    for direction, _p, msg in t.log:
        if msg.kind == "setup":
            continue
        keys = {"down": {"Vbar"}, "up": {"Vhat"}}[direction]
        assert set(msg.arrays) == keys and all(a.shape == (r, n) for a in msg.arrays.values())
        # down: the l2,1 weight in force (one scalar, 8 bytes); up: nothing but the matrix
        assert msg.scalars == ({"mu": cfg.mu_value} if direction == "down" else {})
    assert res.history.rows[0]["bytes_up"] == len(views) * r * n * 8
    assert res.history.rows[0]["bytes_down"] == len(views) * (r * n * 8 + 8)


def test_client_refuses_out_of_order_round(small_problem):
    cfg = FedConfig(n_components=4)
    X = check_views(small_problem.views, 4)[0]
    c = ClientRuntime(X, "fedsonmf", cfg)
    with pytest.raises(ProtocolError, match="before setup"):
        c.handle(Message("round", 1, {"Vbar": np.ones((4, X.shape[1]))}))
    c.handle(Message("setup", 0, {}, {"seed": 0, "client": 0}))
    with pytest.raises(ProtocolError, match="round 3"):
        c.handle(Message("round", 3, {"Vbar": np.ones((4, X.shape[1]))}))


def test_auto_mu_travels_as_one_scalar_and_is_scale_free(small_problem):
    """mu='auto': the server resolves it from Vbar^1 and each round message carries the number."""
    cfg = FedConfig(n_components=4)
    assert cfg.mu_is_auto
    runs = []
    for c in (1.0, 1e3):
        views = check_views([c * v for v in small_problem.views], 4)
        t = InProcessTransport([ClientRuntime(X, "fedsonmf", cfg) for X in views])
        t.log = []
        res = run_federation(t, "fedsonmf", cfg, max_rounds=2, seed=0)
        downs = [msg for d, _, msg in t.log if d == "down" and msg.kind == "round"]
        assert all(set(msg.scalars) == {"mu"} and msg.scalars["mu"] == res.config["mu_value"] for msg in downs)
        assert res.config["mu"] == "auto" and res.config["mu_value"] > 0
        runs.append(res)
    # the weight scales with the data, so the threshold means the same thing
    assert runs[1].config["mu_value"] == pytest.approx(1e3 * runs[0].config["mu_value"], rel=1e-9)


# ----------------------------------------------------------------------------- divergence


def _div_views():
    from fedsonmf._validation import check_views
    from fedsonmf.datasets.synthetic import make_synthetic

    data = make_synthetic(n_clients=4, n_samples=60, n_features=12, rank=4, random_state=0)
    return check_views(data.views, 4)


@pytest.mark.parametrize("algorithm, kw, names", [
    ("fedmgs", {"alpha": 0.09}, "server step"),
    ("fedmgs", {"alpha": 0.5}, "server step"),
    ("fedmgs_avg", {"alpha": 0.5}, "server step"),
    ("fedsonmf", {"alpha": 0.5, "tau": 30, "eta_g": 3.0}, "alpha=0.5, tau=30, eta_g=3"),
])
def test_growing_objective_warns_naming_the_steps(algorithm, kw, names):
    from fedsonmf.exceptions import DivergenceWarning
    from fedsonmf.federation.inprocess import run_inprocess
    from fedsonmf.protocol.config import FedConfig

    with pytest.warns(DivergenceWarning, match=rf"{algorithm}: the objective F grew to .*x its round-1 value.*{names}"):
        run_inprocess(_div_views(), FedConfig(4, **kw), algorithm, max_rounds=12, seed=0)


@pytest.mark.parametrize("alpha", [0.09, 0.2])
def test_fedmgs_growth_is_seen_without_diagnostics(alpha):
    from fedsonmf.exceptions import DivergenceWarning
    from fedsonmf.federation.inprocess import run_inprocess
    from fedsonmf.protocol.config import FedConfig

    with pytest.warns(DivergenceWarning, match=r"fedmgs: the \|\|V\|\|_F\^2 grew to .*server step"):
        run_inprocess(_div_views(), FedConfig(4, alpha=alpha, diagnostics=False), "fedmgs", max_rounds=12, seed=0)


@pytest.mark.parametrize("diagnostics", [True, False])
def test_exploding_run_stops_with_a_divergence_warning(monkeypatch, diagnostics):
    """A server whose V explodes (x100 per round, then NaN) stops the run with the last finite V."""
    from fedsonmf.algorithms import get_algorithm
    from fedsonmf.exceptions import DivergenceWarning
    from fedsonmf.federation.inprocess import run_inprocess
    from fedsonmf.protocol.config import FedConfig
    from fedsonmf.protocol.messages import ServerState

    alg = get_algorithm("fedmgs")
    original = type(alg).server_round

    def exploding(self, state, replies, cfg):
        new = original(self, state, replies, cfg)
        factor = np.nan if new.round > 6 else 100.0 ** (new.round - 1)
        return ServerState(new.round, {k: v * factor for k, v in new.arrays.items()}, new.mu)

    monkeypatch.setattr(type(alg), "server_round", exploding)
    warnings.simplefilter("always", DivergenceWarning)  # also under -W error: the soft warning comes first
    with pytest.warns(DivergenceWarning, match=r"diverged at round \d+: .*(grew to|no longer finite).*server step"):
        res = run_inprocess(_div_views(), FedConfig(4, diagnostics=diagnostics), "fedmgs", max_rounds=20, seed=0)
    assert res.extra.get("diverged") is True and "diverged" in res.stopping_reason
    assert res.n_rounds < 20 and np.all(np.isfinite(res.V))


def test_non_finite_v_stops_without_diagnostics():
    from fedsonmf.exceptions import DivergenceWarning
    from fedsonmf.federation import loop
    from fedsonmf.protocol.config import FedConfig

    monitor = loop.DivergenceMonitor(loop.get_algorithm("fedsonmf"), FedConfig(4))
    assert monitor.check(1, np.ones((2, 3)), None) is None
    with pytest.warns(DivergenceWarning, match=r"V is no longer finite"):
        assert "diverged at round 2" in monitor.check(2, np.full((2, 3), np.nan), None)
    with pytest.warns(DivergenceWarning, match=r"\|\|V\|\|_F\^2 grew to"):
        assert monitor.check(3, np.full((2, 3), 1e4), None) is not None


def test_default_runs_do_not_warn():
    import warnings as _w

    from fedsonmf.algorithms import ALGORITHMS
    from fedsonmf.exceptions import DivergenceWarning
    from fedsonmf.federation.inprocess import run_inprocess
    from fedsonmf.protocol.config import FedConfig

    views = _div_views()
    with _w.catch_warnings():
        _w.simplefilter("error", DivergenceWarning)
        for alg in sorted(ALGORITHMS):
            for diag in (True, False):
                run_inprocess(views, FedConfig(4, diagnostics=diag), alg, max_rounds=8, seed=1)
