"""The Flower apps' handlers without servers: the ServerApp's main runs against a
fake Grid that calls the ClientApp object directly (docs/flower.md, "Flower behaviours").

Fast (no processes, no network); the loopback deployment is in test_flower_deploy.py.
"""

import ast
import json
import time
import tomllib
import uuid

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, Error, MessageType, RecordDict  # noqa: E402
from flwr.app import Message as FlwrMessage
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedsonmf._validation import check_views  # noqa: E402
from fedsonmf.algorithms import ALGORITHMS  # noqa: E402
from fedsonmf.exceptions import AuditError, FederationError
from fedsonmf.federation import checkpoint as ckpt  # noqa: E402
from fedsonmf.federation.flower import codec, write_app_dir, write_views  # noqa: E402
from fedsonmf.federation.flower.audit import audit_wire  # noqa: E402
from fedsonmf.federation.flower.client_app import make_client_app  # noqa: E402
from fedsonmf.federation.flower.server_app import server_main  # noqa: E402
from fedsonmf.federation.flower.template import RUN_CONFIG_DEFAULTS  # noqa: E402
from fedsonmf.federation.flower.transport import FlowerTransport, handshake  # noqa: E402
from fedsonmf.federation.inprocess import run_inprocess  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402
from fedsonmf.protocol.messages import Message  # noqa: E402

R = 4
CFG = FedConfig(n_components=R, tau=3, mu=1.0)


@pytest.fixture(autouse=True)
def _task_identity():
    """Outside a Flower runtime, Message(...) needs the task identity set (internal API)."""
    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old


class FakeGrid:
    """A Grid whose nodes are ClientApp objects called in this process.

    ``drop``: node ids that never answer (hung); ``unavailable``: node ids
    answered by a NODE_UNAVAILABLE error, as the SuperLink does for a dead node.
    """

    def __init__(self, client_app, node_configs: dict[int, dict], drop=(), unavailable=()):
        self.app = client_app
        self.contexts = {nid: Context(run_id=1, node_id=nid, node_config=nc, state=RecordDict(), run_config={})
                         for nid, nc in node_configs.items()}
        self.drop, self.unavailable = set(drop), set(unavailable)
        self.replies: dict[str, FlwrMessage] = {}
        self.pushed = 0

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            nid = msg.metadata.dst_node_id
            self.pushed += 1
            if nid in self.unavailable:
                self.replies[mid] = FlwrMessage(Error(5, "node unavailable"), reply_to=msg)
            elif nid not in self.drop:
                try:
                    self.replies[mid] = self.app(message=msg, context=self.contexts[nid])
                except Exception as exc:  # what the SuperNode runtime does
                    self.replies[mid] = FlwrMessage(Error(2, f"{type(exc)}:<'{exc}'>"), reply_to=msg)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(mid) for mid in list(message_ids) if mid in self.replies]


@pytest.fixture(scope="module")
def problem(small_problem):
    views = small_problem.views[:3]
    return views, check_views(views, R)


def _nodes(tmp_path, views, node_ids=(101, 202, 303)):
    paths = write_views(views, tmp_path / "views")
    # these tests drive the plain protocol, so the nodes allow it (a deployment node's default
    # refuses it: tests/test_secagg.py)
    return {nid: {"partition-id": p, "data-path": str(paths[p]), "state-dir": str(tmp_path / f"node{p}"),
                  "require-secure-aggregation": False} for p, nid in enumerate(node_ids)}


def _run_config(tmp_path, **kw):
    rc = dict(RUN_CONFIG_DEFAULTS)
    rc.update({"num-clients": 3, "num-rounds": 3, "seed": 9, "config-json": json.dumps(CFG.to_dict()),
               "out-dir": str(tmp_path / "server"), "job-id": "job-test", "round-timeout": 5.0,
               "node-timeout": 2.0, "poll-interval": 0.001, "record-wire": True,
               "secure-aggregation": False})  # the plain protocol (secure aggregation: tests/test_secagg.py)
    rc.update(kw)
    return rc


def _server(grid, rc):
    server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    out = rc["out-dir"]
    return np.load(f"{out}/V.npy"), json.loads(open(f"{out}/result.json").read())


def _wire(rc):
    return [json.loads(line) for line in open(f"{rc['out-dir']}/wire.jsonl")]


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


# ----------------------------------------------------------------------------- codec


