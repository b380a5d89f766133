"""The clustering stages' round trips: counted per kind in every report, the orthogonal iteration
stopped once its span has settled, and no score exchange when no client scores."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsonmf.core.server import total
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.pipeline.graph import client_links, client_products
from fedsonmf.pipeline.spectral import PowerSteps, graph_stage, settled_angle
from fedsonmf.pipeline.stages import STAGE_EXCHANGES, finish_clustering


def _components(c=3, n_per=10, seed=0):
    """A graph of c disconnected cliques: its top c eigenvectors are the cliques' indicators."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(c), n_per)
    B = (y[:, None] == y[None, :]).astype(float) * rng.uniform(0.5, 1.0, size=(y.size, y.size))
    B = np.triu(B, 1)
    return y, sp.csr_array(B + B.T)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6))
def test_the_settled_angle_is_zero_for_one_span_and_one_for_orthogonal_spans(seed, c):
    rng = np.random.default_rng(seed)
    F, _ = np.linalg.qr(rng.normal(size=(4 * c, 2 * c)))
    Q, _ = np.linalg.qr(rng.normal(size=(c, c)))
    assert settled_angle(F[:, :c], F[:, :c] @ Q) == pytest.approx(0.0, abs=1e-10)  # the same span, rotated
    assert settled_angle(F[:, :c], F[:, c:]) == pytest.approx(1.0)
    G, _ = np.linalg.qr(rng.normal(size=(4 * c, c)))
    assert 0.0 <= settled_angle(F[:, :c], G) <= 1.0 + 1e-12


def test_the_iteration_stops_once_its_span_has_settled_and_runs_every_step_at_tol_zero():
    y, A = _components()
    n = y.size
    first = client_links(A, y, 3)  # the cliques' links: D^-1/2 A Z already spans the top eigenvectors
    power = PowerSteps(first, 10)
    products = 0
    while (M := power.request()) is not None:
        power.feed(client_products(A, M))
        products += 1
    assert products == 1 and power.taken == 2 and power.angle <= 1e-3  # one product shows the span stays
    every = PowerSteps(first, 10, tol=0.0)
    while (M := every.request()) is not None:
        every.feed(client_products(A, M))
    assert every.taken == 10
    assert settled_angle(power.F, every.F) == pytest.approx(0.0, abs=1e-8) and n == 30


def _text_like(seed=0, c=3, n_per=15):
    """Views of sparse counts (no client scores: every view's mean sample holds little of its energy)."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(c), n_per)
    views = []
    for d in (60, 45):
        P = rng.random((c, d)) < 0.15
        X = (rng.random((y.size, d)) < 0.6 * P[y] + 0.02) * rng.integers(1, 4, size=(y.size, d))
        views.append(sp.csr_matrix(X.astype(float)))
    return views, y


def _stage_exchanges(views, c):
    from fedsonmf.pipeline.graph import client_graph
    from fedsonmf.pipeline.refine import client_refine, refine_view, score_weight

    rviews = [refine_view(X) for X in views]
    weights = [score_weight(Y) for Y in rviews]
    graphs = [client_graph(X, n_clusters=c) for X in views]
    sent: list = []

    def refine(labels):
        sent.append(("refine", np.shape(labels)))
        replies = [client_refine(Y, labels, c, scores=w) for Y, w in zip(rviews, weights)]
        return total([D for D, _ in replies]), total([s for _, s in replies])

    def graph(labels):
        sent.append(("graph", None))
        return total([client_links(A, labels, c) for A in graphs])

    def spectral(M):
        sent.append(("spectral", None))
        return total([client_products(A, M) for A in graphs])

    return dict(refine=refine, graph=graph, spectral=spectral), sent, weights


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_round_trip_is_counted_once_under_its_kind(seed):
    views, y = _text_like(seed)
    c = 3
    ex, sent, _ = _stage_exchanges(views, c)
    start = np.random.default_rng(seed).integers(0, c, size=y.size)
    V = np.random.default_rng(seed).random((4, y.size))
    opts = {"normalize_embedding": True, "kmeans_n_init": 2, "kmeans_max_iter": 50, "refine_starts": 3,
            "refine_seeded_starts": 1, "refine_spectral_steps": 6}
    _, _, report = finish_clustering(V, start, np.zeros((c, 4)), c, seed=seed, opts=opts, **ex)
    counts = report["exchanges"]
    assert set(counts) == set(STAGE_EXCHANGES)
    assert sum(counts.values()) == len(sent) == report["refine_iterations"] + report["graph_iterations"]
    assert counts["kmeans"] == sum(kind == "refine" for kind, _ in sent[:counts["kmeans"]])
    assert counts["spectral"] == sum(kind == "spectral" for kind, _ in sent)
    assert 1 <= report["spectral_steps"] <= 6


@pytest.mark.parametrize("seed", [2, 3, 5, 9])  # planted graphs whose candidate passes the cut rule
def test_without_scores_the_stage_keeps_the_same_partition_with_one_exchange_less(seed):
    from test_spectral import _exchanges, _planted

    y, graphs = _planted(seed=seed, c=4, n_per=20, p_in=0.3, p_out=0.1)
    exchange, products = _exchanges(graphs, 4)
    start = np.random.default_rng(seed).integers(0, 4, size=y.size)

    def zero(block):  # no client scores: every partition's summed score is 0
        return None, np.zeros(len(block))

    want, scored = graph_stage(start, exchange, products, 4, steps=8, seed=seed, refine=zero)
    got, unscored = graph_stage(start, exchange, products, 4, steps=8, seed=seed, refine=None)
    assert scored["counts"]["score"] == 1 and unscored["counts"]["score"] == 0
    assert np.array_equal(got, want) and unscored["kept"] == scored["kept"] and unscored["chosen"] == scored["chosen"]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_driver_sends_no_score_exchange_when_the_first_reply_says_no_client_scores(seed):
    views, y = _text_like(seed)
    c = 3
    ex, sent, weights = _stage_exchanges(views, c)
    assert not any(weights)  # sparse counts: no view scores
    rng = np.random.default_rng(seed)
    start = rng.integers(0, c, size=y.size)
    V = rng.random((4, y.size))
    opts = {"normalize_embedding": True, "kmeans_n_init": 2, "kmeans_max_iter": 50, "refine_starts": 3,
            "refine_seeded_starts": 1, "refine_spectral_steps": 6}
    _, _, report = finish_clustering(V, start, np.zeros((c, 4)), c, seed=seed, opts=opts, **ex)
    assert report["exchanges"]["score"] == 0
    assert all(kind != "refine" for kind, _ in sent[report["exchanges"]["kmeans"]:])  # none after the k-means stage


@pytest.mark.filterwarnings("ignore")
def test_the_fit_report_records_every_stages_round_trips():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 15)
    views = [rng.normal(size=(3, d))[y] * 2 + rng.normal(size=(45, d)) for d in (8, 6)]
    m = FedMultiViewClustering(3, random_state=0, max_rounds=8, n_init=2).fit(views)
    rep = m.fit_report_
    assert set(rep["stage_exchanges"]) == set(STAGE_EXCHANGES)
    assert sum(rep["stage_exchanges"].values()) == rep["refine_exchanges"] + rep["graph_exchanges"]
    assert rep["stage_exchanges"]["kmeans"] == rep["refine_exchanges"] and rep["spectral_steps"] >= 1
