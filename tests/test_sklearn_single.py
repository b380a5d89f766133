"""SparseONMF (the federated core with one client) passes scikit-learn's whole check_estimator."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.utils.estimator_checks import check_estimator

from fedsonmf.estimators import SparseONMF


def test_check_estimator_passes_in_full():
    results = check_estimator(SparseONMF(), on_fail=None, on_skip=None)
    failed = {r["check_name"]: r["exception"] for r in results if r["status"] == "failed"}
    assert not failed, failed
    skipped = {r["check_name"] for r in results if r["status"] == "skipped"}
    assert skipped <= {"check_array_api_input"}, skipped  # only without SCIPY_ARRAY_API
    assert sum(r["status"] == "passed" for r in results) >= 40


def test_factors_shapes_attributes_and_dtype():
    rng = np.random.default_rng(0)
    X = rng.random((40, 9)) - 0.2  # negative entries are valid input (only the factors are constrained)
    m = SparseONMF(3, random_state=0)
    W = m.fit_transform(X)
    H = m.components_
    assert W.shape == (40, 3) and H.shape == (3, 9) and np.all(W >= 0) and np.all(H >= 0)
    np.testing.assert_allclose(H @ H.T, np.eye(3), atol=1e-10)
    assert m.n_components_ == 3 and m.n_iter_ >= 1 and m.n_features_in_ == 9
    assert m.reconstruction_err_ == pytest.approx(np.linalg.norm(X - m.embedding_ @ H), rel=1e-6)
    assert m.score(X) == pytest.approx(-np.linalg.norm(X - W @ H), rel=1e-6)
    assert m.inverse_transform(W).shape == X.shape
    W32 = SparseONMF(3, random_state=0).fit_transform(X.astype(np.float32))
    assert W32.dtype == np.float32
    assert SparseONMF().fit(X).n_components_ == 9  # None: n_features, as NMF


def test_sparse_and_dense_agree_and_sparse_is_accepted():
    rng = np.random.default_rng(1)
    X = rng.random((30, 8)) * (rng.random((30, 8)) < 0.4)
    a = SparseONMF(3, random_state=0, max_rounds=20, tol=0).fit(X)
    b = SparseONMF(3, random_state=0, max_rounds=20, tol=0).fit(sp.csr_matrix(X))
    # the sparse and dense products round differently; 20 nonconvex rounds amplify that to ~1e-7
    np.testing.assert_allclose(a.components_, b.components_, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(a.transform(X), b.transform(sp.csr_matrix(X)), rtol=1e-5, atol=1e-9)


def test_transform_is_sample_wise_and_exact_on_the_training_samples():
    X = np.random.default_rng(2).random((30, 6))
    m = SparseONMF(2, random_state=0, max_rounds=400, tol=1e-10).fit(X)
    np.testing.assert_allclose(m.transform(X[:7]), m.transform(X)[:7])
    np.testing.assert_allclose(m.transform(X), m.embedding_, atol=1e-5 * np.abs(m.embedding_).max())


def test_too_large_rank_and_no_single_view_warning():
    import warnings

    X = np.random.default_rng(3).random((10, 4))
    with pytest.raises(ValueError, match="n_components=5 is larger than n_features=4"):
        SparseONMF(5).fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one client is what SparseONMF is: no "single view" warning
        SparseONMF(2, random_state=0, max_rounds=3, tol=0).fit(X)


def test_signature_is_keyword_only_and_defaults_come_from_the_table():
    import inspect

    from fedsonmf.protocol.params import PARAMS

    params = list(inspect.signature(SparseONMF.__init__).parameters.values())[1:]
    assert params[0].name == "n_components" and params[0].default is None
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])
    for p in params[1:]:
        if p.name == "verbose":
            assert p.default == 0
            continue
        assert p.default == PARAMS[p.name].default, p.name


def test_docstring_examples_run():
    import doctest

    import fedsonmf.estimators.single
    import fedsonmf.estimators.sonmf
    import fedsonmf.model_selection

    for mod in (fedsonmf.estimators.single, fedsonmf.estimators.sonmf, fedsonmf.model_selection):
        res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert res.failed == 0 and res.attempted > 0, mod.__name__
