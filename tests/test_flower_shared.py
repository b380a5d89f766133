"""One loopback deployment serving many fits: its daemons start once (a module-scoped fixture),
several estimators fit on it through ``Flower(deployment=...)``, each fit its own Flower run,
job and out-dir, each equal to the in-process fit.  Slow (real daemons), run in CI."""

import numpy as np
import pytest

pytest.importorskip("flwr")

from sklearn.base import clone  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from fedsonmf.estimators import FedMultiViewClustering  # noqa: E402
from fedsonmf.estimators.options import Flower, from_flat  # noqa: E402
from fedsonmf.exceptions import InputError, ParameterError  # noqa: E402
from fedsonmf.federation.flower import LoopbackDeployment, run_flower, write_views  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

SEED = 7


def _blobs(n_per=15, seed=0):
    """Three planted clusters seen by three dense views, each at least 2c = 6 wide."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), n_per)
    views = []
    for d in (12, 9, 8):
        centers = np.zeros((3, d))
        for k in range(3):
            centers[k, (k * d) // 3:((k + 1) * d) // 3] = 1.0
        views.append(centers[y] + 0.3 * rng.random((y.size, d)))
    return views


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    views = _blobs()
    with LoopbackDeployment(root / "run", write_views(views, root / "views")) as dep:
        yield dep, views
    assert dep.superlink is not None and dep.superlink.poll() is not None  # stopped on leaving the block


def _model(c, **kw):
    return FedMultiViewClustering(c, max_rounds=3, tol=0.0, random_state=SEED, n_init=1, **kw)


def test_several_estimators_fit_on_one_deployment_without_restarting_it(shared):
    dep, views = shared
    daemons = {"superlink": dep.superlink.pid, **{p: n.pid for p, n in dep.nodes.items()}}
    fed = Flower(deployment=dep)
    models = [_model(c, federation=fed).fit(views) for c in (2, 3)]
    assert {"superlink": dep.superlink.pid, **{p: n.pid for p, n in dep.nodes.items()}} == daemons
    assert dep.superlink.poll() is None and all(n.poll() is None for n in dep.nodes.values())
    outs = [m.result_.extra["flower"]["out_dir"] for m in models]
    assert len(set(outs)) == 2 and all(o.startswith(str(dep.run_dir / "fits")) for o in outs)
    assert all(m.result_.extra["flower"]["shared_deployment"] for m in models)
    for c, model in zip((2, 3), models):
        with threadpool_limits(1):  # secure aggregation, as the deployment's nodes require
            ref = _model(c, **from_flat({"secure_aggregation": True})).fit(views)
        assert np.array_equal(model.labels_, ref.labels_) and np.array_equal(model.result_.V, ref.result_.V)
    assert clone(models[0]).federation.deployment is dep  # a clone shares the running deployment
    with pytest.raises(ParameterError, match="shared deployment"):
        models[0].predict(views)


def test_a_fit_on_other_views_or_without_the_nodes_policy_is_refused_before_it_runs(shared):
    dep, views = shared
    runs = dep._runs
    other = [v.copy() for v in views]
    other[1][0, 0] += 1.0
    with pytest.raises(InputError, match="view 1 is not the file"):
        _model(2, federation=Flower(deployment=dep)).fit(other)
    with pytest.raises(ParameterError, match="require secure aggregation"):
        run_flower(dep.view_paths, FedConfig(n_components=4), deployment=dep, n_clusters=2,
                   secure_aggregation=False)
    with pytest.raises(ParameterError, match="not the deployment's run folder"):
        run_flower(dep.view_paths, FedConfig(n_components=4), deployment=dep, n_clusters=2,
                   run_dir=dep.run_dir / "elsewhere")
    assert dep._runs == runs  # nothing was submitted
