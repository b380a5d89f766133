"""Differential privacy of the uploads (fedsonmf.protocol.privacy, fedsonmf.core.dp, the ClientRuntime hook)."""

import json
import math

import numpy as np
import pytest

from fedsonmf import FedSONMF, federated_sonmf
from fedsonmf.core.dp import clip_frobenius, gaussian_release
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.datasets import make_synthetic
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import PrivacyOptions
from fedsonmf.exceptions import ParameterError
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.federation.loop import ClientRuntime, run_federation, setup_messages
from fedsonmf.protocol import privacy
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import Message

dp_accounting = pytest.importorskip("dp_accounting")

DP = dict(diagnostics=False)


@pytest.fixture(scope="module")
def data():
    return make_synthetic(n_clients=3, n_samples=400, n_features=12, rank=4, heterogeneity=0.3, random_state=2)


def _views_dn(data):
    return [np.ascontiguousarray(v.T) for v in data.views]


def _round_replies(X, cfg_dp, cfg_plain, *, dp_seed=(7, 3, 0), client=0, seed=11):
    """Setup + round 1 of one client with and without DP, from the same state and the same broadcast."""
    a = ClientRuntime(X, "fedsonmf", cfg_dp, dp_seed=list(dp_seed))
    b = ClientRuntime(X, "fedsonmf", cfg_plain)
    setup = setup_messages(client + 1, seed, cfg_dp, "fedsonmf")[client]
    ra, rb = a.handle(setup), b.handle(setup)
    assert np.array_equal(a.state.arrays["U"], b.state.arrays["U"])  # the noise never touches the client's state
    Vbar = np.maximum(rb.arrays["Vproj"], 0.0)
    msg = Message("round", 1, {"Vbar": Vbar}, {"mu": 0.0} if cfg_dp.mu_is_auto else {})
    return (ra, rb), (a.handle(msg), b.handle(msg)), prox_l21_nonneg(Vbar, 0.0)


# ----------------------------------------------------------------------------- the mechanism


def test_clip_bounds_the_norm_and_keeps_the_direction():
    rng = np.random.default_rng(0)
    D = rng.normal(size=(5, 30))
    n = np.linalg.norm(D)
    C, norm = clip_frobenius(D, 0.5 * n)
    assert norm == pytest.approx(n)
    assert np.linalg.norm(C) == pytest.approx(0.5 * n)
    assert np.allclose(C / np.linalg.norm(C), D / n)
    small, _ = clip_frobenius(D, 2 * n)
    assert np.array_equal(small, D)  # below the bound: unchanged


def test_noise_has_the_declared_scale(data):
    """Released - V^s - clip(true change) is N(0, (z * 2C)^2) per entry, the std checked to 4 %."""
    X = _views_dn(data)[0]
    z, C, C0 = 0.7, 0.3, 0.9
    cfg_dp = FedConfig(n_components=4, mu=0.0, dp_noise_multiplier=z, dp_clip=C, dp_clip_setup=C0, **DP)
    (sa, sb), (ra, rb), V = _round_replies(X, cfg_dp, FedConfig(n_components=4, mu=0.0, diagnostics=False))
    std = z * 2 * C
    # round upload: clipped around the public V^s
    clipped, _ = clip_frobenius(rb.arrays["Vhat"] - V, C)
    noise = ra.arrays["Vhat"] - V - clipped
    assert noise.size == 4 * 400
    assert abs(noise.std() / std - 1) < 0.04, noise.std() / std
    assert abs(noise.mean()) < 4 * std / math.sqrt(noise.size)
    # setup upload: V_proj clipped around zero to its own bound, noise z * 2 C0, an independent draw
    noise0 = sa.arrays["Vproj"] - clip_frobenius(sb.arrays["Vproj"], C0)[0]
    assert abs(noise0.std() / (z * 2 * C0) - 1) < 0.04
    assert abs(np.corrcoef(noise.ravel(), noise0.ravel())[0, 1]) < 0.1


