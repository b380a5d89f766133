"""The federated k-means refinement (fedsonmf.estimators.refine): each client's distances from its
own row-normalised view, summed by the server, are k-means on the pooled views."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.cluster import KMeans
from sklearn.preprocessing import normalize

from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.refine import assign, client_distances, refine_partition, refine_view
from fedsonmf.exceptions import ParameterError, ProtocolError
from fedsonmf.metrics import clustering_scores


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
    labels, iters = refine_partition(start, lambda lab: sum(client_distances(Y, lab, 3) for Y in Ys))
    Z = np.hstack([normalize(X) for X in views])
    C0 = np.array([Z[start == k].mean(axis=0) for k in range(3)])
    km = KMeans(3, init=C0, n_init=1, algorithm="lloyd", max_iter=300, tol=0).fit(Z)
    assert np.array_equal(labels, km.labels_) and iters >= 1
    assert np.array_equal(assign(sum(client_distances(Y, labels, 3) for Y in Ys)), labels)  # a fixed point


def test_the_estimator_refines_by_default_and_not_with_none():
    views, y = _views(seed=2)
    with pytest.warns(UserWarning):  # narrow views padded to r = 2c
        on = FedMultiViewClustering(3, random_state=0, max_rounds=20).fit(views)
        off = FedMultiViewClustering(3, random_state=0, max_rounds=20, refine="none").fit(views)
    assert on.refine_iter_ and off.refine_iter_ == []
    assert np.array_equal(off.labels_, off.kmeans_.labels_)
    Ys = [refine_view(X) for X in views]  # the refined partition is a fixed point of the pooled k-means
    assert np.array_equal(assign(sum(client_distances(Y, on.labels_, 3) for Y in Ys)), on.labels_)
    assert clustering_scores(y, on.labels_)["acc"] >= clustering_scores(y, off.labels_)["acc"] - 1e-12
    with pytest.raises(ParameterError, match="refine"):
        FedMultiViewClustering(3, refine="spectral").fit(views)


def test_a_node_refuses_to_send_distances_in_the_clear_after_a_secure_fit():
    pytest.importorskip("flwr")
    from fedsonmf.estimators import clustering_steps
    from fedsonmf.federation.flower import clustering as fclust
    from fedsonmf.protocol.messages import Message

    X = np.random.default_rng(0).random((6, 3))
    msg = Message("refine", 1, {"labels": np.zeros(6, dtype=np.int64)}, {"n_clusters": 2})
    with pytest.raises(ProtocolError, match="masked only"):
        fclust.node_refine(msg, X, None, 0, clustering_steps, secure=True)
    plain = fclust.node_refine(msg, X, None, 0, clustering_steps, secure=False)
    assert set(plain.arrays) == {"D"} and plain.arrays["D"].shape == (6, 2)
