"""Federated multi-view clustering over Flower: the same pipeline as the in-process estimator.

* fast (no processes): the ServerApp's main against a fake Grid that calls the ClientApp
  object directly -- labels and V equal ``FedMultiViewClustering`` bit for bit, the nodes keep
  the prepared view and the preprocessing info (mode 0600), the server receives none of it;
* deploy (real SuperLink + SuperNodes on loopback): the estimator with ``engine="flower"``
  and ``predict`` over a deployment, BBCSport (real data), status.json while running,
  the CLI's exit codes.
"""

import json
import os
import stat
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, Error, RecordDict  # noqa: E402
from flwr.app import Message as FlwrMessage  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from _waits import read_status, status_progress, wait_until  # noqa: E402
from fedsonmf.cli.app import app as cli_app  # noqa: E402
from fedsonmf.estimators import FedMultiViewClustering  # noqa: E402
from fedsonmf.estimators.options import Flower, PrivacyOptions, from_flat  # noqa: E402
from fedsonmf.exceptions import CheckpointError, FederationError  # noqa: E402
from fedsonmf.federation import checkpoint as ckpt  # noqa: E402
from fedsonmf.federation.flower import codec, run_flower, write_masks, write_views  # noqa: E402
from fedsonmf.federation.flower.audit import audit_wire  # noqa: E402
from fedsonmf.federation.flower.client_app import make_client_app  # noqa: E402
from fedsonmf.federation.flower.clustering import read_labels_csv  # noqa: E402
from fedsonmf.federation.flower.server_app import server_main  # noqa: E402
from fedsonmf.federation.flower.template import RUN_CONFIG_DEFAULTS  # noqa: E402
from fedsonmf.federation.flower.transport import BatchingGrid  # noqa: E402
from fedsonmf.metrics import clustering_scores  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402

C, ROUNDS, SEED = 3, 4, 7
PRIVATE_KEYS = ("mean_share", "center", "inv_scale", "scale", "standardized", "centered", "sample_l2")


