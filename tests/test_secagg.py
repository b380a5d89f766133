"""Secure aggregation: the server learns only sums.

* the masking protocol (federation/secagg.py): masks cancel exactly for any cohort, the
  fixed point is exact within its stated error, a value that could wrap is refused;
* in-process: V with secure aggregation equals the plain run to <= 1e-6 relative, and the
  transcript of what the server received holds no client's upload (uniform on the ring,
  uncorrelated with every plain upload, summing exactly to the plain sum);
* the Flower apps (fake grid, no processes): the same V bit for bit as in-process, the wire
  audit of the secure protocol, the saved received arrays checked like the in-process ones.
The loopback deployment test is in test_secagg_deploy.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from fedsonmf._validation import check_views
from fedsonmf.exceptions import ParameterError, ProtocolError
from fedsonmf.federation import secagg
from fedsonmf.federation.inprocess import InProcessTransport
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import ClientState, Message
from fedsonmf.protocol.participation import Participation

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

R = 4
CFG = FedConfig(n_components=R, tau=3)


# ----------------------------------------------------------------------------- the protocol


def _keys(m: int, context: str = "ctx"):
    pairs = [secagg.generate_keypair() for _ in range(m)]
    pks = [pk for _, pk in pairs]
    return [secagg.pair_keys(sk, pks, p, context) for p, (sk, _) in enumerate(pairs)]


def test_pair_keys_agree_at_both_ends_and_only_there():
    keys = _keys(4)
    for p in range(4):
        assert not keys[p][p].any()
        for q in range(4):
            if q != p:
                assert np.array_equal(keys[p][q], keys[q][p])
    assert len({keys[p][q].tobytes() for p in range(4) for q in range(p + 1, 4)}) == 6  # distinct per pair


def test_a_relayed_key_list_that_is_not_mine_is_refused():
    (sk0, pk0), (_, pk1), (_, pk2) = (secagg.generate_keypair() for _ in range(3))
    with pytest.raises(ProtocolError, match="not its own"):
        secagg.pair_keys(sk0, [pk1, pk0, pk2], 0, "c")
    with pytest.raises(ProtocolError, match="not distinct"):
        secagg.pair_keys(sk0, [pk0, pk1, pk1], 0, "c")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(m=st.integers(2, 6), rows=st.integers(1, 5), cols=st.integers(1, 40), log_scale=st.integers(-30, 30),
       drop=st.integers(0, 4), seed=st.integers(0, 2 ** 31))
def test_masks_cancel_exactly_for_any_cohort(m, rows, cols, log_scale, drop, seed):
    """For random m, shapes, scales and cohorts: the ring sum of the masked uploads is the ring sum
    of the encoded values (bit for bit), and decodes to the float sum within m 2^-(f+1)."""
    rng = np.random.default_rng(seed)
    keys = _keys(m, context=str(seed))
    cohort = sorted(rng.choice(m, size=max(2, m - drop % (m - 1)), replace=False).tolist())
    scale = 2.0 ** log_scale
    xs = {p: {"arrays.V": rng.standard_normal((rows, cols)) * scale, "scalars.f": rng.random(1) * scale ** 2}
          for p in cohort}
    bound = {"arrays.V": secagg.item_bound(1, scale * 8), "scalars.f": secagg.item_bound(2, scale * 8)}
    bits = {k: secagg.frac_bits(b, len(cohort)) for k, b in bound.items()}
    label = secagg.exchange_label("ctx", "round", 3, cohort)
    masked = {p: secagg.mask_items(xs[p], bits, keys[p], p, cohort, label) for p in cohort}
    for name in bits:
        total = secagg.ring_sum([masked[p][name] for p in cohort])
        plain = secagg.ring_sum([secagg.encode(xs[p][name], bits[name], len(cohort)) for p in cohort])
        assert np.array_equal(total, plain)
        exact = sum(xs[p][name] for p in cohort)
        err = np.max(np.abs(secagg.decode(total, bits[name]) - exact))
        assert err <= len(cohort) * 2.0 ** -(bits[name] + 1) * (1 + 1e-9) + 4 * np.finfo(float).eps * np.max(
            np.abs(exact))
        if len(cohort) >= 2:  # one masked upload is not its encoding
            assert not np.array_equal(masked[cohort[0]][name],
                                      secagg.encode(xs[cohort[0]][name], bits[name], len(cohort)))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(m=st.integers(3, 6), n_drop=st.integers(1, 3), size=st.integers(1, 50), seed=st.integers(0, 2 ** 31))
def test_self_masks_and_revealed_keys_leave_exactly_the_survivors_sum(m, n_drop, size, seed):
    """Double masking: with any clients dropped, the survivors' ring sum minus the revealed keys
    (their self keys, their pair keys with the dropped) is the encoded sum of the survivors."""
    rng = np.random.default_rng(seed)
    keys = _keys(m)
    cohort = list(range(m))
    dropped = sorted(rng.choice(m, size=min(n_drop, m - 2), replace=False).tolist())
    alive = [p for p in cohort if p not in dropped]
    label = secagg.exchange_label("c", "round", 2, cohort, "n0")
    seeds = {p: rng.bytes(32) for p in cohort}
    xs = {p: {"arrays.V": rng.standard_normal(size)} for p in cohort}
    bits = {"arrays.V": secagg.frac_bits(secagg.item_bound(1, 8.0), m)}
    masked = {p: secagg.mask_items(xs[p], bits, keys[p], p, cohort, label, self_seed=seeds[p]) for p in alive}
    ring = secagg.ring_sum([masked[p]["arrays.V"] for p in alive])
    self_keys = {p: secagg.exchange_key(seeds[p], "self|" + label) for p in alive}
    pair = {(p, q): secagg.exchange_key(keys[p][q].tobytes(), "pair|" + label) for p in alive for q in dropped}
    left = secagg.remove_revealed(ring, "arrays.V", self_keys, pair)
    want = secagg.ring_sum([secagg.encode(xs[p]["arrays.V"], bits["arrays.V"], m) for p in alive])
    assert np.array_equal(left, want)
    # without one survivor's self key nothing decodes to the sum
    del self_keys[alive[0]]
    assert not np.array_equal(secagg.remove_revealed(ring, "arrays.V", self_keys, pair), want)


def test_masks_are_fresh_per_round_cohort_and_item():
    k = np.frombuffer(bytes(range(32)), dtype=np.uint8)
    a = secagg.mask_stream(k.tobytes(), secagg.exchange_label("c", "round", 1, [0, 1, 2]) + "|x", 64)
    b = secagg.mask_stream(k.tobytes(), secagg.exchange_label("c", "round", 2, [0, 1, 2]) + "|x", 64)
    c = secagg.mask_stream(k.tobytes(), secagg.exchange_label("c", "round", 1, [0, 1]) + "|x", 64)
    d = secagg.mask_stream(k.tobytes(), secagg.exchange_label("c", "round", 1, [0, 1, 2]) + "|y", 64)
    same = secagg.mask_stream(k.tobytes(), secagg.exchange_label("c", "round", 1, [2, 1, 0]) + "|x", 64)
    assert np.array_equal(a, same)
    assert len({a.tobytes(), b.tobytes(), c.tobytes(), d.tobytes()}) == 4


def test_a_value_that_could_wrap_the_ring_is_refused():
    bits = secagg.frac_bits(secagg.item_bound(1, 1.0), 3)
    secagg.encode(np.full(3, 2.0 ** 16), bits, 3)  # the bound itself fits
    with pytest.raises(secagg.SecAggRangeError, match="beyond the fixed-point range"):
        secagg.encode(np.array([1.0, 2.0 ** 40]), bits, 3, "arrays.Vhat")
    with pytest.raises(secagg.SecAggRangeError, match="NaN"):
        secagg.encode(np.array([np.nan]), bits, 3)


def test_quantisation_error_of_a_mean_is_far_below_1e_6():
    """The fixed point of a real round: the mean's error relative to ||mean||_F."""
    rng = np.random.default_rng(0)
    m, L = 3, 2.0 ** 3
    xs = [np.abs(rng.standard_normal((6, 100))) for _ in range(m)]
    bits = secagg.frac_bits(secagg.item_bound(1, L, vnorm=float(np.linalg.norm(xs[0]))), m)
    total = secagg.decode(secagg.ring_sum([secagg.encode(x, bits, m) for x in xs]), bits)
    exact = sum(xs)
    assert np.max(np.abs(total / m - exact / m)) <= 2.0 ** -(bits + 1) + 1e-15  # the stated per-entry bound
    rel = np.linalg.norm(total / m - exact / m) / np.linalg.norm(exact / m)
    assert rel < 1e-10  # measured 1.4e-12 (error 2^-45 of the bound per entry, times sqrt(r n) in norm)


