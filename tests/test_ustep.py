import itertools

import numpy as np
import pytest
from conftest import random_feasible

from fedsonmf.core.objective import grad_u, stationarity_u
from fedsonmf.core.ustep import (
    PenaltyOptions,
    assignment_from_u,
    polish,
    proj_ob,
    round_st,
    solve_u,
    stiefel_residual,
    u_from_assignment,
)


def phi(X, V, U, Uk, rho1):
    return float(np.sum((X - U @ V) ** 2) + rho1 / 2 * np.sum((U - Uk) ** 2))


def _instance(rng, d, r, n, consistent=False):
    V = np.abs(rng.standard_normal((r, n)))
    if consistent:
        X = random_feasible(d, r, rng) @ V + 0.1 * rng.standard_normal((d, n))
    else:
        X = rng.standard_normal((d, n))
    return X, V, random_feasible(d, r, rng)


@pytest.mark.parametrize("seed", range(15))
@pytest.mark.parametrize("rho1", [0.0, 1.0])
def test_u_step_feasible_and_never_worse(seed, rho1):
    rng = np.random.default_rng(seed)
    d, r, n = 20, 6, 50
    X, V, Uk = _instance(rng, d, r, n, consistent=seed % 2 == 0)
    U, info = solve_u(2 * X @ V.T, 2 * V @ V.T, Uk, rho1)
    assert U.shape == (d, r)
    assert np.all(U >= 0)
    assert stiefel_residual(U) <= 1e-10
    assert phi(X, V, U, Uk, rho1) <= phi(X, V, Uk, Uk, rho1) + 1e-9
    assert info.gain >= 0


def test_phi_is_affine_on_the_feasible_set():
    # ALGORITHM.md §3.2: phi(U) = const - <U, 2XV^T + rho1 U^k> on S_+
    rng = np.random.default_rng(5)
    X, V, Uk = _instance(rng, 12, 4, 30)
    M = 2 * X @ V.T + 1.3 * Uk
    const = None
    for _ in range(5):
        U = random_feasible(12, 4, rng)
        c = phi(X, V, U, Uk, 1.3) + np.vdot(U, M)
        const = c if const is None else const
        assert np.isclose(c, const, rtol=1e-12)


_ASSIGNMENTS = None


def _brute_force_score(M):
    global _ASSIGNMENTS
    d, r = M.shape
    if _ASSIGNMENTS is None:
        _ASSIGNMENTS = [a for a in itertools.product(range(-1, r), repeat=d) if all(j in a for j in range(r))]
    return max(np.vdot(u_from_assignment(M, np.array(a)), M) for a in _ASSIGNMENTS)


def test_u_step_finds_brute_force_optimum_often():
    """>= 85 % of 60 tiny random instances (d=7, r=3) solved to global optimality."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(60):
        X, V, Uk = _instance(rng, 7, 3, 10)
        U, _ = solve_u(2 * X @ V.T, 2 * V @ V.T, Uk, 1.0)
        M = 2 * X @ V.T + 1.0 * Uk
        hits += np.vdot(U, M) >= _brute_force_score(M) - 1e-9
    assert hits >= 51, f"global optimum found in {hits}/60 instances"


def test_r_u_vanishes_at_solved_subproblem_and_is_large_elsewhere():
    rng = np.random.default_rng(7)
    small, large = [], []
    for _ in range(10):
        X, V, Uk = _instance(rng, 15, 4, 40, consistent=True)
        XVt, VVt = X @ V.T, V @ V.T
        U, _ = solve_u(2 * XVt, 2 * VVt, Uk, 0.0)
        small.append(stationarity_u(U, grad_u(U, XVt, VVt)))
        large.append(stationarity_u(Uk, grad_u(Uk, XVt, VVt)))
    assert max(small) < 1e-12
    assert np.median(large) > 1.0


def test_helpers():
    rng = np.random.default_rng(1)
    Y = rng.standard_normal((6, 3))
    Y[:, 2] = -np.abs(Y[:, 2])  # no positive entry: unit vector at the argmax
    P = proj_ob(Y)
    assert np.all(P >= 0) and np.allclose(np.linalg.norm(P, axis=0), 1)
    assert np.count_nonzero(P[:, 2]) == 1
    U = random_feasible(8, 3, rng)
    R, ok = round_st(U + 0.01 * rng.random((8, 3)))
    assert ok and stiefel_residual(R) < 1e-12 and np.array_equal(R > 0, U > 0)
    _, ok = round_st(np.tile([1.0, 0.1, 0.1], (4, 1)))
    assert not ok
    M = rng.standard_normal((8, 3))
    a = polish(M, assignment_from_u(U))
    assert all(np.any(a == j) for j in range(3))
    assert np.vdot(u_from_assignment(M, a), M) >= np.vdot(u_from_assignment(M, assignment_from_u(U)), M) - 1e-12


def test_without_penalty_option_still_feasible():
    rng = np.random.default_rng(2)
    X, V, Uk = _instance(rng, 20, 5, 30)
    U, info = solve_u(2 * X @ V.T, 2 * V @ V.T, Uk, 1.0, PenaltyOptions(use_penalty=False))
    assert info.inner_iterations == 0 and stiefel_residual(U) < 1e-10 and np.all(U >= 0)
