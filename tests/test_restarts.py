"""How the restarts of a clustering fit are combined (fedsonmf.pipeline.restarts): the medoid of their
partitions, label-free, from what the server has."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score

from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import MethodOptions
from fedsonmf.exceptions import ParameterError
from fedsonmf.pipeline.restarts import final_objective, medoid_restart
from fedsonmf.protocol.history import History


class _Res:  # the part of a FitResult the rules read
    def __init__(self, objective):
        self.history = History([{"round": 1, "objective": objective}])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 6))
def test_the_medoid_maximises_the_summed_agreement(seed, k):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 3, size=30)
    parts = []
    for _ in range(k):  # noisy copies of one partition, some far noisier
        p = truth.copy()
        flip = rng.random(30) < rng.choice([0.05, 0.6])
        p[flip] = rng.integers(0, 3, size=int(flip.sum()))
        parts.append(p)
    i = medoid_restart(parts)
    agree = [sum(adjusted_rand_score(a, b) for j, b in enumerate(parts) if j != m) for m, a in enumerate(parts)]
    assert agree[i] == pytest.approx(max(agree))
    assert medoid_restart([p[::-1] for p in parts]) == i  # the same samples reordered: the same restart
    relabel = [(p + 1) % 3 for p in parts]  # renaming the clusters changes nothing
    assert medoid_restart(relabel) == i


def test_a_lone_bad_restart_is_never_the_medoid_and_two_tie_on_the_objective():
    good = np.repeat(np.arange(3), 10)
    bad = np.tile(np.arange(3), 10)
    assert medoid_restart([bad, good, good.copy()]) in (1, 2)
    assert medoid_restart([good, bad], [_Res(2.0), _Res(1.0)]) == 1  # a tie: the lower objective
    assert medoid_restart([good, bad]) == 0  # no objective: the first
    with pytest.raises(ValueError):
        medoid_restart([])


def test_a_fit_without_rows_has_no_objective():
    assert np.isnan(final_objective(type("R", (), {"history": History()})()))


def _views(seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), 15)
    return [rng.normal(size=(3, d))[y] * 2 + rng.normal(size=(45, d)) for d in (8, 6)], y


def test_the_estimator_keeps_one_real_fit():
    views, _ = _views()
    m = FedMultiViewClustering(3, random_state=0, max_rounds=15).fit(views)
    assert m.n_init_ == 5 and len(m.seeds_) == 5
    assert m.best_restart_ in range(5) and m.seed_ == m.seeds_[m.best_restart_]
    assert len(m.refine_iter_) == 1  # only the kept fit is refined
    seed = m.seeds_[m.best_restart_]
    alone = FedMultiViewClustering(3, random_state=seed, max_rounds=15, n_init=1).fit(views)
    assert np.array_equal(alone.result_.V, m.result_.V)  # the kept restart is that seed's fit
    assert np.array_equal(alone.labels_, m.labels_)
    assert np.array_equal(alone.predict(views), m.predict(views))  # and its bases and centres


def test_n_init_auto_is_one_fit_without_an_objective_and_checks_its_input():
    views, _ = _views(1)
    silent = FedMultiViewClustering(3, random_state=0, max_rounds=5, tol=0.0,
                                    method=MethodOptions(diagnostics=False)).fit(views)
    assert silent.n_init_ == 1
    assert FedMultiViewClustering(3, random_state=0, max_rounds=5, n_init=2).fit(views).n_init_ == 2
    for bad in (0, "three", 1.5):
        with pytest.raises(ParameterError, match="n_init"):
            FedMultiViewClustering(3, n_init=bad).fit(views)


def test_restarts_in_threads_give_the_same_fit_as_one_after_the_other():
    """n_jobs=2: the n_init fits run two at a time in threads; every restart's V, the kept restart,
    the refined labels and the centres are those of the sequential run (seeded, BLAS on one thread)."""
    from threadpoolctl import threadpool_limits

    from fedsonmf.datasets import make_synthetic

    data = make_synthetic(n_clients=3, n_samples=60, n_features=12, rank=3, heterogeneity=0.4, random_state=4)
    kw = dict(n_init=3, max_rounds=6, random_state=3)
    with threadpool_limits(1):
        one = FedMultiViewClustering(3, **kw).fit(data.views)
        two = FedMultiViewClustering(3, n_jobs=2, **kw).fit(data.views)
        seen, alone = [], []
        three = FedMultiViewClustering(3, n_jobs=2, **kw).fit(data.views, callback=seen.append)
        FedMultiViewClustering(3, **kw).fit(data.views, callback=alone.append)
    for m in (two, three):
        assert m.best_restart_ == one.best_restart_ and m.seeds_ == one.seeds_
        assert np.array_equal(m.labels_, one.labels_) and np.array_equal(m.cluster_centers_, one.cluster_centers_)
        assert np.array_equal(m.embedding_, one.embedding_)
    # a callback does not stop the threads: every row says whose it is, and each restart's rows
    # (possibly interleaved with another's) are the rows of the sequential run, in order
    assert alone == sorted(alone, key=lambda r: r["restart"]) and {r["n_restarts"] for r in seen + alone} == {3}
    def timeless(rows, i):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows if r["restart"] == i]

    for i in range(3):
        mine = timeless(seen, i)
        assert mine == timeless(alone, i) and [r["round"] for r in mine] == list(range(1, len(mine) + 1))


def test_a_failing_restart_in_a_thread_stops_the_others():
    """n_jobs=2: when one restart fails (here its callback raises, as Ctrl-C would in the CLI), fit
    raises that error at once; the queued restarts never start and the running one stops at its next
    round instead of running every remaining round."""
    from fedsonmf.datasets import make_synthetic

    data = make_synthetic(n_clients=3, n_samples=60, n_features=12, rank=3, random_state=4)
    seen = []

    class Stop(Exception):
        pass

    def callback(row):
        seen.append(row)
        if row["restart"] == 0 and row["round"] == 2:
            raise Stop

    with pytest.raises(Stop):
        FedMultiViewClustering(3, n_init=4, n_jobs=2, max_rounds=400, tol=0.0, random_state=0).fit(
            data.views, callback=callback)
    per = {i: sum(r["restart"] == i for r in seen) for i in range(4)}
    assert per[0] == 2 and per[1] < 400 and per[2] + per[3] <= 2, per


def test_the_whole_pipeline_runs_under_the_fits_blas_limit(monkeypatch):
    """blas_threads="auto" pins BLAS to one thread on small data for the whole fit -- preprocessing,
    the factorisations, k-means on V, the refinements -- not only the factorisation: with more threads
    BLAS sums round differently and a seed's restart medoid can flip (3Sources, seed 5), so the labels
    would depend on the machine's cores and differ from the Flower engine (one thread everywhere).
    Called under a limit of 2, k-means and the refinements see 1 and the labels are those of 1."""
    from threadpoolctl import threadpool_info, threadpool_limits

    import fedsonmf.estimators.clustering as clustering
    import fedsonmf.pipeline.stages as stages
    from fedsonmf.datasets import make_synthetic

    seen: list[int] = []

    def spy(fn):
        def call(*args, **kwargs):
            seen.extend(int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas")
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(clustering, "kmeans_on_embedding", spy(clustering.kmeans_on_embedding))
    monkeypatch.setattr(stages, "refine_best", spy(stages.refine_best))  # the stage driver's refinement
    data = make_synthetic(n_clients=3, n_samples=60, n_features=12, rank=3, heterogeneity=0.4, random_state=4)
    kw = dict(n_init=3, max_rounds=6, random_state=3)
    with threadpool_limits(2, user_api="blas"):
        two = FedMultiViewClustering(3, **kw).fit(data.views)
    assert seen and set(seen) == {1}
    with threadpool_limits(1, user_api="blas"):
        one = FedMultiViewClustering(3, **kw).fit(data.views)
    assert np.array_equal(two.labels_, one.labels_) and np.array_equal(two.embedding_, one.embedding_)
