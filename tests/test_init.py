"""The bases' start (core.init): what each ``init_u`` returns, and what "auto" means where."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import planted
from fedsonmf import FedMultiViewClustering, federated_sonmf
from fedsonmf.core.init import CLUSTERING_INIT_U, INIT_U, init_basis, resolve_init_u, svd_basis
from fedsonmf.core.ustep_patterns import stiefel_residual
from fedsonmf.estimators.options import MethodOptions
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.params import default


def _in_s_plus(U):
    """U >= 0 with orthonormal columns: a point of S_+ (the bound of round_st's test in test_ustep.py)."""
    return np.all(U >= 0) and stiefel_residual(U) < 1e-12


def test_auto_means_random_supports_in_a_factorisation_and_singular_vectors_in_a_clustering_fit():
    assert default("init_u") == "auto" and "auto" in INIT_U
    assert resolve_init_u("auto", clustering=False) == "random"
    assert resolve_init_u("auto", clustering=True) == CLUSTERING_INIT_U == "svd"
    for value in ("random", "svd"):  # an explicit choice is kept everywhere
        assert resolve_init_u(value, clustering=True) == resolve_init_u(value, clustering=False) == value
    assert FedConfig().init_u == "auto"  # kept as given: the clustering layer resolves it for its fits
    with pytest.raises(ValueError, match="init_u"):
        FedConfig(init_u="pca")


def test_auto_factorisation_is_the_random_start_bit_for_bit(small_problem):
    a = federated_sonmf(small_problem.views, 4, max_rounds=3, tol=0, random_state=0)
    b = federated_sonmf(small_problem.views, 4, max_rounds=3, tol=0, random_state=0, init_u="random")
    assert np.array_equal(a.V, b.V)


def test_a_clustering_fit_starts_from_the_singular_vectors_by_default():
    """In process here; the Flower ServerApp resolves "auto" the same way for a clustering run
    (tests/test_flower_cluster.py sends the default FedConfig and gets the estimator's V)."""
    Xs, _ = planted(seed=1)
    kw = dict(n_init=2, max_rounds=4, tol=0, random_state=0)
    auto = FedMultiViewClustering(3, **kw).fit(Xs)
    svd = FedMultiViewClustering(3, **kw, method=MethodOptions(init_u="svd")).fit(Xs)
    rand = FedMultiViewClustering(3, **kw, method=MethodOptions(init_u="random")).fit(Xs)
    assert auto.get_params()["method"] is None  # the parameter is not rewritten (scikit-learn's contract)
    assert auto.factorization_.init_u == "svd"
    assert np.array_equal(auto.result_.V, svd.result_.V) and np.array_equal(auto.labels_, svd.labels_)
    assert not np.array_equal(auto.result_.V, rand.result_.V)


@settings(max_examples=30, deadline=None)
@given(d=st.integers(4, 30), n=st.integers(4, 25), r=st.integers(1, 4), seed=st.integers(0, 2**16),
       signed=st.booleans(), sparse=st.booleans())
def test_every_start_is_a_point_of_s_plus(d, n, r, seed, signed, sparse):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((d, n)) if signed else rng.random((d, n))
    X = sp.csr_matrix(X) if sparse else X
    for method in INIT_U:
        U = init_basis(X, min(r, d), method, np.random.default_rng(seed))
        assert U.shape == (d, min(r, d)) and _in_s_plus(U), method


def test_svd_start_finds_planted_feature_groups():
    """Block-diagonal data (feature group j used only by sample group j, distinct strengths): the
    singular vectors are the blocks', so each rounded column is supported on exactly one group."""
    rng = np.random.default_rng(0)
    groups, d_g, n_g = 4, 6, 10
    X = np.zeros((groups * d_g, groups * n_g))
    for j in range(groups):
        X[j * d_g:(j + 1) * d_g, j * n_g:(j + 1) * n_g] = (j + 1) * (1.0 + 0.1 * rng.random((d_g, n_g)))
    U = svd_basis(X, groups, np.random.default_rng(1))
    assert _in_s_plus(U)
    supports = [set(np.flatnonzero(U[:, k]) // d_g) for k in range(groups)]
    assert sorted(s.pop() for s in supports if len(s) == 1) == list(range(groups))
