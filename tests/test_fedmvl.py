"""FedMVL (Huang et al. 2019), the comparison method: its pieces, determinism, and its place in Table 1."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import planted
from fedsonmf.algorithms import CLUSTERING_METHODS
from fedsonmf.algorithms.fedmvl import _solve_low_rank, _standardize_samples, fedmvl, fedmvl_cluster
from fedsonmf.exceptions import InputError
from fedsonmf.experiments.table1 import available_methods


def _bad_views(case: str):
    """The planted views with one defect (``case``)."""
    Xs = [X.copy() for X in planted()[0]]
    if case == "nan":
        Xs[1][2, 3] = np.nan
    elif case == "inf":
        Xs[2][0, 0] = -np.inf
    elif case == "sparse-nan":
        Xs[0][4, 1] = np.nan
        Xs[0] = sp.csr_array(Xs[0])
    elif case == "rows":
        Xs[1] = Xs[1][:-1]
    elif case == "1-D":
        Xs[1] = Xs[1][:, 0]
    elif case == "3-D":
        Xs[1] = Xs[1][:, :, None]
    elif case == "zeros":
        Xs[1] = np.zeros_like(Xs[1])
    elif case == "strings":
        Xs[1] = Xs[1].astype(str)
    elif case == "empty":
        Xs[2] = Xs[2][:, :0]
    elif case == "no-views":
        return []
    elif case == "not-a-list":
        return Xs[0]
    return Xs


BAD_VIEWS = [
    ("nan", r"view 1 contains NaN or Inf"), ("inf", r"view 2 contains NaN or Inf"),
    ("sparse-nan", r"view 0 contains NaN or Inf"), ("rows", r"different numbers of samples \(rows\): \[45, 44, 45\]"),
    ("1-D", r"view 1 must be 2-D"), ("3-D", r"view 1 must be 2-D"), ("zeros", r"view 1 is all zeros"),
    ("strings", r"view 1 must hold real numbers"), ("empty", r"view 2 is empty"), ("no-views", r"Xs is empty"),
    ("not-a-list", r"must be a list of views"),
]


def test_low_rank_solve_is_the_inverse():
    rng = np.random.default_rng(0)
    G, B = rng.random((20, 3)), rng.random((20, 3))
    want = np.linalg.solve(0.7 * np.eye(20) + 5.0 * G @ G.T, B)
    np.testing.assert_allclose(_solve_low_rank(0.7, 5.0, G, B), want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(_solve_low_rank(0.7, 0.0, G, B), B / 0.7)


def test_samples_are_standardised_over_their_features():
    X = np.random.default_rng(1).random((6, 4))  # (d, n)
    Z = _standardize_samples(X)
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Z.std(axis=0, ddof=1), 1.0)
    assert np.all(_standardize_samples(np.ones((3, 2))) == 0)  # a constant sample: no NaN


@pytest.mark.parametrize("init", ["random", "kmeans"])
def test_runs_deterministically_with_valid_weights(init):
    Xs, y = planted()
    a = fedmvl(Xs, 3, random_state=0, init=init)
    b = fedmvl(Xs, 3, random_state=0, init=init)
    np.testing.assert_array_equal(a.V, b.V)
    assert a.V.shape == a.G.shape == (y.size, 3) and 1 <= a.n_iter <= 35
    assert np.all(a.alpha >= 0) and a.alpha.sum() == pytest.approx(1.0)
    assert np.all(np.isfinite(a.objective))
    labels = fedmvl_cluster(Xs, 3, random_state=0, init=init)
    assert labels.shape == (y.size,) and set(labels) <= {0, 1, 2}


def test_bad_parameters_and_registration():
    Xs, _ = planted()
    with pytest.raises(ValueError, match="init"):
        fedmvl(Xs, 3, init="svd")
    with pytest.raises(ValueError, match="r must differ from 1"):
        fedmvl(Xs, 3, r=1.0)
    assert CLUSTERING_METHODS["fedmvl"] is fedmvl_cluster
    assert "fedmvl" in available_methods()


@pytest.mark.parametrize("case, match", BAD_VIEWS)
def test_bad_views_are_an_input_error_naming_the_problem(case, match):
    with pytest.raises(InputError, match=match):
        fedmvl(_bad_views(case), 3, random_state=0)


@pytest.mark.parametrize("init", ["random", "kmeans"])
def test_dense_and_sparse_views_give_the_same_labels(init):
    Xs, _ = planted()
    dense = fedmvl_cluster(Xs, 3, random_state=0, init=init)
    np.testing.assert_array_equal(fedmvl_cluster([sp.csr_array(X) for X in Xs], 3, random_state=0, init=init), dense)
    np.testing.assert_array_equal(fedmvl_cluster(Xs, 3, random_state=0, init=init), dense)
