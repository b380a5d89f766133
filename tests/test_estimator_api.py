"""The estimators are real scikit-learn estimators: contract, out-of-sample, checkpoints, dtypes."""

import dataclasses
import inspect
import pickle
import warnings

import numpy as np
import pytest
import sklearn.exceptions
from sklearn.base import clone
from sklearn.cluster import KMeans
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted

from fedsonmf import FedSONMF, federated_sonmf
from fedsonmf.datasets import make_synthetic
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import Flower, InProcess, MethodOptions, PrivacyOptions, RefineOptions
from fedsonmf.exceptions import (
    ConvergenceWarning,
    FedSONMFError,
    InputError,
    ParameterError,
)
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.params import CLUSTER_PARAMS, CLUSTERING_SIGNATURE, FED_PARAMS, PARAMS, RUN_PARAMS, grouped

FAST = dict(max_rounds=4, tol=0.0)


@pytest.fixture(scope="module")
def data():
    return make_synthetic(n_clients=3, n_samples=40, n_features=10, rank=3, n_zero_rows=0, heterogeneity=0.3,
                          random_state=1)


def planted_clusters(n_per=15, seed=0):
    """Three well separated clusters seen through two nonnegative views."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), n_per)
    Xs = []
    for d in (9, 12):
        centers = np.zeros((3, d))
        for k in range(3):
            centers[k, k * (d // 3):(k + 1) * (d // 3)] = 1.0
        Xs.append(centers[y] + 0.05 * rng.random((y.size, d)))
    return Xs, y


# ----------------------------------------------------------------------------- parameters declared once


@pytest.mark.parametrize("cls", [FedSONMF, FedMultiViewClustering])
def test_signature_defaults_come_from_the_table(cls):
    sig = inspect.signature(cls.__init__)
    names = [n for n in sig.parameters if n != "self"]
    if cls is FedSONMF:
        assert set(names) == set(FED_PARAMS) | set(RUN_PARAMS)
    else:  # a small surface: the rest lives in the option objects
        assert tuple(names) == CLUSTERING_SIGNATURE and len(names) <= 15
    for n in names:
        if cls is FedMultiViewClustering and n == "n_components":
            assert sig.parameters[n].default == "auto"  # the clustering's own rank rule (r = 2c)
            continue
        assert sig.parameters[n].default == PARAMS[n].default, n


@pytest.mark.parametrize("cls, group", [(MethodOptions, "method"), (RefineOptions, "refinement"),
                                        (PrivacyOptions, "privacy"), (InProcess, "inprocess"), (Flower, "flower")])
def test_option_objects_are_the_table(cls, group):
    """Every field of an option object is a table parameter of its group, with the table's default, and
    every table parameter of the clustering lives in exactly one place: the signature or an object."""
    params = grouped(group)
    assert [f.name for f in dataclasses.fields(cls)] == [p.key for p in params]
    obj = cls()
    for p in params:
        assert getattr(obj, p.key) == p.default, p.name
    placed = set(CLUSTERING_SIGNATURE) | {p.name for g in ("method", "refinement", "privacy", "inprocess", "flower")
                                          for p in grouped(g)}
    assert set(CLUSTER_PARAMS) | set(FED_PARAMS) - {"n_components"} <= placed


def test_the_constraints_are_declared_for_every_parameter():
    """scikit-learn's _parameter_constraints, generated from the table, cover the whole signature."""
    assert set(FedMultiViewClustering._parameter_constraints) == set(CLUSTERING_SIGNATURE)
    for name in CLUSTERING_SIGNATURE:
        assert FedMultiViewClustering._parameter_constraints[name], name


@pytest.mark.parametrize("cls", [FedSONMF, FedMultiViewClustering])
def test_constructor_is_written_out_keyword_only_and_only_stores(cls):
    """scikit-learn style: one positional argument, the rest keyword-only; __init__ stores, never validates."""
    sig = inspect.signature(cls.__init__)
    params = [p for n, p in sig.parameters.items() if n != "self"]
    assert params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])
    src = inspect.getsource(cls.__init__)  # a real function in the class body (no generated code)
    assert "exec" not in src
    bogus = {p.name: object() for p in params}
    est = cls(**bogus)  # any value is stored as given; fit validates
    assert all(getattr(est, n) is v for n, v in bogus.items())


