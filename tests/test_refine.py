"""The federated k-means refinement (fedsonmf.pipeline.refine): each client's distances from its
own row-normalised view, summed by the server, are k-means on the pooled views."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.cluster import KMeans
from sklearn.preprocessing import normalize

from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import RefineOptions
from fedsonmf.exceptions import ParameterError, PartitionRefused, ProtocolError
from fedsonmf.metrics import clustering_scores
from fedsonmf.pipeline.refine import (
    assign,
    client_distances,
    client_refine,
    client_score,
    exchange_batch,
    refine_best,
    refine_partition,
    refine_side_by_side,
    refine_view,
    sample_distances,
    score_weight,
    scores_partitions,
    seeded_starts,
)


def _views(seed=0, n_per=15, c=3):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(c), n_per)
    views = []
    for d in (7, 5):
        centers = rng.normal(size=(c, d)) * 2
        views.append(centers[y] + rng.normal(size=(y.size, d)))  # signed, dense
    return views, y


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_distances_are_the_squared_distances_to_the_cluster_means(seed):
    rng = np.random.default_rng(seed)
    X = rng.random((12, 4)) * (rng.random((12, 4)) < 0.7)
    labels = rng.integers(0, 3, size=12)
    Y = refine_view(X)
    D = client_distances(Y, labels, 3)
    for k in range(3):
        mu = Y[labels == k].mean(axis=0) if np.any(labels == k) else np.zeros(4)
        np.testing.assert_allclose(D[:, k], ((Y - mu) ** 2).sum(axis=1), atol=1e-12)
    # sparse = dense
    np.testing.assert_allclose(client_distances(refine_view(sp.csr_matrix(X)), labels, 3), D, atol=1e-12)


def test_rows_are_unit_norm_and_zero_rows_stay_zero():
    X = np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]])
    Y = refine_view(X)
    np.testing.assert_allclose(np.linalg.norm(Y, axis=1), [1, 0, 1])
    assert np.all(refine_view(X, held=[0, 2])[1] == 0)


def test_the_summed_distances_give_lloyd_on_the_pooled_row_normalised_views():
    views, y = _views()
    start = np.random.default_rng(1).integers(0, 3, size=y.size)
    Ys = [refine_view(X) for X in views]
    labels, iters, _ = refine_partition(start, lambda lab: (sum(client_distances(Y, lab, 3) for Y in Ys), 0.0))
    Z = np.hstack([normalize(X) for X in views])
    C0 = np.array([Z[start == k].mean(axis=0) for k in range(3)])
    km = KMeans(3, init=C0, n_init=1, algorithm="lloyd", max_iter=300, tol=0).fit(Z)
    assert np.array_equal(labels, km.labels_) and iters >= 1
    assert np.array_equal(assign(sum(client_distances(Y, labels, 3) for Y in Ys)), labels)  # a fixed point


def test_only_dense_views_score_and_the_score_is_their_kmeans_objective():
    rng = np.random.default_rng(0)
    dense = rng.random((40, 6)) + 1.0  # every sample near the mean direction: mean share > 0.5
    text = sp.random(40, 300, density=0.02, random_state=1, format="csr") + sp.eye(40, 300, format="csr")
    assert scores_partitions(refine_view(dense)) and not scores_partitions(refine_view(text))
    ones = np.ones((40, 2000))
    ones[[3, 17], [5, 900]] = 0.0  # all ones but two entries (ACM's fifth view): nearly constant
    assert not scores_partitions(refine_view(ones))  # 2.5e-5 of its energy off the mean sample
    assert scores_partitions(refine_view(ones + rng.random((40, 2000))))  # a real spread scores
    labels = rng.integers(0, 3, size=40)
    Y = refine_view(dense)
    D, score = client_refine(Y, labels, 3)
    km_objective = sum(((Y[labels == k] - Y[labels == k].mean(axis=0)) ** 2).sum() for k in range(3))
    np.testing.assert_allclose(score, [km_objective / 40], rtol=1e-10)
    assert client_refine(Y, labels, 3, scores=False)[1].tolist() == [0.0]
    held = np.arange(0, 40, 2)  # incomplete view: the mean over the held samples only
    Dh = client_distances(refine_view(dense, held=held), labels, 3, held=held)
    np.testing.assert_allclose(client_score(Dh, labels, held), [Dh[held, labels[held]].mean()])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 5.0))
def test_a_dense_views_score_is_the_share_of_its_spread_left_within_the_clusters(seed, offset):
    """score = k-means objective / one-cluster objective: 1 for one cluster, 0 for singletons, in
    [0, 1] for any partition, whatever share of the view's energy its mean sample holds (the
    offset moves every sample towards one direction and shrinks the spread)."""
    rng = np.random.default_rng(seed)
    Y = refine_view(rng.random((30, 8)) + offset)
    w = score_weight(Y)
    assert w > 0 and scores_partitions(Y)
    spread = np.mean(np.sum((Y - Y.mean(axis=0)) ** 2, axis=1))
    np.testing.assert_allclose(w, 1.0 / spread, rtol=1e-8)

    def score(labels, c):
        return client_refine(Y, labels, c, scores=w)[1][0]

    np.testing.assert_allclose(score(np.zeros(30, dtype=np.int64), 1), 1.0, rtol=1e-8)
    assert score(np.arange(30), 30) == pytest.approx(0.0, abs=1e-9)
    labels = rng.integers(0, 4, size=30)
    km = sum(((Y[labels == k] - Y[labels == k].mean(axis=0)) ** 2).sum() for k in range(4)) / 30
    np.testing.assert_allclose(score(labels, 4), km / spread, rtol=1e-8)
    assert 0.0 <= score(labels, 4) <= 1.0 + 1e-12


def test_the_score_weight_is_zero_for_text_and_computed_on_the_held_rows():
    rng = np.random.default_rng(0)
    text = sp.random(40, 300, density=0.02, random_state=1, format="csr") + sp.eye(40, 300, format="csr")
    assert score_weight(refine_view(text)) == 0.0
    dense = rng.random((40, 6)) + 1.0
    held = np.arange(0, 40, 2)
    Yh = refine_view(dense, held=held)  # rows outside held are zero, not part of the spread
    Z = Yh[held]
    np.testing.assert_allclose(score_weight(Yh, held=held), 1.0 / np.mean(np.sum((Z - Z.mean(axis=0)) ** 2, axis=1)))
    dense[[1, 5]] = 0.0  # held samples with no features: zero rows, still part of the spread
    Y = refine_view(dense)
    ones = np.zeros(40, dtype=np.int64)
    np.testing.assert_allclose(client_refine(Y, ones, 1, scores=score_weight(Y))[1], [1.0], rtol=1e-10)
    np.testing.assert_allclose(score_weight(sp.csr_matrix(Y)), score_weight(Y), rtol=1e-12)  # sparse = dense


def test_refine_best_keeps_the_lowest_score_and_stops_early_when_nobody_scores():
    views, y = _views(seed=3)
    Ys = [refine_view(X) for X in views]
    starts = [np.random.default_rng(s).integers(0, 3, size=y.size) for s in range(4)]

    def exchange(lab, scoring=True):
        replies = [client_refine(Y, lab, 3, scores=scoring) for Y in Ys]
        return sum(D for D, _ in replies), sum(S for _, S in replies)

    refined = [refine_partition(s, exchange) for s in starts]
    labels, iters, index = refine_best(starts, exchange)
    assert index == int(np.argmin([sc for _, _, sc in refined]))  # first of the lowest on ties
    assert np.array_equal(labels, refined[index][0])
    # the first start alone in the first exchange, then all side by side: the slowest start's exchanges
    assert iters == max(refined[0][1], 1 + max(it for _, it, _ in refined[1:])) < sum(it for _, it, _ in refined)
    calls = []
    silent = lambda lab: (calls.append(1), exchange(lab, scoring=False))[1]  # noqa: E731
    labels0, iters0, index0 = refine_best(starts, silent)
    assert index0 == 0 and np.array_equal(labels0, refine_partition(starts[0], silent)[0])
    assert iters0 == len(calls) // 2  # only the first start was refined
    with pytest.raises(ValueError):
        refine_best([], exchange)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 5))
def test_sample_distances_are_the_pooled_squared_distances_to_those_samples(seed, c):
    """Putting chosen samples each alone in a cluster turns the refinement's reply into their distances."""
    rng = np.random.default_rng(seed)
    views = [rng.normal(size=(12, 3)), sp.random(12, 6, density=0.5, random_state=seed, format="csr")]
    Ys = [refine_view(X) for X in views]
    ids = rng.integers(0, 12, size=7)  # repeats, and more than c - 1 of them
    calls = []

    def exchange(lab):
        calls.append(lab)
        return sum(client_refine(Y, lab, c)[0] for Y in Ys), np.zeros(len(lab))

    D = sample_distances(exchange, ids, 12, c)
    Z = np.hstack([Y.toarray() if sp.issparse(Y) else Y for Y in Ys])
    np.testing.assert_allclose(D, ((Z[:, None, :] - Z[None, ids, :]) ** 2).sum(axis=2), atol=1e-12)
    # one exchange: a block of partitions, each sample asked once, c - 1 per partition
    assert len(calls) == 1 and calls[0].shape == (-(-np.unique(ids).size // (c - 1)), 12)
    assert all(lab.min() >= 0 and lab.max() < c for lab in calls)
    with pytest.raises(ValueError, match="n_clusters >= 2"):  # no cluster left for the rest of the samples
        sample_distances(exchange, ids, 12, 1)


def _one_by_one(starts, exchange, seeded=None):
    """refine_best as it was before the starts travelled side by side: each start refined alone, in
    turn, the seeding asked for after the first; the partitions and the index must not change."""
    best, best_score, index = None, np.inf, 0
    starts = list(starts)
    for i, s in enumerate(starts):
        labels, _, score = refine_partition(s, exchange)
        if best is None or score < best_score:
            best, best_score, index = labels, score, i
        if i == 0:
            if score == 0.0:
                break
            if seeded is not None:
                starts += seeded(exchange)
    return best, index


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 5), st.integers(1, 6), st.booleans())
def test_starts_side_by_side_reach_what_each_reaches_alone(seed, c, n_starts, small_blocks):
    """Lloyd's algorithm of several starts sharing each exchange: every start's partition, iterations and
    score are those it has refined alone; the exchanges are the slowest start's (more only when a block
    must be split: here, with small_blocks, one partition per exchange)."""
    rng = np.random.default_rng(seed)
    # a dense view (it scores: the starts are compared, seeded starts asked for) and a sparse one
    views = [rng.normal(size=(20, 3)) + 2.0, sp.random(20, 8, density=0.4, random_state=seed, format="csr")]
    exchange = _pooled_exchange(views, c)
    assert scores_partitions(refine_view(views[0]))
    starts = [rng.integers(0, c, size=20) for _ in range(n_starts)]
    alone = [refine_partition(s, exchange) for s in starts]
    with pytest.MonkeyPatch.context() as mp:
        if small_blocks:
            mp.setattr("fedsonmf.pipeline.refine.BATCH_VALUES", 1)
        together, calls = refine_side_by_side(starts, exchange, c)
    for (la, ia, sa), (lt, it, st_) in zip(alone, together):
        assert np.array_equal(la, lt) and ia == it and sa == st_
    slowest = max(it for _, it, _ in alone)
    assert calls == (sum(sum(it > k for _, it, _ in alone) for k in range(slowest)) if small_blocks else slowest)
    # and refine_best keeps the partition and the start that refining them one by one keeps
    seeded = lambda ex: seeded_starts(ex, 20, c, n_starts=2, seed=seed)  # noqa: E731
    labels, _, index = refine_best(starts, exchange, seeded=seeded)
    ref_labels, ref_index = _one_by_one(starts, exchange, seeded=seeded)
    assert index == ref_index and np.array_equal(labels, ref_labels)