def blobs(n_per=20, seed=0, noise=0.3):
    """3 planted clusters seen by 3 views: a sparse text-like view, a dense view dominated by a
    common background (its node centres and standardises it), and a view narrower than r = 2c
    (its node pads it)."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(C), n_per)
    views = []
    for d, background in ((12, 0.0), (9, 3.0), (4, 0.0)):
        centers = np.zeros((C, d))
        for k in range(C):
            centers[k, (k * d) // C:((k + 1) * d) // C] = 1.0
        views.append(background + centers[y] + noise * rng.random((y.size, d)))
    views[0] = sp.csr_matrix(views[0] * (rng.random(views[0].shape) < 0.6))
    return views, y


def reference(views, rounds=ROUNDS, seed=SEED, **kw):
    """The in-process estimator with secure aggregation, as a deployment runs by default (the
    masked sums decode to the same V bit for bit); one fit, as one ServerApp run."""
    kw.setdefault("secure_aggregation", True)
    kw.setdefault("n_init", 1)
    masks = kw.pop("masks", None)
    with threadpool_limits(1):
        return FedMultiViewClustering(C, max_rounds=rounds, tol=0.0, random_state=seed,
                                      **from_flat(kw)).fit(views, masks=masks)


@pytest.fixture(autouse=True)
def _task_identity():
    """Outside a Flower runtime, Message(...) needs the task identity set (internal API)."""
    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old


def _parts(msg):
    """A message, or the messages of a batch (the fits of a run at once), each with ``content``,
    ``has_error()`` and ``error`` as a Flower message has them."""
    if msg.has_error() or codec.BATCH not in msg.content:
        return [msg]
    return [SimpleNamespace(content=c, metadata=msg.metadata, has_error=lambda c=c: codec.ERROR in c,
                            error=SimpleNamespace(**dict(c[codec.ERROR])) if codec.ERROR in c else None)
            for c in codec.unpack(msg.content)]


class FakeGrid:
    """A Grid whose nodes are ClientApp objects called in this process (as in test_flower_apps).

    ``sent`` and ``log`` hold the messages of a batch one by one; ``batches`` counts the batches."""

    def __init__(self, client_app, node_configs):
        self.app = client_app
        self.contexts = {nid: Context(run_id=1, node_id=nid, node_config=nc, state=RecordDict(), run_config={})
                         for nid, nc in node_configs.items()}
        self.replies = {}
        self.log = []  # every reply, in push order
        self.sent = []  # (node id, message) of every message, in push order
        self.reply_hook = None  # called on every reply before the server sees it
        self.batches = 0

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            self.sent.extend((msg.metadata.dst_node_id, m) for m in _parts(msg))
            try:
                self.replies[mid] = self.app(message=msg, context=self.contexts[msg.metadata.dst_node_id])
            except Exception as exc:  # what the SuperNode runtime does
                self.replies[mid] = FlwrMessage(Error(2, f"{type(exc)}:<'{exc}'>"), reply_to=msg)
            if self.reply_hook is not None:
                self.reply_hook(self.replies[mid])
            self.log.extend(_parts(self.replies[mid]))
            self.batches += codec.BATCH in msg.content
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(mid) for mid in list(message_ids) if mid in self.replies]


def _fake_run(tmp_path, views, new_views=None, node_extra=None, reply_hook=None, masks=None, before_handle=None,
              nodes_see_run_config=False, **rc_extra):
    paths = write_views(views, tmp_path / "views")
    new_paths = write_views(new_views, tmp_path / "new") if new_views is not None else [None] * len(views)
    mask_paths = write_masks(masks, tmp_path / "masks") if masks is not None else [None] * len(views)
    nodes = {}
    for p, nid in enumerate((11, 22, 33)[: len(views)]):
        nc = {"partition-id": p, "data-path": str(paths[p]), "state-dir": str(tmp_path / f"node{p}"),
              **(node_extra or {})}
        if new_paths[p] is not None:
            nc["predict-path"] = str(new_paths[p])
        if mask_paths[p] is not None:
            nc["mask-path"] = str(mask_paths[p])
        nodes[nid] = nc
    grid = FakeGrid(make_client_app(before_handle=before_handle), nodes)
    grid.reply_hook = reply_hook
    rc = dict(RUN_CONFIG_DEFAULTS)
    rc.update({"num-clients": len(views), "num-rounds": ROUNDS, "seed": SEED, "tol": 0.0,
               "config-json": json.dumps(FedConfig().to_dict()), "out-dir": str(tmp_path / "server"),
               "job-id": "job-c", "round-timeout": 30.0, "node-timeout": 5.0, "poll-interval": 0.001,
               "record-wire": True, "n-clusters": C, "n-init": "1"})
    rc.update(rc_extra)
    if nodes_see_run_config:  # as on a SuperNode, whose ClientApp context carries the run's config
        for ctx in grid.contexts.values():
            ctx.run_config = rc
    with threadpool_limits(1):
        server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    return grid, rc


def test_flower_clustering_equals_the_estimator_and_keeps_preprocessing_on_the_nodes(tmp_path):
    views, y = blobs()
    ref = reference(views)
    assert ref.padded_views_ == [2] and ref.preprocessing_[1]["standardized"]  # the planted cases trigger
    grid, rc = _fake_run(tmp_path, views)
    out = Path(rc["out-dir"])
    V = np.load(out / "V.npy")
    assert np.array_equal(V, ref.result_.V)
    labels = read_labels_csv(out / "labels.csv")
    assert np.array_equal(labels, ref.labels_)
    rows = (out / "labels.csv").read_text().splitlines()
    assert rows[0] == "sample_id,cluster" and len(rows) == 1 + y.size
    assert [int(r.split(",")[0]) for r in rows[1:]] == list(range(y.size))
    assert np.array_equal(np.load(out / "centers.npy"), ref.cluster_centers_)
    result = json.loads((out / "result.json").read_text())
    assert result["clustering"]["n_components"] == ref.n_components_ == 2 * C
    assert "padded" in result["clustering"]["rank_message"]
    # the same starts refined, the same one kept (the dense views score them on both engines)
    assert result["clustering"]["refine_start"] == ref.refine_start_[0]
    assert result["clustering"]["refine_iterations"] == ref.refine_iter_[0]
    assert result["clustering"]["graph_iterations"] == ref.graph_iter_[0] > 0  # then the same graph exchanges
    assert result["clustering"]["exchanges"] == ref.fit_report_["stage_exchanges"]  # kind by kind
    assert result["clustering"]["spectral_steps"] == ref.fit_report_["spectral_steps"]
    assert result["clustering"]["graph_chosen"] == ref.graph_chosen_[0]  # and the same end of the stage
    # every node kept its prepared view and its preprocessing info, private (0600)
    for p in range(3):
        sdir = tmp_path / f"node{p}" / "job-c"
        files = [sdir / f"preprocessing-{p}.npz", next(sdir.glob(f"view-{p}.np[yz]")), sdir / f"graph-{p}.npz"]
        for f in files:
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
        with np.load(files[0]) as z:
            meta = json.loads(str(z["__meta_json__"]))
        assert meta["mean_share"] == pytest.approx(ref.preprocessing_[p]["mean_share"])
        assert meta["scale"] == ref.view_scales_[p]
    # the server received none of it: the audit passes, and no private key is in any upward record
    wire = [json.loads(line) for line in open(out / "wire.jsonl")]
    audit_wire(wire, "fedsonmf", FedConfig(n_components=2 * C, secure_aggregation=True), y.size)
    for row in wire:
        if row["direction"] == "up":
            keys = {k for rec in row["records"].values() for k in rec["items"]}
            assert not keys & set(PRIVATE_KEYS), keys
    # the graph refinement stops after its first exchange here, so every spectral block goes alone
    graph_down = [r["records"]["fedsonmf.arrays"]["items"] for r in wire if r["direction"] == "down" and
                  r["records"]["fedsonmf.meta"]["items"]["kind"]["value"] == "graph"]
    assert graph_down and not any("M" in items for items in graph_down)  # here it stops at once: nothing to share
    setup_down = [r for r in wire if r["direction"] == "down" and
                  r["records"]["fedsonmf.meta"]["items"]["kind"]["value"] == "setup"]
    assert all("clustering" in r["records"]["fedsonmf.scalars"]["items"] for r in setup_down)


def test_incomplete_views_cluster_on_flower_as_in_process(tmp_path):
    """Each node holds some of the samples (its availability mask, a node-local file): its
    preprocessing statistics, refinement distances and k-NN graph come from the samples it holds,
    and the run gives the in-process estimator's V, labels, kept start and graph stage with the same
    masks; the samples a node lacks are never read (garbage there changes nothing)."""
    views, y = blobs(noise=2.5)  # noisy: where the samples are read decides the partition
    rng = np.random.default_rng(3)
    n = y.size
    masks = [rng.random(n) < keep for keep in (0.7, 0.8, 1.0)]
    masks[2] = None  # a complete view beside two incomplete ones
    for mk in masks[:2]:
        mk[rng.choice(n, 2, replace=False)] = True
    ref = reference(views, masks=masks)
    assert not np.array_equal(ref.labels_, reference(views).labels_)  # the masks matter here
    dirty = [views[0].tolil(copy=True), views[1].copy(), views[2]]
    dirty[0][np.flatnonzero(~masks[0]), 0] = 50.0  # rows a node does not hold: never read
    dirty[1][~masks[1]] = -7.0
    dirty[0] = sp.csr_matrix(dirty[0])
    grid, rc = _fake_run(tmp_path, dirty, masks=masks)
    out = Path(rc["out-dir"])
    assert np.array_equal(np.load(out / "V.npy"), ref.result_.V)
    assert np.array_equal(read_labels_csv(out / "labels.csv"), ref.labels_)
    result = json.loads((out / "result.json").read_text())["clustering"]
    assert "refine_error" not in result
    assert result["refine_start"] == ref.refine_start_[0] and result["graph_iterations"] == ref.graph_iter_[0] > 0
    assert np.array_equal(ref.labels_, reference(dirty, masks=masks).labels_)  # in process too
    wire = [json.loads(line) for line in open(out / "wire.jsonl")]
    audit_wire(wire, "fedsonmf", FedConfig(n_components=2 * C, secure_aggregation=True), n, masked=True)


def test_a_node_of_an_incomplete_view_applies_its_minimum_to_the_samples_it_holds(tmp_path):
    """refine-min-cluster-size = m on nodes that hold some of the samples: a cluster may be large
    overall and hold fewer than m of a node's samples, and the node's reply comes from its own samples
    alone, so the node checks those; the server, which knows who holds which sample from the masked
    setup, sends no partition a node would refuse (no refused request), and no node answers a
    partition with a nonempty cluster of fewer than m of its samples."""
    from fedsonmf.federation.flower.clustering import NodePolicy, _request_labels

    views, y = blobs(noise=2.5)
    rng = np.random.default_rng(3)
    n, m = y.size, 8
    masks = [rng.random(n) < 0.6, None, rng.random(n) < 0.7]
    labels = np.repeat(np.arange(C), n // C)
    held = np.flatnonzero(masks[0])
    assert np.bincount(labels[held]).min() < 18 <= np.bincount(labels).min()
    msg = codec.Message("refine", 0, {"labels": labels}, {"n_clusters": C})
    with pytest.raises(Exception, match="refine-min-cluster-size = 18"):
        _request_labels(msg, n, 0, "refine", 18, held=held)  # 20 overall, fewer held
    _request_labels(msg, n, 1, "refine", 18)  # a complete view: 20 each
    assert not NodePolicy(C, [18], [held, None]).meets(labels[None])[0] and NodePolicy(C, [18]).meets(labels[None])[0]
    # each node's own minimum on its own samples: a node that asks for less does not inherit another's
    assert NodePolicy(C, [2, 18], [held, None]).meets(labels[None])[0]
    assert not NodePolicy(C, [18, 2], [held, None]).meets(labels[None])[0]
    grid, rc = _fake_run(tmp_path, views, masks=masks, node_extra={"refine-min-cluster-size": m})
    out = Path(rc["out-dir"])
    summary = json.loads((out / "result.json").read_text())["clustering"]
    assert "refine_error" not in summary, summary.get("refine_error")
    assert not [r for r in grid.log if r.has_error()]
    nodes = {11: 0, 22: 1, 33: 2}
    answered = 0
    for nid, sent in grid.sent:
        if codec.META not in sent.content or str(sent.content[codec.META]["kind"]) not in ("refine", "graph"):
            continue
        fed, _ = codec.decode(sent.content)
        rows = np.asarray(fed.arrays["labels"]).reshape(-1, n)
        mk = masks[nodes[nid]]
        own = rows if mk is None else rows[:, mk]
        for row in own:
            sizes = np.bincount(row, minlength=C)
            assert sizes[sizes > 0].min() >= m
        answered += 1
    assert answered > 0


def test_the_spectral_blocks_ride_on_the_graph_refinements_requests_and_give_the_estimators_labels(tmp_path):
    """Noisy blobs: the graph refinement moves for several exchanges, during which the spectral step's
    blocks travel in the same graph requests (a node replies both products side by side, masked);
    the labels and the stage's exchanges are the in-process estimator's, and the audit passes."""
    views, y = blobs(noise=3.0)
    ref = reference(views)
    grid, rc = _fake_run(tmp_path, views)
    out = Path(rc["out-dir"])
    assert np.array_equal(read_labels_csv(out / "labels.csv"), ref.labels_)
    result = json.loads((out / "result.json").read_text())
    assert result["clustering"]["graph_iterations"] == ref.graph_iter_[0]
    wire = [json.loads(line) for line in open(out / "wire.jsonl")]
    audit_wire(wire, "fedsonmf", FedConfig(n_components=2 * C, secure_aggregation=True), y.size)
    kind = [r["records"]["fedsonmf.meta"]["items"]["kind"]["value"] for r in wire]
    down = [r["records"]["fedsonmf.arrays"]["items"] for r, k in zip(wire, kind) if k == "graph" and
            r["direction"] == "down"]
    up = [r["records"]["fedsonmf.arrays"]["items"] for r, k in zip(wire, kind) if k == "graph" and
          r["direction"] == "up"]
    shared = [items["M"]["shape"] for items in down if "M" in items]
    assert shared and all(shape == [y.size, C] for shape in shared)
    widths = sorted({items["secagg.arrays.L"]["shape"][1] for items in up})
    assert widths == [C, 2 * C]  # the labels' counts alone, or beside the block's products
    # together with the blocks sent alone, no more than the capped steps' blocks per node
    alone = sum(1 for r, k in zip(wire, kind) if k == "spectral" and r["direction"] == "down")
    steps = min(20, y.size // (2 * C))
    assert (len(shared) + alone) == 3 * (steps - 1)


def test_a_run_of_several_fits_keeps_the_estimators_medoid_and_predicts_with_its_bases(tmp_path):
    """``n-init = 3``: the ServerApp fits three times from the estimator's seeds (each fit its own job
    on the nodes), keeps the medoid of their partitions and refines it -- the in-process estimator's
    labels, V and centres -- and a predict run then uses the kept fit's bases."""
    views, _ = blobs()
    new, _ = blobs(n_per=5, seed=3)
    ref = reference(views, n_init=3)
    grid, rc = _fake_run(tmp_path, views, new_views=new, **{"n-init": "3"})
    out = Path(rc["out-dir"])
    assert np.array_equal(np.load(out / "V.npy"), ref.result_.V)
    assert np.array_equal(read_labels_csv(out / "labels.csv"), ref.labels_)
    assert np.array_equal(np.load(out / "centers.npy"), ref.cluster_centers_)
    result = json.loads((out / "result.json").read_text())
    restarts = result["clustering"]["restarts"]
    assert restarts["seeds"] == ref.seeds_ and restarts["best_restart"] == ref.best_restart_
    assert result["seed"] == ref.seeds_[ref.best_restart_]
    assert result["flower"]["job_id"] == f"job-c-restart-{ref.best_restart_}"
    assert result["clustering"]["refine_iterations"] == ref.refine_iter_[0]
    for i in range(3):  # each fit is saved on the SuperLink host and kept on the nodes as its own job
        assert json.loads((out / f"restart-{i}" / "result.json").read_text())["seed"] == ref.seeds_[i]
        assert (tmp_path / "node0" / f"job-c-restart-{i}").is_dir()
    # only the kept fit was refined: the refinement's exchanges name its job alone
    jobs = {codec.decode(m.content)[1]["job-id"] for _, m in grid.sent
            if codec.decode(m.content)[0].kind in ("refine", "graph", "spectral")}
    assert jobs == {f"job-c-restart-{ref.best_restart_}"}
    rc2 = {**rc, "mode": "predict", "model-dir": str(out), "out-dir": str(tmp_path / "predict")}
    with threadpool_limits(1):
        server_main(grid, Context(run_id=2, node_id=0, node_config={}, state=RecordDict(), run_config=rc2))
        want = ref.predict(new)
    assert np.array_equal(read_labels_csv(tmp_path / "predict" / "labels.csv"), want)
    # the fits ran at once (the status counts each one's rounds); with partial participation (node
    # adoption is the run's) they run one after the other -- the same fits, kept fit and labels
    status = json.loads((out / "status.json").read_text())
    assert status["fit_rounds"] == {str(i): ROUNDS for i in range(3)} and status["fits_running"] == []
    # at once, a node got the fits' messages of a round together, one Flower message (the same
    # results as above, where each fit's messages are the ones it sends alone)
    assert grid.batches >= 3 * ROUNDS
    grid, rc = _fake_run(tmp_path / "one-by-one", views, **{"n-init": "3", "min-clients": 3})
    out = Path(rc["out-dir"])
    assert np.array_equal(read_labels_csv(out / "labels.csv"), ref.labels_)
    assert "fit_rounds" not in json.loads((out / "status.json").read_text()) and grid.batches == 0
    order = [codec.decode(m.content)[1]["job-id"] for _, m in grid.sent if codec.decode(m.content)[0].kind == "round"]
    assert order == sorted(order)