def test_function_and_fedconfig_share_the_defaults():
    sig = inspect.signature(federated_sonmf)
    assert sig.parameters["n_components"].default == PARAMS["n_components"].default
    cfg = FedConfig()
    for name in FED_PARAMS:
        if name == "alpha":  # "auto": FedConfig holds the number of the step rule
            from fedsonmf.protocol.config import auto_alpha

            assert PARAMS[name].default == "auto" and cfg.alpha_rule == "auto"
            assert cfg.alpha == auto_alpha(cfg.tau, cfg.eta_g)
        elif name != "ustep":
            assert getattr(cfg, name) == PARAMS[name].default, name


def test_cli_defaults_come_from_the_table():
    import typer.main

    from fedsonmf.cli.app import app

    cmd = typer.main.get_command(app)
    cluster = cmd.commands["cluster"]
    by_name = {p.name: p for p in cluster.params}
    assert by_name["tau"].default == PARAMS["tau"].default
    assert by_name["rho1"].default == PARAMS["rho1"].default
    assert by_name["tol"].default == PARAMS["tol"].default
    assert by_name["mu"].default == PARAMS["mu"].default
    flower_run = cmd.commands["flower"].commands["run"]
    fr = {p.name: p for p in flower_run.params}
    for name in ("tau", "rho1", "tol", "alpha", "eta_g"):
        assert fr[name].default == PARAMS[name].default, name


# ----------------------------------------------------------------------------- scikit-learn contract


@pytest.mark.parametrize("est", [FedSONMF(3), FedMultiViewClustering(3)])
def test_unfitted_use_raises_not_fitted(est, data):
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    with pytest.raises(NotFittedError):
        est.transform(data.views)


def test_fitted_estimator_passes_check_is_fitted_clone_pickle(data):
    est = FedSONMF(3, random_state=0, **FAST).fit(data.views)
    check_is_fitted(est)
    c = clone(est)
    assert c.get_params() == est.get_params() and not hasattr(c, "embedding_")
    back = pickle.loads(pickle.dumps(est))
    assert np.array_equal(back.embedding_, est.embedding_)
    assert np.array_equal(back.transform(data.views), est.transform(data.views))
    assert repr(est).startswith("FedSONMF(") and "n_components=3" in repr(est)


def test_get_set_params_and_nested_clone():
    est = FedMultiViewClustering(4, method=MethodOptions(tau=3))
    assert est.get_params()["method"].tau == 3
    est.set_params(method=MethodOptions(tau=5, alpha=0.02), refinement=RefineOptions(starts=2))
    assert (est.method.tau, est.method.alpha, est.refinement.starts) == (5, 0.02, 2)
    with pytest.raises(ValueError, match="(?i)invalid parameter"):
        est.set_params(tau=1)  # a grouped parameter is set through its option object
    assert clone(est).get_params() == est.get_params()


def test_numpy_scalars_everywhere(data):
    est = FedSONMF(np.int64(3), tau=np.int32(2), alpha=np.float32(0.01), eta_g=np.float64(1.5),
                   max_rounds=np.int64(3), tol=np.float32(0.0), random_state=np.int64(0)).fit(data.views)
    import json

    json.dumps(est.result_.config)  # no NumPy scalars left for the JSON encoder
    assert est.embedding_.shape == (40, 3) and isinstance(est.result_.config["n_components"], int)
    labels = FedMultiViewClustering(np.int64(3), n_init=np.int64(2), random_state=0, **FAST).fit_predict(data.views)
    assert labels.shape == (40,)


@pytest.mark.parametrize("rs", [0, np.random.RandomState(3), np.random.default_rng(3)])
def test_random_state_kinds(data, rs):
    est = FedSONMF(3, random_state=rs, **FAST).fit(data.views)
    again = FedSONMF(3, random_state=est.seed_, **FAST).fit(data.views)
    assert np.array_equal(est.embedding_, again.embedding_)


def test_errors_follow_scikit_learn_conventions(data):
    assert issubclass(ConvergenceWarning, sklearn.exceptions.ConvergenceWarning)
    for err in (InputError, ParameterError, FedSONMFError):
        assert issubclass(err, ValueError)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=sklearn.exceptions.ConvergenceWarning)
        FedSONMF(3, max_rounds=2, tol=1e-12, random_state=0).fit(data.views)
    assert not [w for w in rec if issubclass(w.category, sklearn.exceptions.ConvergenceWarning)]


def test_validation_happens_before_any_computation(data, monkeypatch):
    import fedsonmf.estimators.sonmf as mod

    def boom(*a, **k):
        raise AssertionError("computation started")

    monkeypatch.setattr(mod, "run_inprocess", boom)
    with pytest.raises(ParameterError, match="tau"):
        FedSONMF(3, tau=0).fit(data.views)
    with pytest.raises(ParameterError, match="n_init"):
        FedMultiViewClustering(3, n_init=0).fit(data.views)
    with pytest.raises(InputError, match="different numbers of samples"):
        FedMultiViewClustering(3).fit([data.views[0], data.views[1][:10]])