def test_a_block_of_partitions_is_answered_row_by_row():
    views, y = _views(seed=4)
    Y = refine_view(views[0])
    rows = np.random.default_rng(0).integers(0, 3, size=(4, y.size))
    D, S = client_refine(Y, rows, 3, scores=0.5)
    assert D.shape == (4, y.size, 3) and S.shape == (4,)
    for k in range(4):
        Dk, Sk = client_refine(Y, rows[k], 3, scores=0.5)
        assert np.array_equal(D[k], Dk) and np.array_equal(S[k:k + 1], Sk)
    exchange = _pooled_exchange(views, 3)
    with pytest.raises(ValueError, match="nonempty"):
        exchange_batch(exchange, np.zeros((0, y.size), dtype=np.int64), 3)


def _pooled_exchange(views, c, scoring=True):
    Ys = [refine_view(X) for X in views]

    def exchange(lab):
        replies = [client_refine(Y, lab, c, scores=scoring) for Y in Ys]
        return sum(D for D, _ in replies), sum(S for _, S in replies)

    return exchange


def test_seeded_starts_find_planted_clusters_and_are_deterministic_under_the_seed():
    rng = np.random.default_rng(5)
    c, y = 4, np.repeat(np.arange(4), 25)
    views = [np.eye(c, 6)[y] * 5 + 1 + 0.05 * rng.normal(size=(y.size, 6)) for _ in range(2)]  # dense
    exchange = _pooled_exchange(views, c)
    calls = []
    counted = lambda lab: (calls.append(1), exchange(lab))[1]  # noqa: E731
    starts = seeded_starts(counted, y.size, c, n_starts=3, seed=11)
    assert len(starts) == 3 and all(s.shape == (y.size,) and s.min() >= 0 and s.max() < c for s in starts)
    for s in starts:  # k-means++ puts one centre in each of four far-apart clusters: the planted partition
        assert clustering_scores(y, s)["acc"] == pytest.approx(1.0)
    # the first centres, then c - 1 further ones for 3 starts of 2 + ln 4 = 3 candidates: one exchange each
    assert len(calls) == c
    again = seeded_starts(exchange, y.size, c, n_starts=3, seed=11)
    assert all(np.array_equal(a, b) for a, b in zip(starts, again))  # determinism under the seed
    assert seeded_starts(exchange, y.size, c, n_starts=0, seed=11) == []