# ----------------------------------------------------------------------------- in-process


@pytest.fixture(scope="module")
def views(small_problem):
    return check_views(small_problem.views[:3], R)


class Recorder:
    """An ``upload_hook`` that records each client's finalised (pre-mask) reply."""

    def __init__(self):
        self.plain: dict[tuple[str, int, int], Message] = {}

    def __call__(self, reply, msg, runtime):
        me = int(msg.scalars["client"]) if msg.kind == "setup" else int(runtime.state.arrays[secagg.STATE_ME])
        self.plain[(reply.kind, reply.round, me)] = reply
        return reply


def _run(views, cfg, algorithm="fedsonmf", rounds=4, masks=None, participation=None, available=None, hook=None):
    clients = [ClientRuntime(X, algorithm, cfg, mask=None if masks is None else masks[p], upload_hook=hook)
               for p, X in enumerate(views)]
    transport = InProcessTransport(clients, available=available)
    transport.log = []
    res = run_federation(transport, algorithm, cfg, max_rounds=rounds, seed=7, participation=participation)
    return res, transport.log


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("algorithm,kw", [
    ("fedsonmf", {}), ("fedsonmf", {"init_v": "random"}), ("fedsonmf", {"diagnostics": False}),
    ("fedmavg", {}), ("fedmgs", {"mu": 0.1}), ("fedvra", {}), ("no_correction", {}),
])
def test_secure_v_equals_the_plain_v(views, algorithm, kw):
    cfg = CFG.replace(**kw)
    plain, _ = _run(views, cfg, algorithm)
    secure, _ = _run(views, cfg.replace(secure_aggregation=True), algorithm)
    assert _rel(secure.V, plain.V) <= 1e-6
    assert _rel(secure.V, plain.V) < 1e-9  # measured ~1e-11 (the fixed point is 2^-45 of the bound)
    if cfg.diagnostics:
        for a, b in zip(plain.history.rows, secure.history.rows):
            assert abs(a["objective"] - b["objective"]) <= 1e-9 * abs(a["objective"])
            assert abs(a["R"] - b["R"]) <= 1e-6 * plain.history.rows[0]["R"]