# ----------------------------------------------------------------------------- dtype


def test_float32_views_give_float32_results(data):
    v32 = [v.astype(np.float32) for v in data.views]
    est = FedSONMF(3, random_state=0, **FAST).fit(v32)
    assert est.embedding_.dtype == np.float32 and all(C.dtype == np.float32 for C in est.components_)
    assert est.transform(v32).dtype == np.float32
    e64 = FedSONMF(3, random_state=0, **FAST).fit(data.views).embedding_
    assert e64.dtype == np.float64
    assert np.allclose(est.embedding_, e64, rtol=1e-4, atol=1e-5 * np.abs(e64).max())


# ----------------------------------------------------------------------------- out of sample


def test_transform_of_training_views_matches_embedding_at_convergence(data):
    est = FedSONMF(3, max_rounds=400, tol=1e-8, random_state=0, rho1=1.0, mu=1.0).fit(data.views)
    T = est.transform(data.views)
    assert T.shape == est.embedding_.shape and np.all(T >= 0)
    rel = np.linalg.norm(T - est.embedding_) / np.linalg.norm(est.embedding_)
    assert rel < 1e-3, rel
    # score: higher is better, and the training error is the fitted one at convergence
    assert est.score(data.views) == pytest.approx(-est.reconstruction_err_, rel=1e-3)


def test_transform_embeds_new_samples_like_a_fit(data):
    est = FedSONMF(3, random_state=0, max_rounds=200, tol=1e-6).fit([v[:30] for v in data.views])
    new = [v[30:] for v in data.views]
    E = est.transform(new)
    assert E.shape == (10, 3) and np.all(E >= 0)
    with pytest.raises(InputError, match="fitted on 3 views"):
        est.transform(new[:2])
    with pytest.raises(InputError, match="fitted on 3 views"):
        est.reconstruction_error(new[:1])
    rec = est.inverse_transform(E)
    assert [R.shape for R in rec] == [(10, 10)] * 3


def test_predict_reproduces_the_training_labels():
    Xs, y = planted_clusters()
    model = FedMultiViewClustering(3, random_state=0, max_rounds=300, tol=1e-7).fit(Xs)
    same = np.mean(model.predict(Xs) == model.labels_)
    assert same >= 0.95, same
    # new samples from the same clusters land in the cluster of their training mates
    Xn, yn = planted_clusters(n_per=5, seed=7)
    pred = model.predict(Xn)
    mapping = {k: np.bincount(model.labels_[y == k]).argmax() for k in range(3)}
    assert np.mean(pred == np.array([mapping[k] for k in yn])) >= 0.9


def test_pipeline_with_kmeans(data):
    pipe = Pipeline([("f", FedSONMF(3, random_state=0, **FAST)), ("k", KMeans(3, n_init=3, random_state=0))])
    labels = pipe.fit_predict(data.views)
    assert labels.shape == (40,)
    assert pipe.predict(data.views).shape == (40,)


# ----------------------------------------------------------------------------- checkpoints


def test_checkpoint_dir_resumes_bit_identically(data, tmp_path):
    full = FedSONMF(3, random_state=0, max_rounds=8, tol=0).fit(data.views)
    part = FedSONMF(3, random_state=0, max_rounds=5, tol=0, checkpoint_dir=tmp_path).fit(data.views)
    assert part.n_rounds_ == 5
    resumed = FedSONMF(3, random_state=0, max_rounds=8, tol=0, checkpoint_dir=tmp_path).fit(data.views)
    assert resumed.n_rounds_ == 8
    assert np.array_equal(resumed.embedding_, full.embedding_)
    assert all(np.array_equal(a, b) for a, b in zip(resumed.components_, full.components_))
    # a finished run resumes to itself
    again = FedSONMF(3, random_state=0, max_rounds=8, tol=0, checkpoint_dir=tmp_path).fit(data.views)
    assert np.array_equal(again.embedding_, full.embedding_)


def test_checkpoint_of_another_run_is_refused(data, tmp_path):
    from fedsonmf.exceptions import CheckpointError

    FedSONMF(3, random_state=0, max_rounds=2, tol=0, checkpoint_dir=tmp_path).fit(data.views)
    with pytest.raises(CheckpointError, match="tau"):
        FedSONMF(3, random_state=0, tau=3, max_rounds=4, tol=0, checkpoint_dir=tmp_path).fit(data.views)


