"""The Flower ClientApp: answers with :class:`fedsonmf.federation.ClientRuntime`.

Node config (``flower-supernode --node-config``):

``partition-id``  int, the view index p this node holds (required)
``data-path``     str, the node's own view file (required), samples x features in any view
                  format of :mod:`fedsonmf.datasets.files` (CSV/TSV, ``.npy``, ``.npz``, ``.mtx``,
                  ``.mat``); a parsed format is read through a binary copy in ``state-dir``
``state-dir``     str, node-local directory of the private state files
                  (default: ``<dir of data-path>/.fedsonmf-state``)
                  Simulated nodes (Flower's simulation engine) have neither: they use
                  the run config ``sim-data-dir`` (:mod:`.nodeconfig`, the rule and why).
``mask-path``     str, optional: the samples this node holds (incomplete views, §15.1),
                  ``.npy`` of a boolean vector of length n or of int sample ids.
                  Absent: every sample.  Only membership is sent to the server.
``require-secure-aggregation``  bool, default true on a deployment node (false on a simulated
                  one): refuse a run whose setup turns secure aggregation off, and any request
                  for an upload in the clear (the node's own policy: a server cannot downgrade
                  it); ``false`` lets this node take part in plain runs.
``refine-min-cluster-size``  int, default 1: refuse refinement labels with a nonempty cluster of
                  fewer samples (2 or more refuses the seeded starts, which single out samples).
``secagg-signing-key``  str, optional: this node's Ed25519 signing key (PEM, 0600) for secure
                  aggregation's authenticated key agreement; a run whose (coordinator-signed) run
                  config pins the views' public signing keys (``secagg-peers``) has this node sign its
                  key and verify every peer's before deriving a mask (:func:`secagg_signer`).
``predict-path``  str, optional: new samples of this view (same format as ``data-path``) for a
                  ``predict`` run (:mod:`.clustering`); only the node config names the files a node reads.

A clustering run (:mod:`.clustering`) prepares the view once, at setup, on the node
(preprocessing rule, padding, Frobenius scaling) and factorises the prepared copy kept
in the job folder; the preprocessing info never leaves the node.

A node that missed rounds (partial participation, §15.2) and is told so by the
server (``rejoin`` in the message) resumes from its newest saved state.

Every message runs in a fresh process (Flower deployment), so the client's
private state (U_p and the algorithm's other matrices) is kept in an
atomically written node-local file ``<state-dir>/<job-id>/client-<p>-r<s>.npz``
(:mod:`fedsonmf.federation.checkpoint`), saved before the reply is returned and loaded
for round s+1 only if it holds round s.  ``context.state`` holds only small
items (a ConfigRecord with the job id, partition and last round); large
arrays there are subject to a stale-state race (docs/flower.md, "Flower behaviours").
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.app import Message as FlwrMessage
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedsonmf._io import private_dir, write_atomic, write_json_atomic
from fedsonmf._validation import as_internal_view, check_views
from fedsonmf.core.masks import held_columns
from fedsonmf.exceptions import ProtocolError
from fedsonmf.federation import checkpoint as ckpt
from fedsonmf.federation.flower import clustering as fclust
from fedsonmf.federation.flower import codec, nodeconfig
from fedsonmf.federation.loop import ClientRuntime
from fedsonmf.federation.rejoin import load_latest_client_state
from fedsonmf.pipeline.graph import check_graph_search
from fedsonmf.protocol.messages import Message

__all__ = ["app", "make_client_app", "load_view", "load_mask", "state_dir_of"]

STATE_KEY = "fedsonmf"


#: view formats that are parsed on every read (text, or a MATLAB container): a node keeps a binary copy
PARSED_FORMATS = (".csv", ".tsv", ".mtx", ".mat")


def _file_key(path: Path) -> list | None:
    """What identifies a file's content for the node's caches: resolved path, size, mtime (ns)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return [str(path.resolve()), int(st.st_size), int(st.st_mtime_ns)]


