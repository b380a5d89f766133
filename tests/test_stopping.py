"""The clustering's label-free stopping rule, the server-side stopping hook, blas_threads='auto'."""

import numpy as np
import pytest

from fedsonmf.datasets import make_synthetic
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import MethodOptions
from fedsonmf.estimators.sonmf import AUTO_BLAS_WORK, _blas_limit
from fedsonmf.exceptions import ParameterError
from fedsonmf.pipeline.stopping import LabelStability


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
