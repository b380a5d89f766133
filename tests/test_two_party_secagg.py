"""Secure aggregation between two clients hides nothing between them (docs/privacy.md, "Two clients").

Each client gets the mean of the two uploads back: the server broadcasts
Vbar^{s+1} = V^s + eta_g (mean_q Vhat_q^s - V^s), and the client knows V^s = P(Vbar^s) and its own
Vhat_p^s, so it recovers the other's upload as 2 mean - Vhat_p^s.  The first test runs that attack
on the project's in-process engine with secure aggregation on; the others check the PrivacyWarning
that says so at m = 2 (and only there).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedsonmf._validation import check_views
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.exceptions import PrivacyWarning
from fedsonmf.federation import secagg
from fedsonmf.federation.inprocess import InProcessTransport
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.config import FedConfig

R = 4
CFG = FedConfig(n_components=R, tau=3, secure_aggregation=True)


class Recorder:
    """An ``upload_hook`` keeping each client's own (pre-mask) replies: what that client knows."""

    def __init__(self):
        self.plain: dict = {}

    def __call__(self, reply, msg, runtime):
        me = int(msg.scalars["client"]) if msg.kind == "setup" else int(runtime.state.arrays[secagg.STATE_ME])
        self.plain[(reply.kind, reply.round, me)] = reply
        return reply


def _run(views, cfg, rounds=4, hook=None):
    clients = [ClientRuntime(X, "fedsonmf", cfg, upload_hook=hook) for X in views]
    transport = InProcessTransport(clients)
    transport.log = []
    run_federation(transport, "fedsonmf", cfg, max_rounds=rounds, seed=7)
    return clients, transport.log


def test_with_two_clients_each_recovers_the_others_exact_upload_from_the_broadcast(small_problem):
    views = check_views(small_problem.views[:2], R)
    rec = Recorder()
    with pytest.warns(PrivacyWarning):
        clients, log = _run(views, CFG, hook=rec)
    # what client 0 receives: the round messages' Vbar (the broadcast)
    downs = {msg.round: msg for d, p, msg in log if d == "down" and p == 0 and msg.kind == "round"}
    vbar = {s: msg.arrays["Vbar"] for s, msg in downs.items()}
    cfg = clients[0].cfg
    checked = 0
    for s in sorted(vbar):
        if s + 1 not in vbar:
            continue
        mu = float(downs[s].scalars["mu"])  # the l2,1 weight in force, sent with the round
        V = prox_l21_nonneg(vbar[s], cfg.eta_tilde * mu)  # V^s, as the client computes it
        mean = V + (vbar[s + 1] - V) / cfg.eta_g  # the mean of the two uploads of round s
        recovered = 2 * mean - rec.plain[("round", s, 0)].arrays["Vhat"]  # minus its own upload
        truth = rec.plain[("round", s, 1)].arrays["Vhat"]
        assert np.linalg.norm(recovered - truth) <= 1e-9 * np.linalg.norm(truth)  # fixed-point rounding only
        # while what the server received from client 1 is masked: uncorrelated with the upload
        wire = next(msg for d, p, msg in log if d == "up" and p == 1 and msg.kind == "round" and msg.round == s)
        rho = np.corrcoef(wire.arrays["secagg.arrays.Vhat"].astype(float).ravel(), truth.ravel())[0, 1]
        assert abs(rho) < 6 / np.sqrt(truth.size)
        checked += 1
    assert checked >= 2


def _privacy_warnings(views, cfg):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(views, cfg, rounds=1)
    return [w for w in caught if issubclass(w.category, PrivacyWarning)]


def test_two_party_warning_fires_at_two_clients_only(small_problem):
    two = check_views(small_problem.views[:2], R)
    three = check_views(small_problem.views[:3], R)
    (w,) = _privacy_warnings(two, CFG)
    text = str(w.message)
    assert "2 clients" in text and "2 x mean - its own" in text and "dp_epsilon" in text and "\n" not in text
    assert w.filename == __file__  # attributed to the caller's line, not the library's
    assert _privacy_warnings(three, CFG) == []
    assert _privacy_warnings(two, CFG.replace(secure_aggregation=False)) == []


def test_two_party_warning_with_differential_privacy_says_it_is_what_protects(small_problem):
    two = check_views(small_problem.views[:2], R)
    (w,) = _privacy_warnings(two, CFG.replace(dp_epsilon=8.0, diagnostics=False))
    assert "only the run's differential privacy protects them" in str(w.message)


def test_a_two_node_deployment_warns_in_the_launching_process_before_it_starts(tmp_path):
    pytest.importorskip("flwr")
    from fedsonmf.federation.flower.launcher import run_flower

    rng = np.random.default_rng(0)
    views = []
    for p in range(2):
        views.append(tmp_path / f"v{p}.npy")
        np.save(views[-1], rng.random((30, 6)))
    (tmp_path / "file").write_text("")
    run_dir = tmp_path / "file" / "run"  # under a regular file: the launch fails once the checks passed
    with pytest.warns(PrivacyWarning, match="2 clients hides nothing between them"), pytest.raises(OSError):
        run_flower(views, FedConfig(n_components=2), run_dir=run_dir, max_rounds=1, secure_aggregation=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyWarning)
        with pytest.raises(OSError):
            run_flower(views, FedConfig(n_components=2), run_dir=run_dir, max_rounds=1, secure_aggregation=False)