def _incomplete_masks(n, seed=0):
    rng = np.random.default_rng(seed)
    masks = [rng.random(n) < 0.7 for _ in range(3)]
    masks[0][:] = True
    return masks


def test_secure_incomplete_views_equal_the_plain_run(views):
    masks = _incomplete_masks(views[0].shape[1])
    plain, _ = _run(views, CFG, masks=masks)
    secure, log = _run(views, CFG.replace(secure_aggregation=True), masks=masks)
    assert _rel(secure.V, plain.V) < 1e-9
    # every masked upload is r x n: the blocks travel scattered (no block shape reveals anything new)
    ups = [msg for d, _, msg in log if d == "up" and msg.kind == "round"]
    assert all(a.shape == (R, views[0].shape[1]) for msg in ups for k, a in msg.arrays.items() if a.ndim == 2)


def test_partial_rounds_with_dropouts_unmask_the_sum_of_those_who_replied(views):
    part = Participation(min_clients=2, rejoin="refresh")
    down = lambda s: [p for p in range(3) if not (s == 2 and p == 1)]  # noqa: E731  client 1 misses round 2
    plain, _ = _run(views, CFG, participation=part, available=down)
    rec = Recorder()
    secure, log = _run(views, CFG.replace(secure_aggregation=True), participation=part, available=down, hook=rec)
    assert _rel(secure.V, plain.V) < 1e-9
    assert [r["participants"] for r in secure.history.rows] == [r["participants"] for r in plain.history.rows]
    unmask = [(p, msg) for d, p, msg in log if d == "down" and msg.kind == "unmask" and msg.round == 2]
    assert sorted(p for p, _ in unmask) == [0, 2]  # asked of those who replied
    params = json.loads(unmask[0][1].scalars[secagg.SECAGG_KEY])
    assert params["cohort"] == [0, 1, 2] and params["survivors"] == [0, 2]
    revealed = [msg for d, p, msg in log if d == "up" and msg.kind == "unmask" and msg.round == 2]
    # per survivor (0, 2): a share of its self key and of its pair key with client 1 only (Shamir, 33 bytes)
    assert all(msg.arrays[secagg.REVEALED_KEY].shape == (2, 2, 33) for msg in revealed)
    # the uploads of those who replied, self-masked, are uniform and uncorrelated with their plain values
    ups = [(msg.kind, msg.round, p, dict(msg.arrays)) for d, p, msg in log if d == "up" and msg.kind == "round"]
    for _kind, rnd, p, arrays in ups:
        plain_v = rec.plain[("round", rnd, p)].arrays["Vhat"]
        rho = np.corrcoef(arrays["secagg.arrays.Vhat"].astype(float).ravel(), plain_v.ravel())[0, 1]
        assert abs(rho) < 6 / np.sqrt(plain_v.size)