def test_seeded_starts_are_asked_for_only_when_a_view_scores_and_come_after_the_others():
    views, y = _views(seed=3)
    starts = [np.zeros(y.size, dtype=np.int64)] + [np.random.default_rng(s).integers(0, 3, size=y.size)
                                                  for s in range(2)]
    asked = []

    def seeded(exchange):
        asked.append(1)
        return seeded_starts(exchange, y.size, 3, n_starts=2, seed=0)

    silent = _pooled_exchange(views, 3, scoring=False)
    assert refine_best(starts, silent, seeded=seeded)[2] == 0 and asked == []  # text: never seeded
    exchange = _pooled_exchange(views, 3)
    labels, iters, index = refine_best(starts, exchange, seeded=seeded)
    plain = refine_best(starts, exchange)
    assert asked == [1] and iters > plain[1]  # the seeding's exchanges are counted
    assert index < 5 and (index >= 3 or np.array_equal(labels, plain[0]))
    with pytest.raises(ParameterError, match="'seeded_starts' parameter of RefineOptions"):
        FedMultiViewClustering(3, refinement=RefineOptions(seeded_starts=-1)).fit(views)


def test_sparse_views_never_pay_for_more_starts():
    rng = np.random.default_rng(4)
    y = np.repeat(np.arange(3), 20)
    views = []
    for _ in range(2):
        X = sp.random(60, 200, density=0.03, random_state=int(rng.integers(1 << 30)), format="csr")
        topics = sp.csr_matrix((np.ones(60), (np.arange(60), 10 * y + rng.integers(0, 10, size=60))), shape=(60, 200))
        views.append(X + 3 * topics)
    one = FedMultiViewClustering(3, random_state=0, max_rounds=15, n_init=1,
                                 refinement=RefineOptions(starts=1)).fit(views)
    ten = FedMultiViewClustering(3, random_state=0, max_rounds=15, n_init=1).fit(views)
    assert ten.refine_start_ == [0] and ten.refine_iter_ == one.refine_iter_
    assert np.array_equal(one.labels_, ten.labels_)


