"""FedMVL (Huang et al. 2019), the comparison method: its pieces, determinism, and its place in Table 1."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import BAD_PLANTED_VIEWS, bad_planted_views, planted
from fedsonmf.algorithms import CLUSTERING_METHODS
from fedsonmf.algorithms.fedmvl import _solve_low_rank, _standardize_samples, fedmvl, fedmvl_cluster
from fedsonmf.exceptions import InputError
from fedsonmf.experiments.table1 import available_methods


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


@pytest.mark.parametrize("case, match", BAD_PLANTED_VIEWS)
def test_bad_views_are_an_input_error_naming_the_problem(case, match):
    with pytest.raises(InputError, match=match):
        fedmvl(bad_planted_views(case), 3, random_state=0)


@pytest.mark.parametrize("init", ["random", "kmeans"])
def test_dense_and_sparse_views_give_the_same_labels(init):
    Xs, _ = planted()
    dense = fedmvl_cluster(Xs, 3, random_state=0, init=init)
    np.testing.assert_array_equal(fedmvl_cluster([sp.csr_array(X) for X in Xs], 3, random_state=0, init=init), dense)
    np.testing.assert_array_equal(fedmvl_cluster(Xs, 3, random_state=0, init=init), dense)