def test_a_second_unmask_request_with_other_survivors_is_refused(views):
    part = Participation(min_clients=2, rejoin="refresh")
    clients = [ClientRuntime(X, "fedsonmf", CFG.replace(secure_aggregation=True)) for X in views]
    transport = InProcessTransport(clients)
    transport.log = []
    run_federation(transport, "fedsonmf", CFG.replace(secure_aggregation=True), max_rounds=1, seed=7,
                   participation=part)
    req = [msg for d, p, msg in transport.log if d == "down" and msg.kind == "unmask" and p == 0][0]
    params = json.loads(req.scalars[secagg.SECAGG_KEY])
    clients[0].handle(req)  # the same request again is answered (a lost reply)
    other = Message("unmask", req.round, {}, {secagg.SECAGG_KEY: json.dumps({**params, "survivors": [0, 2]})})
    with pytest.raises(ProtocolError, match="second unmask request"):
        clients[0].handle(other)
    stale = Message("unmask", req.round, {}, {secagg.SECAGG_KEY: json.dumps({**params, "nonce": "x"})})
    with pytest.raises(ProtocolError, match="does not match"):
        clients[0].handle(stale)


@pytest.mark.parametrize("masked", [False, True])
def test_server_kept_correction_runs_from_sums(views, masked):
    """rule (b) under secure aggregation: the server keeps the sum of the clients' G_p (they send
    its change dG, committed only when the server counted them) -- the plain rule's V to 1e-9."""
    part = Participation(min_clients=2, rejoin="server")
    masks = _incomplete_masks(views[0].shape[1]) if masked else None
    down = lambda s: [p for p in range(3) if not (s in (2, 3) and p == 1) and not (s == 5 and p == 2)]  # noqa: E731
    plain, _ = _run(views, CFG, rounds=7, participation=part, available=down, masks=masks)
    secure, log = _run(views, CFG.replace(secure_aggregation=True), rounds=7, participation=part, available=down,
                       masks=masks)
    assert [r["participants"] for r in secure.history.rows] == [r["participants"] for r in plain.history.rows]
    assert _rel(secure.V, plain.V) < 1e-9
    assert "G_kept" not in secure.server_state.arrays and "G_sum" in secure.server_state.arrays


def test_single_client_and_unsupported_rules_are_refused(views):
    with pytest.raises(ParameterError, match="rejoin='server' with algorithm 'fedmavg'"):
        from fedsonmf.algorithms import FedMAvg

        alg = FedMAvg("constant", name="fedmavg")
        alg.supports_partial = True
        clients = [ClientRuntime(X, alg, CFG.replace(secure_aggregation=True)) for X in views]
        run_federation(InProcessTransport(clients), alg, CFG.replace(secure_aggregation=True), max_rounds=1,
                       participation=Participation(min_clients=2, rejoin="server"))
    with pytest.raises(ParameterError, match="at least 2 clients"):
        _run(views[:1], CFG.replace(secure_aggregation=True))


