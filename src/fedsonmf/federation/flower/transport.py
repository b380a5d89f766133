"""The Flower transport of :func:`fedsonmf.federation.run_federation`.

:func:`handshake` waits until one node per view is online and learns which
node holds which view (``partition-id`` in the node config);
:class:`FlowerTransport` then carries one round's messages to the nodes in
view order and returns the replies in that order.  It uses its own short
push/pull loop (``Grid.send_and_receive`` sleeps 3 s between pulls), enforces
a per-round timeout, and maps every error back to the client (view) and round
that caused it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from flwr.app import ConfigRecord, Error, MessageType, RecordDict
from flwr.app import Message as FlwrMessage

from fedsonmf._io import open_private, private_dir, save_npy_atomic
from fedsonmf.exceptions import FederationError
from fedsonmf.federation.flower import codec
from fedsonmf.federation.flower.nodeconfig import MIN_CLUSTER_SIZE
from fedsonmf.federation.flower.security import Pin, check_pin, read_pins, read_retired
from fedsonmf.federation.flower.waits import ArrivalEstimate, reply_wait
from fedsonmf.protocol.messages import Message

_log = logging.getLogger(__name__)

__all__ = ["FederationError", "FlowerTransport", "handshake", "check_views_at_handshake", "check_same_ids",
           "WireRecorder", "BatchingGrid", "FIT_KINDS", "exchange_counts"]


class WireRecorder:
    """Append one JSON line per message that crosses the wire (both directions).

    Every array is described by shape, dtype, bytes and the SHA-256 of its serialised
    bytes (:func:`codec.describe`).  ``arrays_dir``: also save every array the server
    *received* (direction "up") there as ``.npy``, named in the row (``"saved"``), so an
    audit can test the contents (e.g. that no masked upload correlates with a plain one).
    """

    def __init__(self, path, arrays_dir=None):
        self.path = Path(path)
        private_dir(self.path.parent)
        self.arrays_dir = None if arrays_dir is None else Path(arrays_dir)
        if self.arrays_dir is not None:
            private_dir(self.arrays_dir)
        self._count = 0
        self._lock = threading.Lock()  # the fits of a clustering run may exchange at once (threads)

    def record(self, direction: str, client: int | None, node_id: int, flwr_msg: FlwrMessage) -> None:
        """Append one message (direction, client, kind, round, every array's shape and SHA-256) to the log."""
        row: dict[str, object] = {"direction": direction, "client": client, "node_id": int(node_id),
               "message_type": flwr_msg.metadata.message_type, "group_id": flwr_msg.metadata.group_id}
        with self._lock:
            if flwr_msg.has_error():
                row["error"] = {"code": flwr_msg.error.code, "reason": flwr_msg.error.reason}
            else:
                row["records"] = codec.describe(flwr_msg.content)
                if self.arrays_dir is not None and direction == "up":
                    row["saved"] = self._save_arrays(client, flwr_msg.content)
            self._count += 1
            with open_private(self.path, "ab") as fh:  # an append-only log, 0600
                fh.write((json.dumps(row) + "\n").encode())

    def _save_arrays(self, client, content) -> dict:
        saved = {}
        for name, arrays in codec.arrays_of(content).items():
            for key, a in arrays.items():
                fname = f"{self._count:06d}-c{client}-{name}-{key}.npy"
                save_npy_atomic(self.arrays_dir / fname, a)
                saved[f"{name}/{key}"] = fname
        return saved


class _SubReply:
    """A node's reply to one message of a batch, as :func:`_push_pull` and the wire recorder read a
    Flower reply: ``metadata`` (``reply_to_message_id``, ``message_type``, ``group_id``),
    ``content``, ``has_error()`` and ``error`` (``code``, ``reason``)."""

    def __init__(self, sub_id: str, sent: FlwrMessage, content: RecordDict | None, error=None):
        self.metadata = SimpleNamespace(reply_to_message_id=sub_id, message_type=sent.metadata.message_type,
                                        group_id=sent.metadata.group_id)
        self.content, self.error = content, error

    def has_error(self) -> bool:
        return self.error is not None


class BatchingGrid:
    """A Flower ``Grid`` shared by the fits of a clustering run that exchange at once, each in its
    own thread (:func:`.server_app.server_main`).

    A push waits until every fit still running has pushed (or ``linger`` seconds have passed); the
    train messages then queued for one node travel as one Flower message (``train.batch``,
    :func:`.codec.pack`), which the node answers message by message, each exactly as if it had come
    alone, in one reply (the ClientApp's ``batch`` handler). A node thus pays Flower's fixed cost
    per message (its pull, the task, the reply's push: about a second on loopback, docs/flower.md)
    once per round instead of once per fit. Each fit sees its own messages and replies only: a
    message of a batch has the id ``<batch id>:<j>`` and its reply comes back under that id (a
    failed one with its own error, the others' unaffected); a message alone in its node's queue,
    or not a train message, is pushed as it is. The Grid's calls run one at a time (its client is
    not assumed to be thread-safe).

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    senders : int
        The fits that will push; each calls :meth:`leave` when it ends (finished or failed).
    linger : float, default=1.0
        The longest a push waits for the other fits' pushes, seconds. The fits keep step (their
        replies come back in the same batches), so the wait is normally the time between their
        polls; a fit busy longer (its server step) only delays the batch by this much.
    """

    def __init__(self, grid, senders: int, linger: float = 1.0):
        self._grid = grid
        self._senders = int(senders)
        self.linger = float(linger)
        self._cond = threading.Condition()
        self._queue: list[tuple[int, FlwrMessage]] = []  # (push call, message) waiting for the batch
        self._calls = 0  # push calls seen (a call's messages leave together)
        self._waiting: set[int] = set()  # push calls whose messages are queued
        self._ids: dict[int, list[str]] = {}  # push call -> the ids of its messages, once pushed
        self._batches: dict[str, list[tuple[str, FlwrMessage]]] = {}  # batch id -> (sub id, message)
        self._subs: dict[str, str] = {}  # sub id -> its batch id
        self._replies: dict[str, object] = {}  # sub id -> reply, not yet pulled by its fit
        self.batches_sent = 0  # Flower messages that carried more than one fit's message

    def push_messages(self, messages):
        messages = list(messages)
        with self._cond:
            call = self._calls
            self._calls += 1
            self._queue.extend((call, m) for m in messages)
            self._waiting.add(call)
            deadline = time.monotonic() + self.linger
            while call not in self._ids:
                if len(self._waiting) >= self._senders or time.monotonic() >= deadline:
                    self._flush()
                    break
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            return self._ids.pop(call)

    def leave(self) -> None:
        """One fit has ended: the others no longer wait for its pushes."""
        with self._cond:
            self._senders -= 1
            if self._waiting and len(self._waiting) >= self._senders:
                self._flush()

    def _flush(self) -> None:
        """Push the queue: per node, its train messages in one batch (a lone one as it is)."""
        queue, self._queue = self._queue, []
        train = [str(m.metadata.message_type) == MessageType.TRAIN for _, m in queue]
        by_node: dict[int, list[int]] = {}  # node -> the queue positions of its train messages
        for k, (_, m) in enumerate(queue):
            if train[k]:
                by_node.setdefault(int(m.metadata.dst_node_id), []).append(k)
        out: list[FlwrMessage] = []
        parts: list[list[int]] = []  # per Flower message pushed, the queue positions it carries
        for k, (_, m) in enumerate(queue):
            group = by_node[int(m.metadata.dst_node_id)] if train[k] else None
            if group is None or len(group) == 1:
                out.append(m)
                parts.append([k])
            elif group[0] == k:  # the node's first train message: the batch goes out in its place
                subs = [queue[i][1] for i in group]
                out.append(FlwrMessage(codec.pack([s.content for s in subs]), dst_node_id=m.metadata.dst_node_id,
                                       message_type=f"{MessageType.TRAIN}.{codec.BATCH_ACTION}", group_id="batch",
                                       ttl=max(float(s.metadata.ttl) for s in subs)))
                parts.append(group)
        ids: list[str | None] = [None] * len(queue)
        for mid, carried in zip(self._grid.push_messages(out), parts):
            if len(carried) == 1:
                ids[carried[0]] = mid
                continue
            self._batches[mid] = []
            for j, k in enumerate(carried):
                ids[k] = sub = f"{mid}:{j}"
                self._subs[sub] = mid
                self._batches[mid].append((sub, queue[k][1]))
            self.batches_sent += 1
        for (call, _), mid in zip(queue, ids):
            self._ids.setdefault(call, []).append(str(mid))
        self._waiting.clear()
        self._cond.notify_all()

    def pull_messages(self, message_ids):
        message_ids = list(message_ids)
        with self._cond:
            real = [mid for mid in message_ids if mid not in self._subs]
            batches = {self._subs[mid] for mid in message_ids if mid in self._subs and mid not in self._replies}
            out = []
            for rep in self._grid.pull_messages(real + sorted(batches)) if real or batches else []:
                rid = rep.metadata.reply_to_message_id
                if rid in self._batches:
                    self._split(rep, self._batches.pop(rid))
                else:
                    out.append(rep)
            for mid in message_ids:
                if mid in self._replies:
                    self._subs.pop(mid, None)
                    out.append(self._replies.pop(mid))
            return out

    def _split(self, envelope: FlwrMessage, subs: list[tuple[str, FlwrMessage]]) -> None:
        """A batch reply into its messages' replies (a failed batch: its error for each)."""
        if envelope.has_error():
            for sub, sent in subs:
                self._replies[sub] = _SubReply(sub, sent, None, envelope.error)
            return
        contents = codec.unpack(envelope.content)
        if len(contents) != len(subs):
            raise FederationError(f"node {envelope.metadata.src_node_id} answered a batch of {len(subs)} "
                                  f"messages with {len(contents)} replies")
        for (sub, sent), content in zip(subs, contents):
            if codec.ERROR in content:
                err = dict(cast(ConfigRecord, content[codec.ERROR]))
                self._replies[sub] = _SubReply(sub, sent, None,
                                               Error(code=int(cast(int, err["code"])), reason=str(err["reason"])))
            else:
                self._replies[sub] = _SubReply(sub, sent, content)

    def get_node_ids(self):
        with self._cond:
            return list(self._grid.get_node_ids())

    def __getattr__(self, name):
        return getattr(self._grid, name)


#: the exchange kinds of a fit (the others, ``refine``, ``graph``, ``spectral``, ``embed-sum``, ..., follow the fits)
FIT_KINDS = ("setup", "init", "round", "unmask")


def exchange_counts(fit_rows: Sequence[Sequence[dict]], stage_rows: Sequence[dict] = (), *, at_once: bool = False,
                    hellos: int = 1) -> dict:
    """The exchanges of a run per stage (each an exchange between the ServerApp and every node
    asked: one push of messages, their replies pulled).

    Parameters
    ----------
    fit_rows : sequence of sequences of dict
        Per fit, its transport's ``wire_bytes`` rows (kind per exchange; a setup row marked
        ``at_handshake`` travelled with the hellos and is not an exchange of its own; rows of
        other kinds than :data:`FIT_KINDS` are left out).
    stage_rows : sequence of dict
        The rows of the exchanges after the fits (the clustering stages; kinds not in :data:`FIT_KINDS`).
    at_once : bool, default=False
        The fits ran at once over one :class:`BatchingGrid`: their messages of a step travelled
        together, so the fits' exchanges are those of the longest fit (per kind: the most any fit
        made), not their sum.
    hellos : int, default=1
        The handshake's exchange, plus one per node asked later (a restarted node adopted).

    Returns
    -------
    dict
        ``hello``, ``setup_at_hello`` (bool), every kind of :data:`FIT_KINDS`, ``fits`` (their
        exchanges in all), every stage kind that occurred, ``stages`` (their sum) and ``total``.
    """
    per = []
    for rows in fit_rows:
        kinds: dict[str, int] = {}
        for w in rows:  # a stage's rows among them are counted apart (``stage_rows``)
            if w["kind"] in FIT_KINDS and not w.get("at_handshake"):
                kinds[w["kind"]] = kinds.get(w["kind"], 0) + 1
        per.append(kinds)
    def combine(values) -> int:
        values = list(values)
        return int(max(values, default=0) if at_once else sum(values))

    out: dict = {"hello": int(hellos),
                 "setup_at_hello": any(w.get("at_handshake") for rows in fit_rows for w in rows)}
    for kind in FIT_KINDS:
        out[kind] = combine(c.get(kind, 0) for c in per)
    out["fits"] = combine(sum(c.values()) for c in per)
    stages: dict[str, int] = {}
    for w in stage_rows:
        stages[w["kind"]] = stages.get(w["kind"], 0) + 1
    out.update(stages)
    out["stages"] = int(sum(stages.values()))
    out["total"] = out["hello"] + out["fits"] + out["stages"]
    return out


def _get(record, key):
    try:
        return record[key]
    except KeyError:
        return None


def check_views_at_handshake(info: dict, node_ids: Sequence[int], n_components: int) -> None:
    """Refuse, before round 1, views that cannot take part.

    Parameters
    ----------
    info : dict
        The handshake's ``{view: {"d": d_p, "n": n}}`` or ``{"error": ...}``.
    node_ids : sequence of int
        The node of every view, in view order.
    n_components : int
        The rank r (a nonnegative orthonormal U_p needs d_p >= r).

    Raises
    ------
    FederationError
        Naming the view (client) and its node: a view its node could not load, views with
        different numbers of samples, or a view with fewer features than r.
    """
    for p, nid in enumerate(node_ids):
        v = info.get(p, {})
        if "error" in v:
            raise FederationError(f"view {p} (node {nid}) cannot be used: {v['error']}", client=p, round=0,
                                  node_id=nid)
    ns = {p: int(v["n"]) for p, v in info.items() if "n" in v}
    if len(set(ns.values())) > 1:
        raise FederationError(f"the views hold different numbers of samples: {dict(sorted(ns.items()))}", round=0)
    check_same_ids(info, node_ids)
    for p, nid in enumerate(node_ids):
        d = info.get(p, {}).get("d")
        if d is not None and int(d) < n_components:
            raise FederationError(
                f"view {p} (node {nid}) has {int(d)} features, fewer than the rank r = {n_components}: a nonnegative "
                f"orthonormal basis U_p needs n_features >= r; lower the rank to at most "
                f"{min(int(v['d']) for v in info.values() if 'd' in v)}",
                client=p, round=0, node_id=nid)


def check_same_ids(info: dict, node_ids: Sequence[int], file: str = "view file") -> None:
    """Refuse views whose nodes ordered different samples into the same positions.

    ``info``: {view: {..., :data:`codec.IDS_DIGEST`: digest}} (the handshake's, or the digests of the
    new-sample files of a predict run, ``file="new-sample file"``).

    A node whose view file carries sample ids sorts its rows by them and reports a salted digest of
    the id set (:data:`codec.IDS_DIGEST`); row i is then "the i-th smallest id" on every such node,
    which is the same sample only when every node holds the same ids -- and a node without ids keeps
    its file's order, which no id can be matched with.  Either mismatch would pair the rows of
    different samples silently, so the run stops before round 1.
    """
    digests = {p: info.get(p, {}).get(codec.IDS_DIGEST) for p in range(len(node_ids))}
    with_ids = [p for p, dg in digests.items() if dg is not None]
    if not with_ids:
        return
    without = [p for p, dg in digests.items() if dg is None]
    if without:
        raise FederationError(
            f"the {file}s of views {with_ids} are ordered by their sample ids and those of views {without} carry "
            f"no ids, so their rows cannot be matched: give every file its ids (an id column or <stem>.ids.txt), "
            f"or none (then row i of every file is sample i)", client=without[0], round=0,
            node_id=node_ids[without[0]])
    first = with_ids[0]
    for p in with_ids[1:]:
        if digests[p] != digests[first]:
            raise FederationError(
                f"view {p} (node {node_ids[p]}) holds other sample ids than view {first} in its {file}: every "
                f"file must hold the same sample ids, in any row order (each node sorts its rows by id); for views "
                f"that hold different samples, align the files first with `fedsonmf flower align` (keyed tags of the "
                f"ids; docs/flower.md, \"Files of different samples between separate machines\")",
                client=p, round=0, node_id=node_ids[p])


def _error_text(rep: FlwrMessage) -> str:
    err = rep.error
    return f"error code {err.code}: {err.reason}"


#: seconds the other clients' replies are still awaited after an error reply, before the run fails
DRAIN_SECONDS = 30.0
def _push_pull(grid, msgs: list[FlwrMessage], timeout: float, poll: float, stop_on_error: bool = True,
               expect: tuple[ArrivalEstimate, str] | None = None):
    """Push ``msgs``; return ``(msgs_by_id, replies_by_id, missing_ids)``; stops at
    the first error reply (returned among the replies; unless ``stop_on_error``
    is False) or at the timeout.

    After an error reply the other replies are still awaited for up to :data:`DRAIN_SECONDS`
    (the error is reported all the same). A Flower 1.42 SuperNode that has pulled its message
    waits for that message's reply before it pulls anything else; if the run fails before the
    node's ClientApp task starts, no reply ever comes and the node never serves another run
    (measured: the deployment test after a raising client, "views [0] did not answer" in the next
    run's handshake). Waiting lets every node finish its task while the run is still running.

    The pulls wait :func:`reply_wait` apart (every pull is a request to the SuperLink); with
    ``expect = (estimate, kind)`` the first pull waits ``estimate.first_wait(kind)``, and the time
    to the first reply is recorded in it (:class:`.waits.ArrivalEstimate`).
    """
    ids = list(grid.push_messages(msgs))
    by_id = dict(zip(ids, msgs))
    pending = set(ids)
    got: dict[str, FlwrMessage] = {}
    start = time.monotonic()
    deadline = start + timeout
    if expect is not None:
        time.sleep(min(expect[0].first_wait(expect[1]), timeout))
    pulls = 0
    while pending:
        replies = grid.pull_messages(list(pending))
        pulls += 1
        if replies and expect is not None and not got:
            expect[0].observe(time.monotonic() - start, expect[1], first_pull=pulls == 1)
        for rep in replies:
            rid = rep.metadata.reply_to_message_id
            if rid in pending:
                pending.discard(rid)
                got[rid] = rep
        if stop_on_error and any(rep.has_error() for rep in got.values()):
            deadline = min(deadline, time.monotonic() + DRAIN_SECONDS)  # drain, then the caller reports
            stop_on_error = False
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(reply_wait(time.monotonic() - start, poll))
    return by_id, got, pending


def leave_out_unpinned(online: set[int], pinned: set[int], noted: set[int]) -> set[int]:
    """The nodes of ``online`` that hold a pinned key (``pinned``: node ids of the pins file).

    Any other node (a key registered with the SuperLink by someone else: Flower OSS's Control
    API has no user authentication) is left out of the run -- never asked, never sent a view's
    messages -- and logged once (``noted`` collects the node ids already logged).
    """
    for nid in sorted(online - pinned - noted):
        _log.warning("node %d is online but holds no pinned key (registered with the SuperLink by someone "
                     "else): left out of the run", nid)
    noted |= online - pinned
    return online & pinned


def check_claim(pins: dict[int, Pin] | None, owner: dict[int, int], node_id: int, partition: int,
                n_clients: int) -> None:
    """Refuse node ``node_id``'s claim on view ``partition``: out of range, pinned to another
    node's key (``pins``; None = no pins, first answer wins), or already taken."""
    if not 0 <= partition < n_clients:
        raise FederationError(
            f"node {node_id} holds view (partition-id) {partition}, but the run has {n_clients} views "
            f"0..{n_clients - 1}", client=partition, round=0, node_id=node_id)
    if pins is not None:
        check_pin(pins, node_id, partition)
    if partition in owner and owner[partition] != node_id:
        raise FederationError(
            f"nodes {owner[partition]} and {node_id} both hold view {partition}: give each SuperNode a distinct "
            "partition-id", client=partition, round=0, node_id=node_id)


def handshake(grid, n_clients: int, *, job_id: str, timeout: float, poll: float = 0.05,
              recorder: WireRecorder | None = None, info: dict | None = None,
              pins: dict[int, Pin] | None = None, retired=frozenset(), setup: dict | None = None) -> list[int]:
    """Wait for the ``n_clients`` views and return their node ids in view order.

    Asks every online node for its ``partition-id`` (a QUERY message); nodes that join later are
    asked when they appear, nodes that do not answer (a dead node the SuperLink still lists) are
    ignored.  A node whose view is narrower than r does not run the setup (the server refuses the
    view).

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The ServerApp's grid.
    n_clients : int
        The number of views.
    job_id : str
        The run's job id (sent with the hello).
    timeout : float
        Seconds until every view must have answered.
    poll : float, default=0.05
        The longest wait between two pulls, with :data:`.waits.MAX_REPLY_POLL` (:func:`reply_wait`: the
        waits start at milliseconds and grow with the time the handshake has taken).
    recorder : WireRecorder or None, default=None
        Logs every message (privacy audit).
    info : dict or None, default=None
        Filled with ``{view: {"d": d_p, "n": n}}`` (or ``{"error": ...}`` for a view its node
        cannot use; ``"refine-min-cluster-size"`` when its node announces one above 1), and
        ``info[view]["setup"]`` (a Message) when the hello carried the setup.
    pins : dict of int to Pin or None, default=None
        ``{view: Pin}`` from the launcher's pins file: a node may hold only the view pinned to
        its node id, and once every view is found no other node may be online (no
        first-answer-wins).
    retired : set of int, default=frozenset()
        This deployment's replaced node ids (the SuperLink may still list them as online):
        neither asked nor counted as unknown.
    setup : dict or None, default=None
        The setup message's scalars but ``client``: the hello carries the setup (kind
        ``hello+setup``), which each node runs as client = its partition-id -- one exchange
        less before round 1 (:meth:`FlowerTransport.exchange` uses the replies).

    Returns
    -------
    list of int
        The node id of every view, in view order.

    Raises
    ------
    FederationError
        Two nodes claim one view, a node claims a view outside 0..n_clients-1, a node holds a
        view not pinned to it, or not every view answered within ``timeout``.  A node whose key
        is pinned to no view is left out (logged), not an error: a rogue with a registered key
        cannot block the run.
    """
    start = time.monotonic()
    deadline = start + timeout
    asked: dict[str, int] = {}  # message id -> node id
    owner: dict[int, int] = {}  # view -> node id
    kind = codec.SETUP_AT_HELLO if setup else "hello"
    content = RecordDict({codec.META: ConfigRecord({"kind": kind, "round": 0, "client": codec.BROADCAST,
                                                    "job-id": job_id})})
    if setup:
        content = codec.encode(Message(kind, 0, {}, dict(setup)), client=codec.BROADCAST, job_id=job_id)
    pinned = {pin.node_id for pin in pins.values()} if pins is not None else None
    left_out: set[int] = set()  # online nodes with no pinned key: never asked
    while True:
        online = set(grid.get_node_ids()) - set(retired)
        if pinned is not None:
            online = leave_out_unpinned(online, pinned, left_out)
        new = sorted(online - set(asked.values()))
        if new:
            msgs = [FlwrMessage(content, dst_node_id=nid, message_type=MessageType.QUERY, group_id="handshake",
                                ttl=max(timeout, 60.0))
                    for nid in new]
            for nid, mid, msg in zip(new, grid.push_messages(msgs), msgs):
                asked[mid] = nid
                if recorder:
                    recorder.record("down", None, nid, msg)
        waiting = [mid for mid, nid in asked.items() if nid not in owner.values()]
        for rep in grid.pull_messages(waiting) if waiting else []:
            nid = asked.get(rep.metadata.reply_to_message_id)
            if nid is None:
                continue
            if recorder:
                recorder.record("up", None, nid, rep)
            if rep.has_error():
                continue  # e.g. a node that went away: another node may hold its view
            meta_rec = rep.content[codec.META]
            pid = int(meta_rec["partition-id"])
            check_claim(pins, owner, nid, pid, n_clients)
            owner[pid] = nid
            if info is not None:
                info[pid] = {k: info_val for k in ("d", "n", "error", MIN_CLUSTER_SIZE, codec.IDS_DIGEST)
                             if (info_val := _get(meta_rec, k)) is not None}
                if str(meta_rec["kind"]) == codec.SETUP_AT_HELLO:
                    rep_msg, _ = codec.decode(rep.content)
                    info[pid]["setup"] = dataclasses.replace(rep_msg, kind="setup")
                    info[pid]["setup_bytes"] = _array_bytes(rep.content)
        if len(owner) == n_clients:
            return [owner[p] for p in range(n_clients)]
        if time.monotonic() >= deadline:
            missing = sorted(set(range(n_clients)) - set(owner))
            silent = len(online) >= n_clients  # online but not answering: wedged, not gone
            raise FederationError(
                f"handshake: views {missing} did not answer within {timeout:g} s "
                f"({len(online)} node(s) online, views found: {sorted(owner)})"
                + ("; a node that is online but silent may still be waiting for the reply to a message of "
                   "an earlier run that was stopped or failed (a Flower 1.42 behaviour, docs/flower.md): "
                   "restart its SuperNode" if silent else "")
                + (f"; left out, holding no pinned key: nodes {sorted(left_out)}" if left_out else ""),
                client=missing[0] if len(missing) == 1 else None, round=0)
        time.sleep(reply_wait(time.monotonic() - start, poll))  # as an exchange's pulls: short at first


class FlowerTransport:
    """Carry messages to the nodes ``node_ids`` (view order) through a Flower ``Grid``.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    node_ids : list of int
        Node of view p at index p (from :func:`handshake`).
    job_id : str
        Names the clients' state files; sent in every message.
    round_timeout : float
        Seconds to wait for all replies of one round.
    startup_timeout : float, optional
        Seconds to wait for all replies of the setup exchange (node start-up:
        process spawn, imports, loading the view, initial bases); at least
        ``round_timeout``; None means ``round_timeout``.
    poll : float
        Seconds between pulls.
    recorder : WireRecorder, optional
        Logs every message sent and received (the privacy audit).
    pins_path : path, optional
        The launcher's pins file: a node adopted after the handshake must hold the
        view pinned to it (the file is re-read: a restarted node has a new key).
    setup_scalars : dict, optional
        Scalars added to every setup message (a clustering run's options, :mod:`.clustering`).
    on_exchange : callable(kind, round), optional
        Called just before the messages of an exchange are pushed (progress: ``status.json``).

    Partial participation (§15.2): :meth:`exchange_some` waits for the asked
    clients until the round timeout (Flower's per-round deadline), returns the
    replies that came, and treats a missing or failed reply as "did not take
    part" (logged in ``dropped``); before each such round it adopts new nodes
    (a restarted SuperNode has a new node id) by asking them their view.
    """

    def __init__(self, grid, node_ids: Sequence[int], *, job_id: str, round_timeout: float, poll: float = 0.02,
                 recorder: WireRecorder | None = None, startup_timeout: float | None = None, pins_path=None,
                 setup_scalars: dict | None = None, on_exchange=None, setup_at_hello: tuple | None = None,
                 ids_digests: dict | None = None):
        self.grid = grid
        #: {view: the handshake's salted digest of its sample ids}: a node adopted later must match it
        self.ids_digests = dict(ids_digests or {})
        self.pins_path = pins_path
        #: (the scalars the hellos carried, {view: setup reply}) of a setup run at the handshake
        self.setup_at_hello = setup_at_hello
        self.setup_scalars = dict(setup_scalars or {})
        self.on_exchange = on_exchange
        self.node_ids = list(node_ids)
        self.n_clients = len(self.node_ids)
        #: the job id of the messages; a run of several fits (restarts) sets each fit's in turn
        self.job_id = job_id
        #: the handshake's job id: the salt of the ids digests, so a node adopted later is asked with it
        self.hello_job_id = job_id
        self.round_timeout = float(round_timeout)
        # the setup exchange includes the nodes' start-up (process spawn, imports, loading the view,
        # the initial bases): it has its own timeout, never shorter than a round's
        self.startup_timeout = max(self.round_timeout, float(startup_timeout if startup_timeout is not None
                                                             else self.round_timeout))
        self.poll = float(poll)
        #: when an exchange's first reply is expected, per kind of exchange (:mod:`.waits`)
        self.expect = ArrivalEstimate()
        self.recorder = recorder
        #: per exchange: {"round", "kind", "down", "up" (serialised array bytes), "seconds" (push to last reply)}
        self.wire_bytes: list[dict] = []
        self.dropped: list[dict] = []  # partial rounds: {"round", "client", "node_id", "reason"}
        self._seen = set(self.node_ids)  # node ids already asked for their view
        self._left_out: set[int] = set()  # online nodes with no pinned key (logged once, never asked)
        self._hello: dict[str, int] = {}  # hello message id -> node id, answer outstanding
        #: {view: refine-min-cluster-size} announced by the nodes adopted after the handshake
        self.min_cluster_sizes: dict[int, int] = {}
        #: the hello exchanges with nodes that came online after the handshake (:meth:`adopt_new_nodes`)
        self.late_hellos = 0

    def for_fit(self, job_id: str, *, grid, share: int, setup_at_hello: tuple | None = None) -> FlowerTransport:
        """A transport for one of ``share`` fits that exchange at once over ``grid`` (a :class:`BatchingGrid`).

        It has this transport's nodes, pins, recorder, setup scalars, hook and hello salt, and its own
        job id, byte counts and drops.  Each thread polls for its own replies, ``share`` times less
        often, so the pulls reach the SuperLink as often as one fit's would.  A node answers the fits'
        messages of a batch one after the other and replies once, so a fit's reply waits for the
        ``share - 1`` others at every node: the round and start-up timeouts are ``share`` times this
        transport's.
        """
        tr = FlowerTransport(grid, self.node_ids, job_id=job_id, round_timeout=share * self.round_timeout,
                             poll=share * self.poll, recorder=self.recorder,
                             startup_timeout=share * self.startup_timeout, pins_path=self.pins_path,
                             setup_scalars=self.setup_scalars, on_exchange=self.on_exchange,
                             setup_at_hello=setup_at_hello, ids_digests=self.ids_digests)
        tr.hello_job_id = self.hello_job_id
        return tr

    def adopt_new_nodes(self, timeout: float = 5.0) -> dict[int, int]:
        """Route a view to a node that came online since the handshake (a SuperNode restarted
        after a failure has a new node id).  Returns {view: node id} adopted now.

        Each new node is asked once (a QUERY "hello"; starting its ClientApp process can take
        seconds); its answer is collected here in this or a later round, waiting at most
        ``timeout`` seconds when new nodes were just asked.
        """
        unseen = set(self.grid.get_node_ids()) - self._seen
        if unseen and self.pins_path is not None:
            unseen -= read_retired(self.pins_path)  # this deployment's replaced keys: dead, not asked
            # re-read: a restarted node has a new key; a node with no pinned key is never asked
            unseen = leave_out_unpinned(unseen, {pin.node_id for pin in read_pins(self.pins_path).values()},
                                        self._left_out)
        new = sorted(unseen)
        if new:
            content = RecordDict({codec.META: ConfigRecord({"kind": "hello", "round": 0, "client": codec.BROADCAST,
                                                            "job-id": self.hello_job_id})})
            msgs = [FlwrMessage(content, dst_node_id=nid, message_type=MessageType.QUERY, group_id="rejoin",
                                ttl=3600.0) for nid in new]
            self.late_hellos += 1
            for nid, mid, msg in zip(new, self.grid.push_messages(msgs), msgs):
                self._hello[mid] = nid
                self._seen.add(nid)
                if self.recorder:
                    self.recorder.record("down", None, nid, msg)
        adopted: dict[int, int] = {}
        deadline = time.monotonic() + (timeout if new else 0.0)
        while self._hello:
            for rep in self.grid.pull_messages(list(self._hello)):
                nid = self._hello.pop(rep.metadata.reply_to_message_id, None)
                if nid is None:
                    continue
                if self.recorder:
                    self.recorder.record("up", None, nid, rep)
                if rep.has_error():
                    continue
                pid = int(rep.content[codec.META]["partition-id"])
                if self.pins_path is not None:  # a rogue with a registered key must not take a view over
                    check_pin(read_pins(self.pins_path), nid, pid)
                digest = _get(rep.content[codec.META], codec.IDS_DIGEST)
                if 0 <= pid < self.n_clients and digest != self.ids_digests.get(pid):
                    raise FederationError(
                        f"node {nid} came online for view {pid} with other sample ids than the view's node at the "
                        f"handshake: its rows would be other samples (check its view file)", client=pid,
                        node_id=nid)
                if 0 <= pid < self.n_clients:
                    self.node_ids[pid] = nid
                    adopted[pid] = nid
                    if (min_size := _get(rep.content[codec.META], MIN_CLUSTER_SIZE)) is not None:
                        self.min_cluster_sizes[pid] = int(min_size)
            if not self._hello or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        return adopted

    def _contents(self, messages: Sequence[Message], clients) -> list:
        """The encoded content of each of ``messages`` (to ``clients``, in order).  The same message to
        every client (a round's broadcast) is encoded once, as one content for all nodes, so Flower
        pushes its records once, not once per node; otherwise (setup messages each name their view)
        each names its client."""
        if messages and all(msg is messages[0] for msg in messages):
            shared = codec.encode(messages[0], client=codec.BROADCAST, job_id=self.job_id)
            return [shared] * len(messages)
        return [codec.encode(msg, client=p, job_id=self.job_id) for p, msg in zip(clients, messages)]

    def exchange_some(self, messages: dict) -> dict:
        """Send ``{client: message}``; return ``{client: reply}`` of the clients that
        replied without error before the round timeout."""
        if not messages:
            return {}
        self.adopt_new_nodes(timeout=min(5.0, self.round_timeout))
        order = sorted(messages)
        s, kind = messages[order[0]].round, messages[order[0]].kind
        if self.on_exchange is not None:
            self.on_exchange(kind, s)
        flw = [FlwrMessage(content, dst_node_id=self.node_ids[p], message_type=MessageType.TRAIN, group_id=str(s),
                           ttl=self.round_timeout + 60.0)
               for p, content in zip(order, self._contents([messages[p] for p in order], order))]
        t0 = time.monotonic()
        by_id, got, pending = _push_pull(self.grid, flw, self.round_timeout, self.poll, stop_on_error=False,
                                         expect=(self.expect, kind))
        seconds = time.monotonic() - t0
        client_of = dict(zip(by_id, order))
        if self.recorder:
            for mid, msg in by_id.items():
                self.recorder.record("down", client_of[mid], msg.metadata.dst_node_id, msg)
            for mid, rep in got.items():
                self.recorder.record("up", client_of[mid], by_id[mid].metadata.dst_node_id, rep)
        out, down, up = {}, 0, 0
        for mid in by_id:
            p = client_of[mid]
            nid = by_id[mid].metadata.dst_node_id
            down += _array_bytes(by_id[mid].content)
            if mid in pending:
                self.dropped.append({"round": s, "client": p, "node_id": nid, "reason": "no reply before the deadline"})
                continue
            if got[mid].has_error():
                self.dropped.append({"round": s, "client": p, "node_id": nid, "reason": _error_text(got[mid])})
                continue
            rep, meta = codec.decode(got[mid].content)
            if int(meta["client"]) != p or rep.round != s or rep.kind != kind or str(meta["job-id"]) != self.job_id:
                raise FederationError(
                    f"client {p} (node {nid}) answered {rep.kind} round {rep.round} of job {meta['job-id']!r} as "
                    f"client {meta['client']} to round {s} of job {self.job_id!r}", client=p, round=s, node_id=nid)
            out[p] = rep
            up += _array_bytes(got[mid].content)
        self.wire_bytes.append({"round": s, "kind": kind, "down": down, "up": up, "clients": sorted(out),
                                "seconds": round(seconds, 4)})
        return out

    def _setup_done_at_hello(self, messages: Sequence[Message]) -> list[Message] | None:
        """The setup replies the nodes gave at the handshake, if they answer exactly ``messages``
        (each the hellos' scalars with client = the view); else None (the setup is sent)."""
        if not self.setup_at_hello:
            return None
        spec, replies = self.setup_at_hello
        for p, msg in enumerate(messages):
            if p not in replies or msg.arrays or dict(msg.scalars) != {**spec, "client": p}:
                return None
        self.wire_bytes.append({"round": 0, "kind": "setup", "down": 0,
                                "up": int(sum(b for _, b in replies.values())), "at_handshake": True})
        return [replies[p][0] for p in range(self.n_clients)]

    def exchange(self, messages: Sequence[Message]) -> list[Message]:
        """Send one message to every client and return the replies in client order."""
        if len(messages) != self.n_clients:
            raise ValueError(f"{len(messages)} messages for {self.n_clients} clients")
        s, kind = messages[0].round, messages[0].kind
        if kind == "setup" and self.setup_scalars:
            messages = [dataclasses.replace(msg, scalars={**msg.scalars, **self.setup_scalars}) for msg in messages]
        if self.on_exchange is not None:
            self.on_exchange(kind, s)
        if kind == "setup" and (done := self._setup_done_at_hello(messages)) is not None:
            return done
        what = {"setup": "setup", "round": f"round {s}"}.get(kind, kind)
        timeout = self.startup_timeout if kind == "setup" else self.round_timeout
        timeout_name = "start-up timeout" if kind == "setup" else "round timeout"
        flw = [FlwrMessage(content, dst_node_id=nid, message_type=MessageType.TRAIN, group_id=str(s),
                           ttl=timeout + 60.0)
               for nid, content in zip(self.node_ids, self._contents(messages, range(self.n_clients)))]
        t0 = time.monotonic()
        by_id, got, pending = _push_pull(self.grid, flw, timeout, self.poll, expect=(self.expect, kind))
        seconds = time.monotonic() - t0
        client_of = {mid: p for p, mid in enumerate(by_id)}
        if self.recorder:
            for mid, msg in by_id.items():
                self.recorder.record("down", client_of[mid], msg.metadata.dst_node_id, msg)
            for mid, rep in got.items():
                self.recorder.record("up", client_of[mid], self.node_ids[client_of[mid]], rep)
        failed = sorted(((client_of[mid], rep) for mid, rep in got.items() if rep.has_error()), key=lambda t: t[0])
        if failed:
            p, rep = failed[0]
            also = f" (and clients {[q for q, _ in failed[1:]]})" if len(failed) > 1 else ""
            raise FederationError(
                f"client {p} (node {self.node_ids[p]}) failed in {what}: {_error_text(rep)}{also}",
                client=p, round=s, node_id=self.node_ids[p])
        if pending:
            late = sorted(client_of[mid] for mid in pending)
            names = ", ".join(f"client {p} (node {self.node_ids[p]})" for p in late)
            raise FederationError(
                f"{names} did not answer {what} within the {timeout_name} of {timeout:g} s "
                "(hung or disconnected)",
                client=late[0], round=s, node_id=self.node_ids[late[0]])
        replies, down, up = [], 0, 0
        for mid in by_id:
            p = client_of[mid]
            rep, meta = codec.decode(got[mid].content)
            if int(meta["client"]) != p or rep.round != s or rep.kind != kind or str(meta["job-id"]) != self.job_id:
                raise FederationError(
                    f"client {p} (node {self.node_ids[p]}) answered {rep.kind} round {rep.round} of job "
                    f"{meta['job-id']!r} as client {meta['client']} to {what} of job {self.job_id!r}",
                    client=p, round=s, node_id=self.node_ids[p])
            replies.append(rep)
            down += _array_bytes(by_id[mid].content)
            up += _array_bytes(got[mid].content)
        self.wire_bytes.append({"round": s, "kind": kind, "down": down, "up": up, "seconds": round(seconds, 4)})
        return replies


def _array_bytes(rd: RecordDict) -> int:
    return codec.array_bytes(rd)