def _read(path: Path, copy: Path | None = None):
    """The view file ``path`` as (n, d_p): every view format of fedsonmf.datasets.files (CSV/TSV,
    .npy, .npz, .mtx, .mat), one clear error per bad file; rows ordered by sample id when the file
    carries ids (id column or ``<stem>.ids.txt``): the node aligns locally.

    ``copy`` (a path stem in the node's state folder): a view parsed from text or a MATLAB file is
    kept there as a binary copy (``<copy>.npy`` memory-mapped, or ``<copy>.npz``; mode 0600 in a
    0700 folder) with the key of the file and of its ids sidecar in ``<copy>.json``; the next
    message's process (each message is a fresh one under stock Flower) loads the copy instead of
    parsing the file again -- a 2 000 x 1 000 CSV takes 0.6 s to parse, every round and every
    refinement exchange.  An edited or replaced file (or sidecar) changes the key and is parsed again.
    """
    from fedsonmf.datasets.files import ids_digest, read_view, sidecar_ids_path

    path = Path(path)
    if copy is None or path.suffix.lower() not in PARSED_FORMATS:
        return read_view(path, mmap_mode="r", validate=False, order_by_id=True)[0]
    import scipy.sparse as sp

    key = [_file_key(path), _file_key(sidecar_ids_path(path))]
    meta = copy.with_name(copy.name + ".json")
    try:
        saved = json.loads(meta.read_text())
        if saved["key"] == key and "ids" in saved:
            stored = copy.with_name(copy.name + str(saved["suffix"]))
            if stored.suffix == ".npy":
                return np.load(stored, mmap_mode="r", allow_pickle=False)
            return sp.csr_array(sp.load_npz(stored))
    except (OSError, ValueError, KeyError):
        pass  # no copy yet, or a damaged one: parse the file
    X, ids = read_view(path, mmap_mode="r", validate=False, order_by_id=True)
    suffix = ".npz" if sp.issparse(X) else ".npy"
    private_dir(copy.parent)  # the node's state folder, 0700: the copy is the raw view
    write_atomic(copy.with_name(copy.name + suffix),
                 (lambda fh: sp.save_npz(fh, sp.csr_matrix(X), compressed=False)) if sp.issparse(X)
                 else (lambda fh: np.save(fh, np.asarray(X), allow_pickle=False)))
    copy.with_name(copy.name + (".npy" if suffix == ".npz" else ".npz")).unlink(missing_ok=True)  # one copy only
    write_json_atomic(meta, {"key": key, "suffix": suffix, "ids": ids_digest(ids)}, indent=None)
    return X


def _ids_digest(path: Path, copy: Path | None = None) -> str | None:
    """:func:`fedsonmf.datasets.files.ids_digest` of the view file's sample ids (None: no ids).

    A parsed format's ids were hashed when :func:`_read` made its copy (the digest is in the copy's
    record); a binary format's ids can only come from its sidecar, read here.
    """
    from fedsonmf.datasets.files import ids_digest, read_ids, read_view, sidecar_ids_path

    path = Path(path)
    if path.suffix.lower() in PARSED_FORMATS:
        if copy is None:
            return ids_digest(read_view(path, validate=False)[1])
        _read(path, copy)  # makes (or checks) the copy and its record
        return json.loads(copy.with_name(copy.name + ".json").read_text())["ids"]
    side = sidecar_ids_path(path)
    return ids_digest(read_ids(side)) if side.is_file() else None


def _view_copy(context: Context, p: int) -> Path:
    """The stem of the node's binary copy of its parsed view (:func:`_read`), beside the job folders."""
    return nodeconfig.state_base(context) / f"view-copy-{int(p)}"


def _raw_view(context: Context, p: int):
    """The node's own view (``data-path``) as (n, d_p), through its binary copy when parsed."""
    return _read(Path(_data_path(context)), _view_copy(context, p))


def load_view(path, *, validate: bool = True, copy: Path | None = None) -> Any:
    """The view in ``path`` as (d_p, n) (memory-mapped when dense float64).

    ``validate=False`` skips the checks (NaN/Inf, all-zero, scale) for a file
    that this node already validated (:func:`view_facts`); the orientation and
    dtype handling are the same.  ``copy``: the node's binary copy of a parsed view (:func:`_read`).
    """
    X = _read(Path(path), copy)
    if validate:
        return check_views([X])[0]
    return as_internal_view(X)