def test_codec_roundtrip_is_bit_exact():
    rng = np.random.default_rng(1)
    msg = Message("round", 4, {"Vhat": rng.standard_normal((3, 7))}, {"a": np.int64(3), "b": 0.1, "c": "x"},
                  {"grad0": rng.standard_normal((3, 7)), "f0": np.float64(1.5)})
    back, meta = codec.decode(codec.encode(msg, client=2, job_id="j"))
    assert meta == {"kind": "round", "round": 4, "client": 2, "job-id": "j"}
    assert back.kind == "round" and back.round == 4 and back.scalars == {"a": 3, "b": 0.1, "c": "x"}
    assert np.array_equal(back.arrays["Vhat"], msg.arrays["Vhat"])
    assert np.array_equal(back.diagnostics["grad0"], msg.diagnostics["grad0"]) and back.diagnostics["f0"] == 1.5
    assert back.nbytes == msg.nbytes and back.diagnostics_nbytes == msg.diagnostics_nbytes


# ----------------------------------------------------------------------------- same answer


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_apps_give_the_inprocess_result_for_every_algorithm(tmp_path, problem, algorithm):
    views, views_dn = problem
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, views))
    rc = _run_config(tmp_path, algorithm=algorithm)
    V, result = _server(grid, rc)
    ref = run_inprocess(views_dn, CFG, algorithm, max_rounds=3, seed=9)
    assert np.array_equal(V, ref.V)
    assert _strip(result["history"]) == _strip(ref.history.to_records())
    assert result["config"]["algorithm"] == algorithm
    audit_wire(_wire(rc), algorithm, CFG, views_dn[0].shape[1])


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secure"])
def test_the_diagnostic_arrays_go_up_only_when_tol_stops_on_them(tmp_path, problem, secure):
    """tol = 0: the replies carry the diagnostic scalars (the objective) but not the r x n gradient
    (R/R1 is not used): half the upload; the fit is the in-process one, bit for bit."""
    views, views_dn = problem
    up = {}
    for tol in (0.0, 1e-12):
        sub = tmp_path / f"tol{tol:g}"
        nodes = _nodes(sub, views)
        for nc in nodes.values():
            nc["require-secure-aggregation"] = secure
        cfg = CFG.replace(secure_aggregation=secure)
        rc = _run_config(sub, **{"tol": tol, "config-json": json.dumps(cfg.to_dict()), "secure-aggregation": secure})
        V, result = _server(FakeGrid(make_client_app(), nodes), rc)
        ref = run_inprocess(views_dn, cfg, max_rounds=3, seed=9, tol=tol)
        assert np.array_equal(V, ref.V)
        rows = result["history"]
        assert [r["objective"] for r in rows] == [r["objective"] for r in ref.history.rows]
        assert ("R_rel" in rows[-1]) is (tol > 0)
        wire = _wire(rc)
        audit_wire(wire, "fedsonmf", cfg, views_dn[0].shape[1])
        rounds = [w for w in wire if w["direction"] == "up" and
                  w["records"][codec.META]["items"]["kind"]["value"] == "round"]
        keys = {k for w in rounds for rec in w["records"].values() for k in rec["items"]}
        assert any("grad0" in k for k in keys) is (tol > 0)
        up[tol] = sum(it["bytes"] for w in rounds for rec in w["records"].values() for it in rec["items"].values()
                      if "shape" in it)
    assert up[0.0] < 0.6 * up[1e-12]  # the gradient was as large as the upload itself (+ masked scalars)


def test_a_fit_counts_its_exchanges(tmp_path, problem):
    """The hello carried the setup; three rounds; no clustering stage (plain protocol: no init)."""
    views, _ = problem
    rc = _run_config(tmp_path)
    _, result = _server(FakeGrid(make_client_app(), _nodes(tmp_path, views)), rc)
    assert result["flower"]["exchanges"] == {"hello": 1, "setup_at_hello": True, "setup": 0, "init": 0, "round": 3,
                                             "unmask": 0, "fits": 3, "stages": 0, "total": 4}
    status = json.loads(open(f"{rc['out-dir']}/status.json").read())
    assert status["exchange_counts"] == result["flower"]["exchanges"]


def test_clients_keep_large_state_on_disk_and_small_state_in_context(tmp_path, problem):
    views, _ = problem
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, views))
    _server(grid, _run_config(tmp_path, **{"num-rounds": 2}))
    for p, ctx in enumerate(grid.contexts.values()):
        assert set(ctx.state.keys()) == {"fedsonmf"}
        assert dict(ctx.state["fedsonmf"]) == {"job-id": "job-test", "partition-id": p, "round": 2}
        files = sorted(f.name for f in (tmp_path / f"node{p}" / "job-test").iterdir())
        assert files == [f"client-{p}-r1.npz", f"client-{p}-r2.npz"]