def test_the_estimator_refines_by_default_and_not_with_none():
    views, y = _views(seed=2)
    with pytest.warns(UserWarning):  # narrow views padded to r = 2c
        on = FedMultiViewClustering(3, random_state=0, max_rounds=20).fit(views)
        off = FedMultiViewClustering(3, random_state=0, max_rounds=20, refine="none").fit(views)
    assert on.refine_iter_ and off.refine_iter_ == [] and len(on.refine_start_) == 1 and on.n_init_ == 5
    assert np.array_equal(off.labels_, off.kmeans_.labels_)
    Ys = [refine_view(X) for X in views]  # the refined partition is a fixed point of the pooled k-means
    assert np.array_equal(assign(sum(client_distances(Y, on.labels_, 3) for Y in Ys)), on.labels_)
    assert clustering_scores(y, on.labels_)["acc"] >= clustering_scores(y, off.labels_)["acc"] - 1e-12
    with pytest.raises(ParameterError, match="refine"):
        FedMultiViewClustering(3, refine="spectral").fit(views)


def test_a_node_refuses_to_send_distances_in_the_clear_after_a_secure_fit():
    pytest.importorskip("flwr")
    from fedsonmf.federation.flower import clustering as fclust
    from fedsonmf.protocol.messages import Message

    X = np.random.default_rng(0).random((6, 3))
    msg = Message("refine", 1, {"labels": np.zeros(6, dtype=np.int64)}, {"n_clusters": 2})
    with pytest.raises(ProtocolError, match="masked only"):
        fclust.node_refine(msg, X, None, 0, secure=True)
    plain = fclust.node_refine(msg, X, None, 0, secure=False)
    assert set(plain.arrays) == {"D", "score"} and plain.arrays["D"].shape == (6, 2)
    assert plain.arrays["score"].shape == (1,) and plain.arrays["score"][0] > 0  # a dense view scores