def test_the_batching_grid_sends_a_node_one_message_per_round_and_each_fit_its_own_replies():
    """Three senders (fits) push one message per node: each node gets one batch of three, and each
    sender pulls its own replies under its own ids; a message the node fails gets its own error, the
    batch's others are answered; once two senders have left, the third's messages go alone."""
    echo = ClientApp()

    @echo.train()
    def one(msg, context):
        return FlwrMessage(msg.content, reply_to=msg)

    @echo.train(codec.BATCH_ACTION)
    def many(msg, context):
        parts = codec.unpack(msg.content)
        return FlwrMessage(codec.pack([codec.error_content(2, "boom") if "fail" in dict(p["x"]) else p
                                       for p in parts]), reply_to=msg)

    fake = FakeGrid(echo, {11: {}, 22: {}})
    grid = BatchingGrid(fake, senders=3, linger=30.0)  # the batch leaves when all three have pushed
    got = {}

    def sender(i):
        msgs = [FlwrMessage(RecordDict({"x": ConfigRecord({"fit": i, "node": nid, **({"fail": 1} if i == 1 and
                                                                                        nid == 22 else {})})}),
                            dst_node_id=nid, message_type="train", group_id="1") for nid in (11, 22)]
        ids = grid.push_messages(msgs)
        got[i] = {rep.metadata.reply_to_message_id: rep for rep in grid.pull_messages(ids)}, ids

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert fake.batches == 2 and grid.batches_sent == 2 and len(fake.sent) == 6  # 2 Flower messages, 6 inside
    for i, (replies, ids) in got.items():
        assert set(replies) == set(ids)
        for nid, mid in zip((11, 22), ids):
            rep = replies[mid]
            if i == 1 and nid == 22:
                assert rep.has_error() and rep.error.reason == "boom" and rep.error.code == 2
            else:
                assert not rep.has_error() and dict(rep.content["x"]) == {"fit": i, "node": nid}
    grid.leave()
    grid.leave()  # one sender left: its push goes at once, as plain messages
    ids = grid.push_messages([FlwrMessage(RecordDict({"x": ConfigRecord({"fit": 2})}), dst_node_id=11,
                                          message_type="train", group_id="2")])
    assert fake.batches == 2 and ":" not in ids[0]
    assert dict(grid.pull_messages(ids)[0].content["x"]) == {"fit": 2}


def test_a_run_of_several_fits_resumes_at_the_fit_that_failed(tmp_path):
    """The fits run at once: a node that fails in round 3 of the second of three fits ends the run,
    the other fits stop at the end of their round under way (checkpointed); ``resume`` continues
    every fit from its own checkpoint and ends with the labels and V of the uninterrupted run."""
    views, _ = blobs()
    ref = reference(views, n_init=3)
    failed = {"n": 0}

    def fail_once(fed_msg, context, job_id):  # the node of view 1, round 3 of the second fit: an error, once
        if (int(context.node_config["partition-id"]) == 1 and job_id == "job-c-restart-1"
                and fed_msg.kind == "round" and fed_msg.round == 3 and not failed["n"]):
            failed["n"] += 1
            raise RuntimeError("injected failure")

    with pytest.raises(FederationError, match="client 1"):
        _fake_run(tmp_path, views, before_handle=fail_once, **{"n-init": "3"})
    out = tmp_path / "server"
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and status["restart"] == 1 and status["last_completed_round"] == 2
    assert status["checkpoint"] == str(out / "restart-1" / "checkpoint")
    # the others stopped at the end of their round under way (the threads' pace varies: from before
    # their first round, with no checkpoint, to the last), or had finished (their V saved)
    finished = [i for i in range(3) if (out / f"restart-{i}" / "V.npy").is_file()]
    done = {i: ckpt.load_server_checkpoint(out / f"restart-{i}" / "checkpoint").completed_rounds
            if ckpt.has_server_checkpoint(out / f"restart-{i}" / "checkpoint") else 0 for i in range(3)}
    assert 1 not in finished and done[1] == 2 and all(done[i] == ROUNDS for i in finished), (done, finished)
    grid, rc = _fake_run(tmp_path, views, **{"n-init": "3", "resume": True})
    assert np.array_equal(read_labels_csv(out / "labels.csv"), ref.labels_)
    assert np.array_equal(np.load(out / "V.npy"), ref.result_.V)
    sent = [codec.decode(m.content) for _, m in grid.sent]
    for i in range(3):  # every fit went on from its own checkpoint (no round it had done, no setup unless
        mine = [msg for msg, meta in sent if meta["job-id"] == f"job-c-restart-{i}"]  # it had none); a finished
        assert done[i] == 0 or not any(msg.kind == "setup" for msg in mine)  # one is read back
        assert not (i in finished and any(msg.kind == "round" for msg in mine))
        assert sorted({msg.round for msg in mine if msg.kind == "round"}) == list(range(done[i] + 1, ROUNDS + 1))
    with pytest.raises(CheckpointError, match="seeds"):  # another n-init draws other seeds: nothing to resume
        _fake_run(tmp_path, views, **{"n-init": "2", "resume": True})
    # a run whose fits all finished resumes at the refinement: no fit is sent anything again
    grid, rc = _fake_run(tmp_path, views, **{"n-init": "3", "resume": True})
    jobs = {meta["job-id"] for msg, meta in (codec.decode(m.content) for _, m in grid.sent) if msg.kind == "round"}
    assert not jobs and np.array_equal(read_labels_csv(out / "labels.csv"), ref.labels_)