def view_facts(path, cache: Path, mask=None, copy: Path | None = None) -> tuple[Any, dict]:
    """The node's view and what every round needs of it, computed once per view file.

    Every Flower message runs in a fresh process, so without a cache each round
    would re-validate the view (~3 passes), re-hash it for the resume
    fingerprint and recompute ``||X_p||^2``.  The node keeps these facts in
    ``cache`` (``<state-dir>/view-facts-<p>.json``, beside the jobs' folders), keyed by the file's resolved path, size
    and modification time (a replaced or edited file is validated and hashed
    again); nothing of it leaves the node.  ``copy``: the node's binary copy of a view parsed from
    text or a MATLAB file (:func:`_read`).
    """
    from fedsonmf.datasets.files import sidecar_ids_path

    path = Path(path)
    st = path.stat()
    key = [str(path.resolve()), int(st.st_size), int(st.st_mtime_ns),
           None if mask is None else ckpt.view_fingerprint(np.asarray(mask)[None, :]),
           _file_key(sidecar_ids_path(path))]  # the ids order the rows: a new sidecar is a new view
    cache = Path(cache)
    try:
        facts = json.loads(cache.read_text())
        if facts.get("key") == key:
            return load_view(path, validate=False, copy=copy), facts
    except (OSError, ValueError):
        pass
    X = load_view(path, copy=copy)
    held = held_columns(mask, X.shape[1])
    from fedsonmf.core._linalg import sqnorm

    facts = {"key": key, "fingerprint": ckpt.view_fingerprint(X),
             "x_sqnorm": sqnorm(X if held is None else X[:, held]), "ids": _ids_digest(path, copy)}
    write_json_atomic(cache, facts, indent=None)
    return X, facts


def load_mask(context: Context):
    """The node's availability mask (``mask-path``) or None."""
    path = str(context.node_config.get("mask-path", "") or "")
    if not path:
        return None
    return np.load(path, allow_pickle=False)


def _partition(context: Context) -> int:
    try:
        return int(context.node_config["partition-id"])
    except KeyError:
        raise ValueError("node config has no 'partition-id': start the SuperNode with "
                         "--node-config 'partition-id=<view index> data-path=\"<file>\"'") from None


def state_dir_of(context: Context, job_id: str) -> Path:
    """The folder of a node's private state files for job ``job_id`` (below its ``state-dir``)."""
    base = nodeconfig.state_base(context)  # node config, or the simulation rule (nodeconfig's docstring)
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise ProtocolError(f"invalid job id {job_id!r}")
    return Path(base) / job_id


def _data_path(context: Context) -> str:
    return str(nodeconfig.data_path(context))  # node config, or the simulation rule (nodeconfig's docstring)


def _check_secure_policy(context: Context, cfg) -> None:
    """The node's ``require-secure-aggregation`` policy against the run's config."""
    if nodeconfig.requires_secure_aggregation(context) and not cfg.secure_aggregation:
        raise ProtocolError("this node requires secure aggregation (node config require-secure-aggregation, "
                            "true unless its operator sets it to false) but the run's config has "
                            "secure_aggregation=False")


def secagg_signer(context: Context, p: int, cfg=None):
    """The node's :class:`~fedsonmf.federation.secagg.KeySigner` for a secure run (``cfg`` None:
    a masked predict), or None.

    The peers' public signing keys come from the run config (``secagg-peers``), which the
    coordinator signs and every node's gate checks (``gate.py``): the server cannot change them.
    The session is the run config's ``job-id`` (signed likewise).  Refused: a run that pins keys
    when this node has no signing key, or a secure run that pins none when this node has one
    (a server must not be able to drop the authentication).
    """
    from fedsonmf.federation.flower import security as sec
    from fedsonmf.federation.secagg import KeySigner

    if cfg is not None and not cfg.secure_aggregation:
        return None
    peers = str(context.run_config.get(sec.PEERS_KEY, "") or "")
    key_path = str(context.node_config.get(sec.SIGNING_KEY, "") or "")
    if not peers and not key_path:
        return None
    if not peers:
        raise ProtocolError(f"this node signs its secure-aggregation keys (node config {sec.SIGNING_KEY}) but the "
                            f"run config pins no peers' signing keys ({sec.PEERS_KEY}): refused")
    if not key_path:
        raise ProtocolError(f"the run pins secure-aggregation signing keys ({sec.PEERS_KEY}) but this node has none "
                            f"(node config {sec.SIGNING_KEY}): refused")
    session = str(context.run_config.get("job-id", "") or "") or f"run{context.run_id}"
    return KeySigner(sec.load_signing_key(key_path), sec.parse_peer_keys(peers), session, p)