def test_clipping_bounds_the_released_change(data):
    """With (almost) no noise the released change has norm exactly min(||change||, C)."""
    X = _views_dn(data)[1]
    for C in (1e-3, 1e3):
        cfg_dp = FedConfig(n_components=4, mu=0.0, dp_noise_multiplier=1e-12, dp_clip=C, dp_clip_setup=C, **DP)
        (sa, sb), (ra, rb), V = _round_replies(X, cfg_dp, FedConfig(n_components=4, mu=0.0, diagnostics=False))
        true = np.linalg.norm(rb.arrays["Vhat"] - V)
        released = np.linalg.norm(ra.arrays["Vhat"] - V)
        assert released == pytest.approx(min(true, C), rel=1e-6)
        assert np.linalg.norm(sa.arrays["Vproj"]) == pytest.approx(min(np.linalg.norm(sb.arrays["Vproj"]), C),
                                                                    rel=1e-6)
    assert true > 1e-3  # the small bound did clip


def test_gaussian_release_refuses_a_reference_of_another_shape():
    with pytest.raises(ValueError, match="reference"):
        gaussian_release(np.zeros((2, 3)), np.zeros((3, 2)), 1.0, 1.0, np.random.default_rng(0))


# ----------------------------------------------------------------------------- the accountant


def test_epsilon_decreases_as_the_noise_multiplier_grows():
    zs = [0.3, 0.6, 1.0, 2.0, 5.0, 20.0]
    eps = [privacy.epsilon(z, 21, 1e-5) for z in zs]
    assert all(a > b for a, b in zip(eps, eps[1:])), eps
    # more releases cost more
    assert privacy.epsilon(1.0, 41, 1e-5) > privacy.epsilon(1.0, 21, 1e-5)


def test_epsilon_matches_the_library_for_the_composed_mechanism(data):
    """The run's epsilon equals dp-accounting's own value for its rounds + 1 Gaussian releases."""
    from dp_accounting.rdp import RdpAccountant

    res = federated_sonmf(data.views, 4, dp_noise_multiplier=1.3, dp_rounds=5, random_state=0)
    rep = res.extra["privacy"]
    assert rep["rounds"] == 5 and rep["releases_per_client"] == 6
    acc = RdpAccountant()
    acc.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(1.3)] * 6))
    assert rep["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    # secure aggregation: the sum carries the noise of m clients; all views at once: m releases per round
    m = 3
    for key, z in (("epsilon_secagg", 1.3 * math.sqrt(m)), ("epsilon_all_views", 1.3 / math.sqrt(m))):
        acc = RdpAccountant()
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 6))
        assert rep[key] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9), key
    assert rep["epsilon_secagg"] < rep["epsilon"] < rep["epsilon_all_views"]
    assert rep["noise_std"] == pytest.approx(1.3 * 2 * rep["clip"])
    json.dumps(res.to_json_dict(), default=str)  # the report is in the result's JSON
    assert res.to_json_dict()["privacy"]["epsilon"] == rep["epsilon"]


@pytest.mark.parametrize("target", [0.5, 4.0, 300.0])
def test_calibration_meets_the_target(target):
    z = privacy.calibrate_noise_multiplier(target, 1e-5, 21)
    eps = privacy.epsilon(z, 21, 1e-5)
    assert eps <= target and eps == pytest.approx(target, rel=1e-3)
    cfg = FedConfig(dp_epsilon=target, dp_rounds=20, **DP)
    assert cfg.dp_sigma == z  # rounds + the setup upload: 21 releases


# ----------------------------------------------------------------------------- runs


def test_dp_off_is_the_plain_run(data):
    """DP parameters without dp_epsilon / dp_noise_multiplier change nothing, bit for bit."""
    a = federated_sonmf(data.views, 4, max_rounds=4, tol=0, random_state=0)
    b = federated_sonmf(data.views, 4, max_rounds=4, tol=0, random_state=0, dp_clip=0.3, dp_delta=1e-3, dp_rounds=2)
    assert np.array_equal(a.V, b.V) and all(np.array_equal(U, W) for U, W in zip(a.bases, b.bases))
    plain = FedSONMF(4, max_rounds=2, tol=0, random_state=0).fit(data.views)
    assert "privacy" not in a.extra and plain.privacy_ is None
    assert [r["objective"] for r in a.history.rows] == [r["objective"] for r in b.history.rows]