def test_flower_predict_equals_the_estimator(tmp_path):
    views, _ = blobs()
    new, _ = blobs(n_per=5, seed=3)
    ref = reference(views)
    grid, rc = _fake_run(tmp_path, views, new_views=new)
    model = rc["out-dir"]
    rc2 = {**rc, "mode": "predict", "model-dir": model, "out-dir": str(tmp_path / "predict")}
    with threadpool_limits(1):
        server_main(grid, Context(run_id=2, node_id=0, node_config={}, state=RecordDict(), run_config=rc2))
        want_E, want = ref.transform(new), ref.predict(new)
    out = tmp_path / "predict"
    assert np.array_equal(np.load(out / "V.npy").T, want_E)
    assert np.array_equal(read_labels_csv(out / "labels.csv"), want)
    # what the nodes sent (the fit ran with secure aggregation, so the predict does too): a public
    # key, then one masked r x n_new matrix each -- nothing in the clear, nothing with a feature dimension
    up = [row for row in map(json.loads, open(out / "wire.jsonl")) if row["direction"] == "up"]
    arrays = [{k: v["shape"] for k, v in row["records"]["fedsonmf.arrays"]["items"].items()}
              for row in up if "fedsonmf.arrays" in row["records"]]
    assert arrays == [{"secagg.arrays.UtX": [2 * C, 15]}] * 3, arrays
    scalars = [set(row["records"]["fedsonmf.scalars"]["items"]) for row in up if "fedsonmf.scalars" in row["records"]]
    assert {"secagg_pk", "secagg_exp", "n"} in scalars and not any("UtX" in s for s in scalars)


def test_flower_predict_aligns_new_samples_by_their_ids_and_refuses_other_samples(tmp_path):
    """New-sample files with ids (sidecars), rows in a different order on every node: each node sorts
    its rows by id, so the labels are the estimator's; a node whose ids differ stops the predict run."""
    from fedsonmf.exceptions import FederationError

    views, _ = blobs()
    new, _ = blobs(n_per=5, seed=3)
    ref = reference(views)
    ids = np.array([f"s{k:02d}" for k in range(new[0].shape[0])])
    orders = [np.random.default_rng(p).permutation(ids.size) for p in range(len(new))]
    grid, rc = _fake_run(tmp_path, views, new_views=[X[o] for X, o in zip(new, orders)])
    for p, o in enumerate(orders):
        (tmp_path / "new" / f"view{p}.ids.txt").write_text("\n".join(ids[o]) + "\n")

    def predict(out):
        rc2 = {**rc, "mode": "predict", "model-dir": rc["out-dir"], "out-dir": str(tmp_path / out)}
        with threadpool_limits(1):
            server_main(grid, Context(run_id=2, node_id=0, node_config={}, state=RecordDict(), run_config=rc2))

    predict("predict")
    with threadpool_limits(1):
        want = ref.predict(new)
    assert np.array_equal(read_labels_csv(tmp_path / "predict" / "labels.csv"), want)
    (tmp_path / "new" / "view2.ids.txt").write_text("\n".join([*ids[orders[2]][:-1], "s99"]) + "\n")
    with pytest.raises(FederationError, match=r"view 2 \(node 33\) holds other sample ids than view 0 in its "
                                              r"new-sample file"):
        predict("predict2")


def test_a_node_refuses_to_send_new_samples_in_the_clear_after_a_secure_fit(tmp_path):
    """A server that asks for the predict's U_p^T X_p^new unmasked (no key step) gets an error
    from every node whose fit ran with secure aggregation -- the node decides from its own record."""
    from fedsonmf.federation.flower import clustering as fclust
    from fedsonmf.federation.flower import server_app

    views, _ = blobs()
    new, _ = blobs(n_per=5, seed=3)
    grid, rc = _fake_run(tmp_path, views, new_views=new)
    rc2 = {**rc, "mode": "predict", "model-dir": rc["out-dir"], "out-dir": str(tmp_path / "predict")}
    real = server_app.Message

    def downgraded(kind, round, arrays=None, scalars=None, *a):  # the curious server drops the seed
        scalars = {k: v for k, v in (scalars or {}).items() if k != fclust.EMBED_SECAGG_SEED}
        return real(kind, round, arrays or {}, scalars, *a)

    server_app.Message = downgraded
    try:
        with pytest.raises(Exception, match="masked only"), threadpool_limits(1):
            server_main(grid, Context(run_id=3, node_id=0, node_config={}, state=RecordDict(), run_config=rc2))
    finally:
        server_app.Message = real
    assert not (tmp_path / "predict" / "V.npy").exists()


def test_flower_stops_where_the_estimator_stops_with_the_default_stopping_rules(tmp_path):
    """tol > 0 and early_stop="labels" (the default rule): the ServerApp runs the same label-stability
    rule on its V as the in-process estimator, so both stop at the same round with the same labels."""
    views, _ = blobs()
    with threadpool_limits(1), pytest.warns(UserWarning, match="padded"):
        ref = FedMultiViewClustering(C, max_rounds=60, tol=1e-12, random_state=SEED, n_init=1,
                                     privacy=PrivacyOptions(secure_aggregation=True)).fit(views)
    assert "unchanged" in ref.result_.stopping_reason and ref.result_.n_rounds < 60
    _, rc = _fake_run(tmp_path, views, **{"num-rounds": 60, "tol": 1e-12})
    res = json.loads((Path(rc["out-dir"]) / "result.json").read_text())
    assert res["n_rounds"] == ref.result_.n_rounds and "unchanged" in res["stopping_reason"]
    assert np.array_equal(np.load(Path(rc["out-dir"]) / "V.npy"), ref.result_.V)
    assert np.array_equal(read_labels_csv(Path(rc["out-dir"]) / "labels.csv"), ref.labels_)


@pytest.mark.parametrize("rule,want", [("paper", C), ("5", 4)])
def test_rank_rules_are_settled_at_the_handshake(tmp_path, rule, want):
    views, _ = blobs()
    _, rc = _fake_run(tmp_path, views, **{"rank-rule": rule, "num-rounds": 1})
    res = json.loads((Path(rc["out-dir"]) / "result.json").read_text())
    assert res["config"]["n_components"] == res["clustering"]["n_components"] == want
    ref = reference(views, rounds=1, n_components=int(rule) if rule.isdigit() else rule)
    assert np.array_equal(np.load(Path(rc["out-dir"]) / "V.npy"), ref.result_.V)


def test_status_file_reports_progress(tmp_path):
    views, _ = blobs()
    _, rc = _fake_run(tmp_path, views)
    st = json.loads((Path(rc["out-dir"]) / "status.json").read_text())
    assert st["status"] == "completed" and st["rounds_done"] == ROUNDS == st["max_rounds"] and st["round"] == ROUNDS
    assert st["started_at"] <= st["round1_started_at"] <= st["updated_at"]
    assert st["seconds_per_round"] > 0
    # the refinement's exchanges, each counted as it started (the transport's hook)
    wire = json.loads((Path(rc["out-dir"]) / "result.json").read_text())["flower"]["wire_bytes"]
    kinds = [w["kind"] for w in wire if w["kind"] in ("refine", "graph", "spectral")]
    assert kinds and st["exchanges"] == len(kinds) and st["stage"] == kinds[-1]
    assert st["seconds_per_exchange"] >= 0 and st["n_rounds"] == ROUNDS