def test_client_refuses_a_round_its_saved_state_does_not_precede(tmp_path, problem):
    views, _ = problem
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, views))
    _server(grid, _run_config(tmp_path, **{"num-rounds": 2}))
    transport = FlowerTransport(grid, [101, 202, 303], job_id="job-test", round_timeout=2, poll=0.001)
    with pytest.raises(FederationError,
                       match=r"client 0 \(node 101\) failed in round 5: .*no saved state after round 4"):
        transport.exchange([Message("round", 5, {"Vbar": np.zeros((R, 40))})] * 3)


# ----------------------------------------------------------------------------- audit


@pytest.mark.parametrize("diagnostics", [True, False])
def test_wire_audit_only_declared_matrices_and_scalars(tmp_path, problem, diagnostics):
    views, views_dn = problem
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, views))
    rc = _run_config(tmp_path, diagnostics=diagnostics)
    _, result = _server(grid, rc)
    cfg = CFG.replace(diagnostics=diagnostics)
    summary = audit_wire(_wire(rc), "fedsonmf", cfg, 40)
    assert summary["up round"]["messages"] == summary["down round"]["messages"] == 9
    rn = R * 40 * 8
    assert summary["down round"]["bytes"] >= 9 * rn and summary["up round"]["bytes"] >= 9 * rn
    hist = result["history"]
    assert all(row["bytes_up"] == 3 * rn and row["bytes_down"] == 3 * (rn + 8) for row in hist)  # + mu
    if diagnostics:
        assert summary["up round"]["bytes_diagnostics"] >= 9 * rn
        assert all(row["bytes_diagnostics"] == 3 * (rn + 3 * 8) for row in hist)
        assert "R_rel" in hist[0]
    else:
        assert summary["up round"]["bytes_diagnostics"] == 0
        assert all(row["bytes_diagnostics"] == 0 for row in hist) and "R_rel" not in hist[0]
    # no array anywhere with a client's feature dimension (X_p, U_p, X_p V^T)
    ds = {X.shape[0] for X in views_dn}
    for row in _wire(rc):
        for rec in row["records"].values():
            for item in rec["items"].values():
                assert not set(item.get("shape", [])) & ds


def test_wire_audit_catches_a_leak(tmp_path, problem):
    views, _ = problem
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, views))
    rc = _run_config(tmp_path, **{"num-rounds": 1})
    _server(grid, rc)
    rows = _wire(rc)
    up = next(r for r in rows if r["direction"] == "up" and r["group_id"] == "1")
    up["records"][codec.ARRAYS]["items"]["U"] = {"shape": [12, R], "dtype": "float64", "bytes": 384}
    with pytest.raises(AuditError, match="undeclared key 'U'"):
        audit_wire(rows, "fedsonmf", CFG, 40)
    with pytest.raises(AuditError, match="undeclared record 'fedsonmf.diag.arrays'"):
        audit_wire(_wire(rc), "fedsonmf", CFG.replace(diagnostics=False), 40)
    with pytest.raises(AuditError, match=r"has shape \[4, 40\] dtype float64, declared float64 \(4, 41\)"):
        audit_wire(_wire(rc), "fedsonmf", CFG, 41)


# ----------------------------------------------------------------------------- faults


def _fault_app(kind, client, rnd):
    def hook(msg, context, job_id):
        if int(context.node_config["partition-id"]) == client and msg.kind == "round" and msg.round == rnd:
            raise RuntimeError(f"injected {kind} in client {client} round {rnd}")
    return make_client_app(before_handle=hook)


def test_client_error_names_client_and_round_then_resume_matches(tmp_path, problem):
    views, views_dn = problem
    nodes = _nodes(tmp_path, views)
    rc = _run_config(tmp_path)
    with pytest.raises(FederationError, match=r"client 1 \(node 202\) failed in round 2: .*injected raise"):
        _server(FakeGrid(_fault_app("raise", 1, 2), nodes), rc)
    status = json.loads(open(f"{rc['out-dir']}/status.json").read())
    assert status["status"] == "failed" and status["client"] == 1 and status["round"] == 2
    assert status["last_completed_round"] == 1
    assert ckpt.load_server_checkpoint(tmp_path / "server" / "checkpoint").completed_rounds == 1
    # resume with fresh node ids (restarted SuperNodes) and no fault
    V, result = _server(FakeGrid(make_client_app(), _nodes(tmp_path, views, (7, 8, 9))), {**rc, "resume": True})
    ref = run_inprocess(views_dn, CFG, max_rounds=3, seed=9)
    assert np.array_equal(V, ref.V)
    assert _strip(result["history"]) == _strip(ref.history.to_records())
    assert result["flower"]["resumed_from_round"] == 2


