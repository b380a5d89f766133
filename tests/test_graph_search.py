"""The search behind each client's k-NN graph (fedsonmf.pipeline.graph.client_graph): exact up to
EXACT_GRAPH_MAX held samples, approximate (an HNSW index over each view's principal subspace, usearch)
above, with the same weights and tie rule on the candidates found."""

import sys

import numpy as np
import pytest
import scipy.sparse as sp

import fedsonmf.pipeline.graph as graph
from fedsonmf.pipeline.graph import EXACT_GRAPH_MAX, client_graph


def _planted(n=600, d=300, c=4, per_row=12, seed=0):
    """Sparse rows of c planted clusters (each nonzero in its cluster's feature block with probability 0.7)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, n)
    block = d // c
    own = rng.random((n, per_row)) < 0.7
    cols = np.where(own, labels[:, None] * block + rng.integers(0, block, (n, per_row)),
                    rng.integers(0, d, (n, per_row)))
    X = sp.csr_array((rng.random(n * per_row) + 0.5, (np.repeat(np.arange(n), per_row), cols.ravel())),
                     shape=(n, d))
    X.sum_duplicates()
    return X, labels


def test_the_default_search_is_exact_below_the_threshold():
    X, _ = _planted()
    A, B = client_graph(X, n_clusters=4), client_graph(X, n_clusters=4, search="exact")
    assert X.shape[0] <= EXACT_GRAPH_MAX
    assert (A != B).nnz == 0


def test_the_default_search_is_approximate_above_the_threshold(monkeypatch):
    pytest.importorskip("usearch")
    X, _ = _planted()
    monkeypatch.setattr(graph, "EXACT_GRAPH_MAX", 100)
    A, B = client_graph(X, n_clusters=4), client_graph(X, n_clusters=4, search="approximate")
    assert (A != B).nnz == 0  # the same seed and one thread: the same graph on every run


@pytest.mark.parametrize("dense", [False, True])
def test_on_few_features_the_approximate_graph_finds_the_exact_edges_with_the_same_weights(dense):
    """A view no wider than the subspace is searched as it is: the candidates are the exact cosine
    neighbours but for the index's misses, and every edge has the exact graph's weight."""
    pytest.importorskip("usearch")
    X, _ = _planted(d=graph.SUBSPACE_MIN, per_row=6)
    X = X.toarray() if dense else X
    E = client_graph(X, n_neighbors=10, search="exact")
    A = client_graph(X, n_neighbors=10, search="approximate")
    assert (A != A.T).nnz == 0 and A.data.min() > 0 and A.data.max() <= 1
    assert A.diagonal().max() == 0
    # every sample keeps k candidates: its row holds at least k edges after symmetrisation
    assert np.diff(sp.csr_array(A).indptr).min() >= 10
    recall = (E.multiply(A) > 0).sum() / E.nnz
    assert recall > 0.9


def test_on_many_features_the_candidates_come_from_the_principal_subspace():
    """A wide sparse view is searched in its top singular subspace and the candidates ranked by their
    exact cosine: k edges a sample, and at least as much of the graph's weight inside the planted
    clusters as the exact graph has (the subspace leaves out the features no cluster shares)."""
    pytest.importorskip("usearch")
    X, labels = _planted(n=800, d=400, per_row=10)

    def inside(A):
        A = sp.coo_array(A)
        return A.data[labels[A.row] == labels[A.col]].sum() / A.data.sum()

    E = client_graph(X, n_neighbors=10, n_clusters=4, search="exact")
    A = client_graph(X, n_neighbors=10, n_clusters=4, search="approximate")
    assert (A != A.T).nnz == 0 and A.diagonal().max() == 0
    assert np.diff(sp.csr_array(A).indptr).min() >= 10
    assert inside(A) >= inside(E) - 0.01


def test_the_approximate_graph_gives_held_and_nonzero_samples_edges_only():
    pytest.importorskip("usearch")
    X, _ = _planted()
    X = sp.lil_array(X)
    X[5] = 0
    held = np.arange(0, 600, 3)
    A = sp.csr_array(client_graph(sp.csr_array(X), held=held, n_neighbors=8, search="approximate"))
    with_edges = np.flatnonzero(np.diff(A.indptr))
    assert set(with_edges) <= set(held) - {5}
    assert len(with_edges) == len(held) - (5 in held)


def test_duplicated_rows_join_only_their_twins_in_the_approximate_search():
    pytest.importorskip("usearch")
    rng = np.random.default_rng(3)
    base = rng.random((40, 30))
    X = np.repeat(base, 6, axis=0)  # every row 6 times: its 5 copies tie at similarity 1
    E = sp.coo_array(client_graph(X, n_neighbors=3, search="exact"))
    A = sp.coo_array(client_graph(X, n_neighbors=3, search="approximate"))
    assert np.allclose(E.data, 3 / 5)  # exact: each of the 5 twins gets 3/5 of an edge
    # approximate: the tie is shared among the twins found, so at least 3/5 each, and no other edge
    assert np.array_equal(A.row // 6, A.col // 6)
    assert A.data.min() >= 3 / 5 - 1e-12 and A.data.max() <= 1


def test_without_usearch_the_approximate_search_says_what_to_install(monkeypatch):
    X, _ = _planted(n=200)
    monkeypatch.setitem(sys.modules, "usearch", None)
    monkeypatch.setitem(sys.modules, "usearch.index", None)
    with pytest.raises(ImportError, match=r"fedsonmf\[scale\].*refine='kmeans'"):
        client_graph(X, n_neighbors=5, search="approximate")


def test_an_unknown_search_is_refused():
    X, _ = _planted(n=50)
    with pytest.raises(ValueError, match="search must be"):
        client_graph(X, search="fast")


def test_missing_extra_is_said_before_any_fit(monkeypatch):
    """Above EXACT_GRAPH_MAX samples the graph stage needs usearch: without it the estimator says so
    before the factorisation runs (no fit is started), and refine='kmeans' needs nothing more."""
    import sys

    import scipy.sparse as sp

    from fedsonmf import FedMultiViewClustering
    from fedsonmf.pipeline.graph import EXACT_GRAPH_MAX

    monkeypatch.setitem(sys.modules, "usearch", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "usearch.index", None)
    n = EXACT_GRAPH_MAX + 1
    views = [sp.random(n, 20, density=0.2, format="csr", random_state=p) for p in range(2)]
    model = FedMultiViewClustering(2, max_rounds=1, n_init=1, random_state=0)
    with pytest.raises(ImportError, match=r"fedsonmf\[scale\]"):
        model.fit(views)
    assert not hasattr(model, "result_")  # nothing was fitted


def test_a_row_with_fewer_candidates_than_k_keeps_the_ones_it_has():
    """-inf marks a missing candidate: it is never tied with a row's k-th (which is then -inf itself),
    so such a row keeps its finite candidates at weight 1 and nothing is NaN."""
    S = np.array([[0.9, 0.5, -np.inf, -np.inf], [0.9, 0.5, 0.5, 0.1]])
    W = graph._share_ties(S, 3)
    assert np.array_equal(W[0], [1.0, 1.0, 0.0, 0.0])
    assert np.allclose(W[1], [1.0, 1.0, 1.0, 0.0]) and np.isfinite(W).all()


def test_one_row_is_searched_as_a_block_of_one():
    """usearch answers a single query unbatched: the search still gives one row of keys and its count."""
    pytest.importorskip("usearch")
    X, _ = _planted(n=60, d=graph.SUBSPACE_MIN, per_row=6)
    P = sp.csr_array(X / np.sqrt(X.multiply(X).sum(axis=1)).reshape(-1, 1))
    index, Z, order = graph._candidate_index(P, 9, None)
    C, counts = graph._search(index, Z[order[:1]], 9)
    Cb, counts_b = graph._search(index, Z[order[:2]], 9)
    assert C.shape == (1, 9) and counts.tolist() == [9]
    assert np.array_equal(C[0], Cb[0])  # the same answer as in a batch


def test_a_clustering_fit_runs_its_graph_stage_on_the_approximate_search(monkeypatch):
    """End to end above the threshold: the fit's graph stage uses the approximate graphs and recovers
    two planted clusters; the same fit twice gives the same labels."""
    pytest.importorskip("usearch")
    from fedsonmf import FedMultiViewClustering
    from fedsonmf.metrics import adjusted_rand

    monkeypatch.setattr(graph, "EXACT_GRAPH_MAX", 100)
    calls = []
    search = graph._approximate_edges
    monkeypatch.setattr(graph, "_approximate_edges", lambda *a, **k: calls.append(1) or search(*a, **k))
    X1, labels = _planted(n=400, d=200, c=2, per_row=10, seed=1)
    rng = np.random.default_rng(2)
    X2 = sp.csr_array(X1[:, rng.permutation(200)])  # a second view of the same clusters
    fits = [FedMultiViewClustering(2, n_init=2, random_state=0).fit([X1, X2]) for _ in range(2)]
    assert fits[0].fit_report_["graph_exchanges"] >= 1 and len(calls) == 4  # two views, two fits
    assert np.array_equal(fits[0].labels_, fits[1].labels_)
    assert adjusted_rand(labels, fits[0].labels_) > 0.9