def test_the_result_counts_its_exchanges_per_stage(tmp_path):
    """Three fits at once (their messages of a step travel together), then the clustering stages:
    result.json and status.json count the exchanges of each, consistently with the wire."""
    views, _ = blobs()
    _, rc = _fake_run(tmp_path, views, **{"n-init": "3", "num-rounds": 3})
    out = Path(rc["out-dir"])
    result = json.loads((out / "result.json").read_text())
    counts = result["flower"]["exchanges"]
    assert json.loads((out / "status.json").read_text())["exchange_counts"] == counts
    rows = result["flower"]["wire_bytes"]
    # the hellos carried the first fit's setup; the others' setups shared one exchange with its init
    assert counts["hello"] == 1 and counts["setup_at_hello"] and counts["setup"] == 1 and counts["init"] == 1
    assert counts["round"] == max(result["clustering"]["restarts"]["n_rounds"])
    # the longest fit's: its setup (unless at the hello), its init, its rounds
    assert counts["init"] + counts["round"] <= counts["fits"] <= counts["setup"] + counts["init"] + counts["round"]
    stages = [w["kind"] for w in rows if w["kind"] not in ("setup", "init", "round", "unmask")]
    assert stages and counts["stages"] == len(stages)
    assert all(counts[k] == stages.count(k) for k in set(stages))
    assert counts["total"] == counts["hello"] + counts["fits"] + counts["stages"]
    # each fit's own exchanges (one row each) are more than the run's: they travelled together
    assert sum(1 for w in rows if w["kind"] == "round") == sum(result["clustering"]["restarts"]["n_rounds"])


@pytest.mark.parametrize("rule", ["auto", "paper"])
def test_the_setup_travels_with_the_hello_when_r_is_known(tmp_path, rule):
    """With r known before the nodes report (factorisation; clustering rank rule "auto" = 2c) the
    hellos carry the setup: one exchange less before round 1, the same V and labels."""
    views, _ = blobs()
    out = {}
    for at_hello in (True, False):
        grid, rc = _fake_run(tmp_path / str(at_hello), views, **{"rank-rule": rule, "num-rounds": 2,
                                                                 "setup-at-handshake": at_hello})
        wire = [json.loads(line) for line in open(Path(rc["out-dir"]) / "wire.jsonl")]
        kinds = [r["records"]["fedsonmf.meta"]["items"]["kind"]["value"] for r in wire if r["direction"] == "down"]
        # after the rounds, the k-means refinement then the graph refinement and its spectral step (graph and
        # spectral exchanges, then one refine exchange for the dense scores of both partitions when the cut
        # has dropped): one message per node and iteration
        first = kinds.index("refine")
        tail, kinds = kinds[first:], kinds[:first]
        assert set(tail) <= {"refine", "graph", "spectral"} and all(tail.count(k) % 3 == 0 for k in set(tail))
        start_graph = tail.index("graph")
        assert set(tail[:start_graph]) == {"refine"} and "refine" not in tail[start_graph:-3]
        assert tail.count("spectral") > 0  # the blobs' graph: a few steps (n // 2c of them at most)
        out[at_hello] = (np.load(Path(rc["out-dir"]) / "V.npy"), read_labels_csv(Path(rc["out-dir"]) / "labels.csv"),
                         kinds)
        audit_wire(wire, "fedsonmf", FedConfig(n_components=2 * C if rule == "auto" else C, secure_aggregation=True),
                   60)
    assert np.array_equal(out[True][0], out[False][0]) and np.array_equal(out[True][1], out[False][1])
    # secure aggregation (the deployment default): an init exchange (key relay, masked V-bar^1) after the setup
    if rule == "auto":
        assert out[True][2] == ["hello+setup"] * 3 + ["init"] * 3 + ["round"] * 6
    else:  # r = min(c, d_p) needs the widths first
        assert out[True][2] == ["hello"] * 3 + ["setup"] * 3 + ["init"] * 3 + ["round"] * 6
    assert out[False][2] == ["hello"] * 3 + ["setup"] * 3 + ["init"] * 3 + ["round"] * 6


# ----------------------------------------------------------------------------- CLI: bad input, before anything starts


def _cli(*args):
    return CliRunner().invoke(cli_app, [str(a) for a in args])


def test_cli_bad_input_exits_2_before_any_process_starts(tmp_path):
    views, y = blobs()
    paths = write_views(views, tmp_path / "v")
    np.save(tmp_path / "short.npy", np.ones((7, 5)))
    np.save(tmp_path / "flat.npy", np.ones(60))
    cases = [
        (["flower", "cluster", tmp_path / "nope.npy", paths[1], "-k", 3], "nope.npy does not exist"),
        (["flower", "cluster", paths[1], tmp_path / "short.npy", "-k", 3], "different numbers of samples"),
        (["flower", "cluster", paths[1], tmp_path / "flat.npy", "-k", 3], "a view is 2-D (n_samples, n_features)"),
        (["flower", "cluster", *paths, "-k", 61], "n_clusters=61"),
        (["flower", "cluster", *paths, "-k", 3, "--rank", "lots"], "--rank"),
        (["flower", "run", *paths, "--rank", 5], "larger than view 2's number of features (4"),
        (["flower", "run", *paths, "--rejoin", "refresh"], "--rejoin"),
    ]
    for i, (args, message) in enumerate(cases):
        out = tmp_path / f"run{i}"
        r = _cli(*args, "--out", out)
        assert r.exit_code == 2, (args, r.output)
        assert message in " ".join(r.output.split()), (message, r.output)
        assert "starting" not in r.output and not out.exists()
    (tmp_path / "y.csv").write_text("\n".join(map(str, y[:-1])) + "\n")
    r = _cli("flower", "cluster", *paths, "-k", 3, "--labels", tmp_path / "y.csv", "--out", tmp_path / "runy")
    assert r.exit_code == 2 and "59 labels for 60 samples" in r.output and not (tmp_path / "runy").exists()


# ----------------------------------------------------------------------------- real loopback deployments


@pytest.mark.slow
@pytest.mark.deploy
def test_estimator_on_flower_clusters_incomplete_views_as_in_process(tmp_path):
    """FedMultiViewClustering(engine="flower").fit(views, masks=...) on a real deployment: each mask
    lies beside its view in its own client folder (0600) and reaches only that view's node; the
    labels and V are the in-process fit's with the same masks."""
    views, y = blobs(noise=2.5)
    rng = np.random.default_rng(3)
    masks = [rng.random(y.size) < 0.7, None, rng.random(y.size) < 0.8]
    ref = reference(views, rounds=3, masks=masks)
    with pytest.warns(UserWarning, match="padded"):
        model = FedMultiViewClustering(C, max_rounds=3, tol=0.0, random_state=SEED, n_init=1,
                                       federation=Flower(run_dir=tmp_path / "fl")).fit(views, masks=masks)
    assert np.array_equal(model.result_.V, ref.result_.V)
    assert np.array_equal(model.labels_, ref.labels_) and model.graph_iter_ == ref.graph_iter_
    for p, mk in enumerate(masks):
        files = sorted((tmp_path / "fl" / "clients" / f"p{p}").rglob("*.mask.npy"))
        assert len(files) == (mk is not None)
        for f in files:
            assert np.array_equal(np.load(f), mk) and stat.S_IMODE(os.stat(f).st_mode) == 0o600