def test_a_client_without_secure_aggregation_is_refused(views):
    c = ClientRuntime(views[0], "fedsonmf", CFG)
    c.state = ClientState(0, {})
    with pytest.raises(ProtocolError, match="without secure aggregation"):
        c.handle(Message("init", 0, {}, {secagg.SECAGG_KEY: "{}"}))


def _ring_uniform(arrays) -> float:
    u = np.concatenate([np.asarray(a, dtype=np.uint64).ravel() for a in arrays]).astype(np.float64) / 2.0 ** 64
    return float(stats.kstest(u, "uniform").pvalue)


def check_transcript(received: list[tuple[str, int, int, dict]], plain: dict, downs: dict, n_clients: int):
    """What the server received (``(kind, round, client, arrays)``) against the clients' plain
    uploads (``plain[(kind, round, client)]``: the finalised reply before masking) and the
    downlinks (``downs[(kind, round)]``: the ``secagg`` parameters)."""
    masked_all = []
    by_exchange: dict = {}
    plain_values = []
    for (kind, rnd, p), rep in plain.items():
        for field in ("arrays", "diagnostics", "scalars"):
            for k, v in getattr(rep, field).items():
                if isinstance(v, np.ndarray) and v.size > 1 and v.dtype == np.float64:
                    plain_values.append((kind, rnd, p, k, v))
    assert plain_values, "no plain uploads recorded"
    for kind, rnd, p, arrays in received:
        for k, a in arrays.items():
            a = np.asarray(a)
            # no received float array is (or contains) a client's plain upload
            for _, _, _, _, v in plain_values:
                assert not (a.shape == v.shape and np.array_equal(a, v)), f"plain upload {k} received"
            if not k.startswith(secagg.MASKED_PREFIX):
                assert a.dtype != np.float64 or a.size <= 1, f"unmasked float array {k} received"
                continue
            assert a.dtype == np.uint64
            masked_all.append(a)
            by_exchange.setdefault((kind, rnd), {}).setdefault(k, []).append((p, a))
            if a.size >= 16:
                for _, _, _, _, v in plain_values:
                    if v.size == a.size:
                        for w in (a.astype(np.float64), a.view(np.int64).astype(np.float64)):
                            rho = np.corrcoef(w.ravel(), v.ravel())[0, 1]
                            assert abs(rho) < 6 / np.sqrt(a.size), (k, rho)
    assert masked_all
    assert _ring_uniform(masked_all) > 1e-4  # the masked uploads look uniform on Z_2^64
    # the sum of each exchange's masked arrays is exactly the sum of the encoded plain uploads
    checked = 0
    for (kind, rnd), items in by_exchange.items():
        params = downs[(kind, rnd)]
        cohort = params["cohort"]
        for k, got in items.items():
            name = k[len(secagg.MASKED_PREFIX):]
            field, key = name.split(".", 1)
            ps = sorted(p for p, _ in got)
            if ps != cohort:
                continue  # a first try that some client missed (its retry is checked)
            src = "setup" if kind == "init" else "round"
            vals = []
            for p in ps:
                rep = plain[(src, 0 if kind == "init" else rnd, p)]
                v = np.asarray(getattr(rep, field)[key], dtype=np.float64)
                vals.append(v.reshape(1) if v.ndim == 0 else v)
            if any(v.shape != got[0][1].shape for v in vals):
                continue  # column blocks (scattered on the client): checked through V
            enc = secagg.ring_sum([secagg.encode(v, params["bits"][name], len(ps)) for v in vals])
            assert np.array_equal(secagg.ring_sum([a for _, a in got]), enc)
            checked += 1
    assert checked > 0


def test_inprocess_transcript_holds_no_clients_upload(views):
    rec = Recorder()
    res, log = _run(views, CFG.replace(secure_aggregation=True), rounds=3, hook=rec)
    received = [(msg.kind, msg.round, p, dict(msg.arrays)) for d, p, msg in log if d == "up"]
    downs = {(msg.kind, msg.round): secagg.parse_params(msg.scalars[secagg.SECAGG_KEY])
             for d, _, msg in log if d == "down" and secagg.SECAGG_KEY in msg.scalars}
    # and nothing summed travels as a plain scalar or diagnostic
    for d, _, msg in log:
        if d == "up":
            assert not msg.diagnostics and "x_sqnorm" not in msg.scalars
    check_transcript(received, rec.plain, downs, 3)


