"""Views narrower than the rank 2c: the distance-based stages keep the samples' lengths.

Scaling every sample of a d-feature view to unit norm removes one of its d degrees of freedom;
on a view of 3 features whose classes differ by their distance from the origin it removes what
separates them (docs/clustering.md, "Protocol").
"""

import numpy as np
import pytest
import scipy.sparse as sp

from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.metrics import clustering_accuracy
from fedsonmf.pipeline.graph import client_graph
from fedsonmf.pipeline.rank_rule import is_narrow, length_keeping_view
from fedsonmf.pipeline.refine import refine_view


def planted_radial(n_per_class=100, seed=0):
    """3 views of 3 features, 3 classes that differ only by their length along one direction per view."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), n_per_class)
    views = []
    for _ in range(3):
        direction = rng.uniform(0.5, 1.0, 3)
        direction /= np.linalg.norm(direction)
        length = np.array([1.0, 3.0, 5.0])[y]
        views.append(length[:, None] * direction[None, :] + 0.35 * rng.standard_normal((y.size, 3)))
    return views, y


def test_is_narrow_is_the_auto_rank_rule():
    assert is_narrow(3, 3) and is_narrow(5, 3)
    assert not is_narrow(6, 3) and not is_narrow(3000, 5)


def test_length_keeping_view_keeps_length_ratios_and_scales_the_spread_to_one():
    views, _ = planted_radial()
    X = views[0]
    Y = length_keeping_view(X)
    ratio = np.linalg.norm(Y, axis=1) / np.linalg.norm(X, axis=1)
    assert np.allclose(ratio, ratio[0])
    assert np.isclose(np.mean(np.sum((Y - Y.mean(axis=0)) ** 2, axis=1)), 1.0)


def test_length_keeping_view_zeroes_the_samples_not_held_and_reads_sparse():
    views, _ = planted_radial()
    held = np.arange(0, 300, 2)
    Y = length_keeping_view(sp.csr_matrix(views[1]), held)
    assert not np.any(Y[1::2])
    rows = Y[held]
    assert np.isclose(np.mean(np.sum((rows - rows.mean(axis=0)) ** 2, axis=1)), 1.0)


def test_refine_view_of_a_wide_view_is_unchanged_by_n_clusters():
    X = np.random.default_rng(1).uniform(size=(50, 12))
    assert np.array_equal(refine_view(X, n_clusters=3), refine_view(X))


def test_refine_view_of_a_narrow_view_keeps_the_lengths():
    views, _ = planted_radial()
    Y = refine_view(views[0], n_clusters=3)
    norms = np.linalg.norm(Y, axis=1)
    assert norms.max() / norms.min() > 3  # unit-norm rows would give 1


def test_graph_of_a_narrow_view_joins_euclidean_neighbours():
    # samples on one ray: by cosine every pair is tied; by distance the neighbours are the adjacent lengths
    t = np.linspace(1.0, 10.0, 40)
    X = t[:, None] * np.array([[1.0, 2.0, 2.0]]) / 3.0
    A = client_graph(X, n_neighbors=2, n_clusters=2).toarray()
    for i in range(1, 39):
        assert A[i, i - 1] > 0 and A[i, i + 1] > 0
        assert A[i, np.abs(np.arange(40) - i) > 2].sum() == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_planted_radial_classes_are_found_on_3_feature_views(seed):
    views, y = planted_radial(seed=seed)
    labels = FedMultiViewClustering(3, random_state=seed).fit_predict(views)
    assert clustering_accuracy(y, labels) >= 0.95
