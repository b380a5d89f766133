"""The public surface does what a new user assumes: widths checked by ``predict`` as by ``transform``,
views that look transposed named, mvlearn's 3-D array accepted, scikit-learn's own search refused with
the message that points to :mod:`fedsonmf.model_selection`, the CLI's seed count said, data sets printed
as one line.  Small synthetic data, few rounds, one restart: each test takes about a second."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline

from fedsonmf import FedSONMF
from fedsonmf._validation import check_view_orientation
from fedsonmf.datasets import MultiViewDataset, load_mat, make_synthetic
from fedsonmf.datasets.mat import default_data_dir
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.exceptions import DataWarning, InputError

CHEAP = {"max_rounds": 5, "random_state": 0}


def _sonmf():
    return FedSONMF(n_components=3, **CHEAP)


def _clustering():
    return FedMultiViewClustering(n_clusters=3, n_init=1, refine="none", **CHEAP)


def _views(n=60, widths=(8, 9), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.random((n, d)) for d in widths]


@pytest.fixture(autouse=True)
def _quiet_convergence():
    from fedsonmf.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


# ------------------------------------------------------------------ widths of new samples


@pytest.mark.parametrize("make, methods", [(_sonmf, ("transform", "score")),
                                           (_clustering, ("predict", "transform", "score"))])
def test_new_views_of_another_width_get_the_fit_widths_message(make, methods):
    """``predict`` (and every method on new samples) names the fitted widths, as ``transform`` does,
    instead of NumPy's "operands could not be broadcast together" from the fitted preprocessing."""
    model = make().fit(_views())
    for bad, got in ((_views(10, (8, 7)), r"2 views with \[8, 7\]"), (_views(10, (8,)), r"1 views with \[8\]")):
        for method in methods:
            with pytest.raises(InputError, match=r"fitted on 2 views with \[8, 9\] features; got " + got):
                getattr(model, method)(bad)


# ------------------------------------------------------------------ orientation


@pytest.mark.parametrize("make", [_sonmf, _clustering])
def test_views_given_features_as_rows_warn(make):
    """Two 60-sample views of 8 features passed transposed (8 x 60 each) fit as 8 samples: a
    DataWarning says so and how to pass them."""
    transposed = [X.T for X in _views(widths=(8, 8))]
    with pytest.warns(DataWarning, match=r"8 rows and 60 columns.*features-as-rows.*X\.T"):
        make().fit(transposed)


def test_views_with_different_rows_and_equal_columns_name_the_transposition():
    """Transposed views of different widths fail the row check: the error says the likely cause."""
    transposed = [X.T for X in _views(widths=(8, 9))]
    for make in (_sonmf, _clustering):
        with pytest.raises(InputError, match=r"\[8, 9\].*every view has 60 columns.*features-as-rows"):
            make().fit(transposed)


