"""Bad input gets a clear error naming the problem."""

import numpy as np
import pytest
import scipy.sparse as sp

from fedsonmf import FedSONMF, InputError, ParameterError, federated_sonmf


@pytest.fixture
def views():
    rng = np.random.default_rng(0)
    return [rng.random((30, 8)), rng.random((30, 10))]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda v: [v[0], np.where(np.eye(30, 10) > 0, np.nan, v[1])], "view 1 contains NaN or Inf"),
        (lambda v: [np.full((30, 8), np.inf), v[1]], "view 0 contains NaN or Inf"),
        (lambda v: [sp.csr_matrix(np.where(v[0] > 0.9, np.nan, 0.0)), v[1]], "view 0 contains NaN"),
        (lambda v: [v[0], v[1][:20]], "different numbers of samples"),
        (lambda v: [v[0], np.zeros((30, 10))], "view 1 is all zeros"),
        (lambda v: [v[0], sp.csr_matrix((30, 10))], "view 1 is all zeros"),
        (lambda v: [v[0], np.zeros((30, 0))], "view 1 is empty"),
        (lambda v: [np.zeros((0, 8))], "view 0 is empty"),
        (lambda v: [], "Xs is empty"),
        (lambda v: v[0], "must be a list of views"),
        (lambda v: sp.csr_matrix(v[0]), "must be a list of views"),
        (lambda v: [v[0], "abc"], "view 1 must be an array"),
        (lambda v: [v[0], v[1].ravel()], r"view 1 must be 2-D"),
        (lambda v: [v[0].astype(complex), v[1]], "real numbers"),
        (lambda v: [v[0], [[1, 2], [3]]], "view 1 cannot be read"),
    ],
)
def test_bad_views(views, make, match):
    with pytest.raises(InputError, match=match):
        federated_sonmf(make(views), 3, max_rounds=1)


def test_rank_larger_than_features(views):
    with pytest.raises(InputError, match=r"n_components=9 is larger than view 0's number of features \(8\)"):
        FedSONMF(9).fit(views)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mu": -1.0}, "mu must be >= 0"),
        ({"alpha": 0.0}, "alpha must be > 0"),
        ({"alpha": -0.1}, "alpha must be > 0"),
        ({"tau": 0}, "tau must be an integer >= 1"),
        ({"tau": 2.5}, "tau must be an integer >= 1"),
        ({"eta_g": 0}, "eta_g must be > 0"),
        ({"rho1": -1}, "rho1 must be >= 0"),
        ({"mu": float("nan")}, "mu must be a finite real"),
        ({"mu": "big"}, "mu must be a finite real"),
        ({"max_rounds": 2.5}, "max_rounds must be an integer >= 1"),
        ({"max_rounds": 0}, "max_rounds must be an integer >= 1"),
        ({"max_rounds": True}, "max_rounds must be an integer >= 1"),
        ({"tol": -1.0}, "tol must be a real number >= 0"),
        ({"n_components": 0}, "n_components must be a positive integer"),
        ({"n_components": 2.0}, "n_components must be a positive integer"),
        ({"init_u": "pca"}, "init_u must be"),
        ({"correction": "yes"}, "correction must be True or False"),
        ({"random_state": -3}, "random_state must be >= 0"),
        ({"random_state": "seed"}, "random_state must be None"),
        ({"algorithm": "nope"}, "unknown algorithm 'nope'"),
        ({"diagnostics": False, "tol": 1e-3}, "tol > 0 needs diagnostics"),
        ({"blas_threads": 0}, "blas_threads must be None or an integer >= 1"),
    ],
)
def test_bad_parameters(views, kwargs, match):
    kw = {"n_components": 3, "max_rounds": 2, **kwargs}
    with pytest.raises((ParameterError, ValueError), match=match):
        FedSONMF(**kw).fit(views)


def test_negative_entries_are_valid(views):
    shifted = [views[0] - 0.5, views[1]]
    model = FedSONMF(3, max_rounds=3, tol=0, random_state=0).fit(shifted)
    assert np.all(model.embedding_ >= 0)
    assert all(np.all(C >= 0) for C in model.components_)


def test_integer_and_bool_input_are_accepted(views):
    ints = [(v * 10).astype(np.int32) for v in views]
    m = FedSONMF(3, max_rounds=2, tol=0, random_state=0).fit(ints)
    assert m.embedding_.dtype == np.float64
