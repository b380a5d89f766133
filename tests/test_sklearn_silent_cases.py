"""The cases that used to give a silently wrong (or misleading) answer: each is now an error or a warning."""

import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from fedsonmf import FedSONMF, federated_sonmf
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.exceptions import InputError, ParameterError

FAST = dict(max_rounds=3, tol=0, random_state=0)


@pytest.fixture(scope="module")
def views():
    rng = np.random.default_rng(0)
    return [rng.random((30, 6)), rng.random((30, 8))]


@pytest.mark.parametrize("cls", [FedSONMF, FedMultiViewClustering])
def test_a_single_view_warns(cls, views):
    with pytest.warns(UserWarning, match="single view: a federation of one client"):
        cls(2, **FAST).fit(views[:1])


def test_two_views_do_not_warn(views):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FedSONMF(2, **FAST).fit(views)


def test_float16_views_give_float32_with_a_warning(views):
    v16 = [v.astype(np.float16) for v in views]
    with pytest.warns(UserWarning, match="view 0 is float16"):
        est = FedSONMF(2, **FAST).fit(v16)
    assert est.embedding_.dtype == np.float32 and all(C.dtype == np.float32 for C in est.components_)
    with pytest.warns(UserWarning, match="float16"):
        assert est.transform(v16).dtype == np.float32


@pytest.mark.parametrize("bad", [3, "print", [1]])
def test_a_callback_that_is_not_callable_is_a_parameter_error(views, bad):
    with pytest.raises(ParameterError, match="callback must be None or a callable"):
        federated_sonmf(views, 2, callback=bad, **FAST)
    with pytest.raises(ParameterError, match="callback must be None or a callable"):
        FedMultiViewClustering(2, **FAST).fit(views, callback=bad)


@pytest.mark.parametrize("make", [lambda n: np.full((n, 5), 3.0), lambda n: sp.csr_matrix(np.full((n, 5), -2.0))])
def test_a_constant_view_is_named_as_constant_not_all_zero(views, make):
    with pytest.raises(InputError, match=r"view 1 is constant \(every entry is -?\d+\)") as exc:
        FedMultiViewClustering(2, **FAST).fit([views[0], make(30)])
    assert "all zero" not in str(exc.value)


def test_a_one_feature_view_says_it_carries_nothing(views):
    """One positive feature: every sample is the same after scaling it to unit norm -- the client's
    guard says so (and leaves the view uncentred) instead of fitting it silently."""
    with pytest.warns(UserWarning, match=r"view 1: the view is constant .* no information about the clusters"):
        FedMultiViewClustering(2, **FAST).fit([views[0], views[1][:, :1] + 1.0])


def test_an_all_zero_view_is_still_called_all_zero(views):
    with pytest.raises(InputError, match="view 1 is all zero"):
        FedMultiViewClustering(2, **FAST).fit([views[0], np.zeros((30, 4))])


@pytest.mark.parametrize("bad", [-1, 1.5, "yes", None])
def test_verbose_is_an_integer_level(views, bad):
    with pytest.raises(ParameterError, match="verbose must be an integer >= 0"):
        FedSONMF(2, verbose=bad, **FAST).fit(views)


def test_verbose_one_prints_progress_and_a_summary(views, capsys):
    FedSONMF(2, max_rounds=20, tol=0, random_state=0, verbose=1).fit(views)
    err = capsys.readouterr().err.splitlines()
    assert [line.split()[1] for line in err[:2]] == ["10/20", "20/20"] and "left" in err[0]
    assert err[-1].startswith("FedSONMF: 20 rounds")
    FedSONMF(2, max_rounds=3, tol=0, random_state=0, verbose=2).fit(views)
    assert len(capsys.readouterr().err.splitlines()) == 4  # every round and the summary
    FedSONMF(2, **FAST).fit(views)
    assert capsys.readouterr().err == ""  # verbose=0 is silent


def test_sklearn_attributes_and_dataframe_column_names(views):
    df = pd.DataFrame(views[0], columns=[f"gene{i}" for i in range(6)])
    est = FedSONMF(2, **FAST).fit([df, views[1]])
    assert est.n_iter_ == 3 and est.n_components_ == 2 and est.n_features_in_ == [6, 8]
    assert list(est.feature_names_in_[0]) == list(df.columns) and est.feature_names_in_[1] is None
    assert list(est.get_feature_names_out()) == ["fedsonmf0", "fedsonmf1"]
    out = FedSONMF(2, **FAST).set_output(transform="pandas").fit_transform([df, views[1]])
    assert isinstance(out, pd.DataFrame) and list(out.columns) == ["fedsonmf0", "fedsonmf1"]
    assert not hasattr(FedSONMF(2, **FAST).fit(views), "feature_names_in_")
    clu = FedMultiViewClustering(2, **FAST).set_output(transform="pandas").fit([df, views[1]])
    assert clu.n_iter_ == 3 and list(clu.feature_names_in_[0]) == list(df.columns)
    assert list(clu.transform([df, views[1]]).columns) == list(clu.get_feature_names_out())


def test_reconstruction_err_is_the_frobenius_norm_as_in_sklearn(views):
    est = FedSONMF(2, **FAST).fit(views)
    E = est.embedding_
    expected = np.sqrt(sum(np.sum((X - E @ C) ** 2) for X, C in zip(views, est.components_)))
    assert est.reconstruction_err_ == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("cls", [FedSONMF, FedMultiViewClustering])
def test_feature_names_are_checked_at_transform(cls, views):
    df = pd.DataFrame(views[0], columns=[f"g{i}" for i in range(6)])
    est = cls(2, **FAST).fit([df, views[1]])
    est.transform([df, views[1]])
    with pytest.raises(InputError, match="view 0's feature names differ"):
        est.transform([df[df.columns[::-1]], views[1]])
    with pytest.warns(UserWarning, match="view 0 has no feature names"):
        est.transform([views[0], views[1]])
