"""PSFedML (Li et al. 2024), the comparison method: its scaling, graph, monotone client steps, 0/1
selection, determinism, recovery, parameter checks, and its place in Table 1."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import BAD_PLANTED_VIEWS, bad_planted_views, planted
from fedsonmf.algorithms import CLUSTERING_METHODS
from fedsonmf.algorithms.psfedml import (
    PSFEDML_DEFAULTS,
    _check,
    _Client,
    knn_heat_graph,
    psfedml,
    psfedml_cluster,
    scale01,
    select_rows,
)
from fedsonmf.exceptions import InputError
from fedsonmf.experiments.table1 import available_methods
from fedsonmf.metrics import clustering_scores


def test_scaled_views_lie_in_unit_interval_per_sample():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((7, 12)) * 5 - 3  # (d, n), negative entries
    X[:, 4] = 2.5  # a constant sample
    S = scale01(X)
    assert S.min() >= 0 and S.max() <= 1 and np.all(np.isfinite(S))
    assert np.all(S[:, 4] == 0)
    keep = np.arange(12) != 4
    np.testing.assert_allclose(S[:, keep].min(axis=0), 0.0)  # every sample spans [0, 1] over its features
    np.testing.assert_allclose(S[:, keep].max(axis=0), 1.0)
    np.testing.assert_allclose(scale01(sp.csr_matrix(X)), S)


def test_graph_is_symmetric_heat_kernel_on_neighbours():
    rng = np.random.default_rng(1)
    X = rng.random((4, 30))
    W = knn_heat_graph(X, 5, 1.0)
    assert sp.issparse(W) and W.shape == (30, 30)
    Wd = W.toarray()
    np.testing.assert_array_equal(Wd, Wd.T)
    assert np.all(np.diag(Wd) == 0) and np.all((Wd > 0).sum(axis=1) >= 5)
    i, j = np.nonzero(Wd)
    np.testing.assert_allclose(Wd[i, j], np.exp(-np.sum((X[:, i] - X[:, j]) ** 2, axis=0) / 2.0))


@pytest.mark.parametrize("lam", [0.0, 0.1, 1.0, 10.0])
def test_client_steps_stay_nonnegative_and_descend(lam):
    """The multiplicative steps (B, then H) do not increase ||X - BH||^2 + lam tr(H L H^T).  The
    1e-5 floor of the denominators can in principle break the auxiliary-function argument (a
    floored step may overshoot the wrong way where the numerator is below 1e-5), so a tiny relative
    tolerance is allowed; on these instances the objective in fact decreases at every step."""
    Xs, _ = planted()
    for v, X in enumerate(Xs):
        cl = _Client(scale01(X.T), 6, np.random.default_rng(v), lam, 10, 1.0)
        hist = [cl.objective()]
        for _ in range(25):
            cl.step()
            assert np.all(cl.B >= 0) and np.all(cl.H >= 0)
            hist.append(cl.objective())
        h = np.array(hist)
        assert np.all(np.diff(h) <= 1e-10 * h[:-1])
        assert h[-1] < 0.5 * h[0]


def test_selection_is_a_one_per_column_0_1_matrix_of_the_largest_rows():
    rng = np.random.default_rng(2)
    C, K, n = 10, 4, 25
    H, V = rng.random((C, n)), rng.random((n, K))
    for G in (rng.random((C, K)), np.eye(C)[:, :K]):
        G01, rows, dt = select_rows(H, V, G, 1.0)
        assert set(np.unique(G01)) <= {0.0, 1.0}
        np.testing.assert_array_equal(G01.sum(axis=0), np.ones(K))
        assert len(set(rows)) == K and np.all(G01[rows, np.arange(K)] == 1)
        Gs = np.linalg.solve(H @ H.T + np.diag(dt), H @ V)
        norms = np.linalg.norm(Gs, axis=1)
        assert np.all(np.diff(norms[rows]) <= 0) and norms[rows].min() >= np.delete(norms, rows).max()


def test_runs_deterministically_and_shares_rows():
    Xs, y = planted()
    a = psfedml(Xs, 3, random_state=0, max_iter=20)
    b = psfedml(Xs, 3, random_state=0, max_iter=20)
    np.testing.assert_array_equal(a.V, b.V)
    C, K = 20, 4  # max(20, ceil(3 / 0.2)) and rho C
    assert a.V.shape == (y.size, K) and a.n_iter == 20 and len(a.client_objective) == len(a.server_objective) == 20
    assert all(len(set(r)) == K and r.max() < C for r in a.selected)
    assert np.all(a.V >= 0) and np.all(np.isfinite(a.client_objective + a.server_objective))
    np.testing.assert_array_equal(psfedml_cluster(Xs, 3, random_state=5), psfedml_cluster(Xs, 3, random_state=5))
    gen = psfedml_cluster(Xs, 3, random_state=np.random.default_rng(5))  # a Generator is accepted too
    assert gen.shape == (y.size,)


def test_shared_dimension_covers_the_clusters():
    Xs, _ = planted(n_per=6, c=8, dims=(16, 16))
    assert psfedml(Xs, 8, random_state=0, max_iter=2).V.shape[1] == 8  # C = 40, K = 8
    assert psfedml(Xs, 8, random_state=0, max_iter=2, n_components=20).V.shape[1] == 4


def test_recovers_planted_clusters_from_sparse_and_negative_views():
    Xs, y = planted()
    for seed in (0, 1):
        assert clustering_scores(y, psfedml_cluster(Xs, 3, random_state=seed))["acc"] >= 0.9
    shifted = [sp.csr_matrix(Xs[0]), Xs[1] - 5.0, np.column_stack([Xs[2], np.ones(y.size)])]  # constant feature
    assert clustering_scores(y, psfedml_cluster(shifted, 3, random_state=0))["acc"] >= 0.9


@pytest.mark.parametrize("kwargs, name", [
    ({"n_clusters": 1}, "n_clusters"), ({"rho": 0.0}, "rho"), ({"rho": 1.5}, "rho"), ({"beta": -1.0}, "beta"),
    ({"lam": -0.1}, "lam"), ({"max_iter": 0}, "max_iter"), ({"client_max_iter": 0}, "client_max_iter"),
    ({"server_max_iter": 0}, "server_max_iter"), ({"n_neighbors": 0}, "n_neighbors"), ({"t": 0.0}, "t"),
    ({"n_components": 2}, "n_components"),
])
def test_bad_parameters_name_themselves(kwargs, name):
    Xs, _ = planted()
    kwargs = {"n_clusters": 3, **kwargs}
    with pytest.raises(ValueError, match=name):
        psfedml(Xs, **kwargs)


def test_defaults_are_main_m():
    assert PSFEDML_DEFAULTS["rho"] == 0.2 and PSFEDML_DEFAULTS["max_iter"] == 100
    assert PSFEDML_DEFAULTS["beta"] == 1.0 and PSFEDML_DEFAULTS["lam"] == 0.1


def test_registered_for_table1():
    assert CLUSTERING_METHODS["psfedml"] is psfedml_cluster
    assert "psfedml" in available_methods()


@pytest.mark.parametrize("case, match", BAD_PLANTED_VIEWS)
def test_bad_views_are_an_input_error_naming_the_problem(case, match):
    with pytest.raises(InputError, match=match):
        psfedml(bad_planted_views(case), 3, random_state=0)


def test_valid_views_are_scaled_as_given_and_dense_and_sparse_give_the_same_labels():
    """The shared check changes no storage: every view is scale01 of the view as given (a COO view
    densified as COO, so the dense array has the memory order, hence the rounding, it always had);
    the labels do not depend on the storage and are the same for the same seed."""
    Xs, _ = planted()
    given = [Xs[0], sp.coo_array(Xs[1]), sp.csr_matrix(Xs[2].astype(np.float32))]
    views, _, _ = _check(given, 3, None, 0.2, 1.0, 0.1, 1, 1, 1, 10, 1.0, 1e-4)
    for got, X in zip(views, given):
        want = scale01(X.T)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float64 and got.flags.c_contiguous == want.flags.c_contiguous
    dense = psfedml_cluster(Xs, 3, random_state=0)
    for sparse in ([sp.csr_array(X) for X in Xs], [sp.coo_array(X) for X in Xs]):
        np.testing.assert_array_equal(psfedml_cluster(sparse, 3, random_state=0), dense)
    np.testing.assert_array_equal(psfedml_cluster(Xs, 3, random_state=0), dense)