def test_dp_run_is_reproducible_and_every_client_has_its_own_stream(data):
    a = FedSONMF(4, dp_epsilon=20.0, dp_rounds=4, random_state=5).fit(data.views)
    b = FedSONMF(4, dp_epsilon=20.0, dp_rounds=4, random_state=5).fit(data.views)
    c = FedSONMF(4, dp_epsilon=20.0, dp_rounds=4, random_state=6).fit(data.views)
    assert np.array_equal(a.embedding_, b.embedding_)
    assert not np.allclose(a.embedding_, c.embedding_)
    assert a.n_rounds_ == 4 and a.privacy_["epsilon"] <= 20.0
    assert "R_rel" not in a.history_.rows[0]  # no diagnostics were sent
    # the noise of two clients: independent streams (same view, same basis seed, different noise seeds)
    X = _views_dn(data)[0]
    cfg = FedConfig(n_components=4, mu=0.0, dp_noise_multiplier=1.0, dp_clip_setup=1e-6, **DP)
    setup = setup_messages(1, 3, cfg, "fedsonmf")[0]
    n0 = ClientRuntime(X, "fedsonmf", cfg, dp_seed=[5, 3, 0]).handle(setup).arrays["Vproj"]
    n1 = ClientRuntime(X, "fedsonmf", cfg, dp_seed=[5, 3, 1]).handle(setup).arrays["Vproj"]
    assert abs(np.corrcoef(n0.ravel(), n1.ravel())[0, 1]) < 0.1


def test_a_deployment_nodes_noise_is_not_a_function_of_the_run_seed(data):
    """Without dp_seed (a Flower node) the noise seed is the node's own: the server's seed does not give it."""
    X = _views_dn(data)[0]
    cfg = FedConfig(n_components=4, mu=0.0, dp_noise_multiplier=1.0, dp_clip_setup=1e-6, **DP)
    setup = setup_messages(1, 3, cfg, "fedsonmf")[0]
    a, b = ClientRuntime(X, "fedsonmf", cfg), ClientRuntime(X, "fedsonmf", cfg)
    va, vb = a.handle(setup).arrays["Vproj"], b.handle(setup).arrays["Vproj"]
    assert not np.allclose(va, vb)
    assert a.state.arrays["dp_seed"].size == 4  # 128 bits, kept in the client state only


def test_only_noised_arrays_leave_a_dp_client(data):
    """The recorded uplink of a DP run: V_proj and Vhat only, no diagnostics, no scalar but d and n."""
    from fedsonmf.federation.inprocess import InProcessTransport

    cfg = FedConfig(n_components=4, dp_noise_multiplier=2.0, dp_rounds=3, **DP)
    clients = [ClientRuntime(X, "fedsonmf", cfg, dp_seed=[1, 3, p]) for p, X in enumerate(_views_dn(data))]
    transport = InProcessTransport(clients)
    transport.log = []
    res = run_federation(transport, "fedsonmf", cfg, max_rounds=3, seed=1)
    ups = [m for d, _, m in transport.log if d == "up"]
    assert len(ups) == 3 * 4
    for m in ups:
        assert not m.diagnostics
        assert set(m.arrays) == ({"Vproj"} if m.kind == "setup" else {"Vhat"})
        assert set(m.scalars) <= {"d", "n"}
    assert res.extra["privacy"]["rounds"] == 3


def test_dp_run_resumes_bit_identically(data, tmp_path):
    """The noise seeds live in the client states: a resumed DP run ends where an uninterrupted one does."""
    cfg = FedConfig(n_components=4, dp_epsilon=10.0, dp_rounds=6, **DP)
    views = _views_dn(data)
    full = run_inprocess(views, cfg, max_rounds=6, seed=4)
    run_inprocess(views, cfg, max_rounds=3, seed=4, checkpoint_dir=tmp_path)
    resumed = run_inprocess(views, cfg, max_rounds=6, seed=4, checkpoint_dir=tmp_path, resume=True)
    assert np.array_equal(full.V, resumed.V)
    assert resumed.extra["privacy"]["epsilon"] == pytest.approx(full.extra["privacy"]["epsilon"])


