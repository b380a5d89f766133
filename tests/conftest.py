import os

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import settings

from fedsonmf.datasets import make_synthetic

# The property tests draw the same examples on every run by default (derandomize): a property that
# fails in CI fails again on any machine, and a passing suite stays green; the examples a property
# was proved on are still many and varied, only fixed.  HYPOTHESIS_PROFILE=explore draws fresh ones
# each run (and keeps the failures found in .hypothesis/), for hunting counterexamples.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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


def bad_planted_views(case: str):
    """The planted views with one defect (``case``)."""
    Xs = [X.copy() for X in planted()[0]]
    if case == "nan":
        Xs[1][2, 3] = np.nan
    elif case == "inf":
        Xs[2][0, 0] = -np.inf
    elif case == "sparse-nan":
        Xs[0][4, 1] = np.nan
        Xs[0] = sp.csr_array(Xs[0])
    elif case == "rows":
        Xs[1] = Xs[1][:-1]
    elif case == "1-D":
        Xs[1] = Xs[1][:, 0]
    elif case == "3-D":
        Xs[1] = Xs[1][:, :, None]
    elif case == "zeros":
        Xs[1] = np.zeros_like(Xs[1])
    elif case == "strings":
        Xs[1] = Xs[1].astype(str)
    elif case == "empty":
        Xs[2] = Xs[2][:, :0]
    elif case == "no-views":
        return []
    elif case == "not-a-list":
        return Xs[0]
    return Xs


#: (case of bad_planted_views, the message it must give) -- the comparison methods' bad-view tests
BAD_PLANTED_VIEWS = [
    ("nan", r"view 1 contains NaN or Inf"), ("inf", r"view 2 contains NaN or Inf"),
    ("sparse-nan", r"view 0 contains NaN or Inf"), ("rows", r"different numbers of samples \(rows\): \[45, 44, 45\]"),
    ("1-D", r"view 1 must be 2-D"), ("3-D", r"view 1 must be 2-D"), ("zeros", r"view 1 is all zeros"),
    ("strings", r"view 1 must hold real numbers"), ("empty", r"view 2 is empty"), ("no-views", r"Xs is empty"),
    ("not-a-list", r"must be a list of views"),
]


def assert_correction_identity(Vbar_next, clients, eta_tilde: float) -> None:
    """After a round: Vbar^{s+1} = V^s - eta_tilde G^s (the clients' mean kept gradient) and the next
    corrections sum to zero (docs/algorithm.md §4.2, §5); ``clients``: the ClientRuntimes."""
    from fedsonmf.core.vstep import drift_correction

    V_s = clients[0].state.arrays["V_prev"]
    G = np.mean([c.state.arrays["G_prev"] for c in clients], axis=0)
    np.testing.assert_allclose(Vbar_next, V_s - eta_tilde * G, atol=1e-9)
    C = [drift_correction(c.state.arrays["V_prev"], Vbar_next, eta_tilde, c.state.arrays["G_prev"]) for c in clients]
    assert np.abs(np.sum(C, axis=0)).max() <= 1e-9 * max(1.0, np.abs(C).max())


@pytest.fixture
def task_identity():
    """Outside a Flower runtime, Message(...) needs the task identity set (internal API); tests that build
    Flower messages by hand ask for it."""
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old
