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


# ----------------------------------------------------------------------------- one validation path


def test_numpy_scalar_parameters_are_accepted(views):
    res = federated_sonmf(views, np.int64(3), mu=np.float32(0.5), tau=np.int32(2), alpha=np.float64(0.01),
                          eta_g=np.float32(1.5), rho1=np.float16(1.0), max_rounds=np.int64(2), tol=np.float32(0),
                          correction=np.bool_(True), random_state=np.int64(4), n_jobs=np.int64(1))
    assert res.n_rounds == 2 and res.V.shape == (3, 30)
    assert type(res.config["n_components"]) is int and type(res.config["mu"]) is float


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dok", "lil", "bsr", "dia"])
@pytest.mark.parametrize("kind", ["matrix", "array"])
def test_every_sparse_format_is_accepted(views, fmt, kind):
    S = sp.random(30, 10, density=0.4, random_state=1)
    X = getattr(sp, f"{fmt}_{kind}")(S)
    ref = federated_sonmf([views[0], S.toarray()], 3, max_rounds=2, tol=0, random_state=0)
    res = federated_sonmf([views[0], X], 3, max_rounds=2, tol=0, random_state=0)
    np.testing.assert_allclose(res.V, ref.V, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n_jobs, expected", [(None, 1), (1, 1), (2, 2), (np.int64(3), 3), (-1, None)])
def test_n_jobs_values(n_jobs, expected):
    import os

    from fedsonmf._validation import check_n_jobs

    assert check_n_jobs(n_jobs) == (expected if expected is not None else (os.cpu_count() or 1))


@pytest.mark.parametrize("n_jobs", ["2", 2.5, 0, -2, True, [2]])
def test_bad_n_jobs_names_the_parameter(views, n_jobs):
    with pytest.raises(ParameterError, match=r"n_jobs must be None, -1 \(all cores\) or a positive integer"):
        federated_sonmf(views, 3, max_rounds=1, n_jobs=n_jobs)


def test_seeds_from_generators_and_random_states():
    from fedsonmf._validation import check_seed

    assert check_seed(np.random.RandomState(0)) == check_seed(np.random.RandomState(0))
    assert check_seed(np.random.default_rng(0)) == check_seed(np.random.default_rng(0))
    assert check_seed(np.int64(7)) == 7 and check_seed(None) is None
    with pytest.raises(ParameterError, match=r"random_state must be >= 0, got (np\.int64\()?-1"):
        check_seed(np.int64(-1))


def test_reusable_validators_return_python_scalars_and_name_the_parameter():
    from fedsonmf._validation import check_bool, check_choice, check_int, check_real

    assert type(check_int("k", np.int64(3), min=1)) is int
    assert type(check_real("x", np.float32(0.5), min=0.0)) is float
    assert check_bool("flag", np.bool_(False)) is False
    assert check_choice("init", np.str_("svd"), ("svd", "random")) == "svd"
    assert check_int("k", None, allow_none=True) is None
    for call, msg in [
        (lambda: check_int("k", 2.0, min=1), r"k must be an integer >= 1, got 2.0"),
        (lambda: check_int("k", 0, min=1, max=5), r"k must be an integer >= 1 and <= 5, got 0"),
        (lambda: check_int("k", "3", min=1, allow_none=True), r"k must be None or an integer >= 1, got '3'"),
        (lambda: check_real("x", float("nan")), r"x must be a finite real number, got nan"),
        (lambda: check_real("x", 0.0, min=0.0, min_inclusive=False), r"x must be > 0, got 0.0"),
        (lambda: check_real("x", True), r"x must be a finite real number, got True"),
        (lambda: check_bool("flag", 1), r"flag must be True or False, got 1"),
        (lambda: check_choice("init", "pca", ("svd", "random")), r"init must be 'svd' or 'random', got 'pca'"),
    ]:
        with pytest.raises(ParameterError, match=msg):
            call()


@pytest.mark.parametrize("scale", [1e-6, 1e6])
def test_moderately_scaled_views_are_accepted(views, scale):
    res = federated_sonmf([v * scale for v in views], 3, max_rounds=1, tol=0, random_state=0)
    assert np.all(np.isfinite(res.V))


def test_overflowing_view_is_not_reported_as_all_zeros(views):
    with pytest.raises(InputError, match=r"view 1 is too large for float64 arithmetic"):
        federated_sonmf([views[0], views[1] * 1e200], 3, max_rounds=1)
    with pytest.raises(InputError, match=r"view 0 is too small for float64 arithmetic"):
        federated_sonmf([views[0] * 1e-200, views[1]], 3, max_rounds=1)


def test_clustering_rescues_huge_views_by_normalising(views):
    from fedsonmf.estimators.clustering import FedMultiViewClustering

    m = FedMultiViewClustering(2, max_rounds=2, random_state=0, n_init=1).fit([views[0] * 1e200, views[1]])
    assert np.all(np.isfinite(m.embedding_))


@pytest.mark.parametrize("value, want", [("auto", "auto"), (3, 3), (np.int64(2), 2), ("5", 5)])
def test_auto_or_count_reads_auto_a_count_and_a_count_as_text(value, want):
    from fedsonmf._validation import check_auto_or_count

    got = check_auto_or_count("n_init", value)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("value", [0, "0", -1, 2.0, True, "x", "Auto", "", None])
def test_auto_or_count_refuses_anything_else_naming_it(value):
    from fedsonmf._validation import check_auto_or_count

    with pytest.raises(ParameterError, match=r"n_init must be 'auto' or a positive integer, got"):
        check_auto_or_count("n_init", value)
