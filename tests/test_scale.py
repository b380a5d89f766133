"""Sparse end to end, memory, float32."""

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from fedsonmf import federated_sonmf
from fedsonmf.datasets import make_synthetic


def test_sparse_run_never_allocates_a_dense_view():
    d, n, r = 3000, 4000, 3
    views = [sp.random(n, d, density=0.002, format="csr", random_state=s, dtype=np.float64) for s in range(2)]
    dense_bytes = d * n * 8  # 96 MB: one dense copy of a view
    federated_sonmf(views, r, max_rounds=1, tol=0, random_state=0, tau=2)  # warm imports/caches
    tracemalloc.start()
    federated_sonmf(views, r, max_rounds=2, tol=0, random_state=0, tau=2)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < dense_bytes / 10, f"peak {peak / 1e6:.1f} MB"


def test_dense_float64_view_is_not_copied():
    from fedsonmf._validation import check_views

    X = np.random.default_rng(0).random((50, 8))
    (Xt,) = check_views([X], 3)
    assert np.shares_memory(Xt, X)
    S = sp.random(50, 8, density=0.3, format="csr", random_state=0)
    (St,) = check_views([S], 3)
    assert St.format == "csc" and np.shares_memory(St.data, S.data)


@pytest.mark.parametrize("sparse", [False, True])
def test_float32_input_stays_float32_and_is_close_to_float64(sparse):
    from fedsonmf._validation import check_views

    data = make_synthetic(n_clients=3, n_samples=60, n_features=15, rank=4, n_zero_rows=1, random_state=0)
    v64 = [sp.csr_matrix(v) if sparse else v for v in data.views]
    v32 = [v.astype(np.float32) for v in v64]
    assert all(X.dtype == np.float32 for X in check_views(v32, 4))
    kw = dict(max_rounds=8, tol=0, random_state=1, mu=0.5)
    a, b = federated_sonmf(v64, 4, **kw), federated_sonmf(v32, 4, **kw)
    assert b.V.dtype == np.float64
    assert np.linalg.norm(a.V - b.V) <= 1e-4 * np.linalg.norm(a.V)
    np.testing.assert_allclose(b.history.column("objective"), a.history.column("objective"), rtol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_mostly_zero_dense_view_is_stored_sparse_and_fits_as_its_sparse_copy(dtype):
    """Word counts or an adjacency list saved as a full array: the fit stores it CSC (the products
    are several times faster) and gives exactly the V of the same matrix given sparse; the Flower
    node's re-read (as_internal_view) stores it the same way."""
    from fedsonmf._validation import SPARSE_STORAGE_DENSITY, as_internal_view, check_views

    rng = np.random.default_rng(0)
    S = [sp.random(120, 60, density=0.03, format="csr", random_state=s, dtype=dtype) for s in range(2)]
    D = [X.toarray() for X in S]
    internal = check_views(D, 3)
    assert all(sp.issparse(X) and X.format == "csc" and X.dtype == dtype for X in internal)
    for X, Xi in zip(D, internal):
        np.testing.assert_array_equal(Xi.toarray(), X.T)
        R = as_internal_view(X)
        assert sp.issparse(R) and R.format == "csc" and np.array_equal(R.toarray(), X.T)
    kw = dict(max_rounds=6, tol=0, random_state=2)
    np.testing.assert_array_equal(federated_sonmf(D, 3, **kw).V, federated_sonmf(S, 3, **kw).V)
    # just above the line: the transposed array, no copy
    X = np.zeros((100, 10))
    X.flat[rng.choice(X.size, int(SPARSE_STORAGE_DENSITY * X.size) + 1, replace=False)] = 1.0
    (Xt,) = check_views([X], 3)
    assert isinstance(Xt, np.ndarray) and np.shares_memory(Xt, X)
    assert isinstance(as_internal_view(X), np.ndarray)