def test_the_starts_already_refining_ride_on_the_seedings_exchanges(monkeypatch):
    """While the seeding asks its distances, the starts from V refine in the same exchanges (their
    rows beside the seeding's): fewer exchanges, the same partition kept as with the seeding's
    exchanges carrying nothing else."""
    from fedsonmf.pipeline import refine as R

    views, y = _views(seed=3)
    exchange = _pooled_exchange(views, 3)
    starts = [np.random.default_rng(s).integers(0, 3, size=y.size) for s in range(4)]
    asked, sent = [], []

    def seeded(ex):
        return seeded_starts(lambda lab: (asked.append(np.shape(lab)[0]), ex(lab))[1], y.size, 3, n_starts=2, seed=0)

    labels, calls, index = refine_best(starts, lambda lab: (sent.append(np.shape(lab)), exchange(lab))[1],
                                       seeded=seeded)
    seeding = [shape[0] for shape in sent[1:1 + len(asked)]]
    assert len(asked) == 3 and all(s > a for s, a in zip(seeding, asked))  # the riders' rows beside the seeding's
    assert calls == len(sent)

    class Alone(R._Riding):  # the seeding's exchanges carry nothing else
        def __init__(self, exchange, runs, n_clusters):
            super().__init__(exchange, [], n_clusters)

    monkeypatch.setattr(R, "_Riding", Alone)
    want = refine_best(starts, exchange, seeded=seeded)
    assert np.array_equal(labels, want[0]) and index == want[2] and calls <= want[1]


