"""Stochastic local steps (docs/algorithm.md §16): mini-batches of samples in the clients' local steps.

The batch machinery is checked against direct computation (the U-step's products, the
variable-metric prox), the full batch it must reduce to, and on whole runs: descent, no noise
floor under the l2,1 prox, planted recovery, determinism and the Flower engine.
"""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment, minimize

from conftest import planted
from fedsonmf import federated_sonmf
from fedsonmf.core import vstep
from fedsonmf.core.init import batch_rng, random_basis
from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.core.vstep import AUTO_BATCH_MIN_SAMPLES, draw_batches, local_round, resolve_batch
from fedsonmf.datasets.synthetic import make_synthetic
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import MethodOptions
from fedsonmf.exceptions import ParameterError
from fedsonmf.metrics import clustering_accuracy
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.params import SYNTHETIC_STUDY

# ----------------------------------------------------------------------------- the batch rule


def test_auto_is_the_full_batch_below_the_threshold_and_one_sweep_above():
    assert resolve_batch("auto", AUTO_BATCH_MIN_SAMPLES - 1, 10) is None
    assert resolve_batch("auto", 100_003, 10) == 10_001
    assert resolve_batch("auto", 100_000, 1) is None  # tau = 1: one step sees every sample
    assert resolve_batch(500, 500, 10) is None and resolve_batch(10**9, 500, 10) is None
    assert resolve_batch(70, 500, 10) == 70


def test_a_batch_that_leaves_samples_unvisited_is_refused_by_name():
    with pytest.raises(ParameterError, match=r"batch_size=49 .* at least ceil\(n / tau\) = 50"):
        resolve_batch(49, 500, 10)
    with pytest.raises(ParameterError, match="batch_size"):
        FedConfig(batch_size=0)
    with pytest.raises(ParameterError, match="batch_size"):
        FedConfig(batch_size="half")
    views, _ = planted(n_per=20)
    with pytest.raises(ParameterError, match="batch_size=3"):
        federated_sonmf(views, 3, batch_size=3, max_rounds=2)


@pytest.mark.parametrize("n, tau, b", [(100, 10, 10), (100, 10, 13), (97, 4, 50), (30, 3, 29)])
def test_blocks_visit_every_sample_and_follow_the_round_stream(n, tau, b):
    blocks, counts = draw_batches(n, tau, b, batch_rng(5, 3))
    assert len(blocks) == tau
    assert all(np.array_equal(B, np.unique(B)) and B.size <= b for B in blocks)
    assert counts.min() >= 1 and counts.sum() == sum(B.size for B in blocks)
    assert counts.max() - counts.min() <= 2  # random reshuffling: visits differ by little
    again, _ = draw_batches(n, tau, b, batch_rng(5, 3))
    other, _ = draw_batches(n, tau, b, batch_rng(5, 4))
    assert all(np.array_equal(x, y) for x, y in zip(blocks, again))
    assert not all(np.array_equal(x, y) for x, y in zip(blocks, other))


# ----------------------------------------------------------------------------- one round, exactly


def _point(n=60, d=15, r=4, seed=0, sparse=False):
    rng = np.random.default_rng(seed)
    X = rng.random((d, n)) * (rng.random((d, n)) < 0.5)
    X = sp.csc_matrix(X) if sparse else np.asfortranarray(X)
    U = random_basis(d, r, rng)
    V = np.maximum(rng.random((r, n)) - 0.2, 0.0)
    C = 0.05 * rng.standard_normal((r, n))
    return X, U, V, C


@pytest.mark.parametrize("sparse", [False, True])
def test_blocks_of_every_sample_give_the_full_batch_round(sparse):
    """b = n with every column in every block: T_j = k alpha for all j, the full batch's step."""
    X, U, V, C = _point(sparse=sparse)
    tau, n = 4, X.shape[1]
    kw = dict(alpha=0.03, mu=0.5, tau=tau, rho1=0.0, ustep=PenaltyOptions())
    full = local_round(X, U, V, C, **kw)
    mini = local_round(X, U, V, C, batches=([np.arange(n)] * tau, np.full(n, tau)), **kw)
    for name in ("U", "Vhat", "G_avg"):
        np.testing.assert_allclose(getattr(mini, name), getattr(full, name), rtol=1e-10, atol=1e-12, err_msg=name)
    assert mini.UtX is None  # never formed by the stochastic steps; the client computes it when needed


def _weighted_prox(Z, T, mu):
    """argmin_{V >= 0} mu ||V||_{2,1} + sum_j ||V_j - Z_j||^2 / (2 T_j), row by row, numerically;
    columns with T_j = 0 stay at max(Z_j, 0) (T_j = 0 pins them)."""
    out = np.maximum(Z, 0.0)
    free = T > 0
    for i in range(Z.shape[0]):
        z = np.maximum(Z[i], 0.0)

        def f(v, row=out[i], z=z):
            w = row.copy()
            w[free] = v
            return mu * np.linalg.norm(w) + np.sum((v - z[free]) ** 2 / (2 * T[free]))

        res = minimize(f, z[free] * 0.5, bounds=[(0, None)] * int(free.sum()), method="L-BFGS-B",
                       options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 5000})
        out[i, free] = res.x
    return out