def test_hung_client_stops_the_server_within_the_round_timeout(tmp_path, problem):
    views, _ = problem
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, views))
    transport = FlowerTransport(grid, [101, 202, 303], job_id="j", round_timeout=0.3, poll=0.01)
    grid.drop = {303}
    t0 = time.perf_counter()
    with pytest.raises(FederationError, match=r"client 2 \(node 303\) did not answer setup within the start-up "
                                              r"timeout of 0.3 s") as exc:
        transport.exchange([Message("setup", 0, {}, {"seed": 1, "client": p, "algorithm": "fedsonmf",
                                                      "config": json.dumps(CFG.to_dict())}) for p in range(3)])
    assert time.perf_counter() - t0 < 2.0
    assert exc.value.client == 2 and exc.value.round == 0


def test_vanished_node_error_reply_names_the_client(tmp_path, problem):
    views, _ = problem
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, views), unavailable={202})
    transport = FlowerTransport(grid, [101, 202, 303], job_id="j", round_timeout=5, poll=0.01)
    with pytest.raises(FederationError, match=r"client 1 \(node 202\) failed in setup: error code 5"):
        transport.exchange([Message("setup", 0, {}, {"seed": 1, "client": p, "algorithm": "fedsonmf",
                                                      "config": json.dumps(CFG.to_dict())}) for p in range(3)])


# ----------------------------------------------------------------------------- handshake


def test_handshake_orders_nodes_by_view_and_ignores_dead_nodes(tmp_path, problem):
    views, _ = problem
    nodes = _nodes(tmp_path, views, (30, 10, 20))
    nodes[99] = dict(nodes[10])  # a dead node still listed, claiming view 1
    grid = FakeGrid(make_client_app(), nodes, unavailable={99})
    assert handshake(grid, 3, job_id="j", timeout=1.0, poll=0.001) == [30, 10, 20]


def test_handshake_errors(tmp_path, problem):
    views, _ = problem
    nodes = _nodes(tmp_path, views)
    with pytest.raises(FederationError, match=r"views \[2\] did not answer within 0.2 s.*online but silent.*"
                                              r"restart its SuperNode"):  # its node is online: wedged, not gone
        handshake(FakeGrid(make_client_app(), nodes, drop={303}), 3, job_id="j", timeout=0.2, poll=0.01)
    dup = {**nodes, 404: dict(nodes[101])}
    with pytest.raises(FederationError, match="both hold view 0"):
        handshake(FakeGrid(make_client_app(), dup), 4, job_id="j", timeout=0.2, poll=0.01)
    with pytest.raises(FederationError, match="holds view .partition-id. 2, but the run has 2 views"):
        handshake(FakeGrid(make_client_app(), nodes), 2, job_id="j", timeout=0.2, poll=0.01)


# ----------------------------------------------------------------------------- shipped app


def test_shipped_app_template(tmp_path):
    app_dir = write_app_dir(tmp_path / "app")
    conf = tomllib.loads((app_dir / "pyproject.toml").read_text())
    assert conf["tool"]["flwr"]["app"]["config"] == RUN_CONFIG_DEFAULTS
    assert conf["project"]["license"] == {"file": "LICENSE"} and (app_dir / "LICENSE").is_file()
    assert "flwr>=1.42.0,<1.43" in conf["project"]["dependencies"]
    for comp in ("serverapp", "clientapp"):
        module, attr = conf["tool"]["flwr"]["app"]["components"][comp].split(":")
        src = (app_dir / (module.replace(".", "/") + ".py")).read_text()
        # flwr run checks statically that the module *assigns* the app
        assigned = {t.id for node in ast.parse(src).body if isinstance(node, ast.Assign) for t in node.targets}
        assert attr in assigned
        ns: dict = {}
        exec(compile(src, module, "exec"), ns)
        assert type(ns[attr]).__name__ in ("ServerApp", "ClientApp")
    # nothing but the shim is shipped
    assert sorted(p.name for p in app_dir.rglob("*") if p.is_file()) == [
        "LICENSE", "__init__.py", "client_app.py", "pyproject.toml", "server_app.py"]


def test_a_round_sends_every_node_one_content(tmp_path, problem):
    """A round's message is the same for every client: one encoded content (client BROADCAST) goes to
    every node, so Flower stores and pushes its records once (object ids are content hashes); each node
    answers as its own view, and the fit is the in-process one."""
    views, views_dn = problem

    class Recording(FakeGrid):
        sent: list = []

        def push_messages(self, messages):
            messages = list(messages)
            self.sent.append(messages)
            return super().push_messages(messages)

    grid = Recording(make_client_app(), _nodes(tmp_path, views))
    V, _ = _server(grid, _run_config(tmp_path))
    assert np.array_equal(V, run_inprocess(views_dn, CFG, max_rounds=3, seed=9).V)
    rounds = [ms for ms in grid.sent if codec.decode(ms[0].content)[0].kind == "round"]
    assert len(rounds) == 3
    for ms in rounds:
        assert len(ms) == 3 and all(m.content is ms[0].content for m in ms)
        assert int(ms[0].content[codec.META]["client"]) == codec.BROADCAST
        assert len({m.metadata.dst_node_id for m in ms}) == 3