def test_clustering_reports_the_privacy_of_the_fit(data):
    model = FedMultiViewClustering(3, random_state=0, privacy=PrivacyOptions(dp_epsilon=50.0,
                                                                             dp_rounds=3)).fit(data.views)
    assert model.n_rounds_ == 3 and model.privacy_["epsilon"] <= 50.0
    one = FedMultiViewClustering(3, random_state=0, privacy=PrivacyOptions(dp_noise_multiplier=1.0,
                                                                           dp_rounds=3)).fit(data.views)
    assert one.n_init_ == 1 and one.privacy_["epsilon"] == pytest.approx(privacy.epsilon(1.0, 4, 1e-5))
    with pytest.raises(ParameterError, match="n_init"):  # every further fit would spend the budget again
        FedMultiViewClustering(3, n_init=2, privacy=PrivacyOptions(dp_noise_multiplier=1.0,
                                                                   dp_rounds=3)).fit(data.views)


# ----------------------------------------------------------------------------- bad parameters


@pytest.mark.parametrize("kw, fragment", [
    (dict(dp_epsilon=0.0), "dp_epsilon must be None or a finite real number > 0"),
    (dict(dp_epsilon=-1.0), "dp_epsilon must be"),
    (dict(dp_epsilon=float("nan")), "dp_epsilon must be"),
    (dict(dp_epsilon="big"), "dp_epsilon must be"),
    (dict(dp_noise_multiplier=0.0), "dp_noise_multiplier must be"),
    (dict(dp_epsilon=1.0, dp_noise_multiplier=1.0), "not both"),
    (dict(dp_epsilon=1.0, dp_clip=0.0), "dp_clip must be"),
    (dict(dp_epsilon=1.0, dp_clip_setup=float("inf")), "dp_clip_setup must be"),
    (dict(dp_epsilon=1.0, dp_delta=0.0), "dp_delta must be > 0 and < 1"),
    (dict(dp_epsilon=1.0, dp_delta=1.0), "dp_delta must be > 0 and < 1"),
    (dict(dp_epsilon=1.0, dp_rounds=0), "dp_rounds must be an integer >= 1"),
    (dict(dp_epsilon=1.0, init_v="random"), "init_v='projection'"),
])
def test_bad_dp_parameters_are_parameter_errors(data, kw, fragment, monkeypatch):
    import fedsonmf.estimators.sonmf as mod

    def boom(*a, **k):
        raise AssertionError("computation started")

    monkeypatch.setattr(mod, "run_inprocess", boom)
    with pytest.raises(ParameterError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        FedSONMF(4, **kw).fit(data.views)


def test_dp_combinations_that_would_leak_or_overspend_are_refused(data):
    with pytest.raises(ParameterError, match="diagnostics=False"):
        FedConfig(dp_epsilon=1.0)  # FedConfig itself: diagnostics would leave unnoised
    with pytest.raises(ParameterError, match="does not implement differential privacy"):
        FedSONMF(4, algorithm="fedmavg", dp_epsilon=1.0, dp_rounds=2).fit(data.views)
    cfg = FedConfig(n_components=4, dp_epsilon=1.0, dp_rounds=2, **DP)
    with pytest.raises(ParameterError, match="exceeds dp_rounds"):
        run_inprocess(_views_dn(data), cfg, max_rounds=3, seed=0)
    with pytest.raises(ParameterError, match="tol=0"):
        run_inprocess(_views_dn(data), cfg, max_rounds=2, tol=1e-3, seed=0)
    with pytest.raises(ParameterError, match="n_init"):
        FedMultiViewClustering(3, n_init=2, privacy=PrivacyOptions(dp_epsilon=1.0)).fit(data.views)


def test_cli_takes_dp_epsilon_and_reports_it(tmp_path, capsys):
    from scipy.io import savemat

    from fedsonmf.cli.app import main

    d = make_synthetic(n_clients=2, n_samples=60, n_features=10, rank=3, random_state=0)
    y = np.repeat([1, 2, 3], 20)
    f = tmp_path / "toy.mat"
    cell = np.empty((1, 2), dtype=object)
    cell[0, 0], cell[0, 1] = d.views
    savemat(f, {"X": cell, "Y": y[:, None]})
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as exc:
        main(["cluster", str(f), "--seeds", "1", "-q", "--dp-epsilon", "30", "--dp-rounds", "3", "--json", str(out)])
    assert exc.value.code in (0, None)
    text = capsys.readouterr().out
    assert "epsilon = 30" in " ".join(text.split())
    info = json.loads(out.read_text())["result"]["reports"]["fedsonmf"]["info"][0]
    assert info["privacy"]["epsilon"] <= 30 and info["n_rounds"] == 3
    with pytest.raises(SystemExit) as exc:
        main(["cluster", str(f), "--seeds", "1", "-q", "--dp-epsilon", "-1"])
    assert exc.value.code == 2
    assert "'dp_epsilon' parameter" in capsys.readouterr().err


def test_out_of_sample_round_after_a_dp_fit_warns_that_it_is_not_covered(data):
    model = FedSONMF(4, dp_epsilon=50.0, dp_rounds=2, random_state=0).fit(data.views)
    with pytest.warns(UserWarning, match="not covered by the differential privacy"):
        model.transform([v[:5] for v in data.views])


def test_dp_then_secure_aggregation_gives_the_dp_run():
    """The noise is added before the masking: a DP run with secure aggregation equals the DP run
    without it up to the fixed-point encoding (the server sees only the sum of noised uploads)."""
    from fedsonmf import FedSONMF
    from fedsonmf.datasets import make_synthetic

    d = make_synthetic(n_clients=3, n_samples=60, n_features=12, rank=4, heterogeneity=0.3, random_state=0)
    plain = FedSONMF(4, dp_noise_multiplier=1.0, random_state=0).fit(d.views)
    masked = FedSONMF(4, dp_noise_multiplier=1.0, secure_aggregation=True, random_state=0).fit(d.views)
    V0, V1 = plain.embedding_, masked.embedding_
    assert np.linalg.norm(V1 - V0) <= 1e-6 * np.linalg.norm(V0)
    assert masked.privacy_["epsilon"] == plain.privacy_["epsilon"]


@pytest.mark.parametrize("sigma", [0.0001, 1.0])
def test_dp_drift_correction_remembers_the_released_gradient(data, sigma):
    """Under DP the clients' corrections still sum to zero and the server's step is the prox-gradient step
    of the gradients it received (docs/algorithm.md §4.2; docs/privacy.md): every client's G_prev is
    (V^s - released Vhat) / (alpha tau) - C_p, not the gradient it computed before clipping."""
    from conftest import assert_correction_identity
    from fedsonmf.federation.inprocess import InProcessTransport

    cfg = FedConfig(n_components=4, dp_noise_multiplier=sigma, dp_clip=1e-3, dp_rounds=5, **DP)
    clients = [ClientRuntime(X, "fedsonmf", cfg, dp_seed=[4, 1, p]) for p, X in enumerate(_views_dn(data))]
    transport = InProcessTransport(clients)
    transport.log = []
    checked, clipped = [], []

    def on_round_end(state, history):
        assert_correction_identity(state.arrays["Vbar"], clients, cfg.eta_tilde)
        V_s = clients[0].state.arrays["V_prev"]
        ups = [m.arrays["Vhat"] for d, _, m in transport.log if d == "up" and m.kind == "round"][-len(clients):]
        clipped.append(max(np.linalg.norm(u - V_s) for u in ups))  # the released change: at most the clip + noise
        checked.append(state.round)

    run_federation(transport, "fedsonmf", cfg, max_rounds=5, seed=3, on_round_end=on_round_end)
    assert len(checked) == 5
    if sigma < 0.01:  # the clip binds: the change each client computed was many times dp_clip
        assert max(clipped) <= 1.01e-3