@pytest.mark.slow
@pytest.mark.deploy
def test_estimator_on_flower_equals_inprocess_and_predicts_new_samples(tmp_path):
    """FedMultiViewClustering(engine="flower"): each view in its own client folder, one SuperNode
    each; the labels, V and centres equal the in-process fit, and predict over a deployment (the
    nodes read the new samples from their own folders) equals the in-process predict."""
    views, y = blobs()
    new, _ = blobs(n_per=5, seed=3)
    ref = reference(views, rounds=3, n_init=3)  # three restarts in one deployment, the medoid kept
    with pytest.warns(UserWarning, match="padded"):
        model = FedMultiViewClustering(C, max_rounds=3, tol=0.0, random_state=SEED, n_init=3,
                                       federation=Flower(run_dir=tmp_path / "fl")).fit(views)
    assert model.best_restart_ == ref.best_restart_ is not None and model.seeds_ == ref.seeds_
    # one deployment: its ServerApp ran the three fits (each its own job on the nodes) and refined the kept one
    server = tmp_path / "fl" / "run" / "server"
    assert model.flower_run_dir_ == tmp_path / "fl" / "run"
    restarts = json.loads((server / "result.json").read_text())["clustering"]["restarts"]
    assert restarts["seeds"] == ref.seeds_ and restarts["best_restart"] == ref.best_restart_
    for i in range(3):
        fit = json.loads((server / f"restart-{i}" / "result.json").read_text())
        assert fit["seed"] == ref.seeds_[i] and fit["flower"]["job_id"].endswith(f"-restart-{i}")
        assert "clustering" not in fit  # only the kept fit is refined
    assert (model.refine_iter_, model.refine_start_, model.graph_iter_, model.graph_chosen_) == \
        (ref.refine_iter_, ref.refine_start_, ref.graph_iter_, ref.graph_chosen_) and ref.graph_iter_[0] > 0
    assert model.fit_report_["stage_exchanges"] == ref.fit_report_["stage_exchanges"]
    assert np.array_equal(model.result_.V, ref.result_.V)
    assert np.array_equal(model.labels_, ref.labels_) and np.array_equal(model.cluster_centers_, ref.cluster_centers_)
    assert model.n_components_ == ref.n_components_ and model.mu_ == ref.mu_ and model.preprocessing_ is None
    rows = (model.flower_run_dir_ / "server" / "labels.csv").read_text().splitlines()
    assert rows[0] == "sample_id,cluster" and len(rows) == y.size + 1
    assert [r.split(",") for r in rows[1:]] == [[str(i), str(k)] for i, k in enumerate(ref.labels_)]
    for p in range(3):  # each client folder holds its own view only; its node keeps the prepared copy
        held = [f.name for f in (tmp_path / "fl" / "clients" / f"p{p}").iterdir()]
        assert held == [f"view0.{'npz' if p == 0 else 'npy'}"]
    fl = model.result_.extra["flower"]
    assert 0 < fl["round1_started_at"] - fl["launched_at"] == pytest.approx(fl["time_to_round1"])
    with threadpool_limits(1):
        want = ref.predict(new)
    assert np.array_equal(model.predict(new), want)


@pytest.mark.slow
@pytest.mark.deploy
def test_cli_cluster_scores_and_status_shows_the_current_round(tmp_path):
    """``fedsonmf flower cluster`` on a real deployment: while it runs, status.json names the
    current round (polled); at the end labels.csv, the scores in result.json and a wire log
    that holds nothing of the nodes' preprocessing.  Each organisation's file lists its rows in its
    own order, with their ids beside it (``<stem>.ids.txt``): the nodes sort by id, so the result is
    the in-process one, and the ids never travel (only a salted digest of each node's id set)."""
    views, y = blobs()
    ids = np.array([f"s{k:03d}" for k in range(y.size)])  # sorted order = the original order
    orders = [np.random.default_rng(p).permutation(y.size) for p in range(len(views))]
    paths = write_views([X[o] for X, o in zip(views, orders)], tmp_path / "v")
    for path, o in zip(paths, orders):
        path.with_name(path.stem + ".ids.txt").write_text("\n".join(ids[o]) + "\n")
    back = np.random.default_rng(9).permutation(y.size)  # the true classes by id, in yet another order
    (tmp_path / "y.csv").write_text("sample_id,label\n" + "".join(f"{ids[i]},{y[i]}\n" for i in back))
    out = tmp_path / "run"
    result = {}
    th = threading.Thread(target=lambda: result.update(r=_cli(
        "flower", "cluster", *paths, "-k", C, "--rounds", 3, "--tol", 0, "--seed", SEED, "--labels", tmp_path / "y.csv",
        "--record-wire", "--out", out, "--labels-out", tmp_path / "clusters.csv", "--n-init", 1)))
    th.start()
    seen = []
    status = out / "server" / "status.json"

    def watch():
        st = read_status(status)
        if st and st.get("status") == "running" and st.get("phase") == "round":
            seen.append((st["round"], st["rounds_done"], st["max_rounds"]))
        return not th.is_alive()

    wait_until(watch, "the CLI run to end", progress=status_progress(out / "server"))
    th.join()
    r = result["r"]
    assert r.exit_code == 0, r.output
    assert seen and {s[2] for s in seen} == {3}
    assert all(done == k - 1 or done == k for k, done, _ in seen)  # round k runs with k-1 done (k once it ends)
    assert {k for k, _, _ in seen} >= {2}  # seen mid-run, not only at the end
    assert "launch to round 1" in r.output and "ACC" in r.output
    ref = reference(views, rounds=3)
    res = json.loads((out / "server" / "result.json").read_text())
    assert res["scores"] == clustering_scores(y, ref.labels_, ari=True)
    assert np.array_equal(read_labels_csv(out / "server" / "labels.csv"), ref.labels_)
    rows = (tmp_path / "clusters.csv").read_text().splitlines()  # --labels-out: the files' own ids
    assert rows == ["sample_id,cluster", *(f"{i},{k}" for i, k in zip(ids, ref.labels_))]
    wire = [json.loads(line) for line in open(out / "server" / "wire.jsonl")]
    audit_wire(wire, "fedsonmf", FedConfig(n_components=2 * C, secure_aggregation=True), y.size)
    text = (out / "server" / "wire.jsonl").read_text()
    assert not any(k in text for k in ("mean_share", "inv_scale", '"center"'))
    assert text.count(codec.IDS_DIGEST) >= len(views) and not any(i in text for i in ids)


@pytest.mark.slow
@pytest.mark.deploy
def test_cli_cluster_aligns_files_of_different_samples_over_their_ids(tmp_path):
    """``flower cluster --missing mask``: organisations' files that hold different samples, each
    with its own ids and row order (a CSV with an id column, an .npy with an ids sidecar), are
    aligned over the union of their ids as ``fedsonmf cluster --missing mask`` aligns them; each node
    reads only its own aligned copy and mask (0600, in OUT/aligned), and the labels, by id, are the
    in-process estimator's on the same aligned views and masks."""
    from fedsonmf.datasets import load_views

    views, y = blobs()
    views = [X.toarray() if sp.issparse(X) else X for X in views]
    n = y.size
    ids = np.array([f"s{k:03d}" for k in range(n)])
    rng = np.random.default_rng(5)
    # organisation 0 lacks samples 0-11, organisation 1 lacks 12-17, organisation 2 has all; any row order
    held = [rng.permutation(np.arange(12, n)), rng.permutation(np.r_[0:12, 18:n]), rng.permutation(n)]
    paths = []
    for p, (X, rows) in enumerate(zip(views, held)):
        if p == 1:
            path = write_views([X[rows]], tmp_path / "org1")[0]
            path.with_name(path.stem + ".ids.txt").write_text("\n".join(ids[rows]) + "\n")
        else:
            path = tmp_path / f"org{p}" / "view.csv"
            path.parent.mkdir()
            path.write_text("id," + ",".join(f"f{j}" for j in range(X.shape[1])) + "\n" + "".join(
                f"{ids[i]}," + ",".join(repr(float(v)) for v in X[i]) + "\n" for i in rows))
        paths.append(path)
    (tmp_path / "y.csv").write_text("sample_id,label\n" + "".join(f"{ids[i]},{y[i]}\n" for i in range(n)))
    ds = load_views(paths, missing="mask", labels=tmp_path / "y.csv")
    assert ds.masks is not None and not all(np.all(mk) for mk in ds.masks)
    ref = reference(ds.views, rounds=3, masks=ds.masks)
    out = tmp_path / "run"
    r = _cli("flower", "cluster", *paths, "-k", C, "--rounds", 3, "--tol", 0, "--seed", SEED, "--missing", "mask",
             "--n-init", 1, "--labels", tmp_path / "y.csv", "--labels-out", tmp_path / "clusters.csv", "--out", out,
             "-q", "--keep-views")
    assert r.exit_code == 0, r.output
    rows = (tmp_path / "clusters.csv").read_text().splitlines()
    assert rows == ["sample_id,cluster", *(f"{i},{k}" for i, k in zip(ds.ids, ref.labels_))]
    res = json.loads((out / "server" / "result.json").read_text())
    assert res["scores"] == clustering_scores(ds.labels, ref.labels_, ari=True)
    assert any((out / "aligned").rglob("*.npy"))  # --keep-views: the aligned copies stay
    for f in (out / "aligned").rglob("*"):
        assert stat.S_IMODE(f.stat().st_mode) == (0o700 if f.is_dir() else 0o600), f