def test_client_app_refuses_misrouted_message(tmp_path, problem):
    views, _ = problem
    app = make_client_app()
    ctx = Context(run_id=1, node_id=5, node_config=_nodes(tmp_path, views)[202], state=RecordDict(), run_config={})
    msg = FlwrMessage(codec.encode(Message("round", 1, {}), client=0, job_id="j"), dst_node_id=5,
                      message_type=MessageType.TRAIN)
    msg.metadata.__dict__["_message_id"] = "m"
    with pytest.raises(Exception, match="message for client 0 reached the node of view 1"):
        app(message=msg, context=ctx)
    hello = FlwrMessage(RecordDict({codec.META: ConfigRecord({"kind": "hello", "round": 0, "client": -1,
                                                              "job-id": "j"})}),
                        dst_node_id=5, message_type=MessageType.QUERY)
    hello.metadata.__dict__["_message_id"] = "h"
    rep = app(message=hello, context=ctx)
    assert int(rep.content[codec.META]["partition-id"]) == 1


# ----------------------------------------------------------------------------- checks before round 1


class SlowStartGrid(FakeGrid):
    """Replies to setup messages become visible only ``delay`` seconds after the push
    (nodes that start slowly: process spawn, imports, loading the view)."""

    def __init__(self, *args, delay: float, **kw):
        super().__init__(*args, **kw)
        self.delay, self.ready_at = delay, {}

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages):
            if msg.metadata.message_type == MessageType.TRAIN and codec.decode(msg.content)[0].kind == "setup":
                self.ready_at[mid] = time.monotonic() + self.delay
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        return super().pull_messages([m for m in message_ids if self.ready_at.get(m, 0.0) <= now])


def test_rank_larger_than_a_view_is_refused_at_the_handshake(tmp_path, problem):
    views, _ = problem
    narrow = [views[0], views[1][:, :3], views[2]]  # view 1 has 3 features < r = 4
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, narrow))
    rc = _run_config(tmp_path)
    with pytest.raises(FederationError, match=r"view 1 \(node 202\) has 3 features, fewer than the rank r = 4") as exc:
        _server(grid, rc)
    assert exc.value.client == 1 and exc.value.round == 0
    assert grid.pushed == 3  # only the hello messages: no setup, no round
    status = json.loads(open(f"{rc['out-dir']}/status.json").read())
    assert status["status"] == "failed" and status["client"] == 1 and status["round"] == 0


def test_unusable_view_is_reported_at_the_handshake(tmp_path, problem):
    views, _ = problem
    bad = [views[0], views[1], np.full(views[2].shape, np.nan)]
    grid = FakeGrid(make_client_app(), _nodes(tmp_path, bad))
    with pytest.raises(FederationError, match=r"view 2 \(node 303\) cannot be used: InputError: view 0 contains NaN"):
        _server(grid, _run_config(tmp_path))
    assert grid.pushed == 3


def test_slow_node_start_up_has_its_own_timeout(tmp_path, problem):
    views, views_dn = problem
    # a 0.3 s round timeout, nodes that need 0.6 s to start: healthy, not hung
    grid = SlowStartGrid(make_client_app(), _nodes(tmp_path, views), delay=0.6)
    # (the setup as its own exchange: setup-at-handshake off)
    V, _ = _server(grid, _run_config(tmp_path, **{"round-timeout": 0.3, "startup-timeout": 5.0,
                                                  "setup-at-handshake": False}))
    assert np.array_equal(V, run_inprocess(views_dn, CFG, max_rounds=3, seed=9).V)
    # without a start-up allowance the same nodes are reported at the start-up timeout, not the round timeout
    grid = SlowStartGrid(make_client_app(), _nodes(tmp_path / "b", views), delay=2.0)
    with pytest.raises(FederationError, match=r"did not answer setup within the start-up timeout of 0.5 s"):
        _server(grid, _run_config(tmp_path / "b", **{"round-timeout": 0.3, "startup-timeout": 0.5,
                                                      "setup-at-handshake": False}))