def test_the_u_step_sees_the_variable_metric_prox_of_the_whole_copy(monkeypatch):
    """The statistics kept by rank-b updates equal 2 X V_k^T and 2 V_k V_k^T, with V_k the prox of h in
    the metric diag(T_k) of the columns' accumulated steps, computed here directly at every step."""
    X, U, V, C = _point(n=24, d=10, r=3, seed=2)
    n, tau, alpha, mu = X.shape[1], 4, 0.05, 0.8
    blocks, counts = draw_batches(n, tau, 9, batch_rng(1, 1))  # counts 1 or 2: several classes at once
    assert len(set(counts.tolist())) == 2
    seen = []
    real = vstep.solve_u
    monkeypatch.setattr(vstep, "solve_u",
                        lambda B, A, U0, rho1, opts: seen.append((B, A)) or real(B, A, U0, rho1, opts))
    res = local_round(X, U, V, C, alpha=alpha, mu=mu, tau=tau, rho1=0.0, ustep=PenaltyOptions(),
                      batches=(blocks, counts))
    # replay the lazy updates directly
    Vhat, visits, Uk = V.copy(), np.zeros(n), U
    for k, B in enumerate(blocks):
        T = alpha * tau * visits / counts
        Vk = _weighted_prox(Vhat, T, mu) if k else V
        np.testing.assert_allclose(seen[k][0], 2 * X @ Vk.T, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(seen[k][1], 2 * Vk @ Vk.T, rtol=1e-6, atol=1e-7)
        Uk, _ = real(2 * X @ Vk.T, 2 * Vk @ Vk.T, Uk, 0.0, PenaltyOptions())
        g = 2 * (Vk[:, B] - Uk.T @ X[:, B])
        Vhat[:, B] -= alpha * tau / counts[B] * (g + C[:, B])
        visits[B] += 1
    np.testing.assert_allclose(res.Vhat, Vhat, rtol=1e-6, atol=1e-8)
    # every column moved by alpha tau in all: the uploaded G is the mean of its visits' gradients
    np.testing.assert_allclose(res.G_avg, (V - res.Vhat) / (alpha * tau) - C, atol=1e-12)


def test_the_radius_solves_the_weighted_prox():
    rng = np.random.default_rng(4)
    S = rng.random((3, 5)) * np.array([[1], [0.5], [0.0]])  # a class with no mass
    t = np.array([0.0, 0.3, 0.7])
    nu = vstep._row_radius(S, t)
    with np.errstate(divide="ignore", invalid="ignore"):
        lhs = np.where(S > 0, S / (nu + t[:, None]) ** 2, 0.0).sum(axis=0)
    np.testing.assert_allclose(lhs, 1.0, rtol=1e-12)
    zero = vstep._row_radius(np.array([[0.0], [0.01]]), np.array([0.0, 0.5]))
    assert zero[0] < 1e-12  # 0.01 / 0.25 < 1: the row vanishes


# ----------------------------------------------------------------------------- whole runs


def test_minibatch_runs_converge_without_a_noise_floor():
    """The paper's synthetic setting (mu = 1: the l2,1 prox is active) with one sweep per round reaches
    the full batch's residuals; a prox with one threshold for columns at different steps stalls at R ~ 5e-2."""
    data = make_synthetic(n_clients=10, heterogeneity=0.9, random_state=0)
    n = data.views[0].shape[0]
    kw = dict(max_rounds=30, tol=0, random_state=0, **SYNTHETIC_STUDY)
    full = federated_sonmf(data.views, 6, **kw)
    mini = federated_sonmf(data.views, 6, batch_size=math.ceil(n / 10), **kw)
    assert mini.history.column("R")[-1] < 1e-6
    assert mini.history.rounds_to(1e-2) <= full.history.rounds_to(1e-2) + 1
    F = np.asarray(mini.history.column("objective"))
    assert np.all(np.diff(F) <= 1e-9 * F[0])  # the objective descends every round


def test_planted_factorization_recovered_with_minibatches():
    data = make_synthetic(n_clients=4, n_samples=80, n_features=16, rank=4, n_zero_rows=0, noise=1e-4,
                          heterogeneity=0.0, random_state=5)
    res = federated_sonmf(data.views, 4, mu=0.0, rho1=0.0, max_rounds=60, tol=0, random_state=2, init_u="svd",
                          batch_size=8)
    V, Vs = res.V, data.V
    rows, cols = linear_sum_assignment(-np.abs(np.corrcoef(V, Vs)[:4, 4:]))
    perm = cols[np.argsort(rows)]
    assert np.linalg.norm(V - Vs[perm]) / np.linalg.norm(Vs) < 1e-2
    for U, Ustar in zip(res.bases, data.bases):
        assert np.linalg.norm(U - Ustar[:, perm]) < 1e-2


def test_planted_clusters_recovered_with_minibatches():
    views, y = planted(n_per=20)
    est = FedMultiViewClustering(3, random_state=0, method=MethodOptions(batch_size=6)).fit(views)
    assert clustering_accuracy(y, est.labels_) == 1.0


def test_random_state_threads_through_the_batch_draws():
    data = make_synthetic(n_clients=3, n_samples=50, n_features=12, rank=4, random_state=1)
    kw = dict(max_rounds=5, tol=0, mu=0.5, batch_size=7)
    a = federated_sonmf(data.views, 4, random_state=3, **kw)
    b = federated_sonmf(data.views, 4, random_state=3, n_jobs=2, **kw)
    assert np.array_equal(a.V, b.V)
    full = federated_sonmf(data.views, 4, random_state=3, **{**kw, "batch_size": "auto"})
    assert not np.allclose(a.V, full.V)


def test_flower_apps_give_the_inprocess_result_with_minibatches(tmp_path, small_problem):
    pytest.importorskip("flwr")
    import json

    from flwr.supercore.task_identity import TaskIdentity

    from fedsonmf._validation import check_views
    from fedsonmf.federation.flower.client_app import make_client_app
    from fedsonmf.federation.inprocess import run_inprocess
    from test_flower_apps import FakeGrid, R, _nodes, _run_config, _server, _strip

    views = small_problem.views[:3]
    cfg = FedConfig(n_components=R, tau=3, mu=1.0, batch_size=15)
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, views))
    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1  # outside a Flower runtime
    try:
        V, result = _server(grid, _run_config(tmp_path, **{"config-json": json.dumps(cfg.to_dict())}))
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old
    ref = run_inprocess(check_views(views, R), cfg, "fedsonmf", max_rounds=3, seed=9)
    assert np.array_equal(V, ref.V)
    assert _strip(result["history"]) == _strip(ref.history.to_records())


