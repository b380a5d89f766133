import numpy as np
import pytest

from fedsonmf.datasets import make_synthetic


@pytest.fixture(scope="session")
def small_problem():
    """A small planted problem: 4 clients, n=40, d=12, r=4 (fast)."""
    return make_synthetic(n_clients=4, n_samples=40, n_features=12, rank=4, n_zero_rows=1,
                          heterogeneity=0.6, random_state=3)


def random_feasible(d, r, rng):
    """A random point of S_+ (nonnegative, orthonormal columns)."""
    cols = rng.permutation(np.arange(d) % r)
    U = np.zeros((d, r))
    U[np.arange(d), cols] = rng.uniform(0.5, 1.0, d)
    return U / np.linalg.norm(U, axis=0)


def planted(n_per=15, c=3, dims=(12, 9, 10), seed=0):
    """Views whose features are split into c disjoint blocks, one per cluster."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(c), n_per)
    views = []
    for d in dims:
        X = 0.01 * rng.random((y.size, d))
        blocks = np.array_split(np.arange(d), c)
        for k in range(c):
            X[np.ix_(y == k, blocks[k])] += 1.0 + rng.random(((y == k).sum(), blocks[k].size))
        views.append(X)
    return views, y
