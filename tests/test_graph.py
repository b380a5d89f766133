"""The federated graph refinement (fedsonmf.pipeline.graph): each client's neighbour counts from
its own k-NN graph, summed by the server, are weighted kernel k-means for the normalized cut of
the summed graph."""

import os
import stat

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsonmf.core.server import total
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import PrivacyOptions, RefineOptions
from fedsonmf.exceptions import ParameterError, ProtocolError
from fedsonmf.metrics import clustering_scores
from fedsonmf.pipeline.graph import (
    MAX_NEIGHBORS,
    client_graph,
    client_links,
    graph_assign,
    graph_neighbors,
    graph_refine,
    normalized_cut,
)
from fedsonmf.pipeline.refine import refine_stages
from test_refine import _views  # the same planted dense, signed views


def _exchange(graphs, c):
    return lambda labels: total([client_links(A, labels, c) for A in graphs])


def test_the_graph_is_the_symmetric_knn_graph_of_the_unit_rows():
    views, _ = _views()
    X = views[0]
    n, k = X.shape[0], 4
    A = client_graph(X, n_neighbors=k).toarray()
    assert np.array_equal(A, A.T) and set(np.unique(A)) <= {0.0, 1.0} and not np.any(np.diag(A))
    Y = X / np.linalg.norm(X, axis=1, keepdims=True)
    dist = ((Y[:, None, :] - Y[None, :, :]) ** 2).sum(-1) + np.diag(np.full(n, np.inf))
    knn = np.argsort(dist, axis=1)[:, :k]
    for i in range(n):  # every sample joined to its k nearest by cosine, and nothing else chosen by it
        assert A[i, knn[i]].all()
        chosen_by_others = {j for j in range(n) if i in knn[j]}
        assert set(np.flatnonzero(A[i])) == set(knn[i]) | chosen_by_others
    assert np.array_equal(client_graph(sp.csr_matrix(X), n_neighbors=k).toarray(), A)  # dense = sparse
    assert np.array_equal(client_graph(3.0 * X, n_neighbors=k).toarray(), A)  # per-sample scale-free


def test_missing_and_empty_samples_get_no_edges_and_k_follows_the_rule():
    views, _ = _views()
    X = views[0].copy()
    X[3] = 0.0
    A = client_graph(X, held=np.arange(1, X.shape[0])).toarray()
    assert not A[[0, 3]].any() and not A[:, [0, 3]].any()
    assert (A.sum(axis=1)[np.r_[1, 2, 4:X.shape[0]]] >= min(graph_neighbors(X.shape[0]), X.shape[0] - 3)).all()
    assert graph_neighbors(100) == 10 and graph_neighbors(2**14) == 14 and graph_neighbors(5) == 4
    assert client_graph(np.ones((1, 3))).nnz == 0


def test_k_rises_to_half_the_mean_cluster_size_of_the_held_samples_up_to_the_cap():
    """Given c, k is half the mean cluster size of the held samples where that exceeds the
    reference's rule, at most MAX_NEIGHBORS; never below the reference's rule, never n or more."""
    assert graph_neighbors(400, 40) == 10  # 40 faces of 10: the reference's k
    assert graph_neighbors(210, 7) == 15 and graph_neighbors(685, 5) == MAX_NEIGHBORS
    assert graph_neighbors(2**14, 2) == MAX_NEIGHBORS and graph_neighbors(2**40, 2) == 40  # log2 n above the cap
    assert graph_neighbors(1000, 5, n_held=100) == 10 and graph_neighbors(1000, 5, n_held=300) == MAX_NEIGHBORS
    assert graph_neighbors(30, 1) == 15 and graph_neighbors(8, 1) == 7  # at most n - 1
    views, _ = _views()
    X = views[0]
    n = X.shape[0]
    A = client_graph(X, n_clusters=1)  # one cluster: as many neighbours as the cap (or n - 1) allows
    k = graph_neighbors(n, 1)
    assert k > graph_neighbors(n) and np.array_equal(A.toarray(), client_graph(X, n_neighbors=k).toarray())
    held = np.arange(0, n, 3)  # a third of the samples: k from their count
    B = client_graph(X, held=held, n_clusters=1).toarray()
    assert np.array_equal(B, client_graph(X, held=held, n_neighbors=graph_neighbors(n, 1, held.size)).toarray())


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_the_assignment_is_weighted_kernel_kmeans_for_the_normalized_cut(seed):
    """graph_assign from the summed links = argmin over k of the weighted kernel k-means distance
    with weights d and kernel D^-1 A D^-1, computed here from the whole graph (Dhillon et al. 2004)."""
    rng = np.random.default_rng(seed)
    n, c = int(rng.integers(6, 30)), int(rng.integers(2, 5))
    graphs = []
    for _ in range(2):
        B = (rng.random((n, n)) < 0.3).astype(float)
        B = np.triu(B, 1)
        graphs.append(sp.csr_array(B + B.T + np.eye(n)))  # self-loops: every degree positive
    labels = rng.integers(0, c, size=n)
    L = _exchange(graphs, c)(labels)
    A = sum(g.toarray() for g in graphs)
    d = A.sum(axis=1)
    assert np.allclose(L.sum(axis=1) * n, d)
    K = A / np.outer(d, d)
    dist = np.full((n, c), np.inf)
    for k in range(c):
        members = labels == k
        if not members.any():
            continue
        w = d[members]
        dist[:, k] = (np.diag(K) - 2 * K[:, members] @ w / w.sum()
                      + w @ K[np.ix_(members, members)] @ w / w.sum() ** 2)
    new = graph_assign(L, labels, c)
    assert np.allclose(dist[np.arange(n), new], dist.min(axis=1))
    # the cut from the links is the normalized cut of the summed graph
    cut = sum((d[labels == k].sum() - A[np.ix_(labels == k, labels == k)].sum()) / d[labels == k].sum()
              for k in range(c) if (labels == k).any())
    assert normalized_cut(L, labels, c) == pytest.approx(cut)
    assert np.array_equal(graph_assign(0.125 * L, labels, c), new)  # sums or means (exact scale): the same step


