"""EFIMVC (Liu et al. 2025), the comparison method: its simplex QP and projection, the properties of
its updates (orthogonal P, monotone client steps), determinism, recovery, masks, and its place in Table 1."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from conftest import BAD_PLANTED_VIEWS, bad_planted_views, planted
from fedsonmf.algorithms import CLUSTERING_METHODS
from fedsonmf.algorithms.efimvc import (
    _check,
    _Client,
    _procrustes,
    efimvc,
    efimvc_cluster,
    project_simplex,
    simplex_qp,
)
from fedsonmf.exceptions import InputError
from fedsonmf.experiments.table1 import available_methods
from fedsonmf.metrics import clustering_scores


def _brute_projection(v: np.ndarray) -> np.ndarray:
    """Nearest simplex point by trying every support: on support S the nearest point of the face's
    affine hull is v_S - (sum v_S - 1) / |S|; keep the nearest one that is nonnegative."""
    best, best_d = None, np.inf
    for k in range(1, v.size + 1):
        for S in itertools.combinations(range(v.size), k):
            z = np.zeros_like(v)
            z[list(S)] = v[list(S)] - (v[list(S)].sum() - 1.0) / k
            if z.min() >= -1e-12 and np.sum((z - v) ** 2) < best_d:
                best, best_d = z, np.sum((z - v) ** 2)
    return best


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 5), N=st.integers(1, 4), seed=st.integers(0, 10**6), scale=st.sampled_from([0.1, 1.0, 30.0]))
def test_simplex_projection_is_exact(m, N, seed, scale):
    V = scale * np.random.default_rng(seed).standard_normal((m, N))
    Z = project_simplex(V)
    assert np.all(Z >= 0) and np.allclose(Z.sum(axis=0), 1.0)
    np.testing.assert_allclose(project_simplex(Z), Z, atol=1e-12)  # idempotent
    for i in range(N):
        np.testing.assert_allclose(Z[:, i], _brute_projection(V[:, i]), atol=1e-10)


def _slsqp(H: np.ndarray, f: np.ndarray) -> float:
    m = f.size
    res = minimize(lambda z: 0.5 * z @ H @ z + f @ z, np.full(m, 1.0 / m), jac=lambda z: H @ z + f,
                   method="SLSQP", bounds=[(0, 1)] * m,
                   constraints=[{"type": "eq", "fun": lambda z: z.sum() - 1.0, "jac": lambda z: np.ones(m)}],
                   options={"ftol": 1e-12, "maxiter": 500})
    return float(res.fun)


def _check_qp(G, shift, F, Z):
    """Feasible, KKT (every used coordinate at the smallest gradient entry) and no worse than SLSQP,
    to 1e-7 of the scale, or to the solver's round-off floor min(10 eps cond(H), 1e-6) if larger."""
    assert np.all(Z >= 0) and np.allclose(Z.sum(axis=0), 1.0)
    for i in range(F.shape[1]):
        H = G + shift[i] * np.eye(G.shape[0])
        g = H @ Z[:, i] + F[:, i]
        ev = np.linalg.eigvalsh(H)
        scale = ev[-1] + np.abs(F[:, i]).max()
        cond = ev[-1] / ev[0] if ev[0] > 0 else np.inf
        allow = max(1e-7, min(10 * np.finfo(float).eps * cond, 1e-6)) * scale
        assert Z[:, i] @ g - g.min() <= allow  # the duality gap
        if np.isfinite(cond):  # every used coordinate at the smallest gradient entry; a singular H (cond = inf)
            # is solved to its gap floor of 1e-6 of the scale, which bounds only z_j (g_j - min g), not g_j alone
            assert np.all(g[Z[:, i] > 1e-6] - g.min() <= 1e-5 * scale)
        ours = 0.5 * Z[:, i] @ H @ Z[:, i] + F[:, i] @ Z[:, i]
        assert ours <= _slsqp(H, F[:, i]) + allow


@settings(max_examples=40, deadline=None)
@given(m=st.integers(2, 6), N=st.integers(1, 4), rank=st.integers(1, 6), seed=st.integers(0, 10**6),
       lam=st.sampled_from([0.0, 1e-3, 1.0, 100.0]), warm=st.booleans())