DATA = Path(os.environ.get("FEDSONMF_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
BBCSPORT = DATA / "BBCSport" / "zskong" / "BBCSport.mat"


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.realdata
@pytest.mark.skipif(not BBCSPORT.is_file(), reason="shared data folder absent")
def test_bbcsport_over_flower_gives_the_inprocess_labels(tmp_path):
    """BBCSport's two (sparse, text) views, each written to its own client folder, clustered on a
    loopback deployment: the labels (and V) of the in-process estimator, the same scores."""
    from fedsonmf.datasets import load_mat

    ds = load_mat(BBCSPORT)
    c = int(np.unique(ds.labels).size)
    paths = [write_views([X], tmp_path / f"client{p}")[0] for p, X in enumerate(ds.views)]
    with threadpool_limits(1):
        ref = FedMultiViewClustering(c, max_rounds=5, tol=0.0, random_state=0, n_init=1,
                                     privacy=PrivacyOptions(secure_aggregation=True)).fit(ds.views)
    res = run_flower(paths, FedConfig(), run_dir=tmp_path / "run", max_rounds=5, seed=0, n_clusters=c,
                     clustering={"n_init": 1}, labels=ds.labels)
    assert np.array_equal(res.extra["labels"], ref.labels_)
    assert np.array_equal(res.V, ref.result_.V)
    assert res.extra["scores"] == clustering_scores(ds.labels, ref.labels_, ari=True)
    assert res.extra["clustering"]["n_components"] == 2 * c


def test_a_node_refusing_small_clusters_gets_no_seeding_labels_and_the_run_completes(tmp_path):
    """A node's ``refine-min-cluster-size`` (here 2) refuses the seeded starts' labels, which put
    drawn samples alone in a cluster: the server drops those starts and goes on, and the result
    is the estimator's without seeded starts, bit for bit; no node answered a partition with a
    cluster of one sample."""
    views, _ = blobs()
    ref = reference(views, refine_seeded_starts=0)
    assert reference(views).refine_iter_[0] > ref.refine_iter_[0]  # the default seeds here (dense views)
    grid, rc = _fake_run(tmp_path, views, node_extra={"refine-min-cluster-size": 2})
    out = Path(rc["out-dir"])
    assert np.array_equal(read_labels_csv(out / "labels.csv"), ref.labels_)
    summary = json.loads((out / "result.json").read_text())["clustering"]
    assert "refine_error" not in summary
    assert len(summary["refine_notes"]) == 1 and "seeded starts skipped" in summary["refine_notes"][0]
    assert "refine-min-cluster-size = 2" in summary["refine_notes"][0]
    assert summary["refine_start"] == ref.refine_start_[0] and summary["graph_iterations"] == ref.graph_iter_[0]
    hellos = [r.content[codec.META] for r in grid.log
              if not r.has_error() and str(r.content[codec.META]["kind"]).startswith("hello")]
    assert len(hellos) == len(views) and all(h["refine-min-cluster-size"] == 2 for h in hellos)
    assert not [r for r in grid.log if r.has_error()]  # announced at the hellos: nothing sent to be refused
    wire = [json.loads(line) for line in open(out / "wire.jsonl")]  # the announcement is declared wire payload
    audit_wire(wire, "fedsonmf", FedConfig(n_components=2 * C, secure_aggregation=True), views[0].shape[0])


def _policy_nodes(send, n_clusters, min_size):
    """``send`` behind nodes that refuse, as ``_request_labels`` does, any request holding a partition
    with a nonempty cluster below ``min_size``; ``asked`` records every partition sent."""
    from fedsonmf.exceptions import FederationError
    from fedsonmf.federation.flower.clustering import SMALL_CLUSTER_REFUSAL

    asked = []

    def ask(labels):
        labels = np.asarray(labels)
        for row in labels.reshape(-1, labels.shape[-1]):
            asked.append(row.copy())
            sizes = np.bincount(row, minlength=n_clusters)
            if sizes[sizes > 0].min() < min_size:
                raise FederationError(f"client 0 failed in refine: a cluster of {sizes[sizes > 0].min()} "
                                      f"{SMALL_CLUSTER_REFUSAL} = {min_size} (and clients [1, 2])")
        return send(labels)

    return ask, asked


def test_the_refine_exchange_learns_a_nodes_minimum_and_sends_only_what_meets_it():
    """A node's refusal names its minimum: the server's exchange learns it, sends the request again
    without the partitions below it (answered NaN, the refinement's mark of a refused partition), and
    never sends such a partition again; a lost node, or a refusal that shows no higher minimum, raises."""
    from fedsonmf.exceptions import FederationError
    from fedsonmf.federation.flower.clustering import SMALL_CLUSTER_REFUSAL, NodePolicy, RefineExchange

    n, c = 12, 3

    def send(labels):  # the summed replies of the nodes: here recognisable numbers
        rows = np.asarray(labels).reshape(-1, n)
        D = np.stack([np.tile(row[:, None], (1, c)).astype(float) for row in rows])
        return (D[0], np.ones(1)) if np.ndim(labels) == 1 else (D, np.arange(rows.shape[0], dtype=float))

    assert NodePolicy(c).floor == 1 and NodePolicy(c, [1, 4, 2]).floor == 4  # the largest minimum announced
    ask, asked = _policy_nodes(send, c, 4)
    ex = RefineExchange(ask, c)
    big = np.repeat(np.arange(c), n // c)  # clusters of 4
    small = big.copy()
    small[:3] = 1  # a cluster of 1
    D, score = ex(np.stack([small, big, small]))
    assert ex.policy.floor == 4 and ex.policy.refused == 2
    assert np.isnan(score[[0, 2]]).all() and np.isnan(D[[0, 2]]).all() and np.array_equal(D[1][:, 0], big)
    asked.clear()
    D, score = ex(small)  # known now: not sent at all
    assert not asked and D.shape == (n, c) and np.isnan(D).all() and np.isnan(score).all() and ex.policy.refused == 3
    D, score = ex(big)
    assert len(asked) == 1 and np.array_equal(asked[0], big) and np.array_equal(D[:, 0], big)
    assert score.tolist() == [1.0]

    def lost(labels):
        raise FederationError("client 1 (node 22) did not reply within 30 s")

    with pytest.raises(FederationError, match="did not reply"):
        RefineExchange(lost, c)(big)
    def stubborn(labels):  # refuses even what meets the minimum it shows: raised, not retried for ever
        raise FederationError(f"client 0 failed in refine: {SMALL_CLUSTER_REFUSAL} = 4")

    with pytest.raises(FederationError, match="= 4"):
        RefineExchange(stubborn, c)(big)
    # a refusal that names its node teaches that node's minimum, even below another node's
    policy = NodePolicy(c, [10, 1])
    policy.learn(FederationError(f"client 1 failed in refine: {SMALL_CLUSTER_REFUSAL} = 5", client=1))
    assert policy.mins == [10, 5] and policy.floor == 10
    with pytest.raises(FederationError):  # the same again: nothing new, raised
        policy.learn(FederationError(f"client 1 failed in refine: {SMALL_CLUSTER_REFUSAL} = 5", client=1))


def _without_announcement(reply):
    """What a node of a release that does not announce its minimum at the hello sends."""
    meta = reply.content[codec.META] if not reply.has_error() and codec.META in reply.content else {}
    if "refine-min-cluster-size" in meta:
        del meta["refine-min-cluster-size"]


@pytest.mark.parametrize("announced", [True, False], ids=["announced", "learnt-from-refusal"])
def test_partitions_below_a_nodes_minimum_stop_their_search_and_the_run_keeps_the_rest(tmp_path, monkeypatch,
                                                                                       announced):
    """Noisy blobs and a node minimum of 18 samples per cluster (the clusters hold 20): the seeding is
    refused, and so are partitions the starts and the graph refinement move to; the server knows the
    minimum from the nodes' hellos (or, from nodes that do not announce it, learns it from the first
    refusal), those searches stop at the last partition answered (the graph refinement at its lowest
    cut met), the others go on, and the run ends with the partition, start and graph stage of the
    estimator under the same policy (no seeding), with no refine_error; announced, no request is
    refused at all; learnt, only the first."""
    from fedsonmf.federation.flower.clustering import NodePolicy, RefineExchange

    m = 18
    views, _ = blobs(noise=2.5)
    refine0, graph0 = FedMultiViewClustering._refine_exchange, FedMultiViewClustering._graph_exchanges

    def policed_refine(self, views_, masks, secure):
        return RefineExchange(_policy_nodes(refine0(self, views_, masks, secure), C, m)[0], C)

    def policed_graph(self, views_, masks, secure):  # what the server's graph exchanges do once they know m
        exchange, products, both = graph0(self, views_, masks, secure)
        policy = NodePolicy(C, [m])
        small = lambda labels: not policy.meets(np.asarray(labels)[None])[0]  # noqa: E731
        nan = lambda labels: np.full((np.size(labels), C), np.nan)  # noqa: E731
        return ((lambda labels: nan(labels) if small(labels) else exchange(labels)), products,
                (lambda labels, M: (nan(labels), products(M)) if small(labels) else both(labels, M)))

    monkeypatch.setattr(FedMultiViewClustering, "_refine_exchange", policed_refine)
    monkeypatch.setattr(FedMultiViewClustering, "_graph_exchanges", policed_graph)
    ref = reference(views, refine_seeded_starts=0)
    grid, rc = _fake_run(tmp_path, views, node_extra={"refine-min-cluster-size": m},
                         reply_hook=None if announced else _without_announcement)
    out = Path(rc["out-dir"])
    assert np.array_equal(read_labels_csv(out / "labels.csv"), ref.labels_)
    summary = json.loads((out / "result.json").read_text())["clustering"]
    assert "refine_error" not in summary
    assert summary["refine_start"] == ref.refine_start_[0] and summary["graph_iterations"] == ref.graph_iter_[0]
    notes = summary["refine_notes"]
    assert "seeded starts skipped" in notes[0] and f"refine-min-cluster-size = {m}" in notes[0]
    assert "of the starts not sent" in notes[1] and "of the graph stage not sent" in notes[2]
    refused = [r for r in grid.log if r.has_error()]
    assert all(f"refine-min-cluster-size = {m}" in r.error.reason for r in refused)
    assert len(refused) == (0 if announced else 3)  # learnt: the first request, refused by each node


def test_the_min_cluster_size_policy_of_a_node():
    from types import SimpleNamespace

    from fedsonmf.exceptions import ProtocolError
    from fedsonmf.federation.flower.clustering import _request_labels
    from fedsonmf.federation.flower.nodeconfig import min_cluster_size
    from fedsonmf.protocol.messages import Message

    assert min_cluster_size(SimpleNamespace(node_config={})) == 1
    assert min_cluster_size(SimpleNamespace(node_config={"refine-min-cluster-size": "3"})) == 3
    for bad in (0, -1, True, 1.5, "x"):
        with pytest.raises(ValueError, match="integer >= 1"):
            min_cluster_size(SimpleNamespace(node_config={"refine-min-cluster-size": bad}))
    msg = Message("refine", 0, {"labels": np.array([0, 0, 1, 1, 1, 2])}, {"n_clusters": 3})
    assert _request_labels(msg, 6, 0, "refine", 1)[1] == 3
    with pytest.raises(ProtocolError, match="a cluster of 1 sample"):
        _request_labels(msg, 6, 0, "refine", 2)
    empty = Message("refine", 0, {"labels": np.array([0, 0, 1, 1])}, {"n_clusters": 3})
    assert _request_labels(empty, 4, 0, "refine", 2)[1] == 3  # an empty cluster singles no one out


def test_a_node_answers_a_block_of_partitions_within_its_limits():
    """The k-means refinement's starts travel side by side: a node answers an (S, n) block of labels with
    its distances side by side (n, S c) and S scores -- each the reply to that partition alone --, checks
    every row (range, its min-cluster-size policy) and refuses more rows than refine_batch_rows allows;
    the graph exchange takes one partition only."""
    from fedsonmf.exceptions import ProtocolError
    from fedsonmf.federation.flower.clustering import _request_labels, node_refine
    from fedsonmf.pipeline.refine import batch_rows
    from fedsonmf.protocol.messages import Message

    rng = np.random.default_rng(0)
    X = rng.random((12, 5)) + 0.5  # dense: the node scores
    rows = rng.integers(0, 3, size=(4, 12))
    rows[:, :3] = [0, 1, 2]  # no empty cluster, nor a singleton below
    rows[:, 3:6] = [0, 1, 2]
    block = node_refine(Message("refine", 1, {"labels": rows}, {"n_clusters": 3}), X, None, 0, secure=False)
    assert block.arrays["D"].shape == (12, 4 * 3) and block.arrays["score"].shape == (4,)
    for k in range(4):
        one = node_refine(Message("refine", 1, {"labels": rows[k]}, {"n_clusters": 3}), X, None, 0, secure=False)
        assert np.array_equal(block.arrays["D"][:, 3 * k:3 * k + 3], one.arrays["D"])
        assert block.arrays["score"][k] == one.arrays["score"][0] > 0
    msg = Message("refine", 1, {"labels": rows}, {"n_clusters": 3})
    with pytest.raises(ProtocolError, match="labels of shape"):  # not a graph request
        _request_labels(msg, 12, 0, "graph", 1)
    with pytest.raises(ProtocolError, match="more than the 2 one exchange"):
        _request_labels(msg, 12, 0, "refine", 1, block=lambda n, c: 2)
    single = rows.copy()
    single[2, :] = 0
    single[2, 0] = 1  # one row of the block with a cluster of one sample
    with pytest.raises(ProtocolError, match="a cluster of 1 sample"):
        _request_labels(Message("refine", 1, {"labels": single}, {"n_clusters": 3}), 12, 0, "refine", 2,
                        block=batch_rows)
    bad = rows.copy()
    bad[1, 0] = 3
    with pytest.raises(ProtocolError, match="outside 0..2"):
        _request_labels(Message("refine", 1, {"labels": bad}, {"n_clusters": 3}), 12, 0, "refine", 1,
                        block=batch_rows)
    with pytest.raises(ProtocolError, match="labels of shape"):  # a block for another n
        _request_labels(msg, 13, 0, "refine", 1, block=batch_rows)
    for c in (0, 13, 10**9):  # a reply of n x c numbers: no more clusters than samples (the node's memory)
        with pytest.raises(ProtocolError, match=f"request for {c} clusters of a view of 12 samples"):
            _request_labels(Message("graph", 1, {"labels": rows[0]}, {"n_clusters": c}), 12, 0, "graph", 1)


def test_a_node_without_the_scale_extra_says_so_at_set_up_not_after_the_fits(tmp_path, monkeypatch):
    """Above EXACT_GRAPH_MAX held samples a node's graph needs the approximate search: a node without
    its extra refuses the set-up with the install hint, before any round runs."""
    import sys

    import fedsonmf.pipeline.graph as graph

    monkeypatch.setattr(graph, "EXACT_GRAPH_MAX", 10)
    monkeypatch.setitem(sys.modules, "usearch", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "usearch.index", None)
    views, _ = blobs()
    kinds = []
    with pytest.raises(FederationError, match=r"fedsonmf\[scale\]"):
        _fake_run(tmp_path, views, nodes_see_run_config=True,
                  before_handle=lambda fed_msg, context, job_id: kinds.append(fed_msg.kind))
    assert "round" not in kinds
