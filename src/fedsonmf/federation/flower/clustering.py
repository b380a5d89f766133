"""Federated multi-view clustering on Flower: the node's and the server's parts.

The pipeline is :class:`~fedsonmf.estimators.clustering.FedMultiViewClustering`'s, step for
step; the steps themselves (preprocessing rule, padding, Frobenius scaling, rank rule,
k-means, the refinements) are the pure functions of :mod:`fedsonmf.pipeline`, imported here.

Fit run (run config ``n-clusters = c > 0``):

1. handshake: every node reports its view's (raw) width d_p; the server resolves
   r = ``resolve_rank(c, [d_p], rank-rule)`` (:func:`resolve_rank_at_handshake`);
2. setup: the message carries r (in the config) and the clustering options
   (scalar ``clustering``, :func:`setup_scalars`); each node applies
   ``prepare_view`` to ITS OWN view (:func:`prepare_node_view`) and keeps the prepared
   view and the preprocessing info (means, scales, the statistic that decided the
   rule) in its job folder, written atomically with mode 0600; nothing of it is sent;
3. rounds: the nodes factorise the prepared view (the ordinary rounds);
4. the server runs the estimator's driver of what follows the fits,
   :func:`~fedsonmf.pipeline.stages.cluster_fits`: k-means on every fit's V with its seed, the
   medoid fit kept, the stages after it over the nodes' exchanges; then it writes ``labels.csv``
   and ``centers.npy`` (:func:`write_outputs`).

Predict run (run config ``mode = "predict"``, ``model-dir`` = the fit's out-dir): one
``embed`` exchange with the fitted bases held fixed.  Each node reads its new samples
from the file its **node config** names (``predict-path``; a run config never chooses
a file a node reads), applies its saved transform and sends ``U_p^T X_p^new`` (r x n_new);
the server takes the prox of their mean (the in-process ``transform``) and assigns the
nearest fitted centre.

Sample ids: row i of every view file is sample i; ``labels.csv`` holds
``sample_id,cluster`` with ids 0..n-1 (our choice: no ids travel to the server, and a
view file's own ids, where a reader provides them, stay on its node).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedsonmf._io import save_npy_atomic, write_atomic
from fedsonmf.core.masks import held_columns
from fedsonmf.core.server import total
from fedsonmf.exceptions import FederationError, ProtocolError
from fedsonmf.federation import checkpoint as ckpt
from fedsonmf.federation.rejoin import load_latest_client_state
from fedsonmf.pipeline.graph import client_graph, client_links, client_products
from fedsonmf.pipeline.policy import SMALL_CLUSTER_REFUSAL, NodePolicy, RefineExchange, smallest_clusters
from fedsonmf.pipeline.rank_rule import resolve_rank
from fedsonmf.pipeline.refine import batch_rows, client_refine, refine_view, score_weight
from fedsonmf.pipeline.stages import cluster_fits
from fedsonmf.pipeline.steps import apply_view, prepare_view
from fedsonmf.protocol.messages import Message
from fedsonmf.protocol.params import default

__all__ = ["drop_prepared_view", "clustering_options", "setup_scalars", "resolve_rank_at_handshake",
           "prepare_node_view", "prepared_view_path", "node_embed", "write_clustering_outputs", "write_outputs",
           "write_labels_csv",
           "read_labels_csv"]

#: the setup-message scalar that carries the clustering options (JSON)
SETUP_KEY = "clustering"


# ----------------------------------------------------------------------------- options (server)


def clustering_options(rc) -> dict | None:
    """The clustering options of a run config, or None for a plain factorisation (``n-clusters = 0``)."""
    c = int(rc.get("n-clusters", 0) or 0)
    if c <= 0:
        return None
    text = str(rc.get("rank-rule", "auto") or "auto")
    rule: str | int = int(text) if text.isdigit() else text
    return {
        "n_clusters": c, "rank_rule": rule,
        "preprocess": str(rc.get("preprocess", default("preprocess"))),
        "normalize_views": bool(rc.get("normalize-views", default("normalize_views"))),
        "normalize_embedding": bool(rc.get("normalize-embedding", default("normalize_embedding"))),
        "kmeans_n_init": int(rc.get("kmeans-n-init", default("kmeans_n_init"))),
        "kmeans_max_iter": int(rc.get("kmeans-max-iter", default("kmeans_max_iter"))),
        "early_stop": str(rc.get("early-stop", default("early_stop"))),
        "refine": str(rc.get("refine", default("refine"))),
        "refine_starts": int(rc.get("refine-starts", default("refine_starts"))),
        "refine_seeded_starts": int(rc.get("refine-seeded-starts", default("refine_seeded_starts"))),
        "refine_spectral_steps": int(rc.get("refine-spectral-steps", default("refine_spectral_steps"))),
        # the number of fits ("auto" or a count; resolved by the steps' resolve_n_init), the medoid kept
        "n_init": str(rc.get("n-init", default("n_init"))),
    }


def setup_scalars(opts: dict) -> dict:
    """What the nodes need of the options: the preprocessing rule and the Frobenius switch (r is in the config)."""
    return {SETUP_KEY: json.dumps({"preprocess": opts["preprocess"], "normalize_views": opts["normalize_views"]})}


def resolve_rank_at_handshake(opts: dict, view_info: dict, n_views: int) -> tuple[int, str | None]:
    """r from c and the widths d_p the nodes reported at the handshake (``choose_rank``)."""
    widths, ns = [], set()
    for p in range(n_views):
        v = view_info.get(p, {})
        if "error" in v or "d" not in v:
            return 0, None  # check_views_at_handshake names the view that cannot be used
        widths.append(int(v["d"]))
        ns.add(int(v["n"]))
    c = opts["n_clusters"]
    if ns and c > min(ns):
        raise FederationError(f"n_clusters={c} is larger than the number of samples ({min(ns)})", round=0)
    return resolve_rank(c, widths, opts["rank_rule"])


# ----------------------------------------------------------------------------- node


def _atomic_write(path: Path, write) -> None:
    """``write(fh)`` into a 0600 temporary file beside ``path``, fsync, rename over ``path``
    (:func:`fedsonmf._io.write_atomic`)."""
    write_atomic(path, write)


def prepared_view_path(sdir: Path, p: int) -> Path | None:
    """The node's prepared view of this job (``view-<p>.npy`` or ``.npz``), or None for a plain factorisation."""
    for suffix in (".npy", ".npz"):
        path = Path(sdir) / f"view-{int(p)}{suffix}"
        if path.is_file():
            return path
    return None