# ----------------------------------------------------------------------------- the CLI's entry point


def _main(argv, capsys):
    from fedsonmf.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_cli_help_is_dash_h(capsys):
    code, out, _ = _main(["synthetic", "-h"], capsys)
    assert code == 0 and "--heterogeneity" in out and "-H" in out


@pytest.mark.parametrize("argv, fragment", [
    (["synthetic", "--tau", "0", "--rounds", "2", "-q"], "tau must be an integer >= 1"),
    (["synthetic", "--rank", "30", "--rounds", "2", "-q"], "rank=30 must not exceed n_features=20"),
    (["synthetic", "--rounds", "2", "-q", "--json", "/nonexistent-dir/x.json"], "does not exist"),
    (["synthetic", "-H", "2", "--rounds", "2", "-q"], "must be in [0, 1]"),
    (["synthetic", "--algorithm", "nope", "--rounds", "2", "-q"], "unknown algorithm"),
    (["flower", "run", "x.npy", "--out", "/tmp/x", "--mu", "big"], "'auto'"),
])
def test_cli_failures_exit_non_zero_with_one_line(argv, fragment, capsys):
    code, out, err = _main(argv, capsys)
    assert code != 0
    assert fragment in err, err
    assert "Traceback" not in err


def test_cli_checkpoint_flag(tmp_path, capsys):
    code, out, _ = _main(["synthetic", "--rounds", "3", "-q", "--clients", "3", "--checkpoint-dir", str(tmp_path)],
                         capsys)
    assert code in (0, None) or code == 0
    assert (tmp_path / "server.npz").is_file()


@pytest.mark.parametrize("c", [1e-6, 1e6])
def test_fit_on_scaled_data_gives_same_bases_and_scaled_v(data, c):
    """With the scale-free defaults (mu auto, rho1 0) a fit on c X is the fit on X, scaled."""
    a = federated_sonmf(data.views, 3, max_rounds=6, tol=0, random_state=0)
    b = federated_sonmf([c * v for v in data.views], 3, max_rounds=6, tol=0, random_state=0)
    assert all(np.allclose(U, W, atol=1e-9) for U, W in zip(a.bases, b.bases))
    np.testing.assert_allclose(b.V / c, a.V, rtol=1e-7, atol=1e-9 * np.abs(a.V).max())
    assert [r["effective_rank"] for r in a.history.rows] == [r["effective_rank"] for r in b.history.rows]


def test_training_error_counts_only_the_samples_a_view_holds(data):
    """With masks, rows outside a view's mask are never read: not by the fit, not by reconstruction_err_."""
    mask0 = np.arange(40) % 2 == 0
    masks = [mask0, None, None]
    a = [v.copy() for v in data.views]
    b = [v.copy() for v in data.views]
    a[0][~mask0] = 0.0
    b[0][~mask0] = 1e3
    ea = FedSONMF(3, random_state=0, **FAST).fit(a, masks=masks)
    eb = FedSONMF(3, random_state=0, **FAST).fit(b, masks=masks)
    assert np.array_equal(ea.embedding_, eb.embedding_)
    assert ea.reconstruction_err_ == eb.reconstruction_err_


def test_option_fields_are_searchable_as_nested_parameters(data):
    """scikit-learn's nested names reach an option object's fields: set_params(method__tau=...) checks
    the value, a clone gets its own object, and a search over one field runs."""
    from sklearn.base import clone

    from fedsonmf.model_selection import GridSearchCV

    est = FedMultiViewClustering(3, method=MethodOptions(tau=3), max_rounds=3, tol=0, n_init=1, random_state=0)
    twin = clone(est)
    assert twin.method is not est.method and twin.method == est.method
    est.set_params(method__tau=5, refinement=RefineOptions(starts=2))
    assert (est.method.tau, twin.method.tau, est.refinement.starts) == (5, 3, 2)
    with pytest.raises(ParameterError, match="'tau' parameter of MethodOptions"):
        est.set_params(method__tau=0)
    with pytest.raises(ParameterError, match="has no field 'bogus'"):
        est.set_params(method__bogus=1)
    est.method.tau = -1  # assigned past the checks: refused when the estimator fits with it
    with pytest.raises(ParameterError, match="'tau' parameter of MethodOptions"):
        est.fit(data.views)
    est.method.tau = 5
    search = GridSearchCV(est, {"method__tau": [2, 5]}, cv=2).fit(data.views)
    assert search.best_params_["method__tau"] in (2, 5) and est.method.tau == 5
