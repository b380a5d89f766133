"""The stages after the fit run by one driver (fedsonmf.pipeline.stages.finish_clustering) for both engines."""

import numpy as np
import pytest

from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import RefineOptions, flat
from fedsonmf.exceptions import FederationError
from fedsonmf.pipeline.policy import NodePolicy, RefineExchange
from fedsonmf.pipeline.stages import STAGE_EXCHANGES, STAGE_OPTIONS, finish_clustering
from fedsonmf.pipeline.steps import cluster_embedding

C = 3


def _views(seed=0, n_per=20):
    """Three dense views of three planted clusters (every view scores in the k-means refinement)."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(C), n_per)
    views = []
    for d in (9, 8, 7):
        centers = np.zeros((C, d))
        for k in range(C):
            centers[k, (k * d) // C:((k + 1) * d) // C] = 1.0
        views.append(1.0 + centers[y] + 0.8 * rng.random((y.size, d)))
    return views


def _lost_at(call: int, graph, products, both):
    """The graph stage's exchanges, sharing one count of calls: the ``call``-th raises (a node lost)."""
    count = [0]

    def failing(fn):
        def exchange(*args):
            count[0] += 1
            if count[0] == call:
                raise FederationError("client 1 (node 7) did not reply within 30 s", client=1)
            return fn(*args)
        return exchange

    return failing(graph), failing(products), failing(both)


def test_without_exchanges_the_fits_partition_and_centres_stand():
    V = np.abs(np.random.default_rng(1).standard_normal((4, 30)))
    labels, centers, _ = cluster_embedding(V, C, seed=0)
    opts = {key: flat(FedMultiViewClustering().get_params())[key] for key in STAGE_OPTIONS}
    out, out_centers, report = finish_clustering(V, labels, centers, C, seed=0, opts=opts)
    assert out is labels and out_centers is centers
    assert report == {"refine_iterations": 0, "refine_start": None, "graph_iterations": 0, "spectral_kept": False,
                      "graph_chosen": "", "spectral_steps": 0, "exchanges": dict.fromkeys(STAGE_EXCHANGES, 0),
                      "notes": [], "error": None}


def test_a_node_lost_in_the_graph_stage_keeps_the_same_partition_on_both_engines(monkeypatch, tmp_path):
    """A node lost at the graph stage's second exchange: the in-process estimator warns and keeps the
    lowest cut the graph refinement had met, and the ServerApp's step (write_clustering_outputs), over the
    same V, seed and exchanges, writes the same labels and centres and reports the same counts."""
    pytest.importorskip("flwr")
    from fedsonmf.federation.flower import clustering as fclust

    views = _views()
    graph0 = FedMultiViewClustering._graph_exchanges
    monkeypatch.setattr(FedMultiViewClustering, "_graph_exchanges",
                        lambda self, v, masks, secure: _lost_at(2, *graph0(self, v, masks, secure)))
    with pytest.warns(RuntimeWarning, match="ended early .*did not reply"):
        m = FedMultiViewClustering(C, n_init=1, max_rounds=30, random_state=2).fit(views)
    assert m.refine_iter_[0] > 0 and m.graph_iter_ == [0] and m.spectral_kept_ == [False]
    monkeypatch.undo()

    exchanges = m._graph_exchanges(views, None, secure=False)
    summary = fclust.write_clustering_outputs(tmp_path, m.embedding_.T, fclust.clustering_options({"n-clusters": C}),
                                              m.seeds_[m.best_restart_], m._refine_exchange(views, None, False),
                                              *_lost_at(2, *exchanges))
    assert np.array_equal(fclust.read_labels_csv(tmp_path / "labels.csv"), m.labels_)
    assert np.array_equal(np.load(tmp_path / "centers.npy"), m.cluster_centers_)
    assert summary["refine_iterations"] == m.refine_iter_[0] and summary["refine_start"] == m.refine_start_[0]
    assert summary["graph_iterations"] == 0 and "did not reply" in summary["refine_error"]


def test_a_policy_that_refuses_the_seeding_leaves_a_note_and_the_starts_go_on():
    """A client minimum of 2 samples per cluster refuses the seeded starts' partitions (each puts drawn
    samples alone in a cluster): the driver drops the seeding with a note and refines the other starts,
    ending where the refinement without seeded starts ends."""
    views = _views(seed=3)
    m = FedMultiViewClustering(C, n_init=1, max_rounds=30, random_state=0, refine="kmeans",
                               refinement=RefineOptions(seeded_starts=0)).fit(views)
    V, seed = m.embedding_.T, m.seeds_[0]
    labels, centers, _ = cluster_embedding(V, C, seed=seed)
    opts = {key: flat(m.get_params())[key] for key in STAGE_OPTIONS} | {"refine_seeded_starts": 3}
    policy = NodePolicy(C, [2, 1, 1])
    refine = RefineExchange(m._refine_exchange(views, None, False), C, policy)
    out, _, report = finish_clustering(V, labels, centers, C, seed=seed, opts=opts, refine=refine, policy=policy)
    assert "seeded starts skipped" in report["notes"][0] and "refine-min-cluster-size = 2" in report["notes"][0]
    assert report["error"] is None and np.array_equal(out, m.labels_)
    assert report["refine_start"] == m.refine_start_[0]