# ----------------------------------------------------------------------------- Flower apps (fake grid)



def test_flower_apps_secure_equal_inprocess_secure_and_pass_the_audit(tmp_path, small_problem, views, monkeypatch,
                                                                     task_identity):
    from fedsonmf.federation.flower.audit import audit_wire
    from fedsonmf.federation.flower.client_app import make_client_app
    from fedsonmf.federation.inprocess import run_inprocess
    from test_flower_apps import FakeGrid, _nodes, _run_config, _server, _strip, _wire

    cfg = FedConfig(n_components=R, tau=3, mu=1.0, secure_aggregation=True)
    rec = Recorder()
    monkeypatch.setattr(ClientRuntime, "upload_hook", rec)
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, small_problem.views[:3]))
    rc = _run_config(tmp_path, **{"config-json": json.dumps(cfg.to_dict()), "secure-aggregation": True,
                                  "record-wire-arrays": True})
    V, result = _server(grid, rc)
    monkeypatch.setattr(ClientRuntime, "upload_hook", None)
    ref = run_inprocess(views, cfg, max_rounds=3, seed=9)
    assert np.array_equal(V, ref.V)  # the same code path: the decoded sums do not depend on the keys
    assert _strip(result["history"]) == _strip(ref.history.to_records())
    plain = run_inprocess(views, cfg.replace(secure_aggregation=False), max_rounds=3, seed=9)
    assert _rel(V, plain.V) < 1e-9
    rows = _wire(rc)
    summary = audit_wire(rows, "fedsonmf", cfg, views[0].shape[1])
    assert summary["up round"]["messages"] == 9 and summary["up init"]["messages"] == 3
    from fedsonmf.exceptions import AuditError
    with pytest.raises(AuditError):  # the plain declaration does not admit the secure wire
        audit_wire(rows, "fedsonmf", cfg.replace(secure_aggregation=False), views[0].shape[1])
    received, downs = wire_transcript(rows, tmp_path / "server" / "wire-arrays")
    check_transcript(received, rec.plain, downs, 3)


def wire_transcript(rows, arrays_dir):
    """``(received, downs)`` for :func:`check_transcript` from a recorded wire log."""
    received, downs = [], {}
    for row in rows:
        meta = row["records"].get("fedsonmf.meta", {}).get("items", {})
        kind, rnd = meta.get("kind", {}).get("value"), meta.get("round", {}).get("value")
        if row["direction"] == "up" and kind == "hello+setup":  # the setup sent with the hello
            kind = "setup"
        if row["direction"] == "up" and kind in ("setup", "init", "round"):
            arrays = {k.split("/", 1)[1]: np.load(arrays_dir / f) for k, f in row.get("saved", {}).items()}
            received.append((kind, rnd, row["client"], arrays))
        sa = row["records"].get("fedsonmf.scalars", {}).get("items", {}).get(secagg.SECAGG_KEY)
        if row["direction"] == "down" and sa is not None:
            downs[(kind, rnd)] = secagg.parse_params(sa["value"])
    return received, downs


@pytest.mark.parametrize("rule", ["refresh", "server"])
def test_flower_apps_partial_rounds_with_a_dropped_node(tmp_path, small_problem, views, rule, task_identity):
    """A node that stops answering in rounds 2-4 and rejoins under a new node id: the unmask step
    runs over Flower, V equals the in-process secure run with the same availability."""
    from fedsonmf.federation.flower.audit import audit_wire
    from fedsonmf.federation.flower.client_app import make_client_app
    from fedsonmf.federation.inprocess import run_inprocess
    from test_flower_apps import FlakyGrid, _nodes, _run_config, _server, _wire

    cfg = FedConfig(n_components=R, tau=3, mu=1.0, secure_aggregation=True)
    grid = FlakyGrid(make_client_app(), _nodes(tmp_path, small_problem.views[:3]), dead=303, new=404, k=2, back=5)
    rc = _run_config(tmp_path, **{"config-json": json.dumps(cfg.to_dict()), "secure-aggregation": True,
                                  "num-rounds": 6, "round-timeout": 0.3, "min-clients": 2.0, "rejoin": rule})
    V, result = _server(grid, rc)
    assert [r["participants"] for r in result["history"]] == [[0, 1, 2], [0, 1], [0, 1], [0, 1], [0, 1, 2],
                                                              [0, 1, 2]]
    part = Participation(min_clients=2, rejoin=rule)
    avail = lambda s: [0, 1] if 2 <= s <= 4 else [0, 1, 2]  # noqa: E731
    ref = run_inprocess(views, cfg, max_rounds=6, seed=9, available=avail, participation=part)
    assert np.array_equal(V, ref.V)
    plain = run_inprocess(views, cfg.replace(secure_aggregation=False), max_rounds=6, seed=9, available=avail,
                          participation=part)
    assert _rel(V, plain.V) < 1e-9
    summary = audit_wire(_wire(rc), "fedsonmf", cfg, views[0].shape[1], partial=True)
    assert summary["up unmask"]["messages"] == 3 + 2 * 3 + 3 * 2