def test_planted_communities_are_recovered_from_a_scrambled_start():
    rng = np.random.default_rng(1)
    c, n_per = 4, 25
    y = np.repeat(np.arange(c), n_per)
    graphs = []
    for _ in range(3):  # each view: dense within a community, a few edges across
        P = np.where(y[:, None] == y[None, :], 0.4, 0.02)
        B = np.triu(rng.random(P.shape) < P, 1).astype(float)
        graphs.append(sp.csr_array(B + B.T))
    start = y.copy()
    flip = rng.choice(y.size, size=30, replace=False)
    start[flip] = rng.integers(0, c, size=flip.size)
    exchange = _exchange(graphs, c)
    labels, iters, cut = graph_refine(start, exchange, c)
    assert clustering_scores(y, labels)["acc"] == 1.0 and iters >= 2
    assert cut == pytest.approx(normalized_cut(exchange(y), y, c)) and cut < normalized_cut(exchange(start), start, c)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000))
def test_the_kept_partition_never_has_a_larger_cut_than_the_start(seed):
    rng = np.random.default_rng(seed)
    views, _ = _views(seed=seed % 50)
    graphs = [client_graph(X) for X in views]
    start = rng.integers(0, 3, size=views[0].shape[0])
    exchange = _exchange(graphs, 3)
    labels, iters, cut = graph_refine(start, exchange, 3, max_iter=50)
    assert cut <= normalized_cut(exchange(start), start, 3) + 1e-12 and 1 <= iters <= 50
    assert cut == pytest.approx(normalized_cut(exchange(labels), labels, 3))


def test_the_estimator_refines_on_the_graphs_by_default():
    views, y = _views(seed=2)
    with pytest.warns(UserWarning):  # narrow views padded to r = 2c
        # the spectral step after the graph refinement: tests/test_spectral.py
        both = FedMultiViewClustering(3, random_state=0, max_rounds=20, n_init=1,
                                      refinement=RefineOptions(spectral_steps=0)).fit(views)
        km = FedMultiViewClustering(3, random_state=0, max_rounds=20, n_init=1, refine="kmeans").fit(views)
        graph = FedMultiViewClustering(3, random_state=0, max_rounds=20, n_init=1, refine="graph").fit(views)
        secure = FedMultiViewClustering(3, random_state=0, max_rounds=20, n_init=1,
                                        privacy=PrivacyOptions(secure_aggregation=True),
                                        refinement=RefineOptions(spectral_steps=0)).fit(views)
    assert both.graph_iter_ and km.graph_iter_ == [] and graph.refine_iter_ == [] and graph.graph_iter_
    assert both.refine_iter_ == km.refine_iter_
    # the default is the graph refinement started from the k-means-refined partition
    want, iters, _ = graph_refine(km.labels_, _exchange([client_graph(X) for X in views], 3), 3)
    assert np.array_equal(both.labels_, want) and both.graph_iter_ == [iters]
    assert np.array_equal(secure.labels_, both.labels_)  # the masked sums give the same partition
    assert both.cluster_centers_.shape == (3, both.n_components_)
    with pytest.raises(ParameterError, match="refine"):
        refine_stages("spectral")
    assert refine_stages("kmeans+graph") == ("kmeans", "graph") and refine_stages("none") == ()


