import doctest

import numpy as np
import pytest
from scipy.optimize import minimize

import fedsonmf.core.prox as prox_mod
from fedsonmf.core.prox import l21_norm, prox_l21_nonneg


def _numeric_prox_value(z, t):
    """min_{v>=0} t||v|| + 1/2||v-z||^2 by L-BFGS-B from several starts."""
    def f(v):
        return t * np.sqrt(v @ v + 1e-300) + 0.5 * np.sum((v - z) ** 2)
    best = np.inf
    for x0 in (np.maximum(z, 0), np.full_like(z, 0.1), np.zeros_like(z) + 1e-6):
        res = minimize(f, x0, method="L-BFGS-B", bounds=[(0, None)] * len(z), options={"ftol": 1e-14, "gtol": 1e-10})
        best = min(best, res.fun)
    return best, f


def test_doctests():
    assert doctest.testmod(prox_mod).failed == 0


@pytest.mark.parametrize("seed", range(20))
def test_prox_is_optimal_against_numerical_solution(seed):
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((4, 6)) * rng.uniform(0.2, 3)
    t = rng.uniform(0, 2)
    P = prox_l21_nonneg(Z, t)
    for i in range(Z.shape[0]):
        val, f = _numeric_prox_value(Z[i], t)
        assert f(P[i]) <= val + 1e-8


def test_prox_optimality_conditions():
    # KKT of the row problem: for a nonzero row v, v - z_+ + t v/||v|| = 0 on the positive part.
    rng = np.random.default_rng(1)
    Z = rng.standard_normal((50, 8))
    t = 0.7
    P = prox_l21_nonneg(Z, t)
    assert np.all(P >= 0)
    for z, v in zip(Z, P):
        zp = np.maximum(z, 0)
        if np.linalg.norm(zp) <= t:
            assert np.all(v == 0)
        else:
            np.testing.assert_allclose(v - zp + t * v / np.linalg.norm(v), 0, atol=1e-12)


def test_prox_nonexpansive():
    rng = np.random.default_rng(2)
    for _ in range(500):
        Z, W = rng.standard_normal((2, 5, 7))
        t = rng.uniform(0, 3)
        assert np.linalg.norm(prox_l21_nonneg(Z, t) - prox_l21_nonneg(W, t)) <= np.linalg.norm(Z - W) + 1e-12


def test_zero_threshold_is_projection_and_input_untouched():
    Z = np.array([[1.0, -2.0], [-0.5, 3.0]])
    Z0 = Z.copy()
    np.testing.assert_array_equal(prox_l21_nonneg(Z, 0.0), np.maximum(Z, 0))
    np.testing.assert_array_equal(Z, Z0)


def test_prox_does_not_commute_with_averaging():
    # docs/algorithm.md §2: the reason for variable splitting.
    z1, z2 = np.array([[2.0]]), np.array([[-2.0]])
    t = 0.5
    avg_then_prox = prox_l21_nonneg((z1 + z2) / 2, t)
    prox_then_avg = (prox_l21_nonneg(z1, t) + prox_l21_nonneg(z2, t)) / 2
    assert avg_then_prox[0, 0] == 0 and prox_then_avg[0, 0] == 0.75


def test_negative_threshold_rejected():
    with pytest.raises(ValueError, match="threshold"):
        prox_l21_nonneg(np.ones((2, 2)), -1.0)


def test_l21_norm_rows():
    assert l21_norm(np.array([[3.0, 4.0], [0.0, 1.0]])) == pytest.approx(6.0)