def test_secure_run_resumes_from_its_checkpoint_to_the_same_v(tmp_path, views):
    from fedsonmf.federation.inprocess import run_inprocess

    cfg = CFG.replace(secure_aggregation=True)
    full = run_inprocess(views, cfg, max_rounds=5, seed=4)
    run_inprocess(views, cfg, max_rounds=3, seed=4, checkpoint_dir=tmp_path)
    resumed = run_inprocess(views, cfg, max_rounds=5, seed=4, checkpoint_dir=tmp_path, resume=True)
    assert np.array_equal(resumed.V, full.V)
    run_inprocess(views, CFG, max_rounds=3, seed=4, checkpoint_dir=tmp_path / "plain")
    from fedsonmf.exceptions import CheckpointError
    with pytest.raises(CheckpointError, match="secure_aggregation: False in the checkpoint, True now"):
        run_inprocess(views, cfg, max_rounds=5, seed=4, checkpoint_dir=tmp_path / "plain", resume=True)


def test_estimator_takes_the_parameter(small_problem):
    from fedsonmf import FedSONMF

    plain = FedSONMF(R, max_rounds=3, random_state=0, tol=0).fit(small_problem.views[:3])
    secure = FedSONMF(R, max_rounds=3, random_state=0, tol=0, secure_aggregation=True).fit(small_problem.views[:3])
    assert _rel(secure.embedding_, plain.embedding_) < 1e-9
    assert secure.result_.config["secure_aggregation"] is True


@pytest.mark.parametrize("policy", ["default", True, "true"])
def test_a_node_that_requires_secure_aggregation_refuses_a_plain_run(tmp_path, small_problem, task_identity, policy):
    """A deployment node (one with a data-path) refuses plain runs unless its operator allows them:
    by default, or with the node config set (TOML's bool, or its text)."""
    from fedsonmf.exceptions import FederationError
    from fedsonmf.federation.flower.client_app import make_client_app
    from test_flower_apps import FakeGrid, _nodes, _run_config, _server

    nodes = _nodes(tmp_path, small_problem.views[:3])
    for nc in nodes.values():
        del nc["require-secure-aggregation"]
        if policy != "default":
            nc["require-secure-aggregation"] = policy
    grid = FakeGrid(make_client_app(), nodes)
    with pytest.raises(FederationError, match="requires secure aggregation"):
        _server(grid, _run_config(tmp_path))  # the plain protocol


def test_the_secure_aggregation_policy_of_a_node():
    from types import SimpleNamespace

    from fedsonmf.federation.flower.nodeconfig import requires_secure_aggregation

    def ctx(**nc):
        return SimpleNamespace(node_config=nc)

    assert requires_secure_aggregation(ctx(**{"data-path": "/v.npy"}))  # a deployment node: on unless allowed
    assert not requires_secure_aggregation(ctx(**{"partition-id": 0}))  # a simulated node follows the run
    for value, want in ((True, True), (False, False), ("true", True), ("False", False)):
        assert requires_secure_aggregation(ctx(**{"data-path": "/v.npy", "require-secure-aggregation": value})) is want
    with pytest.raises(ValueError, match="must be true or false"):
        requires_secure_aggregation(ctx(**{"data-path": "/v.npy", "require-secure-aggregation": 1}))
