"""The clustering estimator reports its whole fit: every fit's rounds, the stages and the total time."""

import numpy as np
import pytest

from fedsonmf.estimators import FedMultiViewClustering


def _views(seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), 15)
    return [rng.normal(size=(3, d))[y] * 2 + rng.normal(size=(45, d)) for d in (8, 6)], y


@pytest.mark.filterwarnings("ignore")
def test_the_report_covers_every_fit_and_stage_and_verbose_says_where_the_fit_is(capsys):
    views, _ = _views()
    m = FedMultiViewClustering(3, random_state=0, max_rounds=8, n_init=3, verbose=1).fit(views)
    rep = m.fit_report_
    assert rep["n_fits"] == 3 and rep["rounds"] == m.fit_rounds_ and len(m.fit_rounds_) == 3
    assert rep["total_rounds"] == sum(m.fit_rounds_) and m.fit_rounds_[m.best_restart_] == m.n_rounds_
    assert rep["refine_exchanges"] == sum(m.refine_iter_) and rep["graph_exchanges"] == sum(m.graph_iter_)
    assert rep["kept_fit_stopping_reason"] == m.result_.stopping_reason
    assert rep["seconds"] > 0 and m.stopping_reason_.endswith("s in all")
    assert f"{rep['total_rounds']} rounds in all" in m.stopping_reason_
    err = capsys.readouterr().err
    for i in (1, 2, 3):  # every fit says which it is
        assert f"fit {i}/3" in err
    assert "kept (the medoid" in err and "k-means refinement:" in err and "graph stage:" in err
    assert err.strip().splitlines()[-1].startswith("FedMultiViewClustering: done:")
    assert "FedSONMF:" not in err  # the fits do not report as if each were the whole job


def test_fit_predict_is_fit_then_labels():
    views, _ = _views(1)
    kw = dict(random_state=0, max_rounds=8, n_init=2)
    with pytest.warns(UserWarning):
        a = FedMultiViewClustering(3, **kw).fit_predict(views)
        b = FedMultiViewClustering(3, **kw).fit(views).labels_
    assert np.array_equal(a, b)