def test_run_flower_checks_the_view_files_before_starting_anything(tmp_path, problem):
    from fedsonmf.exceptions import InputError
    from fedsonmf.federation.flower.launcher import run_flower

    views, _ = problem
    paths = write_views([views[0], views[1][:, :3]], tmp_path / "views")
    with pytest.raises(InputError, match=r"n_components=4 is larger than view 1's number of features \(3"):
        run_flower(paths, CFG, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_flower_client_refuses_to_resume_on_other_data(tmp_path, problem):
    """The node checks its own view against the fingerprint in its own state file."""
    views, _ = problem
    rc = _run_config(tmp_path, **{"num-rounds": 2})
    _server(FakeGrid(make_client_app(), _nodes(tmp_path, views)), rc)
    scaled = [views[0], views[1] * 1.01, views[2]]  # view 1 rescaled by 1 % between the runs
    with pytest.raises(FederationError, match=r"client 1 \(node 202\) failed in round 3: .*CheckpointError.*"
                                              r"client 1: refusing to resume on other data"):
        _server(FakeGrid(make_client_app(), _nodes(tmp_path, scaled)), {**rc, "num-rounds": 3, "resume": True})


# ----------------------------------------------------------------------------- §15: masks, partial rounds


def test_apps_with_masks_give_the_inprocess_result(tmp_path, problem):
    from fedsonmf.federation.flower import write_masks

    views, views_dn = problem
    n = views_dn[0].shape[1]
    mk = np.random.default_rng(4).random((3, n)) > 0.3
    mk[0] |= ~mk.any(axis=0)
    nodes = _nodes(tmp_path, views)
    for nc, path in zip(nodes.values(), write_masks(list(mk), tmp_path / "views")):
        nc["mask-path"] = str(path)
    rc = _run_config(tmp_path)
    V, result = _server(FakeGrid(make_client_app(), nodes), rc)
    ref = run_inprocess(views_dn, CFG, max_rounds=3, seed=9, masks=list(mk))
    assert np.array_equal(V, ref.V)
    assert _strip(result["history"]) == _strip(ref.history.to_records())
    # the wire carries only the declared items: held-column blocks, sample ids once, the weights
    summary = audit_wire(_wire(rc), "fedsonmf", CFG, n, masked=True)
    assert summary["up round"]["messages"] == 9
    with pytest.raises(AuditError):
        audit_wire(_wire(rc), "fedsonmf", CFG, n)  # undeclared without masked=True


def _id_csv(path, X, ids, order):
    """A CSV view with an ``id`` column, its rows in ``order`` (floats written to round-trip exactly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["id," + ",".join(f"f{j}" for j in range(X.shape[1]))]
    lines += [f"{ids[i]}," + ",".join(repr(float(v)) for v in X[i]) for i in order]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_nodes_align_rows_by_their_files_ids_and_the_server_checks_the_id_sets(tmp_path, problem):
    """Each node sorts its CSV rows by the file's id column (any row order in the files gives the
    in-process result); the hello carries a job-salted digest of the id set, nothing else of the ids."""
    from fedsonmf.datasets.files import ids_digest

    views, views_dn = problem
    n = views_dn[0].shape[1]
    ids = [f"patient-{k:03d}" for k in range(n)]
    rng = np.random.default_rng(7)
    paths = [_id_csv(tmp_path / "csv" / f"view{p}.csv", X, ids, rng.permutation(n)) for p, X in enumerate(views)]
    nodes = {nid: {"partition-id": p, "data-path": str(paths[p]), "state-dir": str(tmp_path / f"node{p}"),
                   "require-secure-aggregation": False} for p, nid in enumerate((101, 202, 303))}
    rc = _run_config(tmp_path)
    V, _ = _server(FakeGrid(make_client_app(), nodes), rc)
    assert np.array_equal(V, run_inprocess(views_dn, CFG, max_rounds=3, seed=9).V)
    audit_wire(_wire(rc), "fedsonmf", CFG, n)  # the digest is a declared meta key
    hellos = [json.dumps(row) for row in _wire(rc) if codec.IDS_DIGEST in json.dumps(row)]
    sent = {codec.salted_ids_digest(ids_digest(ids), rc["job-id"])}
    assert len(hellos) == 3 and all(next(iter(sent)) in h for h in hellos)
    assert not any(i in h for h in hellos for i in ids) and ids_digest(ids) not in " ".join(hellos)
    assert codec.salted_ids_digest(ids_digest(ids), "another-job") not in sent


@pytest.mark.parametrize("case", ["other ids", "no ids"])
def test_views_of_other_samples_are_refused_at_the_handshake(tmp_path, problem, case):
    """Same n, other samples: without the check the rows of different samples would be paired silently."""
    views, _ = problem
    n = views[0].shape[0]
    ids = [str(k) for k in range(n)]
    paths = [_id_csv(tmp_path / "csv" / f"view{p}.csv", X, ids, range(n)) for p, X in enumerate(views[:2])]
    if case == "other ids":
        paths.append(_id_csv(tmp_path / "csv" / "view2.csv", views[2], [*ids[:-1], str(10 * n)], range(n)))
        want = r"view 2 \(node 303\) holds other sample ids than view 0 in its view file"
    else:
        paths += write_views([views[2]], tmp_path / "npy")  # row i is sample i: no id to match
        want = r"the view files of views \[0, 1\] are ordered by their sample ids and those of views \[2\] carry no ids"
    nodes = {nid: {"partition-id": p, "data-path": str(paths[p]), "state-dir": str(tmp_path / f"node{p}"),
                   "require-secure-aggregation": False} for p, nid in enumerate((101, 202, 303))}
    rc = _run_config(tmp_path)
    grid = FakeGrid(make_client_app(), nodes)
    with pytest.raises(FederationError, match=want) as exc:
        _server(grid, rc)
    assert exc.value.client == 2 and exc.value.round == 0
    assert grid.pushed == 3  # the hellos only: no round ran


class FlakyGrid(FakeGrid):
    """Node ``dead`` stops answering from round ``k`` on; from round ``back`` a new node id
    ``new`` serves the same view with the same node-local state (a restarted SuperNode)."""

    def __init__(self, *a, dead, new, k, back, **kw):
        super().__init__(*a, **kw)
        self.dead, self.new, self.k, self.back = dead, new, k, back
        self.new_config = dict(self.contexts[dead].node_config)
        self.last = 0

    def get_node_ids(self):
        if self.last >= self.back - 1 and self.new not in self.contexts:  # restarted during round back-1
            self.contexts[self.new] = Context(run_id=1, node_id=self.new, node_config=self.new_config,
                                              state=RecordDict(), run_config={})
        return list(self.contexts)

    def push_messages(self, messages):
        rounds = [int(m.metadata.group_id) for m in messages if m.metadata.group_id.isdigit()]
        self.last = max([self.last, *rounds])
        if rounds and max(rounds) >= self.k:
            self.drop.add(self.dead)
        return super().push_messages(messages)


@pytest.mark.parametrize("rule", ["refresh", "server"])
def test_dropped_node_rejoins_under_a_new_node_id(tmp_path, problem, rule):
    views, views_dn = problem
    grid = FlakyGrid(make_client_app(), _nodes(tmp_path, views), dead=303, new=404, k=2, back=5)
    rc = _run_config(tmp_path, **{"num-rounds": 7, "round-timeout": 0.3, "min-clients": 2.0, "rejoin": rule})
    V, result = _server(grid, rc)
    parts = [r["participants"] for r in result["history"]]
    assert parts == [[0, 1, 2], [0, 1], [0, 1], [0, 1], [0, 1, 2], [0, 1, 2], [0, 1, 2]]
    ref = run_inprocess(views_dn, CFG, max_rounds=7, seed=9, available=lambda s: [0, 1] if 2 <= s <= 4 else [0, 1, 2],
                        participation=__import__("fedsonmf.protocol.participation", fromlist=["P"]).Participation(
                            min_clients=2, rejoin=rule))
    assert np.array_equal(V, ref.V)
    audit_wire(_wire(rc), "fedsonmf", CFG, 40, partial=True)  # rejoin items are declared
    dropped = result["flower"]["dropped"]
    assert [d["round"] for d in dropped] == [2, 3, 4] and all(d["client"] == 2 for d in dropped)


def test_a_node_adopted_later_must_hold_the_views_sample_ids(tmp_path, problem):
    """A SuperNode restarted for a view with a file of other ids would pair other samples' rows."""
    views, _ = problem
    n = views[0].shape[0]
    ids = [str(k) for k in range(n)]
    paths = [_id_csv(tmp_path / "csv" / f"view{p}.csv", X, ids, range(n)) for p, X in enumerate(views)]
    nodes = {nid: {"partition-id": p, "data-path": str(paths[p]), "state-dir": str(tmp_path / f"node{p}"),
                   "require-secure-aggregation": False} for p, nid in enumerate((101, 202, 303))}
    grid = FlakyGrid(make_client_app(), nodes, dead=303, new=404, k=2, back=4)
    grid.new_config["data-path"] = str(_id_csv(tmp_path / "other" / "view2.csv", views[2], [*ids[:-1], "x"], range(n)))
    rc = _run_config(tmp_path, **{"num-rounds": 6, "round-timeout": 0.3, "min-clients": 2.0})
    with pytest.raises(FederationError, match=r"node 404 came online for view 2 with other sample ids") as exc:
        _server(grid, rc)
    assert exc.value.client == 2


