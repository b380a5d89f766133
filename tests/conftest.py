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