def _state_round(msg: Message) -> int:
    """The saved round a message continues from: a round s message the state of round s-1; the
    secure-aggregation exchanges (``init`` after setup, ``unmask`` after round s) the
    state they follow (0, resp. s)."""
    return msg.round if msg.kind in ("init", "unmask") else msg.round - 1


def _predict_path(context: Context) -> Path:
    path = str(context.node_config.get("predict-path", "") or "")
    if not path:
        raise ValueError("node config has no 'predict-path' (the node's own file of new samples): restart the "
                         "SuperNode with --node-config '... predict-path=\"<file>\"'")
    return Path(path)


def _clustering_setup(fed_msg: Message, context: Context, sdir: Path, p: int, mask):
    """Setup of a clustering run: prepare this node's view (kept node-local); its path.

    With an availability mask the preprocessing's statistics come from the samples the node
    holds, and the rows of the others are zero in the prepared view (never read), as in process."""
    cfg = ckpt.config_from_dict(json.loads(str(fed_msg.scalars["config"])))
    X = _raw_view(context, p)
    held = held_columns(mask, X.shape[0], client=p)
    opts = fclust.clustering_options(context.run_config)
    if opts is not None:  # this node's graph may need the approximate search's extra: said now, not after the fits
        check_graph_search(opts["refine"], X.shape[0] if held is None else len(held), dp=cfg.dp_enabled)
    path = fclust.prepare_node_view(X, sdir, p, dict(fed_msg.scalars), cfg.n_components, held=held)
    return path, max(int(X.shape[1]), cfg.n_components)


def _save(context: Context, sdir: Path, p: int, job_id: str, runtime: ClientRuntime, algorithm: str, cfg_json: str,
          X, fingerprint: str) -> None:
    """Save the client's state before replying (the next round's process reads this file)."""
    assert runtime.state is not None  # a client that answered a message has set up
    ckpt.save_client_state(sdir, p, runtime.state, {"algorithm": algorithm, "config": cfg_json, "job": job_id,
                                                     **ckpt.client_resume_meta(X, fingerprint)})
    context.state[STATE_KEY] = ConfigRecord({"job-id": job_id, "partition-id": p, "round": int(runtime.state.round)})


