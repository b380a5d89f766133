"""The graph refinement's spectral step (fedsonmf.pipeline.spectral): a few steps of orthogonal
iteration on the summed graph, from the clients' products with the server's blocks, and k-means on
the block (the start's centroids or k-means++ replicates, the lower objective) give a second
start; it is kept only when it lowers the cut clearly and does not raise the dense views' score."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score

from fedsonmf.core.server import total
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import PrivacyOptions, RefineOptions
from fedsonmf.exceptions import ParameterError, ProtocolError
from fedsonmf.metrics import clustering_scores
from fedsonmf.pipeline.graph import client_graph, client_links, client_products, graph_refine, normalized_cut
from fedsonmf.pipeline.spectral import (
    SPECTRAL_MARGIN,
    STAGE_PARTITIONS,
    graph_stage,
    medoid_choice,
    spectral_partition,
    spectral_refine,
    spectral_steps,
)
from test_refine import _views  # the same planted dense, signed views


def _exchanges(graphs, c):
    return (lambda labels: total([client_links(A, labels, c) for A in graphs]),
            lambda M: total([client_products(A, M) for A in graphs]))


def _planted(seed=1, c=4, n_per=25, views=3, p_in=0.4, p_out=0.02):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(c), n_per)
    graphs = []
    for _ in range(views):
        P = np.where(y[:, None] == y[None, :], p_in, p_out)
        B = np.triu(rng.random(P.shape) < P, 1).astype(float)
        graphs.append(sp.csr_array(B + B.T))
    return y, graphs


def _orthonormal_power(S, F, steps):
    for _ in range(steps):
        F, _ = np.linalg.qr(S @ F)
    return F


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_the_products_are_the_graphs_times_the_block_and_the_links_are_the_indicators_product(seed):
    rng = np.random.default_rng(seed)
    _, graphs = _planted(seed=seed % 20, c=3, n_per=8, views=1)
    A = graphs[0]
    M = rng.uniform(-1, 1, size=(A.shape[0], 3))
    assert np.allclose(client_products(A, M), (A @ M) / A.shape[0])
    assert np.all(np.abs(client_products(A, M)) <= 1.0)  # inside the fixed point's public bound
    labels = rng.integers(0, 3, size=A.shape[0])
    Z = np.eye(3)[labels]
    assert np.allclose(client_products(A, Z), client_links(A, labels, 3))
    with pytest.raises(ValueError, match="block of shape"):
        client_products(A, M[:-1])


def _block(graphs, start, c, steps):
    A = sum(graphs)
    d = np.asarray(A.sum(axis=1)).ravel()
    S = sp.diags_array(1 / np.sqrt(d)) @ A @ sp.diags_array(1 / np.sqrt(d))
    F = _orthonormal_power(S, np.sqrt(d)[:, None] * np.eye(c)[start], steps)
    return F / np.linalg.norm(F, axis=1, keepdims=True)


def _objective(E, labels):
    return sum(float(np.sum((E[labels == k] - E[labels == k].mean(axis=0)) ** 2)) for k in np.unique(labels))


def test_the_steps_are_orthogonal_iteration_of_the_normalised_summed_graph():
    """The server's iteration from the exchanges equals orthogonal iteration of D^-1/2 A D^-1/2 from
    D^1/2 Z computed on the summed graph itself (the partition from it, by the same Lloyd start)."""
    y, graphs = _planted(seed=3, p_in=0.15, p_out=0.05)
    exchange, products = _exchanges(graphs, 4)
    start = np.random.default_rng(0).integers(0, 4, size=y.size)
    calls = []
    for steps in (1, 2, 7):
        calls.clear()
        got = spectral_partition(start, exchange(start), lambda M: calls.append(1) or products(M), 4, steps,
                                 n_init=0, seed=0)  # Lloyd's from the start's centroids only
        assert len(calls) == steps - 1  # the first step is the graph exchange of the start itself
        E = _block(graphs, start, 4, steps)
        from sklearn.cluster import KMeans
        cen = np.stack([E[start == k].mean(axis=0) for k in range(4)])
        want = KMeans(4, init=cen, n_init=1).fit_predict(E)
        assert adjusted_rand_score(want, got) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_block_is_clustered_by_the_lowest_objective_of_the_start_and_the_replicates(seed):
    """Many small clusters: Lloyd's from a poor start's centroids stops at a local minimum; the
    k-means++ replicates are taken only when they reach a lower objective on the block, and the
    candidate is the same for the same seed."""
    y, graphs = _planted(seed=seed, c=8, n_per=10, p_in=0.5, p_out=0.04)
    exchange, products = _exchanges(graphs, 8)
    start = np.random.default_rng(seed).integers(0, 8, size=y.size)
    E = _block(graphs, start, 8, 5)
    only = spectral_partition(start, exchange(start), products, 8, 5, n_init=0, seed=seed)
    both = spectral_partition(start, exchange(start), products, 8, 5, n_init=10, seed=seed)
    assert _objective(E, both) <= _objective(E, only) * (1 + 1e-9)
    assert np.array_equal(both, spectral_partition(start, exchange(start), products, 8, 5, n_init=10, seed=seed))


def test_planted_communities_are_found_from_a_random_start():
    y, graphs = _planted(seed=1)
    exchange, products = _exchanges(graphs, 4)
    start = np.random.default_rng(5).integers(0, 4, size=y.size)  # no information at all
    got = spectral_partition(start, exchange(start), products, 4, 20, seed=0)
    assert clustering_scores(y, got)["acc"] == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_candidate_does_not_depend_on_the_names_of_the_clusters(seed):
    views, _ = _views(seed=seed)
    graphs = [client_graph(X) for X in views]
    exchange, products = _exchanges(graphs, 3)
    start = np.random.default_rng(seed).integers(0, 3, size=views[0].shape[0])
    renamed = np.array([2, 0, 1])[start]
    a = spectral_partition(start, exchange(start), products, 3, 10, seed=0)
    b = spectral_partition(renamed, exchange(renamed), products, 3, 10, seed=0)
    assert adjusted_rand_score(a, b) == pytest.approx(1.0)


def test_the_steps_are_capped_so_the_products_never_span_half_the_samples():
    assert spectral_steps(400, 40, 20) == 5  # ORL: 400 faces, 40 classes
    assert spectral_steps(3312, 6, 20) == 20
    assert spectral_steps(10, 6, 20) == 0 and spectral_steps(1000, 3, 0) == 0
    for n, c in ((169, 6), (2000, 10), (617, 17)):
        assert spectral_steps(n, c, 20) * c <= n / 2


def test_the_candidate_is_kept_only_when_it_lowers_the_cut_clearly_and_the_score_does_not_rise():
    y, graphs = _planted(seed=2, p_in=0.3, p_out=0.03)
    exchange, products = _exchanges(graphs, 4)
    start = np.random.default_rng(1).integers(0, 4, size=y.size)
    first = []
    refined, _, cut = graph_refine(start, exchange, 4, max_iter=1, first=first)  # a poor partition: one assignment
    assert len(first) == 1 and np.array_equal(first[0], exchange(start))  # the start's links, kept for the step
    kept, info = spectral_refine(start, first[0], refined, cut, exchange, products, 4, steps=20, seed=0)
    assert info["kept"] and clustering_scores(y, kept)["acc"] == 1.0
    assert info["cut"] < (1 - SPECTRAL_MARGIN) * cut and info["exchanges"] > 0  # fewer than 20 once settled
    # a score that says the candidate is worse keeps the refined partition; both scores in one exchange
    asked = []

    def worse(block):
        asked.append(np.asarray(block))
        return None, np.array([0.0 if np.array_equal(row, refined) else 1.0 for row in block])

    same, info = spectral_refine(start, first[0], refined, cut, exchange, products, 4, steps=20, seed=0, refine=worse)
    assert not info["kept"] and np.array_equal(same, refined)
    assert len(asked) == 1 and asked[0].shape == (2, y.size) and np.array_equal(asked[0][1], refined)
    # a cut lower by less than the margin keeps it too
    near, info = spectral_refine(start, first[0], refined, info["cut"] * (1 + SPECTRAL_MARGIN / 2), exchange,
                                 products, 4, steps=20, seed=0)
    assert not info["kept"] and np.array_equal(near, refined)
    none, info = spectral_refine(start, first[0], refined, cut, exchange, products, 4, steps=0, seed=0)
    assert np.array_equal(none, refined) and info == {"steps": 0, "exchanges": 0, "cut": None, "kept": False}


def test_the_estimator_runs_the_step_after_the_graph_refinement():
    views, _ = _views(seed=4)
    kw = dict(random_state=0, max_rounds=20, n_init=1)
    with pytest.warns(UserWarning):  # narrow views padded to r = 2c
        km = FedMultiViewClustering(3, refine="kmeans", **kw).fit(views)
        off = FedMultiViewClustering(3, **kw, refinement=RefineOptions(spectral_steps=0)).fit(views)
        on = FedMultiViewClustering(3, **kw).fit(views)
        secure = FedMultiViewClustering(3, **kw, privacy=PrivacyOptions(secure_aggregation=True)).fit(views)
    assert off.spectral_kept_ == [False] and len(on.spectral_kept_) == 1
    refine = on._refine_exchange(views, None, secure=False)
    exchange, products, _ = on._graph_exchanges(views, None, secure=False)
    cut = normalized_cut(exchange(off.labels_), off.labels_, 3)
    steps = spectral_steps(views[0].shape[0], 3, 20)
    want, info = spectral_refine(km.labels_, exchange(km.labels_), off.labels_, cut, exchange, products, 3,
                                 steps=steps, seed=on.seeds_[0], refine=refine)
    # the default ends with the medoid of the start, the cut rule's partition and the spectral candidate
    candidate = spectral_partition(km.labels_, exchange(km.labels_), products, 3, steps, seed=on.seeds_[0])
    medoid, chosen = medoid_choice(km.labels_, want, candidate)
    assert np.array_equal(on.labels_, medoid) and on.graph_chosen_ == [chosen] and chosen in STAGE_PARTITIONS
    assert on.spectral_kept_ == [info["kept"]]
    # the steps' products travel with the graph refinement's labels: the shorter of the two is free
    assert on.graph_iter_ == [off.graph_iter_[0] + info["exchanges"] - min(off.graph_iter_[0] - 1, steps - 1)]
    assert np.array_equal(secure.labels_, on.labels_)  # the masked sums give the same partition
    with pytest.raises(ParameterError, match="'spectral_steps' parameter of RefineOptions"):
        FedMultiViewClustering(3, refinement=RefineOptions(spectral_steps=-1)).fit(views)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 5), st.integers(6, 40))
def test_the_medoid_choice_returns_the_partition_the_other_two_agree_with_most(seed, c, n):
    """Of three partitions the medoid has the highest summed adjusted Rand index to the other two
    (ties: the stage's result, then the start), so it is the one opposite the least similar pair."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, c, size=n)
    moved = np.where(rng.random(n) < rng.random(), rng.integers(0, c, size=n), start)
    candidate = rng.integers(0, c, size=n) if seed % 2 else np.where(rng.random(n) < 0.3, 0, moved)
    P = {"refined": moved, "start": start, "spectral": candidate}
    labels, name = medoid_choice(start, moved, candidate)
    assert name in STAGE_PARTITIONS and np.array_equal(labels, P[name])
    agree = {k: sum(adjusted_rand_score(a, b) for j, b in P.items() if j != k) for k, a in P.items()}
    assert agree[name] >= max(agree.values()) - 1e-12
    earlier = STAGE_PARTITIONS[:STAGE_PARTITIONS.index(name)]
    assert all(agree[k] < agree[name] - 1e-12 for k in earlier)  # a tie goes to the earlier name
    # a partition met twice is the medoid; all three equal: the stage's own result
    assert medoid_choice(start, start, candidate)[1] == "refined"
    if adjusted_rand_score(start, moved) < 1 - 1e-12:  # the same partition up to names: all three tie
        assert medoid_choice(start, moved, start)[1] == "start"
    assert medoid_choice(moved, moved, moved)[1] == "refined"


def test_a_node_answers_a_bounded_block_from_its_kept_graph_and_refuses_anything_else(tmp_path):
    pytest.importorskip("flwr")
    from fedsonmf.federation.flower import clustering as fclust
    from fedsonmf.protocol.messages import Message

    X = np.random.default_rng(0).random((12, 3))
    M = np.random.default_rng(1).uniform(-1, 1, size=(12, 2))
    msg = Message("spectral", 1, {"M": M}, {})
    with pytest.raises(ProtocolError, match="masked only"):
        fclust.node_graph(msg, lambda: X, tmp_path, None, 0, secure=True)
    reply = fclust.node_graph(msg, lambda: X, tmp_path, None, 0, secure=False)
    assert reply.kind == "spectral" and set(reply.arrays) == {"L"}
    assert np.allclose(reply.arrays["L"], client_products(client_graph(X), M))
    for bad, what in ((M * 2, "exceed 1"), (np.full((12, 2), np.nan), "not finite"), (M[:5], "shape"),
                      (np.zeros((12, 0)), "shape")):
        with pytest.raises(ProtocolError, match=what):
            fclust.node_graph(Message("spectral", 2, {"M": bad}, {}), lambda: X, tmp_path, None, 0, secure=False)
    # n = 12, blocks of 2 columns: at most 12 // 4 = 3 steps, the first a graph exchange -> 2 blocks per job
    fclust.node_graph(Message("spectral", 3, {"M": M}, {}), lambda: X, tmp_path, None, 0,
                      secure=False)
    with pytest.raises(ProtocolError, match="4 answered of the 4 this job may ask"):
        fclust.node_graph(Message("spectral", 4, {"M": M}, {}), lambda: X, tmp_path, None, 0,
                          secure=False)
    # narrower blocks do not buy many more columns: never n / 2 of them in all
    fclust.node_graph(Message("spectral", 5, {"M": M[:, :1]}, {}), lambda: X, tmp_path, None, 0,
                      secure=False)
    with pytest.raises(ProtocolError, match="5 answered of the 5"):
        fclust.node_graph(Message("spectral", 6, {"M": M[:, :1]}, {}), lambda: X, tmp_path, None, 0, secure=False)
    with pytest.raises(ProtocolError, match="0 answered of the 0"):  # the run config turned the step off
        fclust.node_graph(Message("spectral", 1, {"M": M}, {}), lambda: X, tmp_path / "other", None, 0, secure=False,
                          max_steps=0)
    assert not (tmp_path / "other" / "spectral-0.json").exists()


def test_a_node_answers_a_block_that_rides_on_a_graph_request_side_by_side_and_under_the_same_cap(tmp_path):
    pytest.importorskip("flwr")
    from fedsonmf.federation.flower import clustering as fclust
    from fedsonmf.protocol.messages import Message

    X = np.random.default_rng(0).random((12, 3))
    M = np.random.default_rng(1).uniform(-1, 1, size=(12, 2))
    labels = np.repeat(np.arange(3), 4)
    A = client_graph(X)

    def ask(r, block, folder=tmp_path, **kw):
        msg = Message("graph", r, {"labels": labels, "M": block}, {"n_clusters": 3})
        return fclust.node_graph(msg, lambda: X, folder, None, 0, secure=False, **kw)

    reply = ask(1, M)
    assert reply.kind == "graph" and set(reply.arrays) == {"L"} and reply.arrays["L"].shape == (12, 5)
    assert np.allclose(reply.arrays["L"], np.hstack([client_links(A, labels, 3), client_products(A, M)]))
    with pytest.raises(ProtocolError, match="exceed 1"):  # the block is checked as a spectral request's is
        ask(2, M * 2)
    ask(3, M)  # the second block of 2 columns: the cap of the test above, 4 columns per job
    with pytest.raises(ProtocolError, match="4 answered of the 4"):  # a block on a graph request counts too
        ask(4, M)
    with pytest.raises(ProtocolError, match="4 answered of the 4"):  # and so does a spectral one
        fclust.node_graph(Message("spectral", 5, {"M": M}, {}), lambda: X, tmp_path, None, 0,
                          secure=False)
    plain = fclust.node_graph(Message("graph", 6, {"labels": labels}, {"n_clusters": 3}), lambda: X, tmp_path, None,
                              0, secure=False)  # labels alone are still answered
    assert np.allclose(plain.arrays["L"], client_links(A, labels, 3))
    with pytest.raises(ProtocolError, match="0 answered of the 0"):  # the run config turned the step off
        ask(1, M, folder=tmp_path / "off", max_steps=0)


def _sequential(start, exchange, products, c, steps, seed, refine=None):
    """The graph stage as two searches one after the other (graph_refine, then spectral_refine), then
    the medoid of the start, that result and the spectral candidate when the
    clients answered the candidate (a finite cut)."""
    first = []
    refined, iterations, cut = graph_refine(start, exchange, c, first=first)
    labels, info = spectral_refine(start, first[0], refined, cut, exchange, products, c, steps=steps, seed=seed,
                                   refine=refine)
    info["chosen"] = "refined"
    if info["cut"] is not None and np.isfinite(info["cut"]):
        candidate = spectral_partition(np.asarray(start), first[0], products, c, steps, seed=seed)
        labels, info["chosen"] = medoid_choice(start, labels, candidate)
    return labels, iterations, info


def _combined(graphs, c, fail_at=None, error=None):
    """A combined exchange (labels and a block in one round trip) over the clients' graphs; it raises
    ``error`` at its ``fail_at``-th call (a node lost).  ``both.calls``: the calls so far."""
    def both(labels, M):
        both.calls += 1
        if both.calls == fail_at:
            raise error
        L = total([np.hstack([client_links(A, labels, c), client_products(A, M)]) for A in graphs])
        return L[:, :c], L[:, c:]

    both.calls = 0
    return both


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 8), st.booleans())
def test_the_stage_shares_its_exchanges_and_reaches_the_partitions_of_the_two_searches_one_after_the_other(
        seed, steps, scored):
    y, graphs = _planted(seed=seed % 50, c=3, n_per=12, p_in=0.35, p_out=0.08)
    c, rng = 3, np.random.default_rng(seed)
    start = rng.integers(0, c, size=y.size)
    exchange, products = _exchanges(graphs, c)
    sent = {"graph": 0, "products": 0, "both": 0, "refine": 0}

    def count(kind, fn):
        def call(*args):
            sent[kind] += 1
            return fn(*args)
        return call

    both = _combined(graphs, c)

    def scores(block):  # a dense view's score: any fixed function of the partitions
        return None, np.array([float(np.sum(row * np.arange(row.size)) % 7) for row in block])

    refine = scores if scored else None
    want, iterations, info = _sequential(start, exchange, products, c, steps, seed, refine)
    progress: dict = {}
    got, stage = graph_stage(start, count("graph", exchange), count("products", products), c, steps=steps, seed=seed,
                             refine=count("refine", refine) if scored else None, both=count("both", both),
                             progress=progress)
    assert np.array_equal(got, want) and stage["kept"] == info["kept"] and stage["cut"] == info["cut"]
    assert stage["graph_iterations"] == iterations and "labels" in progress and stage["chosen"] == info["chosen"]
    shared = min(iterations - 1, max(steps - 1, 0))  # the products that rode on the graph refinement's exchanges
    assert sent["both"] == shared
    assert stage["exchanges"] == sum(sent.values()) == iterations + info["exchanges"] - shared
    # without the combined exchange: the same partition, every request on its own round trip
    alone, stage_alone = graph_stage(start, exchange, products, c, steps=steps, seed=seed, refine=refine)
    assert np.array_equal(alone, want) and stage_alone["exchanges"] == iterations + info["exchanges"]


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 14), st.integers(0, 8))
def test_under_a_clients_minimum_cluster_size_the_stage_keeps_answered_partitions(seed, m, steps):
    """A client's policy refuses partitions with a nonempty cluster below ``m`` (NaN links, what the
    server's exchange returns for them, its block still answered): the graph refinement ends at its
    lowest cut met, a refused candidate is not kept, a refused start is returned as it is -- the
    stage keeps a partition the clients answered, the one the two searches one after the other keep."""
    y, graphs = _planted(seed=seed % 50, c=3, n_per=12, p_in=0.35, p_out=0.08)
    c, rng = 3, np.random.default_rng(seed)
    start = rng.integers(0, c, size=y.size)
    exchange, products = _exchanges(graphs, c)
    both = _combined(graphs, c)
    answered = []

    def small(labels):
        sizes = np.bincount(labels, minlength=c)
        return sizes[sizes > 0].min() < m

    def policed(labels):
        if small(labels):
            return np.full((labels.size, c), np.nan)
        answered.append(np.array(labels))
        return exchange(labels)

    def policed_both(labels, M):
        if small(labels):
            return np.full((labels.size, c), np.nan), products(M)
        answered.append(np.array(labels))
        return both(labels, M)

    got, stage = graph_stage(start, policed, products, c, steps=steps, seed=seed, both=policed_both)
    if small(start):
        assert np.array_equal(got, start) and stage["graph_iterations"] == 0 and not stage["kept"]
        return
    assert any(np.array_equal(got, a) for a in answered)
    want, iterations, info = _sequential(start, policed, products, c, steps, seed)
    assert np.array_equal(got, want) and stage["graph_iterations"] == iterations and stage["kept"] == info["kept"]