def test_orientation_rule_spares_samples_by_features_views():
    """The rule needs equal widths of at least 4 x n_samples across two or more views: views of
    different widths, one wide view, or equal widths under 4 x n do not warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        for shapes in ([(50, 3000), (50, 3100)], [(50, 3000)], [(720, 784), (720, 784)], [(60, 8), (60, 8)]):
            check_view_orientation([sp.csr_array(s) for s in shapes])
    with pytest.warns(DataWarning):
        check_view_orientation([sp.csr_array((50, 200)), sp.csr_array((50, 200))])


@pytest.mark.skipif(default_data_dir() is None, reason="the shared data folder is not here")
def test_orientation_rule_spares_the_shared_data_sets():
    """None of the shared sets (wide text: BBCSport 544 x 3183/3203, 3Sources 169 x ~3500) warns."""
    paths = sorted(default_data_dir().glob("*/*/*.mat"))
    assert paths
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        for path in paths:
            check_view_orientation(load_mat(path).views)


# ------------------------------------------------------------------ mvlearn's 3-D array


def test_a_3d_array_is_the_list_of_its_views():
    """mvlearn's (n_views, n_samples, n_features) array fits, transforms and predicts as the list of
    its 2-D slices."""
    views = _views(widths=(8, 8))
    stack = np.stack(views)
    a, b = _sonmf(), _sonmf()
    np.testing.assert_array_equal(a.fit_transform(stack), b.fit_transform(views))
    np.testing.assert_array_equal(a.transform(stack[:, :7]), b.transform([X[:7] for X in views]))
    c, d = _clustering(), _clustering()
    np.testing.assert_array_equal(c.fit_predict(stack), d.fit_predict(views))
    np.testing.assert_array_equal(c.predict(stack[:, :7]), d.predict([X[:7] for X in views]))


def test_a_2d_array_and_a_4d_array_get_hints_that_fit():
    X = np.random.default_rng(0).random((20, 4))
    with pytest.raises(InputError, match=r"wrap a single view as \[X\]"):
        _sonmf().fit(X)
    with pytest.raises(InputError, match=r"got 4 dimensions.*3-D array is read as \(n_views, n_samples"):
        _sonmf().fit(X.reshape(1, 1, 20, 4))


# ------------------------------------------------------------------ scikit-learn's own search


@pytest.mark.parametrize("make, grid", [
    (_sonmf, {"tau": [2, 5]}),
    (_clustering, {"max_rounds": [3, 5]}),
    (lambda: Pipeline([("f", _sonmf()), ("k", KMeans(3, n_init=1))]), {"f__tau": [2, 5]}),
])
def test_sklearn_gridsearch_with_default_cv_names_fedsonmf_model_selection(make, grid):
    """Two views and cv=5: scikit-learn's splitter would fail first ("n_splits=5 greater than the
    number of samples: n_samples=2"); the refusal that points to fedsonmf.model_selection comes
    before it, for a list and for a 3-D array."""
    views = _views(widths=(8, 8))
    for X in (views, np.stack(views)):
        with pytest.raises(InputError, match=r"split this (list|3-D array) of views.*fedsonmf\.model_selection"):
            GridSearchCV(make(), grid).fit(X)


@pytest.mark.parametrize("make", [_sonmf, _clustering])
def test_sklearn_cross_val_score_names_fedsonmf_model_selection(make):
    with pytest.raises(InputError, match=r"fedsonmf\.model_selection"):
        cross_val_score(make(), _views())


def test_fedsonmf_model_selection_and_clone_still_work():
    from sklearn.base import clone

    from fedsonmf.model_selection import GridSearchCV as MultiViewGridSearchCV

    clone(_sonmf())
    search = MultiViewGridSearchCV(_sonmf(), {"tau": [2, 5]}, cv=2).fit(_views())
    assert search.best_params_["tau"] in (2, 5)


# ------------------------------------------------------------------ the CLI's seeds


def _cluster_cli(tmp_path, capsys, *extra):
    from fedsonmf.cli.app import main

    rng = np.random.default_rng(0)
    np.save(tmp_path / "a.npy", rng.random((30, 6)))
    np.save(tmp_path / "b.npy", rng.random((30, 5)))
    np.savetxt(tmp_path / "y.csv", np.repeat(np.arange(3), 10), fmt="%d")
    with pytest.raises(SystemExit) as exc:
        main(["cluster", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--rounds", "5", "--n-init", "1",
              *map(str, extra)])
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    return [line for line in err.splitlines() if line.startswith("fedsonmf cluster:")]


def test_cli_cluster_says_how_many_seeds_and_why(tmp_path, capsys):
    assert _cluster_cli(tmp_path, capsys, "--clusters", 3) == [
        "fedsonmf cluster: 1 fit (seed 0): no labels, so no scores to average over seeds"]
    assert _cluster_cli(tmp_path, capsys, "--labels", tmp_path / "y.csv", "--seeds", 2) == [
        "fedsonmf cluster: 2 fits (seeds 0..1, as --seeds asks); the scores are the mean ± std over the seeds"]
    assert _cluster_cli(tmp_path, capsys, "--labels", tmp_path / "y.csv", "--seeds", 2, "-q") == []


def test_cli_cluster_default_seeds_rule_is_stated():
    from typer.testing import CliRunner

    from fedsonmf.cli.app import app
    from fedsonmf.cli.cluster import _seeds_line

    assert _seeds_line(10, None, True) == ("fedsonmf cluster: 10 fits (seeds 0..9, the default with labels; "
                                          "--seeds N to change); the scores are the mean ± std over the seeds")
    help_text = " ".join(CliRunner().invoke(app, ["cluster", "--help"], env={"COLUMNS": "400"}).output.split())
    assert "Default: 10 when the data has labels" in help_text and "1 without labels" in help_text


# ------------------------------------------------------------------ data sets print as one line


def test_data_sets_print_as_one_line():
    data = make_synthetic(n_clients=3, n_samples=40, n_features=10, rank=4)
    text = repr(data)
    assert "\n" not in text and len(text) < 200
    assert text == "SyntheticData(3 views of 40x10 dense, n_samples=40, rank=4 (2 active rows of V*), no labels)"
    views = [np.ones((4, 3)), sp.csr_array(np.eye(4, 5))]
    mask = np.array([[True, True], [True, False], [True, True], [False, True]])
    ds = MultiViewDataset(views=views, labels=np.array([0, 1, 1, 2]), view_names=["X{1}", "X{2}"], name="toy",
                          mask=mask)
    assert repr(ds) == ("MultiViewDataset('toy': 4 samples, 2 views [X{1} 4x3 dense, X{2} 4x5 sparse 20% nonzero], "
                        "3 classes, incomplete, held per view 3/3)")
    ds = MultiViewDataset(views=views[:1], labels=None, view_names=["a"], name="one")
    assert repr(ds) == "MultiViewDataset('one': 4 samples, 1 views [a 4x3 dense], no labels, complete)"
    assert str(ds) == repr(ds)