def test_a_node_keeps_its_graph_private_and_refuses_the_clear_after_a_secure_fit(tmp_path):
    pytest.importorskip("flwr")
    from fedsonmf.federation.flower import clustering as fclust
    from fedsonmf.protocol.messages import Message

    X = np.random.default_rng(0).random((12, 3))
    msg = Message("graph", 1, {"labels": np.repeat([0, 1], 6)}, {"n_clusters": 2})
    with pytest.raises(ProtocolError, match="masked only"):
        fclust.node_graph(msg, lambda: X, tmp_path, None, 0, secure=True)
    assert not (tmp_path / "graph-0.npz").exists()  # refused before anything is computed
    plain = fclust.node_graph(msg, lambda: X, tmp_path, None, 0, secure=False)
    assert set(plain.arrays) == {"L"}
    assert np.allclose(plain.arrays["L"], client_links(client_graph(X), msg.arrays["labels"], 2))
    assert stat.S_IMODE(os.stat(tmp_path / "graph-0.npz").st_mode) == 0o600
    reads = []
    again = fclust.node_graph(msg, lambda: reads.append(1) or X, tmp_path, None, 0, secure=False)
    assert reads == [] and np.array_equal(again.arrays["L"], plain.arrays["L"])  # the kept graph: no re-read
    with pytest.raises(ProtocolError, match="graph labels"):
        fclust.node_graph(Message("graph", 2, {"labels": np.zeros(5, dtype=np.int64)}, {"n_clusters": 2}),
                          lambda: X, tmp_path, None, 0, secure=False)
    for bad in (np.full(12, 2), np.full(12, -1)):  # a label outside the clusters: named, not a scipy traceback
        with pytest.raises(ProtocolError, match="outside 0..1"):
            fclust.node_graph(Message("graph", 3, {"labels": bad}, {"n_clusters": 2}), lambda: X, tmp_path, None, 0,
                              secure=False)
        with pytest.raises(ProtocolError, match="outside 0..1"):
            fclust.node_refine(Message("refine", 3, {"labels": bad}, {"n_clusters": 2}), X, None, 0, secure=False)


def test_tied_neighbours_share_the_weight_and_no_edge_is_the_searchs_pick():
    """Rows with one nonzero each (a few tags): a sample's nearest are all the samples of its tag,
    tied; each of them gets k / (their number), a sample of another tag nothing, and every sample
    gives out exactly k before the graph is symmetrised."""
    rng = np.random.default_rng(3)
    n, k = 60, 10
    tag = rng.integers(0, 4, size=n)
    tags = sp.csr_matrix((np.ones(n), (np.arange(n), tag)), shape=(n, 4))
    A = client_graph(tags, n_neighbors=k).toarray()
    same = (tag[:, None] == tag[None, :]) & ~np.eye(n, dtype=bool)
    group = same.sum(axis=1)
    assert np.array_equal(A > 0, same)  # every other sample of its tag, none of another
    share = np.minimum(1.0, k / group)  # a tag of at most k others: all of them, weight 1
    np.testing.assert_allclose(A[same], np.maximum(share[:, None], share[None, :])[same])
    labels = rng.integers(0, 3, size=n)
    G = sp.csr_array(A)
    moved = graph_refine(labels, _exchange([G], 3), 3)[0]
    assert normalized_cut(client_links(G, moved, 3), moved, 3) <= normalized_cut(client_links(G, labels, 3), labels, 3)
    views, _ = _views()
    assert set(np.unique(client_graph(views[0]).toarray())) <= {0.0, 1.0}  # continuous features: no ties


def test_a_sample_tied_with_crowds_keeps_only_its_strictly_nearer_neighbours():
    from fedsonmf.pipeline.graph import MAX_TIE_GROUP

    n, k = 100, 10
    assert client_graph(np.ones((n, 3)), n_neighbors=k).nnz == 0  # a constant view: one tie of n - 1
    X = np.ones((n, 2))
    X[:3, 1] = 2.0  # three samples alike, the other 97 alike
    A = client_graph(X, n_neighbors=4).toarray()
    # sample 0: samples 1, 2 strictly nearer, then 97 tied (> MAX_TIE_GROUP x 4): only 1 and 2 kept;
    # sample 3: 96 tied at similarity 1 and none nearer: no edge at all
    assert 97 > 96 > MAX_TIE_GROUP * 4
    np.testing.assert_array_equal(A[:3, :3], 1.0 - np.eye(3))
    assert not A[3:].any() and not A[:, 3:].any()


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_the_graph_does_not_depend_on_the_order_of_the_samples(seed):
    """Small integer features: many exact ties. Permuting the samples permutes the graph."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(15, 50))
    X = rng.integers(0, 3, size=(n, int(rng.integers(2, 6)))).astype(float)
    perm = rng.permutation(n)
    A = client_graph(X, n_neighbors=5).toarray()
    B = client_graph(X[perm], n_neighbors=5).toarray()
    np.testing.assert_allclose(B, A[np.ix_(perm, perm)], atol=1e-12)
    assert np.allclose(A, A.T) and (A >= 0).all() and (A <= 1).all() and not np.diag(A).any()


def test_no_refinement_reads_the_exact_views_under_differential_privacy_unless_asked():
    views, _ = _views(seed=4)
    kw = dict(random_state=0, max_rounds=3, n_init=1, privacy=PrivacyOptions(dp_noise_multiplier=1.0))
    with pytest.warns(UserWarning, match="padded"):
        auto = FedMultiViewClustering(3, **kw).fit(views)
    assert auto.refine_iter_ == [] and auto.graph_iter_ == []
    assert np.array_equal(auto.labels_, auto.kmeans_.labels_)
    with pytest.warns(UserWarning, match="not covered by the differential privacy"):
        asked = FedMultiViewClustering(3, refine="kmeans+graph", **kw).fit(views)
    assert asked.refine_iter_ and asked.graph_iter_
    assert refine_stages("auto") == ("kmeans", "graph") and refine_stages("auto", dp=True) == ()
