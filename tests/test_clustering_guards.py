"""Guards for degenerate views: each warns, naming the view, and does the sensible thing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from fedsonmf.estimators.clustering import FedMultiViewClustering
from fedsonmf.estimators.options import MethodOptions
from fedsonmf.exceptions import DataWarning
from fedsonmf.pipeline.steps import prepare_view
from fedsonmf.pipeline.view_rule import apply_view_preprocessing, preprocess_view

FAST = dict(max_rounds=5, tol=0.0, method=MethodOptions(diagnostics=False))


def dense(n=40, d=6, seed=0):
    rng = np.random.default_rng(seed)
    return 5.0 + rng.random((n, d))


def test_constant_view_warns_and_is_not_centred():
    X = np.ones((30, 4))
    Y, info = preprocess_view(X, "auto")
    assert not info["centered"] and any("constant" in w for w in info["warnings"])
    assert np.all(np.isfinite(Y)) and np.any(Y)
    with pytest.warns(DataWarning, match="view 2: the view is constant"):
        prepare_view(X, preprocess="auto", n_components=3, view=2)


def test_constant_view_in_a_fit_warns_and_fits():
    """A view whose samples are all the same after the per-sample scaling (each row a multiple of
    one row) warns and is not centred; a view of one repeated number is refused before (the
    silent-cases test): it cannot tell any samples apart."""
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 20)
    X0 = np.where(y[:, None] == 0, [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]) + 0.01 * rng.random((40, 4))
    X1 = rng.uniform(1, 3, size=(40, 1)) * np.ones((40, 5))
    with pytest.warns(UserWarning, match="view 1: the view is constant"):
        m = FedMultiViewClustering(2, random_state=0, **FAST).fit([X0, X1])
    assert m.labels_.shape == (40,)


def test_near_constant_features_are_zeroed_with_a_warning():
    X = dense()
    X[:, 2] = 1e-10 * np.random.default_rng(3).random(X.shape[0])  # a spread at rounding level of the others
    Y, info = preprocess_view(X, "auto")
    assert info["standardized"] and info["resample_l2"]
    assert np.all(Y[:, 2] == 0) and np.allclose(np.linalg.norm(Y, axis=1), 1.0)
    assert any("near-constant" in w for w in info["warnings"])
    np.testing.assert_allclose(apply_view_preprocessing(X, info), Y)


def test_exactly_constant_features_become_zero_silently():
    X = dense()
    X[:, 1] = 0.0  # constant after the per-sample scaling too
    Y, info = preprocess_view(X, "auto")
    assert np.all(Y[:, 1] == 0) and info["warnings"] == []


def test_mostly_empty_rows_point_to_masks():
    X = dense()
    X[:17] = 0.0  # 42 % all-zero rows
    with pytest.warns(DataWarning, match=r"view 0: 42 % of its samples are all-zero rows.*masks"):
        prepare_view(X, preprocess="auto", n_components=3, view=0)
    with warnings.catch_warnings():  # the held rows only: nothing to flag
        warnings.simplefilter("error")
        prepare_view(X, preprocess="auto", n_components=3, view=0, held=np.arange(17, 40))


def test_the_empty_rows_warning_says_what_measured_better_for_the_kind_of_view():
    X = dense()
    X[:8] = 0.0  # 20 %: the view stays dense (its mean sample holds most of its energy)
    _, info = preprocess_view(X, "auto")
    assert info["centered"] and "masks measured" in info["warnings"][0]
    T = sp.random(40, 300, density=0.05, random_state=1, format="csr")
    T = sp.csr_matrix(sp.diags((np.arange(40) >= 12).astype(float)) @ T)  # a text-like view, 30 % empty rows
    _, info = preprocess_view(T, "auto")
    assert not info["centered"] and "zero rows measured" in info["warnings"][0]


def test_warnings_point_at_the_users_line():
    """Every warning of a fit (here a view padded up to r, a degenerate view, a capped run) names the
    caller's file and line, through fit_predict and scikit-learn's fit_transform wrapper alike, not
    a line inside the library."""
    rng = np.random.default_rng(0)
    views = [rng.random((30, 3)), rng.random((30, 8))]
    views[1][:12] = 0.0  # 40 % all-zero rows
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        FedMultiViewClustering(2, n_init=1, random_state=0, max_rounds=2).fit_predict(views)
        FedMultiViewClustering(2, n_init=1, random_state=0, max_rounds=2).fit_transform(views)
    kinds = {w.category.__name__ for w in rec}
    assert {"DataWarning", "ConvergenceWarning"} <= kinds, kinds
    assert [w.filename for w in rec] == [__file__] * len(rec), [(w.filename, str(w.message)[:40]) for w in rec]