def test_a_stage_that_fails_midway_leaves_the_best_partition_the_graph_refinement_met():
    y, graphs = _planted(seed=3, c=3, n_per=15, p_in=0.3, p_out=0.1)
    exchange, products = _exchanges(graphs, 3)
    start = np.random.default_rng(0).integers(0, 3, size=y.size)
    failing = _combined(graphs, 3, fail_at=2, error=RuntimeError("a node was lost"))
    progress: dict = {}
    with pytest.raises(RuntimeError, match="lost"):
        graph_stage(start, exchange, products, 3, steps=10, seed=0, both=failing, progress=progress)
    partial, _, _ = graph_refine(start, exchange, 3, max_iter=2)  # the start's exchange and one combined
    assert np.array_equal(progress["labels"], partial)


def test_a_node_lost_mid_stage_on_flower_leaves_the_lowest_cut_the_graph_refinement_met(tmp_path):
    """The ServerApp's clustering step (write_clustering_outputs) with a combined exchange that fails
    at its third call: labels.csv holds the best partition the graph refinement had met, and
    result.json says why the stage stopped."""
    pytest.importorskip("flwr")
    from fedsonmf.exceptions import FederationError
    from fedsonmf.federation.flower import clustering as fclust
    from fedsonmf.pipeline.steps import cluster_embedding

    y, graphs = _planted(seed=3, c=3, n_per=15, p_in=0.3, p_out=0.1)
    exchange, products = _exchanges(graphs, 3)
    both = _combined(graphs, 3, fail_at=3, error=FederationError("node 2 lost"))
    V = np.abs(np.random.default_rng(0).standard_normal((6, y.size)))  # an embedding with no cluster structure
    opts = fclust.clustering_options({"n-clusters": 3})
    summary = fclust.write_clustering_outputs(tmp_path, V, opts, 0, None, exchange, products, both)
    assert summary["refine_error"] == "FederationError: node 2 lost" and both.calls == 3
    start, _, _ = cluster_embedding(V, 3, seed=0, normalize_embedding=True, kmeans_n_init=10,
                                                     kmeans_max_iter=300)
    met, iterations, _ = graph_refine(start, exchange, 3, max_iter=3)  # the start's exchange and two combined
    assert iterations == 3
    assert np.array_equal(fclust.read_labels_csv(tmp_path / "labels.csv"), met)
