"""The clustering's stopping rules (step residual, labels), the server-side stopping hook, blas_threads='auto'."""

import numpy as np
import pytest

from fedsonmf.core.residuals import step_residual
from fedsonmf.datasets import make_synthetic
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import MethodOptions
from fedsonmf.estimators.sonmf import AUTO_BLAS_WORK, _blas_limit
from fedsonmf.exceptions import ParameterError
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.pipeline.steps import stop_rule
from fedsonmf.pipeline.stopping import FirstOf, LabelStability, StepResidual
from fedsonmf.protocol.config import FedConfig


def _views():
    data = make_synthetic(n_clients=2, n_samples=80, n_features=12, rank=4, random_state=0)
    return [np.abs(X) for X in data.views]


def test_label_rule_stops_before_tol_and_is_deterministic():
    views = _views()
    # a tight tol, so that the label rule is what stops the run on this small problem
    a = FedMultiViewClustering(3, random_state=0, max_rounds=60, tol=1e-8).fit(views)
    b = FedMultiViewClustering(3, random_state=0, max_rounds=60, tol=1e-8).fit(views)
    slow = FedMultiViewClustering(3, random_state=0, max_rounds=60, tol=1e-8,
                                  method=MethodOptions(early_stop="none")).fit(views)
    assert "k-means assignments" in a.result_.stopping_reason and a.result_.converged
    assert a.n_rounds_ <= slow.n_rounds_
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.embedding_, b.embedding_)
    # the stopped run is the first rounds of the long one
    long = FedMultiViewClustering(3, random_state=0, max_rounds=a.n_rounds_, tol=0.0).fit(views)
    np.testing.assert_array_equal(a.embedding_, long.embedding_)


def test_tol_zero_runs_every_round():
    model = FedMultiViewClustering(3, random_state=0, max_rounds=7, tol=0.0).fit(_views())
    assert model.n_rounds_ == 7


def test_the_step_residual_is_the_servers_step_mapping_plus_r_u_and_needs_no_upload():
    """R_step^s = ||(V^s - V^{s+1}) / eta||^2 + R_U^s (docs/algorithm.md §7.5), from the server's own
    matrices; R_step_rel is it over round 1's."""
    data = make_synthetic(n_clients=2, n_samples=60, n_features=10, rank=3, random_state=1)
    cfg = FedConfig(n_components=3)
    res = run_inprocess(data.views, cfg, max_rounds=5, tol=0.0, seed=0)
    # V after k rounds: a shorter run is the first rounds of the longer one, bit for bit
    Vs = {k: run_inprocess(data.views, cfg, max_rounds=k, tol=0.0, seed=0).V for k in range(1, 6)}
    for s in range(1, 5):  # row s: round s + 1, from V after s rounds to V after s + 1
        row = res.history.rows[s]
        assert row["R_step"] == pytest.approx(step_residual(Vs[s], Vs[s + 1], cfg.eta_tilde) + row["R_U"], rel=1e-12)
        assert row["R_step_rel"] == pytest.approx(row["R_step"] / res.history.rows[0]["R_step"], rel=1e-12)
    assert step_residual(Vs[5], Vs[5], cfg.eta_tilde) == 0.0  # a fixed point


def test_a_clustering_fit_stops_on_the_servers_step_and_sends_no_gradient():
    views = _views()
    model = FedMultiViewClustering(3, random_state=0, max_rounds=200, tol=1e-3,
                                   method=MethodOptions(early_stop="none")).fit(views)
    rows = model.result_.history.rows
    assert "R_step/R_step1" in model.result_.stopping_reason and model.result_.converged
    assert rows[-1]["R_step_rel"] <= 1e-3 < min(r["R_step_rel"] for r in rows[:-1])
    r, n = model.embedding_.shape[1], model.embedding_.shape[0]
    # each reply's diagnostics are the three scalars, not the r x n gradient R/R1 would need
    assert all(row["bytes_diagnostics"] < r * n * 8 for row in rows) and "R_rel" not in rows[0]


def test_stop_rules_are_asked_in_order_and_tol_zero_has_none():
    assert stop_rule("labels", 3, seed=0, tol=0.0) is None
    rule = stop_rule("none", 3, seed=0, tol=1e-2)
    assert rule(4, np.ones((2, 5)), {"R_step_rel": 0.5}) is None
    assert "R_step/R_step1 = 0.005 <= tol = 0.01 at round 4" in rule(4, np.ones((2, 5)), {"R_step_rel": 0.005})
    seen = []
    both = FirstOf(StepResidual(1e-2), lambda s, V, row: seen.append(s))
    assert both(1, None, {"R_step_rel": 1.0}) is None and seen == [1]
    assert both(2, None, {"R_step_rel": 0.0}) and seen == [1]  # the first that stops ends the round's asking


def test_bad_early_stop_raises():
    with pytest.raises(ParameterError, match="early_stop"):
        FedMultiViewClustering(3, method=MethodOptions(early_stop="sometimes")).fit(_views())


def test_label_stability_counts_unchanged_rounds():
    rng = np.random.default_rng(0)
    V = np.abs(rng.standard_normal((3, 50)))
    rule = LabelStability(2, patience=2)
    assert rule(1, V) is None and rule(2, V) is None
    assert "unchanged for 2 rounds" in rule(3, V)
    assert LabelStability(2).patience == 5  # the default, chosen in docs/speed.md


def test_blas_auto():
    small = [np.ones((100, 10))]
    big = [np.ones((int(AUTO_BLAS_WORK) // 10 + 1, 1))]
    assert _blas_limit("auto", small, 10, 1) == 1
    assert _blas_limit("auto", big, 10, 1) is None
    assert _blas_limit("auto", big, 10, 2) == 1
    assert _blas_limit(None, small, 10, 1) is None and _blas_limit(3, small, 10, 1) == 3


@pytest.mark.parametrize("n", [9_999, 20_000])
def test_label_stability_allows_a_ten_thousandth_of_the_samples_to_move(n):
    """Two well-separated groups; every round one sample on the boundary changes side. Below 10 000
    samples that is a change (the rule never settles); from 10 000 on, up to n / 10 000 moving samples
    count as settled, so one boundary sample cannot hold a large fit to its round budget."""
    rng = np.random.default_rng(0)
    half = n // 2
    base = np.zeros((2, n))
    base[0, :half] = 1.0 + 0.01 * rng.random(half)
    base[1, half:] = 1.0 + 0.01 * rng.random(n - half)
    rule = LabelStability(2, patience=2)
    stopped = None
    for s in range(1, 6):
        V = base.copy()
        V[:, 0] = (1.0, 0.0) if s % 2 else (0.0, 1.0)  # sample 0 changes side every round
        stopped = stopped or rule(s, V)
    assert (stopped is not None) == (n >= 10_000)
    if stopped:
        assert "at most 2 samples" in stopped