def _refusing(exchange, c, min_size):
    """``exchange`` behind a client's ``refine-min-cluster-size`` policy, as the server's exchange sees it
    (:class:`fedsonmf.federation.flower.clustering.RefineExchange`): a partition with a nonempty cluster
    of fewer than ``min_size`` samples is answered NaN; ``answered`` collects the partitions answered."""
    answered = []

    def ex(lab):
        lab = np.asarray(lab)
        rows = lab.reshape(-1, lab.shape[-1])
        D, S = exchange(lab)
        D = np.array(D, dtype=np.float64).reshape(rows.shape[0], rows.shape[1], c)
        S = np.array(S, dtype=np.float64).reshape(rows.shape[0])
        for k, row in enumerate(rows):
            sizes = np.bincount(row, minlength=c)
            if sizes[sizes > 0].min() < min_size:
                D[k], S[k] = np.nan, np.nan
            else:
                answered.append(row.copy())
        return (D[0], S[:1]) if lab.ndim == 1 else (D, S)

    return ex, answered


def test_a_refused_partition_ends_its_start_at_the_last_partition_answered():
    views, y = _views(seed=2)
    exchange = _pooled_exchange(views, 3)
    start = np.zeros(y.size, dtype=np.int64)
    start[:2] = [1, 2]  # two clusters of one sample, then Lloyd's moves
    refused, answered = _refusing(exchange, 3, 2)
    labels, iters, score = refine_partition(start, refused)
    assert iters == 0 and score == np.inf and np.array_equal(labels, start) and not answered  # refused at once
    moved = y.copy()
    moved[:6] = (moved[:6] + 1) % 3  # six samples misplaced: Lloyd's moves them
    assert refine_partition(moved, exchange)[1] >= 2
    answers = []

    def once(lab):  # the clients answer the start, then refuse
        D, S = exchange(lab)
        if answers:
            return np.full_like(D, np.nan), np.full_like(S, np.nan)
        answers.append(1)
        return D, S

    labels, iters, score = refine_partition(moved, once)
    assert np.array_equal(labels, moved) and iters == 1 and score == float(np.sum(exchange(moved)[1]))
    with pytest.raises(PartitionRefused, match="every start"):
        refine_best([start, start[::-1].copy()], _refusing(exchange, 3, 2)[0])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 4), st.integers(1, 8))
def test_the_refinement_keeps_an_answered_partition_under_a_clients_policy(seed, c, min_size):
    """Under a client's min-cluster-size policy (partitions below it answered NaN) every start stops at
    the last partition answered for it, the seeding (samples alone in a cluster) is dropped, and the
    partition kept is one the clients answered: the one that refining the starts one by one under
    the same policy keeps; with no start answered, PartitionRefused."""
    rng = np.random.default_rng(seed)
    views = [rng.normal(size=(24, 3)) + 2.0, sp.random(24, 8, density=0.4, random_state=seed, format="csr")]
    exchange, answered = _refusing(_pooled_exchange(views, c), c, min_size)
    starts = [rng.integers(0, c, size=24) for _ in range(4)]
    starts[1][:c - 1] = np.arange(1, c)  # small clusters in some starts
    starts[1][c - 1:] = 0

    def seeded(ex):
        try:
            return seeded_starts(ex, 24, c, n_starts=2, seed=seed)
        except PartitionRefused:
            return []

    try:
        labels, _, index = refine_best(starts, exchange, seeded=seeded)
    except PartitionRefused:
        for s in starts:  # every start refused at once
            assert np.bincount(s, minlength=c)[np.bincount(s, minlength=c) > 0].min() < min_size
        return
    assert any(np.array_equal(labels, a) for a in answered)
    ref_labels, ref_index = _one_by_one(starts, exchange, seeded=seeded)
    assert index == ref_index and np.array_equal(labels, ref_labels)