def test_quorum_failure_in_the_apps_is_a_federation_error(tmp_path, problem):
    views, _ = problem
    grid = FlakyGrid(make_client_app(), _nodes(tmp_path, views), dead=303, new=404, k=2, back=99)
    rc = _run_config(tmp_path, **{"num-rounds": 3, "round-timeout": 0.3, "min-clients": 3.0})
    with pytest.raises(FederationError, match="quorum"):
        _server(grid, rc)
    st = json.loads(open(f"{rc['out-dir']}/status.json").read())
    assert st["status"] == "failed" and st["round"] == 2 and "quorum" in st["error"]


def test_node_validates_and_hashes_its_view_once(tmp_path, problem, monkeypatch):
    """A node's per-round process reuses the validated facts of its view file."""
    import fedsonmf.federation.flower.client_app as ca
    from fedsonmf.core._linalg import sqnorm

    views, views_dn = problem
    (path,) = write_views([views[0]], tmp_path / "v")
    cache = tmp_path / "state" / "view-facts-0.json"
    X, facts = ca.view_facts(path, cache)
    assert facts["x_sqnorm"] == pytest.approx(sqnorm(views_dn[0])) and cache.is_file()
    calls = []
    monkeypatch.setattr(ca, "check_views", lambda *a, **k: calls.append(1) or (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr(ca.ckpt, "view_fingerprint", lambda X: calls.append(2) or "x")
    X2, facts2 = ca.view_facts(path, cache)
    assert calls == [] and facts2 == facts and np.array_equal(np.asarray(X2), np.asarray(X))
    # a changed file is validated (and hashed) again
    np.save(path, np.asarray(views[0]) * 2.0)
    with pytest.raises(AssertionError):
        ca.view_facts(path, cache)


def test_after_an_error_reply_the_other_replies_are_still_awaited(monkeypatch):
    """A Flower 1.42 SuperNode that pulled its message waits for its reply before it pulls anything
    else: if the run failed at the first error reply, a node whose task had not started yet would
    never serve the next run. _push_pull keeps pulling the others (up to DRAIN_SECONDS)."""
    from types import SimpleNamespace

    from fedsonmf.federation.flower import transport

    class Grid:
        def __init__(self):
            self.pulls = 0

        def push_messages(self, msgs):
            return ["a", "b", "c"][: len(msgs)]

        def pull_messages(self, ids):
            self.pulls += 1
            def rep(mid, err):
                return SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid), has_error=lambda: err)
            out = [rep("a", True)] if self.pulls == 1 else []  # client 0 fails at once
            if self.pulls == 4:
                out.append(rep("b", False))  # client 1 answers three pulls later
            return [r for r in out if r.metadata.reply_to_message_id in ids]

    monkeypatch.setattr(transport, "DRAIN_SECONDS", 1.0)
    grid = Grid()
    by_id, got, pending = transport._push_pull(grid, ["m0", "m1", "m2"], timeout=60.0, poll=0.0)
    assert set(got) == {"a", "b"} and got["a"].has_error() and pending == {"c"}
    monkeypatch.setattr(transport, "DRAIN_SECONDS", 0.0)  # the drain is bounded: client 2 never answers
    grid = Grid()
    _, got, pending = transport._push_pull(grid, ["m0", "m1", "m2"], timeout=60.0, poll=0.0)
    assert set(got) == {"a"} and pending == {"b", "c"} and grid.pulls == 1


