import warnings

import numpy as np
import pytest

from fedsonmf import ConvergenceWarning, FedSONMF, federated_sonmf


def test_estimator_and_function_share_one_path(small_problem):
    kw = dict(mu=0.5, tau=5, max_rounds=5, tol=0, random_state=3)
    model = FedSONMF(4, **kw)
    emb = model.fit_transform(small_problem.views)
    res = federated_sonmf(small_problem.views, 4, **kw)
    assert np.array_equal(emb, res.V.T)
    assert emb.shape == (40, 4)
    assert [C.shape for C in model.components_] == [(4, 12)] * 4
    assert model.n_rounds_ == 5 == len(model.history_)
    assert model.n_features_in_ == [12] * 4
    # scikit-learn's definition (NMF): the Frobenius norm of the residual, here of the views side by side
    assert model.reconstruction_err_ == pytest.approx(
        np.sqrt(np.sum([np.sum((v.T - C.T @ emb.T) ** 2) for v, C in zip(small_problem.views, model.components_)])))
    assert model.n_iter_ == 5 and model.n_components_ == 4


def test_history_fields(small_problem):
    res = federated_sonmf(small_problem.views, 4, max_rounds=4, tol=0, random_state=0)
    rec = res.history.to_records()
    for key in ("round", "objective", "R_V", "R_U", "R", "R_rel", "R_avg_rel", "R_rel0", "R_avg_rel0",
                "effective_rank", "bytes_up", "bytes_down", "bytes_diagnostics", "seconds"):
        assert key in rec[0]
    assert rec[0]["R_rel"] == 1.0 and [r["round"] for r in rec] == [1, 2, 3, 4]
    R = res.history.column("R")
    assert np.allclose(res.history.column("R_avg_rel"), np.cumsum(R) / np.arange(1, 5) / R[0])
    # the paper's averaged metric can never fall below 1/s (docs/algorithm.md §7.3)
    assert np.all(res.history.column("R_avg_rel") >= 1 / np.arange(1, 5) - 1e-15)
    from fedsonmf.protocol.config import auto_alpha

    assert res.config["eta_tilde"] == pytest.approx(1.5 * 10 * auto_alpha(10, 1.5))  # alpha="auto" (the default)


def test_tol_stops_early_and_warning_when_budget_runs_out(small_problem):
    res = federated_sonmf(small_problem.views, 4, max_rounds=200, tol=1e-2, random_state=0)
    assert res.converged and res.n_rounds < 200 and res.history.rows[-1]["R_rel"] <= 1e-2
    with pytest.warns(ConvergenceWarning, match="max_rounds=2"):
        federated_sonmf(small_problem.views, 4, max_rounds=2, tol=1e-8, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        federated_sonmf(small_problem.views, 4, max_rounds=2, tol=0, random_state=0)


def test_params_roundtrip():
    m = FedSONMF(5, mu=0.1)
    assert m.get_params()["mu"] == 0.1
    m.set_params(mu=0.2, tau=3)
    assert (m.mu, m.tau) == (0.2, 3)
    with pytest.raises(ValueError, match="(?i)invalid parameter"):
        m.set_params(bogus=1)


@pytest.mark.parametrize("init_u, init_v", [("svd", "projection"), ("random", "random")])
def test_other_initialisations(small_problem, init_u, init_v):
    res = federated_sonmf(small_problem.views, 4, max_rounds=6, tol=0, random_state=0, init_u=init_u, init_v=init_v)
    F = res.history.column("objective")
    assert F[-1] < F[0]


def test_parallel_clients_give_identical_result(small_problem):
    a = federated_sonmf(small_problem.views, 4, max_rounds=3, tol=0, random_state=0)
    b = federated_sonmf(small_problem.views, 4, max_rounds=3, tol=0, random_state=0, n_jobs=2)
    assert np.array_equal(a.V, b.V)


def test_without_diagnostics_no_extra_traffic(small_problem):
    res = federated_sonmf(small_problem.views, 4, max_rounds=2, tol=0, random_state=0, diagnostics=False)
    row = res.history.rows[0]
    assert row["bytes_diagnostics"] == 0 and "R" not in row
