"""Cross-validation of multi-view estimators: scikit-learn's splitters must split samples, never views."""

import numpy as np
import pytest
from sklearn import model_selection as skms

from fedsonmf import FedSONMF
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import MethodOptions
from fedsonmf.exceptions import InputError
from fedsonmf.model_selection import (
    GridSearchCV,
    MultiViewData,
    MultiViewKFold,
    cross_val_score,
    cross_validate,
    train_test_split,
)

FAST = dict(max_rounds=3, tol=0, random_state=0)


@pytest.fixture(scope="module")
def views():
    rng = np.random.default_rng(0)
    return [rng.random((40, 6)), rng.random((40, 8))]


def test_sklearn_grid_search_on_a_list_of_views_is_refused(views):
    """It used to train on view A, score on view B and return a 'best' tau."""
    with pytest.raises(ValueError, match="split this list of views along the list"):
        skms.GridSearchCV(FedSONMF(2, **FAST), {"tau": [5, 10]}, cv=2).fit(views)


def test_sklearn_cross_val_score_on_a_list_of_views_is_refused(views):
    """It used to return [nan, nan]."""
    with pytest.raises(ValueError, match="fedsonmf.model_selection"):
        skms.cross_val_score(FedSONMF(2, **FAST), views, cv=2)
    with pytest.raises(ValueError, match="fedsonmf.model_selection"):
        skms.cross_val_score(FedMultiViewClustering(3, **FAST), views, cv=2)


def test_refusal_is_an_input_error_naming_the_fix(views):
    with pytest.raises(InputError, match="MultiViewData"):
        skms.GridSearchCV(FedSONMF(2, **FAST), {"tau": [5]}, cv=2, error_score="raise").fit(views)


def test_grid_search_splits_the_samples_of_every_view(views):
    seen = []

    class Spy(FedSONMF):
        def fit(self, Xs, y=None, *, masks=None):
            seen.append([X.shape for X in MultiViewData(Xs).views] if isinstance(Xs, MultiViewData) else None)
            return super().fit(Xs, y, masks=masks)

    search = GridSearchCV(Spy(2, **FAST), {"tau": [2, 5]}, cv=2).fit(views)
    assert search.best_params_["tau"] in (2, 5)
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
    assert seen[0] == [(20, 6), (20, 8)]  # half of the samples, every view
    assert search.best_estimator_.embedding_.shape == (40, 2)  # refit on all samples


def test_sklearn_tools_work_on_multiview_data(views):
    data = MultiViewData(views)
    assert len(data) == 40 and data.shape == (40, 2)
    scores = skms.cross_val_score(FedSONMF(2, **FAST), data, cv=3)
    assert scores.shape == (3,) and np.all(np.isfinite(scores)) and np.all(scores < 0)
    search = skms.GridSearchCV(FedMultiViewClustering(3, **FAST),
                               {"method": [MethodOptions(tau=2), MethodOptions(tau=5)]}, cv=2).fit(data)
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))


def test_label_free_clustering_score(views):
    model = FedMultiViewClustering(3, **FAST).fit(views)
    s = model.score(views)
    assert np.isfinite(s) and s <= 0
    assert np.all(np.isfinite(cross_val_score(FedMultiViewClustering(3, **FAST), views, cv=3)))
    out = cross_validate(FedSONMF(2, **FAST), views, cv=2)
    assert np.all(np.isfinite(out["test_score"]))


def test_multiview_kfold_and_train_test_split(views):
    folds = list(MultiViewKFold(4, shuffle=True, random_state=0).split(views))
    assert len(folds) == 4 and sorted(np.concatenate([te for _, te in folds]).tolist()) == list(range(40))
    y = np.arange(40)
    tr, te, ytr, yte = train_test_split(views, y, test_size=0.25, random_state=0)
    assert [X.shape for X in tr] == [(30, 6), (30, 8)] and [X.shape for X in te] == [(10, 6), (10, 8)]
    np.testing.assert_array_equal(tr[0], views[0][ytr])


def test_multiview_data_refuses_mismatched_views():
    with pytest.raises(ValueError, match="different numbers of samples"):
        MultiViewData([np.ones((4, 2)), np.ones((5, 2))])
    with pytest.raises(TypeError, match="list of views"):
        MultiViewData(np.ones((4, 2)))


def test_a_pipeline_inside_a_search_is_refused_on_a_list_and_works_on_multiview_data(views):
    from sklearn.cluster import KMeans
    from sklearn.pipeline import Pipeline

    pipe = Pipeline([("f", FedSONMF(2, **FAST)), ("k", KMeans(2, n_init=2, random_state=0))])
    with pytest.raises(ValueError, match="split this list of views"):
        skms.GridSearchCV(pipe, {"f__tau": [2, 5]}, cv=2).fit(views)
    search = GridSearchCV(pipe, {"f__tau": [2, 5]}, cv=2).fit(views)
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