def drop_prepared_view(sdir: Path, p: int) -> None:
    """Forget a prepared view of this job (a plain factorisation reuses the job id)."""
    for suffix in (".npy", ".npz"):
        (Path(sdir) / f"view-{int(p)}{suffix}").unlink(missing_ok=True)


def _info_path(sdir: Path, p: int) -> Path:
    return Path(sdir) / f"preprocessing-{int(p)}.npz"


def prepare_node_view(X, sdir: Path, p: int, scalars: dict, n_components: int, held=None) -> Path:
    """Apply the clustering preprocessing to this node's raw view ``X`` (n, d_p) and keep it here
    (``held``: the sample ids of an incomplete view, whose statistics alone decide the transform).

    Writes ``<sdir>/view-<p>.npy|.npz`` (the prepared view, (n, max(d_p', r))) and
    ``<sdir>/preprocessing-<p>.npz`` (the info: rule, flags, mean share, means, scales,
    Frobenius divisor), each atomically with mode 0600.  Returns the prepared view's path.
    """
    import scipy.sparse as sp

    try:
        opts = json.loads(str(scalars[SETUP_KEY]))
        rule, scale_views = str(opts["preprocess"]), bool(opts["normalize_views"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"setup message with a malformed {SETUP_KEY!r} scalar: {exc}") from None
    Y, info = prepare_view(X, preprocess=rule, n_components=n_components, normalize_views=scale_views,
                                 held=held, view=p)
    sdir = Path(sdir)
    sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    drop_prepared_view(sdir, p)
    _graph_path(sdir, p).unlink(missing_ok=True)  # a new fit of this job: the graph is built again from X
    (sdir / f"spectral-{p}.json").unlink(missing_ok=True)  # and its spectral step may ask its blocks again
    if sp.issparse(Y):
        path = sdir / f"view-{p}.npz"
        _atomic_write(path, lambda fh: sp.save_npz(fh, sp.csr_matrix(Y), compressed=False))
    else:
        path = sdir / f"view-{p}.npy"
        _atomic_write(path, lambda fh: np.save(fh, np.asarray(Y), allow_pickle=False))
    arrays = {k: v for k, v in info.items() if isinstance(v, np.ndarray)}
    meta = {k: v for k, v in info.items() if k not in arrays}
    meta.update(n_components=int(n_components), normalize_views=scale_views)
    ckpt.atomic_save_npz(_info_path(sdir, p), arrays, meta)  # mkstemp: mode 0600
    return path


def _load_info(sdir: Path, p: int) -> dict:
    arrays, meta = ckpt.load_npz(_info_path(sdir, p))
    return {**meta, **arrays}


def node_embed(X_new, sdir: Path, p: int, state) -> Message:
    """The node's half of ``predict``: its new samples ``X_new`` (n_new, d_p) through its saved
    transform, then ``U_p^T X_p^new`` (r x n_new) with the fitted (final) basis U_p of ``state``
    (:func:`fitted_state`)."""
    from fedsonmf._validation import check_views
    from fedsonmf.core._linalg import ut_x

    info = _load_info(sdir, p)
    r = int(info["n_components"])
    Y = apply_view(X_new, info, n_components=r, normalize_views=bool(info["normalize_views"]))
    (Xi,) = check_views([Y])
    U = np.ascontiguousarray(state.arrays["U"], dtype=np.float64)  # as FedSONMF._bases
    if U.shape[0] != Xi.shape[0]:
        raise ProtocolError(f"client {p}: the new samples have {Xi.shape[0]} features after preprocessing, "
                            f"the fitted basis {U.shape[0]}")
    return Message("embed", 0, {"UtX": ut_x(U, Xi)}, {"n": int(Xi.shape[1])})


# ----------------------------------------------------------------------------- predict under secure aggregation

#: the one summed item of a predict exchange: U_p^T X_p^new (r x n_new), of degree 1 in the data
EMBED_SPEC = {"UtX": ("arrays", 1)}
#: the scalar of an ``embed`` message asking for the masked protocol (its value: the exchange's seed)
EMBED_SECAGG_SEED = "secagg-seed"


def _embed_key_file(sdir: Path, p: int) -> Path:
    return Path(sdir) / f"predict-secagg-{p}.npz"


def fitted_state(sdir: Path, p: int):
    """``(state, secure)``: this node's newest saved client state and whether its fit ran with
    secure aggregation (its own record, not anything the server says now); read once per message."""
    from fedsonmf.protocol.config import FedConfig

    state, smeta = load_latest_client_state(sdir, p, 10**9)
    return state, bool(FedConfig.from_dict(json.loads(str(smeta["config"]))).secure_aggregation)


def refuse_clear(secure: bool, p: int, what: str, request: str) -> None:
    """A node whose uploads must be masked (``secure``) refuses a request for ``what`` in the clear."""
    if secure:
        raise ProtocolError(f"client {p}: the fit ran with secure aggregation or the node requires it "
                            f"(node config require-secure-aggregation), so {what} sent masked only; "
                            f"{request} asks for them in the clear")


def node_embed_keys(reply: Message, sdir: Path, p: int, seed: int, signer=None) -> Message:
    """First step of a masked predict: keep ``U_p^T X_p^new`` and a fresh key pair node-local
    (0600), answer with the public key and the exponent only (:func:`fedsonmf.federation.secagg.client_setup`)."""
    from fedsonmf.core._linalg import sqnorm
    from fedsonmf.federation import secagg
    from fedsonmf.protocol.messages import ClientState

    state, out = secagg.client_setup(ClientState(0, {}), reply, EMBED_SPEC, me=p, seed=int(seed), signer=signer,
                                     x_sqnorm=float(sqnorm(reply.arrays["UtX"])))
    ckpt.atomic_save_npz(_embed_key_file(sdir, p), state.arrays, {"kind": "predict-secagg"})
    return out


def node_embed_masked(msg: Message, sdir: Path, p: int, signer=None) -> Message:
    """Second step: pair keys from the relayed public keys, the masked ``U_p^T X_p^new``.

    The pending key file is removed once used, so a node answers one masked sum per key step
    (a second request with other public keys could otherwise help unmask its upload).
    """
    from fedsonmf.federation import secagg
    from fedsonmf.protocol.messages import ClientState

    path = _embed_key_file(sdir, p)
    if not path.is_file():
        raise ProtocolError(f"client {p}: a masked embed request without a pending key step (or answered before)")
    arrays, _ = ckpt.load_npz(path)
    try:
        _, rep = secagg.client_init(ClientState(0, arrays), msg, signer=signer)
    finally:
        path.unlink(missing_ok=True)
    return Message("embed-sum", 0, rep.arrays, rep.scalars)


# ----------------------------------------------------------------------------- server outputs


def write_labels_csv(path, labels, sample_ids=None) -> Path:
    """``sample_id,cluster`` per line (header first), written atomically; ids 0..n-1 unless given."""
    path = Path(path)
    labels = np.asarray(labels)
    ids = np.arange(labels.size) if sample_ids is None else np.asarray(sample_ids)
    text = "sample_id,cluster\n" + "".join(f"{i},{int(k)}\n" for i, k in zip(ids, labels))
    write_atomic(path, text)
    return path


def read_labels_csv(path) -> np.ndarray:
    """The ``cluster`` column of a file written by :func:`write_labels_csv`, in sample-id order."""
    rows = Path(path).read_text().splitlines()[1:]
    pairs = sorted((int(a), int(b)) for a, b in (r.split(",") for r in rows if r))
    return np.array([k for _, k in pairs], dtype=np.int64)


def write_clustering_outputs(out: Path, V: np.ndarray, opts: dict, seed: int, refine=None,
                             graph=None, spectral=None, both=None, policy: NodePolicy | None = None) -> dict:
    """One fit's clustering (:func:`~fedsonmf.pipeline.stages.cluster_fits` of ``V`` alone, the
    estimator's), ``labels.csv`` and ``centers.npy`` in ``out``: the exchanges as for
    :func:`~fedsonmf.pipeline.stages.finish_clustering`.  Returns :func:`write_outputs`' summary."""
    _, labels, centers, km, report = cluster_fits(
        [V], [seed], int(opts["n_clusters"]), opts=opts,
        exchanges=lambda best: {"refine": refine, "graph": graph, "spectral": spectral, "both": both, "policy": policy})
    return write_outputs(out, V, opts, labels, centers, km, report)


def write_outputs(out: Path, V: np.ndarray, opts: dict, labels, centers, km, report: dict) -> dict:
    """``labels.csv`` and ``centers.npy`` of the clustering reached (:func:`~fedsonmf.pipeline.stages.cluster_fits`)
    in ``out``.  Returns the clustering summary for result.json: the options, the sizes, the stages'
    report (``refine_iterations``, ``refine_start``, ``graph_iterations``, ``spectral_kept``,
    ``graph_chosen``), ``refine_notes`` for partitions not sent and ``refine_error`` for a node lost
    during a stage (the partition reached before it is the one written)."""
    c = int(opts["n_clusters"])
    write_labels_csv(out / "labels.csv", labels)
    save_npy_atomic(out / "centers.npy", centers)
    return {**opts, "n_components": int(V.shape[0]), "cluster_sizes": np.bincount(labels, minlength=c).tolist(),
            "kmeans_inertia": float(km.inertia_), "labels_csv": str(out / "labels.csv"),
            "refine_iterations": report["refine_iterations"], "refine_start": report["refine_start"],
            "graph_iterations": report["graph_iterations"], "spectral_kept": report["spectral_kept"],
            **({"graph_chosen": report["graph_chosen"]} if report["graph_chosen"] else {}),
            **({"refine_error": report["error"]} if report["error"] else {}),
            **({"refine_notes": report["notes"]} if report["notes"] else {})}


# ----------------------------------------------------------------------------- the k-means refinement

#: the summed items of a refinement exchange: a node's distances D_p (n x c) and its score (1,)
#: (a mean of its distances, or 0), both bounded by 4 (rows of unit norm), so of degree 0 in the data
REFINE_SPEC = {"D": ("arrays", 0), "score": ("arrays", 0)}


def _labels_exchange(transport, m: int, kind: str, spec: dict, n_clusters: int, secure: bool):
    """``exchange(labels) -> {item: sum over the nodes}`` of the items of ``spec``: one ``kind``
    message per node carrying the labels (masked sums under secure aggregation, at the public
    scale of degree-0 items)."""
    return _array_exchange(transport, m, kind, spec, secure,
                           lambda labels: ({"labels": np.asarray(labels, dtype=np.int64)},
                                           {"n_clusters": int(n_clusters)}))


def _array_exchange(transport, m: int, kind: str, spec: dict, secure: bool, payload: Callable):
    """``exchange(x) -> {item: sum over the nodes}``: one ``kind`` message per node with the arrays
    and scalars ``payload(x)`` (masked sums under secure aggregation, at the public scale of
    degree-0 items)."""
    from fedsonmf.federation import secagg
    from fedsonmf.federation.loop import exchange_sum, with_secagg

    count = [0]

    def exchange(x) -> dict:
        count[0] += 1
        arrays, scalars = payload(x)
        msg = Message(kind, count[0], arrays, scalars)
        if secure:
            bits = secagg.server_bits(spec, 0, 0.0, m)
            _, agg = exchange_sum(transport, [with_secagg(msg, range(m), bits)] * m, bits)
            return {key: np.asarray(agg.sums[key], dtype=np.float64) for key in spec}
        replies = transport.exchange([msg] * m)
        return {key: total([rep.arrays[key] for rep in replies]) for key in spec}

    return exchange


def refine_exchange(transport, m: int, n_clusters: int, secure: bool,
                    policy: NodePolicy | None = None) -> RefineExchange:
    """The server's driver of the refinement: ``exchange(labels) -> (sum_p D_p, sum_p score_p)``
    over the nodes, one ``refine`` message each (masked sums under secure aggregation): (n, c) and
    (1,) for labels (n,); for a block of partitions (S, n), (S, n, c) and (S,) (a node sends its
    distances side by side, (n, S c)).  Partitions below the nodes' ``refine-min-cluster-size``
    (``policy``, shared with the graph stage's exchanges) are answered NaN (:class:`RefineExchange`)."""
    sums = _labels_exchange(transport, m, "refine", REFINE_SPEC, n_clusters, secure)

    def send(labels):
        out = sums(labels)
        if labels.ndim == 1:
            return out["D"], out["score"]
        S, n = labels.shape
        return (np.asarray(out["D"]).reshape(n, S, int(n_clusters)).transpose(1, 0, 2),
                np.asarray(out["score"], dtype=np.float64).reshape(S))

    return RefineExchange(send, n_clusters, policy)


# ----------------------------------------------------------------------------- the graph refinement

#: the summed item of a graph exchange: a node's neighbour counts per cluster A_p Z / n (n x c),
#: entries at most 1, so of degree 0 in the data (the fixed point's public scale: exponent 0)
GRAPH_SPEC = {"L": ("arrays", 0)}


def graph_exchange(transport, m: int, n_clusters: int, secure: bool, *, policy: NodePolicy | None = None,
                   products: Callable | None = None):
    """The server's drivers of the graph refinement, ``(exchange, both)``, one ``graph`` message per
    node each time (masked sums under secure aggregation, at the public scale of degree-0 items):

    * ``exchange(labels) -> sum_p A_p Z / n`` (n, c);
    * ``both(labels, M) -> (sum_p A_p Z / n, sum_p A_p M / n)``: the message carries a spectral block
      ``M`` (n, w) (entries at most 1) beside the labels, and each node replies the two side by side,
      (n, c + w), one masked sum -- so the spectral step's products travel with the graph
      refinement's labels (:func:`~fedsonmf.pipeline.spectral.graph_stage`).

    The two share one count of graph messages (every message's kind and round stay unique).  Labels
    below the nodes' ``refine-min-cluster-size`` (``policy``, :class:`NodePolicy`) are not sent: their
    links are NaN, and ``both`` sends the block alone through ``products`` (the spectral exchange)."""
    c = int(n_clusters)
    policy = NodePolicy(c) if policy is None else policy

    def payload(x):
        labels, M = x if isinstance(x, tuple) else (x, None)
        arrays = {"labels": np.asarray(labels, dtype=np.int64)}
        if M is not None:
            arrays["M"] = np.asarray(M, dtype=np.float64)
        return arrays, {"n_clusters": c}

    sums = _array_exchange(transport, m, "graph", GRAPH_SPEC, secure, payload)

    def policed(labels, ask: Callable, alone: Callable):
        _, reply = policy.ask(np.asarray(labels)[None], lambda ok: ask())
        return alone() if reply is None else reply

    def refused_links(labels):
        return np.full((np.size(labels), c), np.nan)

    def exchange(labels):
        return policed(labels, lambda: sums(np.asarray(labels))["L"], lambda: refused_links(labels))

    def both(labels, M):
        def ask():
            L = sums((labels, M))["L"]
            return L[:, :c], L[:, c:]

        def alone():
            if products is None:
                raise ValueError("graph_exchange: a block beside refused labels needs the products exchange")
            return refused_links(labels), products(M)

        return policed(labels, ask, alone)

    return exchange, both


def spectral_exchange(transport, m: int, secure: bool):
    """The server's driver of the graph refinement's spectral step: ``products(M) -> sum_p A_p M / n``
    over the nodes for a block ``M`` (n, c) with entries at most 1, one ``spectral`` message each
    (a masked sum under secure aggregation, at the graph exchange's public scale)."""
    sums = _array_exchange(transport, m, "spectral", GRAPH_SPEC, secure,
                           lambda M: ({"M": np.asarray(M, dtype=np.float64)}, {}))
    return lambda M: sums(M)["L"]


def _request_block(msg: Message, n: int, p: int) -> np.ndarray:
    """The block (n, c) of a spectral request, checked against this node's ``n`` samples: finite,
    entries at most 1 (the bound that keeps the reply inside the fixed point's public scale)."""
    M = np.asarray(msg.arrays["M"], dtype=np.float64)
    if M.ndim != 2 or M.shape[0] != n or not 1 <= M.shape[1] <= n:
        raise ProtocolError(f"client {p}: a spectral block of shape {M.shape} for a view of {n} samples")
    if not np.all(np.isfinite(M)) or np.max(np.abs(M)) > 1.0:
        raise ProtocolError(f"client {p}: a spectral block with entries that are not finite or exceed 1")
    return M


def _request_labels(msg: Message, n: int, p: int, what: str, min_size: int = 1, *,
                    block: Callable[[int, int], int] | None = None, held=None) -> tuple[np.ndarray, int]:
    """The labels (n,) and cluster count of a refinement request, checked against this node's ``n``
    samples and its policy: no nonempty cluster of fewer than ``min_size`` samples -- of the samples
    it holds (``held``, an incomplete view: its reply is computed from those alone).  ``block``
    (the k-means refinement's ``refine_batch_rows``): an (S, n) block of partitions side by side is
    accepted too, each checked alike, S at most ``block(n, c)``."""
    labels = np.asarray(msg.arrays["labels"], dtype=np.int64)
    c = int(msg.scalars["n_clusters"])
    if labels.shape != (n,) and not (block and labels.ndim == 2 and labels.shape[0] >= 1 and labels.shape[1] == n):
        raise ProtocolError(f"client {p}: {what} labels of shape {labels.shape} for a view of {n} samples")
    if not 1 <= c <= n:  # the reply holds n x c numbers: no more clusters than samples
        raise ProtocolError(f"client {p}: {what} request for {c} clusters of a view of {n} samples")
    if labels.size and (labels.min() < 0 or labels.max() >= c):
        raise ProtocolError(f"client {p}: {what} labels outside 0..{c - 1}")
    rows = labels.reshape(-1, n)
    if block is not None and rows.shape[0] > block(n, c):  # the node's memory: S n c distances in its reply
        raise ProtocolError(f"client {p}: a block of {rows.shape[0]} {what} partitions, more than the "
                            f"{block(n, c)} one exchange may carry for {n} samples and {c} clusters")
    if min_size > 1 and labels.size:
        small = int(smallest_clusters(rows if held is None else rows[:, held], c).min())
        if small < min_size:
            raise ProtocolError(f"client {p}: {what} labels with a cluster of {small} sample(s) "
                                f"{SMALL_CLUSTER_REFUSAL} = {min_size}")
    return labels, c


def _graph_path(sdir: Path, p: int) -> Path:
    return Path(sdir) / f"graph-{int(p)}.npz"


def node_graph(msg: Message, read_view: Callable[[], Any], sdir: Path, state, p: int, *,
               secure: bool, max_steps: int | None = None, min_size: int = 1, mask=None) -> Message:
    """A node's half of a graph exchange: its neighbour counts ``A_p Z / n`` from the k-NN graph of
    its own raw view (``read_view()``: (n, d_p)), built at the first exchange of the job and kept in
    the node's state folder (``graph-<p>.npz``, mode 0600; it never leaves the node; dropped when the
    job's view is prepared again), so the view is read only then; masked with the pair keys of the
    fit's ``state`` when the request is masked; a plain request is refused when ``secure``.  A
    ``spectral`` request (the graph refinement's spectral step) gets ``A_p M / n`` for its block
    ``M`` (n, c) instead, from the same graph, under the same rules -- and at most the columns of
    ``spectral_steps(n, c, max_steps) - 1`` such blocks per job (``max_steps``: the run config's
    ``refine-spectral-steps``; the first step is a graph exchange): the node enforces the cap that
    keeps the products from spanning half of the sample space, whatever the server asks (a count
    of columns in ``spectral-<p>.json`` of the state folder).  A ``graph`` request may carry such a
    block beside its labels (``graph_exchange``'s ``both``): the reply is then the two
    side by side, (n, c + w), and the block counts against the same cap.  Labels with a nonempty cluster of
    fewer than ``min_size`` samples (the node's ``refine-min-cluster-size``) are refused.  With an
    availability ``mask`` the graph joins the samples the node holds only (the others get no edge)."""
    import scipy.sparse as sp

    from fedsonmf.federation import secagg

    path = _graph_path(sdir, p)
    A, X = None, None
    if path.is_file():
        A = sp.csr_array(sp.load_npz(path))
        n = A.shape[0]
    else:
        X = read_view()
        n = X.shape[0]
    spectral = msg.kind == "spectral"
    block = _request_block(msg, int(n), p) if spectral or "M" in msg.arrays else None
    held = held_columns(mask, int(n), client=p)
    if not spectral:
        labels, c = _request_labels(msg, int(n), p, "graph", min_size, held=held)
    if secagg.SECAGG_KEY not in msg.scalars:
        refuse_clear(secure, p, "the graph refinement's neighbour counts are", "this request")
    if block is not None:
        _count_spectral_columns(sdir, p, int(n), block.shape[1], _spectral_max(max_steps))
    if A is None:  # built at the first request: a graph one names c, a spectral block is (n, c)
        clusters = int(block.shape[1]) if spectral and block is not None else c
        A = client_graph(X, held=held, n_clusters=clusters)
        _atomic_write(path, lambda fh: sp.save_npz(fh, sp.csr_matrix(A), compressed=False))
    if spectral:
        L = client_products(A, block)
    else:  # a graph request; with a block: the two replies side by side, (n, c + w)
        L = client_links(A, labels, c)
        if block is not None:
            L = np.hstack([L, client_products(A, block)])
    reply = Message(msg.kind, msg.round, {"L": L})
    if secagg.SECAGG_KEY in msg.scalars:
        _, reply = secagg.client_mask(state, reply, msg, GRAPH_SPEC)
    return reply


def _spectral_max(max_steps: int | None) -> int:
    return int(default("refine_spectral_steps") if max_steps is None else max_steps)


def _count_spectral_columns(sdir: Path, p: int, n: int, width: int, max_steps: int) -> None:
    """Count the columns of one more spectral block answered in this job, or refuse it.

    The honest server asks T - 1 blocks of c columns, T = min(max_steps, n // (2c)), so
    (T - 1) c <= min((max_steps - 1) c, n // 2 - c); the node counts columns, not blocks, so a server
    that varies the blocks' widths still gets fewer than n / 2 columns in all."""
    path = Path(sdir) / f"spectral-{int(p)}.json"
    answered = int(json.loads(path.read_text())["columns"]) if path.is_file() else 0
    limit = max(0, min((int(max_steps) - 1) * width, n // 2 - width))
    if answered + width > limit:
        raise ProtocolError(f"client {p}: refused a spectral block of {width} columns: {answered} answered of the "
                            f"{limit} this job may ask (refine-spectral-steps, at most n // (2c) steps)")
    _atomic_write(path, lambda fh: fh.write(json.dumps({"columns": answered + width}).encode()))


def node_refine(msg: Message, X, state, p: int, *, secure: bool, min_size: int = 1, mask=None) -> Message:
    """A node's half of a refinement exchange: its distances D_p from its own raw view ``X``
    (n, d_p) and its score (its k-means objective as a share of its spread when its view is dense,
    else 0: decided from its own view), masked with the pair keys of the fit's ``state`` when the
    request is masked; a plain request is refused when ``secure``, and labels with a nonempty
    cluster of fewer than ``min_size`` samples (the node's ``refine-min-cluster-size``) always.  With
    an availability ``mask`` the cluster means, the score and the distances come from the samples the
    node holds (the others' rows are zero: they add nothing to the sum over the nodes)."""
    from fedsonmf.federation import secagg

    held = held_columns(mask, X.shape[0], client=p)
    labels, c = _request_labels(msg, X.shape[0], p, "refine", min_size, block=batch_rows, held=held)
    Y = refine_view(X, held=held)
    D, score = client_refine(Y, labels, c, held=held, scores=score_weight(Y, held=held))
    if labels.ndim == 2:  # a block: the distances side by side, (n, S c), the scores (S,)
        D = np.ascontiguousarray(np.transpose(D, (1, 0, 2)).reshape(X.shape[0], -1))
    reply = Message("refine", msg.round, {"D": D, "score": score})
    if secagg.SECAGG_KEY in msg.scalars:
        _, reply = secagg.client_mask(state, reply, msg, REFINE_SPEC)
    else:
        refuse_clear(secure, p, "the refinement's distances are", "this request")
    return reply
