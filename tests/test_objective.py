import numpy as np
import scipy.sparse as sp

from conftest import random_feasible
from fedsonmf.core._linalg import ut_x, x_vt
from fedsonmf.core.objective import grad_u, grad_v, loss, objective, stationarity_u


def _taylor_slope(f, grad, x, rng):
    """Slope of log|f(x+tD) - f(x) - t<g,D>| vs log t: 2 for a correct gradient."""
    D = rng.standard_normal(x.shape)
    g = np.vdot(grad, D)
    ts = np.logspace(-1, -5, 9)
    errs = np.array([abs(f(x + t * D) - f(x) - t * g) for t in ts])
    return np.polyfit(np.log(ts), np.log(errs), 1)[0]


def test_grad_v_taylor():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((9, 15))
    U = rng.standard_normal((9, 3))  # any U, not only feasible ones
    V = rng.standard_normal((3, 15))
    G = grad_v(U.T @ U, U.T @ X, V)
    slope = _taylor_slope(lambda W: loss(X, U, W), G, V, rng)
    assert 1.9 < slope < 2.1


def test_grad_u_taylor():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((9, 15))
    U = rng.standard_normal((9, 3))
    V = rng.standard_normal((3, 15))
    G = grad_u(U, X @ V.T, V @ V.T)
    def f(W):
        return float(np.sum((X - W @ V) ** 2))
    slope = _taylor_slope(f, G, U, rng)
    assert 1.9 < slope < 2.1


def test_grad_v_is_2_lipschitz_for_orthonormal_u():
    rng = np.random.default_rng(2)
    U = random_feasible(10, 4, rng)
    X = rng.standard_normal((10, 20))
    V1, V2 = rng.standard_normal((2, 4, 20))
    g1 = grad_v(U.T @ U, ut_x(U, X), V1)
    g2 = grad_v(U.T @ U, ut_x(U, X), V2)
    np.testing.assert_allclose(np.linalg.norm(g1 - g2) / np.linalg.norm(V1 - V2), 2.0, rtol=1e-12)


def test_loss_expansion_matches_direct_dense_and_sparse():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((8, 30)) * (rng.random((8, 30)) < 0.3)
    U = random_feasible(8, 3, rng)
    V = np.abs(rng.standard_normal((3, 30)))
    direct = float(np.sum((X - U @ V) ** 2))
    assert np.isclose(loss(X, U, V), direct, rtol=1e-12)
    assert np.isclose(loss(sp.csr_matrix(X), U, V), direct, rtol=1e-12)
    np.testing.assert_allclose(ut_x(U, sp.csr_matrix(X)), U.T @ X, atol=1e-13)
    np.testing.assert_allclose(x_vt(sp.csr_matrix(X), V), X @ V.T, atol=1e-13)
    assert np.isclose(objective([X], [U], V, 0.5), direct + 0.5 * np.sum(np.linalg.norm(V, axis=1)))


def test_stationarity_u_zero_iff_normal_cone():
    rng = np.random.default_rng(4)
    U = random_feasible(7, 3, rng)
    # G in the normal cone: multiples of U on supports (none here are zero rows)
    G = U * rng.standard_normal(3)
    assert stationarity_u(U, G) < 1e-24
    # a tangent component on the support counts
    H = G.copy()
    i = np.flatnonzero(U[:, 0] > 0)[:2]
    H[i[0], 0] += 1.0
    H[i[1], 0] -= U[i[0], 0] / U[i[1], 0]  # keep orthogonal to U_{.0}? only approximately
    assert stationarity_u(U, H) > 1e-3
    # entries in a row owned by another column are free
    K = G.copy()
    j = int(np.argmax(U[0]))
    K[0, (j + 1) % 3] += 5.0
    assert stationarity_u(U, K) < 1e-24
    # on a zero row only negative entries count
    U2 = U.copy()
    U2[0] = 0
    U2 /= np.linalg.norm(U2, axis=0)
    G2 = U2 * 1.0
    G2[0] = [1.0, -2.0, 3.0]
    assert np.isclose(stationarity_u(U2, G2), 4.0)