@example(m=5, N=2, rank=2, seed=74658, lam=0.0, warm=False)  # FISTA alone stopped at a gap of 0.0136 (a CI run)
def test_client_qp_is_solved(m, N, rank, seed, lam, warm):
    """The client form: H = A^T A + lambda2 I shared by every sample (A^T A possibly singular)."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((rank, m)) * rng.uniform(0.1, 10)
    F = rng.standard_normal((m, N)) * rng.uniform(0.1, 10)
    Z0 = project_simplex(rng.random((m, N))) if warm else None
    shift = np.full(N, lam)
    _check_qp(A.T @ A, shift, F, simplex_qp(A.T @ A, lam, F, Z0))


@settings(max_examples=25, deadline=None)
@given(m=st.integers(2, 6), V=st.integers(1, 3), N=st.integers(1, 5), seed=st.integers(0, 10**6),
       beta=st.sampled_from([1e-3, 1.0, 100.0]))
def test_server_qp_is_solved(m, V, N, seed, beta):
    """The server form: H_i = h_i I + 2 beta sum_v P_v^T L_v P_v, h_i the number of views holding sample i."""
    rng = np.random.default_rng(seed)
    Lp = np.zeros((m, m))
    for _ in range(V):
        S = rng.random((m, m))
        S = 0.5 * (S + S.T)
        P = np.linalg.qr(rng.standard_normal((m, m)))[0]
        Lp += P.T @ (np.diag(S.sum(axis=0)) - S) @ P
    h = rng.integers(1, V + 1, size=N).astype(float)
    F = -rng.random((m, N)) * h
    Z = simplex_qp(2 * beta * Lp, h, F, project_simplex(rng.random((m, N))))
    _check_qp(2 * beta * Lp, h, F, Z)


@settings(max_examples=15, deadline=None)
@given(m=st.integers(2, 6), seed=st.integers(0, 10**6), beta=st.sampled_from([1e-3, 1.0, 100.0]))
def test_procrustes_keeps_p_orthogonal_and_never_lowers_its_objective(m, seed, beta):
    rng = np.random.default_rng(seed)
    S = rng.random((m, m))
    S = 0.5 * (S + S.T)
    L = np.diag(S.sum(axis=0)) - S
    Lmx = np.linalg.eigvalsh(L)[-1] * np.eye(m) - L
    Zall, Zv = project_simplex(rng.random((m, 20))), project_simplex(rng.random((m, 20)))
    ZZ, ZZv = Zall @ Zall.T, Zv @ Zall.T
    P0 = np.linalg.qr(rng.standard_normal((m, m)))[0]
    P = _procrustes(P0, Lmx, ZZ, ZZv, beta, 100, 1e-3)
    np.testing.assert_allclose(P.T @ P, np.eye(m), atol=1e-10)

    def value(Q):
        return beta * np.trace(Q.T @ Lmx @ Q @ ZZ) + np.trace(Q.T @ ZZv)

    assert value(P) >= value(P0) - 1e-10 * (1 + abs(value(P0)))


def test_client_objective_never_increases():
    """Exact A-step (least squares), exact Z-step (the simplex QP, never worse than its warm start)."""
    Xs, y = planted()
    rng = np.random.default_rng(1)
    held = rng.random(y.size) > 0.2
    qp = {"tol": 1e-9, "max_iter": 3000}
    cl = _Client(Xs[0], held, 6, 0.5, 0, qp)
    Zall = project_simplex(rng.random((6, y.size)))
    P = np.linalg.qr(rng.standard_normal((6, 6)))[0]
    Z, S, last = cl.train(Zall, P, tol=0.0, max_iter=12)  # tol 0: run all 13 iterations
    h = np.array(cl.history)
    assert h.size == 13 and last == h[-1]
    assert np.all(np.diff(h) <= 1e-9 * h[:-1])
    assert np.all(Z[:, ~held] == 0) and np.allclose(Z[:, held].sum(axis=0), 1.0)
    assert S.shape == (6, 6) and np.allclose(S, S.T) and np.allclose(np.diag(S), 1.0)


def test_runs_deterministically_with_orthogonal_alignments():
    Xs, y = planted()
    a = efimvc(Xs, 3, random_state=0)
    b = efimvc(Xs, 3, random_state=0)
    np.testing.assert_array_equal(a.Zall, b.Zall)
    m = 6  # 2k anchors by default
    assert a.Zall.shape == (m, y.size) and 2 <= a.n_iter <= 6 and len(a.objective) == a.n_iter
    np.testing.assert_allclose(a.Zall.sum(axis=0), 1.0)
    assert np.all(a.Zall >= 0) and np.all(np.isfinite(a.objective))
    for P in a.P:
        np.testing.assert_allclose(P.T @ P, np.eye(m), atol=1e-10)
    np.testing.assert_array_equal(efimvc_cluster(Xs, 3, random_state=5), efimvc_cluster(Xs, 3, random_state=5))
    gen = efimvc_cluster(Xs, 3, random_state=np.random.default_rng(5))  # a Generator is accepted too
    assert gen.shape == (y.size,)


def test_recovers_planted_clusters():
    Xs, y = planted()
    for seed in (0, 1):
        assert clustering_scores(y, efimvc_cluster(Xs, 3, random_state=seed))["acc"] >= 0.9


def test_masks_missing_samples_get_labels_and_zero_codes():
    Xs, y = planted()
    masks = [np.ones(y.size, bool) for _ in Xs]
    masks[0][[0, 20]] = False
    masks[1][[1, 20]] = False  # sample 20 is held by view 2 only
    Xs[0][[0, 20]] = 1e6  # rows a view lacks are never read
    res = efimvc(Xs, 3, random_state=0, masks=masks)
    assert np.all(res.Z[0][:, [0, 20]] == 0) and np.all(res.Z[1][:, [1, 20]] == 0)
    assert np.all(np.isfinite(res.Zall)) and np.allclose(res.Zall.sum(axis=0), 1.0)
    labels = efimvc_cluster(Xs, 3, random_state=0, masks=masks)
    assert labels.shape == (y.size,) and set(labels) <= {0, 1, 2}
    assert clustering_scores(y, labels)["acc"] >= 0.9


@pytest.mark.parametrize("kwargs, name", [
    ({"n_anchors": 1}, "n_anchors"), ({"n_anchors": 2}, "n_anchors"), ({"n_anchors": 46}, "n_anchors"),
    ({"lambda2": -1.0}, "lambda2"), ({"lambda3": -0.1}, "lambda3"), ({"n_clusters": 1}, "n_clusters"),
    ({"masks": [np.zeros(45, bool)] * 3}, "masks"),
])
def test_bad_parameters_name_themselves(kwargs, name):
    Xs, _ = planted()
    kwargs = {"n_clusters": 3, **kwargs}
    with pytest.raises(ValueError, match=name):
        efimvc(Xs, **kwargs)


def test_registered_for_table1():
    assert CLUSTERING_METHODS["efimvc"] is efimvc_cluster
    assert "efimvc" in available_methods()


def test_table1_hands_an_incomplete_files_masks_to_efimvc_only(monkeypatch):
    """``reproduce table1`` gives the file's availability masks to a comparison method that takes
    them (EFIMVC, built for incomplete views) and not to one that does not (FedMVL)."""
    from fedsonmf.datasets.mat import MultiViewDataset
    from fedsonmf.experiments import table1

    Xs, y = planted()
    mask = np.ones((y.size, len(Xs)), bool)
    mask[[0, 20], 0] = False
    seen = {}

    def with_masks(views, c, *, random_state=None, masks=None):
        seen["efimvc"] = masks
        return y

    def without(views, c, *, random_state=None):
        seen["fedmvl"] = "called"
        return y

    monkeypatch.setitem(CLUSTERING_METHODS, "efimvc", with_masks)
    monkeypatch.setitem(CLUSTERING_METHODS, "fedmvl", without)
    ds = MultiViewDataset(views=Xs, labels=y, view_names=["a", "b", "c"], name="planted", mask=mask)
    res = table1.run_dataset(ds, key="p", label="p", methods=["efimvc", "fedmvl"], seeds=[0])
    assert seen["fedmvl"] == "called" and len(seen["efimvc"]) == 3
    np.testing.assert_array_equal(np.column_stack(seen["efimvc"]), mask)
    assert "efimvc" in res.note


@pytest.mark.parametrize("case, match", BAD_PLANTED_VIEWS)
def test_bad_views_are_an_input_error_naming_the_problem(case, match):
    with pytest.raises(InputError, match=match):
        efimvc(bad_planted_views(case), 3, random_state=0)


def test_valid_views_keep_their_storage_and_dense_and_sparse_give_the_same_labels():
    """The shared check converts nothing: dense views stay float64 arrays (a mostly-zero one too,
    which check_views would make CSC), sparse ones CSR, all (n, d); and the labels do not depend
    on the storage and are the same for the same seed."""
    Xs, _ = planted()
    mostly_zero = np.where(np.arange(Xs[0].size).reshape(Xs[0].shape) % 25 == 0, Xs[0], 0.0)
    views, _, _ = _check([mostly_zero, Xs[1].astype(np.float32), sp.coo_array(Xs[2])], 3, None, None, 1.0, 1.0)
    assert type(views[0]) is np.ndarray and views[0].dtype == np.float64
    np.testing.assert_array_equal(views[0], mostly_zero)
    assert type(views[1]) is np.ndarray and views[1].dtype == np.float64
    np.testing.assert_array_equal(views[1], Xs[1].astype(np.float32))
    assert sp.issparse(views[2]) and views[2].format == "csr" and views[2].shape == Xs[2].shape
    np.testing.assert_array_equal(views[2].toarray(), Xs[2])
    dense = efimvc_cluster(Xs, 3, random_state=0)
    np.testing.assert_array_equal(efimvc_cluster([sp.csr_array(X) for X in Xs], 3, random_state=0), dense)
    np.testing.assert_array_equal(efimvc_cluster(Xs, 3, random_state=0), dense)