def test_an_exchange_first_pulls_when_its_replies_are_expected_and_learns_their_time(monkeypatch):
    """The first pull of an exchange waits the estimate of its kind (docs/flower.md, "The node loop");
    the time to its first reply is recorded under that kind."""
    from types import SimpleNamespace

    from fedsonmf.federation.flower import transport
    from fedsonmf.federation.flower.waits import ArrivalEstimate

    slept = []
    monkeypatch.setattr(transport.time, "sleep", slept.append)

    class Grid:
        def push_messages(self, msgs):
            return ["a", "b"]

        def pull_messages(self, ids):
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid), has_error=lambda: False)
                    for mid in ids]

    est = ArrivalEstimate(fraction=0.5, memory=3)
    for t in (0.08, 0.09, 0.1):
        est.observe(t, "round")
    _, got, pending = transport._push_pull(Grid(), ["m0", "m1"], timeout=60.0, poll=0.0, expect=(est, "round"))
    assert set(got) == {"a", "b"} and not pending
    assert slept == [pytest.approx(0.04)]  # one wait, then one pull found both replies
    assert est.first_wait("round") == 0.0  # found by that first pull: measured afresh next time
    transport._push_pull(Grid(), ["m0", "m1"], timeout=60.0, poll=0.0, expect=(est, "round"))
    assert slept[-1] == 0.0 and est._recent["round"][-1] >= 0.0  # no wait; its time is recorded
