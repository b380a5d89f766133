"""Property tests (hypothesis) over random valid configurations.

Small sizes (n <= 30, d_p <= 10, <= 3 views, few rounds).  Every run must end feasible
(U_p >= 0, U_p^T U_p = I, V >= 0), finite, without a DivergenceWarning, and -- where the
analysis guarantees it (homogeneous clients h = 0, small steps) -- with an objective that
does not increase.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fedsonmf import federated_sonmf  # noqa: E402
from fedsonmf.algorithms import ALGORITHMS  # noqa: E402
from fedsonmf.datasets import make_synthetic  # noqa: E402
from fedsonmf.exceptions import DivergenceWarning  # noqa: E402

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def problems(draw):
    m = draw(st.integers(1, 3))
    n = draw(st.integers(4, 30))
    widths = [draw(st.integers(1, 10)) for _ in range(m)]
    r = draw(st.integers(1, min(widths)))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["uniform", "shifted", "sparse", "integer", "float32", "scaled"]))
    views = []
    for d in widths:
        X = rng.random((n, d))
        if kind == "shifted":
            X = X - 0.3  # negative entries are valid
        elif kind == "sparse":
            X = sp.random(n, d, density=0.5, random_state=int(rng.integers(2**31)), format="csr")
            if X.nnz == 0:
                X = sp.csr_matrix(np.eye(n, d))
        elif kind == "integer":
            X = (X * 5).astype(np.int64)
            if not X.any():
                X[0, 0] = 1
        elif kind == "float32":
            X = X.astype(np.float32)
        elif kind == "scaled":
            X = X * 10.0 ** draw(st.integers(-6, 6))
        views.append(X)
    return views, r, seed


@st.composite
def configs(draw):
    return dict(
        algorithm=draw(st.sampled_from(sorted(ALGORITHMS))),
        tau=draw(st.integers(1, 4)),
        alpha=draw(st.sampled_from([1e-3, 1e-2, 3e-2])),
        eta_g=draw(st.sampled_from([1.0, 1.5])),
        mu=draw(st.sampled_from([0.0, 0.1, 1.0])),
        rho1=draw(st.sampled_from([0.0, 1.0])),
        correction=draw(st.booleans()),
        init_u=draw(st.sampled_from(["random", "svd"])),
        init_v=draw(st.sampled_from(["projection", "random"])),
        diagnostics=draw(st.booleans()),
        max_rounds=draw(st.integers(1, 4)),
    )


def _check_feasible(res, r):
    V = res.V
    assert V.shape[0] == r and np.all(np.isfinite(V)) and np.all(V >= 0)
    for U in res.bases:
        assert U.shape[1] == r and np.all(np.isfinite(U)) and np.all(U >= 0)
        assert np.max(np.abs(U.T @ U - np.eye(r))) <= 1e-8
    for row in res.history.rows:
        for k, v in row.items():
            if isinstance(v, float):
                assert np.isfinite(v), (k, v)


@SETTINGS
@given(problems(), configs())
def test_random_valid_configuration_is_feasible_and_finite(problem, cfg):
    views, r, seed = problem
    with warnings.catch_warnings():
        warnings.simplefilter("error", DivergenceWarning)
        warnings.simplefilter("ignore", RuntimeWarning)  # k-means init on tiny data may warn
        res = federated_sonmf(views, r, tol=0.0, random_state=seed, **cfg)
    assert res.n_rounds == cfg["max_rounds"]
    _check_feasible(res, r)


@SETTINGS
@given(st.integers(2, 3), st.integers(12, 30), st.integers(0, 2**16), st.sampled_from([1e-3, 5e-3]),
       st.integers(1, 3))
def test_objective_does_not_increase_for_homogeneous_clients_and_small_steps(m, n, seed, alpha, tau):
    data = make_synthetic(n_clients=m, n_samples=n, n_features=8, rank=3, heterogeneity=0.0, n_zero_rows=1,
                          noise=0.01, random_state=seed)
    res = federated_sonmf(data.views, 3, alpha=alpha, tau=tau, eta_g=1.0, mu=0.1, max_rounds=6, tol=0.0,
                          random_state=seed)
    _check_feasible(res, 3)
    F = np.array([row["objective"] for row in res.history.rows])
    assert np.all(np.diff(F) <= 1e-9 * max(1.0, abs(F[0]))), F
