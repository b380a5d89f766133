"""Federated multi-view clustering: estimator API, robustness, determinism on real data."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import planted
from fedsonmf import ParameterError
from fedsonmf.datasets.mat import default_data_dir
from fedsonmf.estimators.clustering import (
    FedMultiViewClustering,
    auto_mu,
    normalize_rows,
)
from fedsonmf.estimators.options import Flower, MethodOptions, PrivacyOptions, RefineOptions
from fedsonmf.experiments.evaluation import (
    concat_kmeans,
    concat_nmf,
    evaluate_clustering,
)
from fedsonmf.metrics import clustering_scores

FAST = dict(max_rounds=5, tol=0.0, method=MethodOptions(diagnostics=False))


def test_planted_problem_is_clustered_perfectly():
    Xs, y = planted()
    model = FedMultiViewClustering(3, random_state=0, max_rounds=30, tol=0.0)
    labels = model.fit_predict(Xs)
    assert clustering_scores(y, labels) == pytest.approx({"acc": 1.0, "nmi": 1.0, "purity": 1.0})


def test_estimator_api():
    Xs, y = planted()
    model = FedMultiViewClustering(3, random_state=1, n_components="paper", **FAST)  # r = c
    labels = model.fit_predict(Xs)
    assert labels.shape == (y.size,)
    assert np.array_equal(labels, model.labels_)
    assert model.embedding_.shape == (y.size, 3)
    assert model.n_components_ == 3 and model.mu_ > 0 and model.seed_ == 1
    assert np.all(model.embedding_ >= 0)
    assert set(np.unique(labels)) <= {0, 1, 2}
    # fit returns self; get/set params round-trip
    assert model.fit(Xs) is model
    assert model.set_params(n_components=4).get_params()["n_components"] == 4
    assert FedMultiViewClustering(3, random_state=1, n_components=4, **FAST).fit(Xs).embedding_.shape == (y.size, 4)


@pytest.mark.parametrize("bad, match", [
    (0, "'n_clusters' parameter of FedMultiViewClustering must be an int in the range"),
    (-2, "'n_clusters' parameter of FedMultiViewClustering must be an int in the range"),
    (2.5, "'n_clusters' parameter of FedMultiViewClustering must be an int in the range"),
    (True, "'n_clusters' parameter of FedMultiViewClustering must be an int, not a bool"),
    (1000, "n_clusters=1000 is larger than n_samples=45"),
])
def test_n_clusters_validation(bad, match):
    Xs, _ = planted()
    with pytest.raises(ParameterError, match=match):
        FedMultiViewClustering(bad, **FAST).fit(Xs)


@pytest.mark.parametrize("kw, match", [
    ({"n_components": 0}, "n_components"), ({"n_init": 0}, "n_init"), ({"preprocess": "auto-std"}, "preprocess"),
    ({"method": {"tau": 5}}, "'method' parameter of FedMultiViewClustering must be None or an instance of"),
])
def test_other_parameter_validation(kw, match):
    Xs, _ = planted()
    with pytest.raises(ParameterError, match=match):
        FedMultiViewClustering(3, **{**FAST, **kw}).fit(Xs)


@pytest.mark.parametrize("make, match", [
    (lambda: MethodOptions(mu="big"), "'mu' parameter of MethodOptions"),
    (lambda: MethodOptions(mu=-1.0), "'mu' parameter of MethodOptions"),
    (lambda: RefineOptions(starts=0), "'starts' parameter of RefineOptions"),
    (lambda: PrivacyOptions(dp_delta=1.0), "'dp_delta' parameter of PrivacyOptions"),
    (lambda: Flower(run_dir=3), "'run_dir' parameter of Flower"),
])
def test_option_objects_check_their_fields_when_made(make, match):
    with pytest.raises(ParameterError, match=match):
        make()


def test_all_zero_sample_gives_no_nan():
    Xs, y = planted()
    Xs = [X.copy() for X in Xs]
    for X in Xs:
        X[0] = 0.0  # sample 0 is empty in every view
    for normalize in (True, False):
        model = FedMultiViewClustering(3, random_state=0, **{**FAST, "method": MethodOptions(
            diagnostics=False, normalize_embedding=normalize)}).fit(Xs)
        assert np.all(np.isfinite(model.embedding_))
        assert model.labels_.shape == (y.size,)
    assert np.all(np.isfinite(normalize_rows(np.zeros((2, 3)))))
    labels = concat_nmf(Xs, 3, random_state=0)
    assert labels.shape == (y.size,)


def test_auto_mu_is_scale_free():
    Xs, _ = planted()
    mu1 = auto_mu(Xs, 3, eta_tilde=0.15, seed=0)
    mu2 = auto_mu([10 * X for X in Xs], 3, eta_tilde=0.15, seed=0)
    assert mu2 == pytest.approx(10 * mu1)
    assert auto_mu(Xs, 3, eta_tilde=0.15, mu_scale=0.0) == 0.0
    # the estimator normalises the views first, so its mu_ does not depend on their scale
    a = FedMultiViewClustering(3, random_state=0, **FAST).fit(Xs).mu_
    b = FedMultiViewClustering(3, random_state=0, **FAST).fit([10 * X for X in Xs]).mu_
    assert a == pytest.approx(b)


def test_evaluate_clustering_protocol_and_context_methods():
    Xs, y = planted()
    rep = evaluate_clustering(Xs, y, seeds=[0, 1], max_rounds=30, tol=0.0)
    assert rep.seeds == [0, 1] and len(rep.scores["acc"]) == 2 and len(rep.seconds) == 2
    s = rep.summary()
    assert s["acc"] == pytest.approx(100.0) and s["acc_std"] == pytest.approx(0.0)
    assert clustering_scores(y, concat_kmeans(Xs, 3, random_state=0))["acc"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- real data

DATA = default_data_dir()
THREE_SOURCES = DATA / "3Sources" / "ChuanbinZhang" / "3Sources.mat" if DATA else None
needs_data = pytest.mark.skipif(
    THREE_SOURCES is None or not Path(THREE_SOURCES).is_file(), reason="shared data folder absent"
)


@pytest.mark.realdata
@needs_data
def test_3sources_run_is_deterministic_under_a_seed():
    from fedsonmf.datasets.mat import load_mat

    ds = load_mat(THREE_SOURCES)
    kw = dict(random_state=3, max_rounds=3, tol=0.0, method=MethodOptions(diagnostics=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = FedMultiViewClustering(ds.n_classes, **kw).fit(ds.views)
        b = FedMultiViewClustering(ds.n_classes, **kw).fit(ds.views)
    assert np.array_equal(a.embedding_, b.embedding_)
    assert np.array_equal(a.labels_, b.labels_)
    assert a.labels_.shape == (169,)
    assert 0.0 < clustering_scores(ds.labels, a.labels_)["acc"] <= 1.0


# ----------------------------------------------------------------------------- the label-free defaults


def test_default_rank_is_two_c_and_narrow_views_are_padded():
    Xs, y = planted(dims=(12, 4, 10))  # view 1 is narrower than r = 2c = 6
    with pytest.warns(UserWarning, match=r"view\(s\) \[1\].*padded"):
        model = FedMultiViewClustering(3, random_state=0, **FAST).fit(Xs)
    assert model.n_components_ == 6 and model.padded_views_ == [1]
    assert model.embedding_.shape == (y.size, 6) and model.labels_.max() <= 2
    # more clusters than the narrowest view has features is never refused
    Xs5, y5 = planted(c=5, dims=(12, 3))
    with pytest.warns(UserWarning, match="padded"):
        assert FedMultiViewClustering(5, random_state=0, **FAST).fit_predict(Xs5).shape == y5.shape
    with pytest.warns(UserWarning, match="capped at 3"):
        assert FedMultiViewClustering(5, n_components=4, random_state=0, **FAST).fit(Xs5).n_components_ == 3


def test_dense_views_are_centred_by_their_own_statistic_and_predict_reuses_it():
    rng = np.random.default_rng(0)
    Xs, y = planted()
    dense = [X + 5.0 for X in Xs]  # a large common part: the mean sample dominates each view
    model = FedMultiViewClustering(3, random_state=0, max_rounds=60, tol=0.0).fit(dense)
    assert all(info["centered"] and info["standardized"] for info in model.preprocessing_)
    assert clustering_scores(y, model.labels_)["acc"] == pytest.approx(1.0)
    assert np.mean(model.predict(dense) == model.labels_) >= 0.95
    sparse_like = FedMultiViewClustering(3, random_state=0, **FAST).fit(Xs)
    assert not any(info["centered"] for info in sparse_like.preprocessing_)
    assert rng is not None


def test_paper_preset_is_one_call_away():
    m = FedMultiViewClustering.paper(3, random_state=0, **FAST)
    assert (m.n_components, m.preprocess, m.method.normalize_embedding) == ("paper", "none", False)
    Xs, y = planted()
    assert m.fit(Xs).n_components_ == 3


def test_restarts_are_combined_by_consensus():
    Xs, y = planted()
    model = FedMultiViewClustering(3, n_init=3, random_state=0, max_rounds=30, tol=0.0).fit(Xs)
    assert len(model.seeds_) == 3 and len(set(model.seeds_)) == 3
    assert clustering_scores(y, model.labels_)["acc"] == pytest.approx(1.0)
    assert np.mean(model.predict(Xs) == model.labels_) >= 0.95