def make_client_app(before_handle: Callable[[Message, Context, str], None] | None = None) -> ClientApp:
    """A fresh ClientApp that answers with :class:`fedsonmf.federation.ClientRuntime`.

    Parameters
    ----------
    before_handle : callable or None, default=None
        ``before_handle(msg, context, job_id)`` before every train message (a hook for
        fault-injection tests; None in normal use).

    Returns
    -------
    flwr.clientapp.ClientApp
    """
    client = ClientApp()

    def setup(fed_msg: Message, context: Context, p: int, job_id: str, sdir: Path, mask) -> Message:
        """The setup exchange on this node (a setup message, or the setup a hello carries)."""
        view_path, facts_path = Path(_data_path(context)), sdir.parent / f"view-facts-{p}.json"
        public_d = None
        if fclust.SETUP_KEY in fed_msg.scalars:  # a clustering run: the node prepares its own view
            view_path, public_d = _clustering_setup(fed_msg, context, sdir, p, mask)
            facts_path = sdir / f"view-facts-{p}.json"
        else:
            fclust.drop_prepared_view(sdir, p)  # a plain factorisation under this job id: the raw view
        # validated, hashed and measured once per view file (node-local cache)
        X, facts = view_facts(view_path, facts_path, mask, _view_copy(context, p))
        algorithm, cfg_json = str(fed_msg.scalars["algorithm"]), str(fed_msg.scalars["config"])
        setup_cfg = ckpt.config_from_dict(json.loads(cfg_json))
        _check_secure_policy(context, setup_cfg)  # the node's own policy: a server cannot downgrade it
        runtime = ClientRuntime(X, algorithm, setup_cfg, mask=mask, x_sqnorm=facts["x_sqnorm"],
                                signer=secagg_signer(context, p, setup_cfg))
        reply = runtime.handle(fed_msg)
        _save(context, sdir, p, job_id, runtime, algorithm, cfg_json, X, facts["fingerprint"])
        if public_d is not None:
            # the reply's d is the prepared width (max(d_p, r) after padding); it says max(d_p, r),
            # what the server knows anyway (d_p from the hello, r its own), whatever a rule did to the view
            reply = dataclasses.replace(reply, scalars={**reply.scalars, "d": public_d})
        return reply

    @client.query()
    def hello(msg: FlwrMessage, context: Context) -> FlwrMessage:
        p = _partition(context)
        path = Path(_data_path(context))
        if not path.is_file():
            raise FileNotFoundError(f"view file {path} of partition {p} does not exist")
        meta_in = cast(ConfigRecord, msg.content[codec.META])
        job_id = str(meta_in["job-id"])
        fields: dict[str, Any] = {"kind": "hello", "round": 0, "client": p, "partition-id": p, "job-id": job_id}
        # the server may send the setup with the hello (one exchange less before round 1)
        spec: dict[str, Any] | None = (codec.scalars_of(msg.content)
                                       if str(meta_in["kind"]) == codec.SETUP_AT_HELLO else None)
        reply = None
        try:  # validate the view now: a bad view is reported at the handshake, before round 1
            # (through the node-local cache: the setup and the rounds then skip the validation)
            sdir = state_dir_of(context, job_id)
            mask = load_mask(context)
            X, facts = view_facts(path, sdir.parent / f"view-facts-{p}.json", mask, _view_copy(context, p))
            fields.update(d=int(X.shape[0]), n=int(X.shape[1]))
            # rows ordered by the file's ids: the server checks that every node holds the same id set
            if facts.get("ids"):
                fields[codec.IDS_DIGEST] = codec.salted_ids_digest(facts["ids"], job_id)
            # the node's policy, announced so that the server never sends a partition it would refuse
            # (an operator's setting, not data; a refusal would state it anyway)
            if (min_size := nodeconfig.min_cluster_size(context)) > 1:
                fields[nodeconfig.MIN_CLUSTER_SIZE] = min_size
            r = ckpt.config_from_dict(json.loads(str(spec["config"]))).n_components if spec else 0
            # a view narrower than r is left to the server's check (its message names r and the view);
            # a clustering run pads it instead
            if spec and (X.shape[0] >= r or fclust.SETUP_KEY in spec):
                setup_msg = Message("setup", 0, {}, {**spec, "client": p})
                if before_handle is not None:
                    before_handle(setup_msg, context, job_id)
                reply = setup(setup_msg, context, p, job_id, sdir, mask)
                fields["kind"] = codec.SETUP_AT_HELLO
        except Exception as exc:  # noqa: BLE001 - reported to the server as this view's error
            fields["error"] = f"{type(exc).__name__}: {exc}"
            reply, fields["kind"] = None, "hello"
        content = RecordDict() if reply is None else codec.encode(reply, client=p, job_id=job_id)
        codec.set_meta(content, fields)
        return FlwrMessage(content, reply_to=msg)

    def answer(content: RecordDict, context: Context) -> RecordDict:
        """The reply's content to one train message's ``content`` (alone, or one of a batch)."""
        fed_msg, meta = codec.decode(content)
        p = _partition(context)
        if int(meta["client"]) not in (p, codec.BROADCAST):
            raise ProtocolError(f"message for client {meta['client']} reached the node of view {p}")
        job_id = str(meta["job-id"])
        sdir = state_dir_of(context, job_id)
        if before_handle is not None:
            before_handle(fed_msg, context, job_id)
        mask = load_mask(context)
        if fed_msg.kind in ("embed", "refine", "graph", "spectral"):  # after a fit: predict, or a refinement
            state, fit_secure = fclust.fitted_state(sdir, p)
            # masked when this node's fit was (its own record) or its policy asks: a server cannot
            # downgrade these uploads to the clear
            secure = fit_secure or nodeconfig.requires_secure_aggregation(context)
            if fed_msg.kind == "refine":  # distances from the raw view
                reply = fclust.node_refine(fed_msg, _raw_view(context, p), state, p, secure=secure,
                                           min_size=nodeconfig.min_cluster_size(context), mask=mask)
            elif fed_msg.kind in ("graph", "spectral"):  # products with the view's k-NN graph (read once, to build it)
                max_steps = context.run_config.get("refine-spectral-steps")
                reply = fclust.node_graph(fed_msg, lambda: _raw_view(context, p), sdir, state, p,
                                          secure=secure, max_steps=None if max_steps is None else int(max_steps),
                                          min_size=nodeconfig.min_cluster_size(context), mask=mask)
            else:  # predict: the fitted bases fixed (no state change)
                reply = fclust.node_embed(_read(_predict_path(context)), sdir, p, state)
                if fclust.EMBED_SECAGG_SEED in fed_msg.scalars:
                    reply = fclust.node_embed_keys(reply, sdir, p, int(fed_msg.scalars[fclust.EMBED_SECAGG_SEED]),
                                                   signer=secagg_signer(context, p))
                else:
                    fclust.refuse_clear(secure, p, "the new samples are", "this predict request")
                if (digest := _ids_digest(_predict_path(context))) is not None:  # rows ordered by their ids
                    reply = dataclasses.replace(reply, scalars={
                        **reply.scalars, codec.IDS_DIGEST: codec.salted_ids_digest(digest, job_id)})
            return codec.encode(reply, client=p, job_id=job_id)
        if fed_msg.kind == "embed-sum":  # predict under secure aggregation: the masked upload
            reply = fclust.node_embed_masked(fed_msg, sdir, p, signer=secagg_signer(context, p))
            return codec.encode(reply, client=p, job_id=job_id)
        if fed_msg.kind == "setup":
            return codec.encode(setup(fed_msg, context, p, job_id, sdir, mask), client=p, job_id=job_id)
        view_path = fclust.prepared_view_path(sdir, p)  # a clustering run's prepared view, if any
        facts_path = sdir / f"view-facts-{p}.json" if view_path else sdir.parent / f"view-facts-{p}.json"
        # validated, hashed and measured once per view file (node-local cache); the fingerprint is
        # compared here, on the node, and never leaves it
        X, facts = view_facts(view_path or _data_path(context), facts_path, mask, _view_copy(context, p))
        fingerprint, x_sqnorm = facts["fingerprint"], facts["x_sqnorm"]
        if fed_msg.scalars.get("rejoin"):  # missed rounds: the newest saved state (§15.2)
            state, smeta = load_latest_client_state(sdir, p, fed_msg.round - 1)
        else:
            state, smeta = ckpt.load_client_state(sdir, p, _state_round(fed_msg))
        algorithm, cfg_json = str(smeta["algorithm"]), str(smeta["config"])
        cfg = ckpt.config_from_dict(json.loads(cfg_json))
        held = held_columns(mask, X.shape[1], client=p)
        ckpt.verify_client_resume(p, X, state, smeta, cfg.n_components, fingerprint,
                                  n_cols=None if held is None else held.size)
        runtime = ClientRuntime(X, algorithm, cfg, state=state, mask=mask, x_sqnorm=x_sqnorm,
                                signer=secagg_signer(context, p, cfg))
        reply = runtime.handle(fed_msg)
        _save(context, sdir, p, job_id, runtime, algorithm, cfg_json, X, fingerprint)
        return codec.encode(reply, client=p, job_id=job_id)

    @client.train()
    def train(msg: FlwrMessage, context: Context) -> FlwrMessage:
        return FlwrMessage(answer(msg.content, context), reply_to=msg)

    @client.train(codec.BATCH_ACTION)
    def batch(msg: FlwrMessage, context: Context) -> FlwrMessage:
        """Several train messages for this node in one (the fits of a clustering run at once,
        :class:`~fedsonmf.federation.flower.transport.BatchingGrid`): each answered as if it had come
        alone, one after the other, in order; one that raises gets its own error reply, the others
        are answered all the same."""
        replies = []
        for content in codec.unpack(msg.content):
            try:
                replies.append(answer(content, context))
            except Exception as exc:  # noqa: BLE001 - that message's error reply, in Flower's format
                replies.append(codec.error_content(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, codec.error_reason(exc)))
        return FlwrMessage(codec.pack(replies), reply_to=msg)

    return client


# the installed app (what the gate's executors run, and the shim app imports)

app = make_client_app()