def test_a_checkpointed_minibatch_run_resumes_bit_identically(tmp_path):
    from fedsonmf._validation import check_views
    from fedsonmf.federation.inprocess import run_inprocess

    data = make_synthetic(n_clients=3, n_samples=50, n_features=12, rank=4, random_state=1)
    views = check_views(data.views, 4)
    cfg = FedConfig(n_components=4, tau=3, batch_size=20)
    full = run_inprocess(views, cfg, "fedsonmf", max_rounds=4, seed=11)
    run_inprocess(views, cfg, "fedsonmf", max_rounds=2, seed=11, checkpoint_dir=tmp_path)
    res = run_inprocess(views, cfg, "fedsonmf", max_rounds=4, checkpoint_dir=tmp_path, resume=True)
    assert np.array_equal(res.V, full.V)
    assert all(np.array_equal(a, b) for a, b in zip(res.bases, full.bases))


def test_corrections_sum_to_zero_and_the_server_step_holds_with_minibatches(small_problem):
    """sum_p C_p^{s+1} = 0 and Vbar^{s+1} = V^s - eta G^s in every round (§16.5): G_p is defined by the upload."""
    from conftest import assert_correction_identity
    from fedsonmf._validation import check_views
    from fedsonmf.federation.inprocess import InProcessTransport
    from fedsonmf.federation.loop import ClientRuntime, run_federation

    cfg = FedConfig(n_components=4, tau=5, alpha=0.02, mu=0.5, batch_size=9)
    clients = [ClientRuntime(X, "fedsonmf", cfg) for X in check_views(small_problem.views, 4)]
    checked = []

    def on_round_end(state, history):
        assert_correction_identity(state.arrays["Vbar"], clients, cfg.eta_tilde)
        checked.append(state.round)

    run_federation(InProcessTransport(clients), "fedsonmf", cfg, max_rounds=6, seed=0, on_round_end=on_round_end)
    assert checked == list(range(2, 8))
    assert all("batch" in c.state.arrays for c in clients)  # the mini-batch path ran


def test_cli_takes_batch_size_and_names_its_bound(tmp_path):
    """`--batch-size` comes from the parameter table: an int reaches the method, a too small one is
    refused with the bound ceil(n / tau)."""
    from typer.testing import CliRunner

    from fedsonmf.cli.app import app

    rng = np.random.default_rng(0)
    z = np.repeat(np.arange(3), 40)
    paths = []
    for p in range(2):
        X = rng.random((120, 30)) * 0.1
        X[np.arange(120), z * 10 + p] += 1.0
        paths.append(str(tmp_path / f"v{p}.csv"))
        np.savetxt(paths[-1], X, delimiter=",")
    ok = CliRunner().invoke(app, ["cluster", *paths, "--clusters", "3", "--batch-size", "60", "--quiet"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(app, ["cluster", *paths, "--clusters", "3", "--batch-size", "5"])
    assert bad.exit_code != 0 and "ceil(n / tau) = 12" in bad.output + str(bad.exception)
