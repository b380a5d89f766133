"""The privacy audit: what may cross the wire, and a check of a recorded wire log.

Declared payload (r = rank, n = samples; nothing else may travel):

==========  ========  ===========================================================
direction   kind      content
==========  ========  ===========================================================
down        hello     ``fedsonmf.meta`` only (handshake); kind ``hello+setup``: also the setup's
                      scalars but ``client`` (the node uses its partition-id)
up          hello     ``fedsonmf.meta`` only (the node's partition-id and its view's
                      ``d, n``, or ``error``: why the view cannot be used; a node policy's
                      ``refine-min-cluster-size`` when above 1); kind
                      ``hello+setup``: also the setup reply (as "up setup")
down        setup     scalars ``seed, client, algorithm, config`` (no arrays); a clustering
                      run adds ``clustering`` (its preprocessing rule and Frobenius switch)
up          setup     scalars ``d, n`` (+ ``x_sqnorm`` with init_v="random");
                      array ``Vproj`` (r x n) with init_v="projection"
down        round     arrays ``algorithm.downlink_keys``, each r x n
up          round     arrays ``algorithm.uplink_keys``, each r x n; with diagnostics
                      on: scalars ``f0, rU0, rU`` and, only when the run stops on
                      R/R1 (tol > 0), the diagnostic array ``grad0`` (r x n, the
                      gradient at the round start, used for R_V); a round message
                      of a run that does not says ``residuals`` = False
==========  ========  ===========================================================

With secure aggregation (``cfg.secure_aggregation``, docs/privacy.md) every summed item
travels only masked, as a uint64 array ``secagg.<field>.<key>`` in ``fedsonmf.arrays``
(r x n for matrices -- blocks of incomplete views scattered into r x n --, shape (1,) for
scalars): the setup reply carries the public key ``secagg_pk`` and the exponent
``secagg_exp`` instead of ``Vproj``/``x_sqnorm``; an ``init`` exchange (down: the scalar
``secagg``, the relayed public keys and scales; up: the masked setup items) precedes round 1;
round messages carry the scalar ``secagg``; replies hold no plain upload or diagnostic;
partial runs' round replies also carry ``secagg.shares`` (uint8 (c, 33 c + 16): the client's
Shamir shares of the round's mask keys, encrypted to each of the c clients asked), and an
``unmask`` step follows every round (down: ``secagg`` and the shares addressed to the node,
``secagg.shares_in``; up: the revealed shares ``secagg.revealed``, uint8 (k, 1 + j, 33)).

``fedsonmf.meta`` (kind, round, client index, job id, partition-id) is
transport metadata.  Note that ``d`` (a client's feature count) is disclosed
at the handshake (so the server can check r <= d_p before round 1) and at setup.  No array
with a d_p dimension (X_p, U_p, X_p V^T) may ever travel.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedsonmf.algorithms import get_algorithm
from fedsonmf.federation.flower import codec
from fedsonmf.federation.flower.nodeconfig import MIN_CLUSTER_SIZE
from fedsonmf.protocol.config import FedConfig

__all__ = ["declared_payload", "audit_wire", "AuditError", "DIAGNOSTIC_ARRAYS", "DIAGNOSTIC_SCALARS"]

from fedsonmf.core.residuals import DIAGNOSTIC_ARRAYS, DIAGNOSTIC_SCALARS  # noqa: E402  (declared by their producer)
from fedsonmf.exceptions import AuditError  # noqa: E402
from fedsonmf.federation.loop import RESIDUALS_KEY  # noqa: E402

META_KEYS = {"kind", "round", "client", "job-id", "partition-id", "d", "n", "error", MIN_CLUSTER_SIZE, codec.IDS_DIGEST}


def declared_payload(algorithm, cfg: FedConfig, *, masked: bool = False, partial: bool = False) -> dict:
    """What may travel, per direction and message kind.

    Kinds: ``"rn"`` a float64 (r, n) matrix; ``"r*"`` a float64 (r, k) block with k <= n (the
    held columns of an incomplete view, docs/algorithm.md §15.1); ``"ids"`` an int64 vector of
    at most n sample ids; ``"n"`` a float64 vector of length n; ``"scalar"``.  A kind ending in
    ``"?"`` is optional (present only in some messages: the rejoin items of a partial run, §15.2).

    Parameters
    ----------
    algorithm : str or FederatedAlgorithm
        The algorithm whose messages are declared.
    cfg : FedConfig
        Its configuration (diagnostics, secure aggregation, DP change what travels).
    masked : bool, default=False
        Clients hold sample subsets (incomplete views).
    partial : bool, default=False
        Rounds may go on without some clients.

    Returns
    -------
    dict
        ``{(direction, kind): {record name: {key: kind}}}``.
    """
    if cfg.secure_aggregation:
        return _declared_secure(get_algorithm(algorithm), cfg, masked=masked, partial=partial)
    alg = get_algorithm(algorithm)
    block = "r*" if masked else "rn"
    setup_arrays, setup_scalars = alg.setup_uplink(cfg)
    setup_up = {codec.SCALARS: {k: "scalar" for k in setup_scalars}}
    if setup_arrays or masked:
        setup_up[codec.ARRAYS] = {k: block for k in setup_arrays}
        if masked:
            setup_up[codec.ARRAYS]["cols"] = "ids?"  # only clients that do not hold every sample
    round_up = {codec.ARRAYS: {k: block for k in alg.uplink_keys}}
    if cfg.diagnostics:  # the arrays only when the server computes R/R1 (tol > 0; RESIDUALS_KEY)
        round_up[codec.DIAG_ARRAYS] = {k: block + "?" for k in DIAGNOSTIC_ARRAYS}
        round_up[codec.DIAG_SCALARS] = {k: "scalar" for k in DIAGNOSTIC_SCALARS}
    down_round = {codec.ARRAYS: {k: "rn" for k in alg.downlink_keys}}
    down_scalars = {"mu": "scalar"}  # the l2,1 weight in force, every round
    if cfg.diagnostics:
        down_scalars[RESIDUALS_KEY] = "scalar?"  # False: no diagnostic arrays (nothing stops on R/R1)
    if masked:
        down_round[codec.ARRAYS]["w"] = "n"  # the weights m / c_j (holder counts)
    if partial:
        down_round[codec.ARRAYS].update({"V_prev": "rn?", "Gk": "rn?"})
        down_scalars["rejoin"] = "scalar?"
    if down_scalars:
        down_round[codec.SCALARS] = down_scalars
    down_setup = {codec.SCALARS: {**{k: "scalar" for k in ("seed", "client", "algorithm", "config")},
                                  "clustering": "scalar?"}}
    return {
        ("down", "hello"): {},
        ("up", "hello"): {},
        # the setup sent with the hello (one exchange less): the setup's payload, "client" = the node's view
        ("down", codec.SETUP_AT_HELLO): {codec.SCALARS: {k: v for k, v in down_setup[codec.SCALARS].items()
                                                         if k != "client"}},
        ("up", codec.SETUP_AT_HELLO): setup_up,
        # a clustering run adds its options (preprocessing rule, Frobenius switch) to the setup message
        ("down", "setup"): down_setup,
        ("up", "setup"): setup_up,
        ("down", "round"): down_round,
        ("up", "round"): round_up,
        # a clustering run's k-means refinement: the partition down, each node's distances up
        # (several partitions side by side: labels (S, n) down, distances (n, S c) and scores (S,) up)
        ("down", "refine"): {codec.ARRAYS: {"labels": "labels*"}, codec.SCALARS: {"n_clusters": "scalar"}},
        ("up", "refine"): {codec.ARRAYS: {"D": "n*", "score": "k"}},
        # its graph refinement: the partition down, each node's neighbour counts per cluster up; with a
        # spectral block beside the labels, the products with it too, side by side (n, c + w)
        ("down", "graph"): {codec.ARRAYS: {"labels": "labels", "M": "n*?"}, codec.SCALARS: {"n_clusters": "scalar"}},
        ("up", "graph"): {codec.ARRAYS: {"L": "n*"}},
        # its spectral step: a block of the server's iteration down, each node's products with its graph up
        ("down", "spectral"): {codec.ARRAYS: {"M": "n*"}},
        ("up", "spectral"): {codec.ARRAYS: {"L": "n*"}},
    }


def _declared_secure(alg, cfg: FedConfig, *, masked: bool, partial: bool) -> dict:
    """:func:`declared_payload` with secure aggregation: summed items only masked (kinds
    ``"rn-u64"``: uint64 (r, n); ``"1-u64"``: uint64 (1,))."""
    from fedsonmf.federation.secagg import MASKED_PREFIX, SECAGG_KEY

    def masked_items(kind: str) -> dict:
        out = {}
        for key, (field, _deg) in alg.summed_items(cfg, kind).items():
            scalar = field == "scalars" or (field == "diagnostics" and key in DIAGNOSTIC_SCALARS)
            # a diagnostic array travels only when the server computes R/R1 (RESIDUALS_KEY)
            optional = "?" if field == "diagnostics" and key in DIAGNOSTIC_ARRAYS else ""
            out[f"{MASKED_PREFIX}{field}.{key}"] = ("1-u64" if scalar else "rn-u64") + optional
        return out

    setup_arrays, setup_scalars = alg.setup_uplink(cfg)
    summed_setup = set(alg.summed_items(cfg, "setup"))
    setup_up = {codec.SCALARS: {**{k: "scalar" for k in setup_scalars if k not in summed_setup},
                                "secagg_pk": "scalar", "secagg_exp": "scalar", "secagg_sig": "scalar?"}}
    if masked:
        setup_up[codec.ARRAYS] = {"cols": "ids?"}
    down_scalars = {SECAGG_KEY: "scalar", "mu": "scalar", **({RESIDUALS_KEY: "scalar?"} if cfg.diagnostics else {})}
    down_round = {codec.ARRAYS: {k: "rn" for k in alg.downlink_keys}}
    if masked:
        down_round[codec.ARRAYS]["w"] = "n"
    if partial:
        down_round[codec.ARRAYS].update({"V_prev": "rn?", "Gk": "rn?"})
        down_scalars["rejoin"] = "scalar?"
    down_round[codec.SCALARS] = down_scalars
    round_up = {codec.ARRAYS: masked_items("round")}
    if partial:
        # threshold recovery: the client's encrypted Shamir shares of the round's mask keys
        round_up[codec.ARRAYS][f"{MASKED_PREFIX}shares"] = "shares"
    if partial:  # rule (b) from sums: the change of the kept G_p, and the flag telling the clients to send it
        round_up[codec.ARRAYS][f"{MASKED_PREFIX}arrays.dG"] = "rn-u64?"
        down_scalars["kept_sum"] = "scalar?"
    decl = {
        ("down", "hello"): {},
        ("up", "hello"): {},
        ("down", "setup"): {codec.SCALARS: {**{k: "scalar" for k in ("seed", "client", "algorithm", "config")},
                                             "clustering": "scalar?"}},
        ("up", "setup"): setup_up,
        # the setup sent with the hello (one exchange less): the setup's payload, "client" = the node's view
        ("down", codec.SETUP_AT_HELLO): {codec.SCALARS: {**{k: "scalar" for k in ("seed", "algorithm", "config")},
                                                         "clustering": "scalar?"}},
        ("up", codec.SETUP_AT_HELLO): setup_up,
        ("down", "init"): {codec.SCALARS: {SECAGG_KEY: "scalar"}},
        ("up", "init"): {codec.ARRAYS: masked_items("setup"),
                         codec.SCALARS: {"secagg_digest": "scalar?", "secagg_echo": "scalar?"}},
        ("down", "round"): down_round,
        ("up", "round"): round_up,
        # the k-means refinement of a clustering run: the partition down, the masked distances up
        ("down", "refine"): {codec.ARRAYS: {"labels": "labels*"},
                             codec.SCALARS: {"n_clusters": "scalar", SECAGG_KEY: "scalar"}},
        ("up", "refine"): {codec.ARRAYS: {f"{MASKED_PREFIX}arrays.D": "n*-u64",
                                          f"{MASKED_PREFIX}arrays.score": "k-u64"}},
        # the graph refinement: the partition down, the masked neighbour counts up
        ("down", "graph"): {codec.ARRAYS: {"labels": "labels", "M": "n*?"},
                            codec.SCALARS: {"n_clusters": "scalar", SECAGG_KEY: "scalar"}},
        ("up", "graph"): {codec.ARRAYS: {f"{MASKED_PREFIX}arrays.L": "n*-u64"}},
        # the graph refinement's spectral step: the server's block down, the masked products up
        ("down", "spectral"): {codec.ARRAYS: {"M": "n*"}, codec.SCALARS: {SECAGG_KEY: "scalar"}},
        ("up", "spectral"): {codec.ARRAYS: {f"{MASKED_PREFIX}arrays.L": "n*-u64"}},
    }
    if partial:
        decl[("down", "unmask")] = {codec.ARRAYS: {MASKED_PREFIX + "shares_in": "shares"},
                                    codec.SCALARS: {SECAGG_KEY: "scalar"}}
        decl[("up", "unmask")] = {codec.ARRAYS: {MASKED_PREFIX + "revealed": "revealed"}}
    return decl


def _shape_ok(kind: str, item: dict, r: int, n: int) -> bool:
    shape, dtype = item.get("shape") or [], item.get("dtype")
    if kind == "rn-u64":
        return shape == [r, n] and dtype == "uint64"
    if kind == "1-u64":
        return shape == [1] and dtype == "uint64"
    if kind == "1":
        return shape == [1] and dtype == "float64"
    if kind == "key":
        return shape == [32] and dtype == "uint8"
    if kind == "keys":
        return len(shape or []) == 2 and shape[1] == 32 and dtype == "uint8"
    if kind == "shares":  # ciphertexts of Shamir shares: 33 bytes per secret + a 16-byte tag
        return len(shape or []) == 2 and shape[1] > 16 and (shape[1] - 16) % 33 == 0 and dtype == "uint8"
    if kind == "revealed":  # revealed Shamir shares, 33 bytes each
        return len(shape or []) == 3 and shape[2] == 33 and dtype == "uint8"
    if kind == "rn":
        return shape == [r, n] and dtype == "float64"
    if kind == "r*":
        return len(shape or []) == 2 and shape[0] == r and 1 <= shape[1] <= n and dtype == "float64"
    if kind == "ids":
        return len(shape or []) == 1 and shape[0] <= n and dtype == "int64"
    if kind == "n":
        return shape == [n] and dtype == "float64"
    if kind == "labels":
        return shape == [n] and dtype == "int64"
    if kind == "labels*":  # one partition, or a block of them side by side
        return (shape == [n] or (len(shape or []) == 2 and shape[0] >= 1 and shape[1] == n)) and dtype == "int64"
    if kind == "k":
        return len(shape or []) == 1 and shape[0] >= 1 and dtype == "float64"
    if kind == "k-u64":
        return len(shape or []) == 1 and shape[0] >= 1 and dtype == "uint64"
    if kind == "n*":
        return len(shape) == 2 and shape[0] == n and dtype == "float64"
    if kind == "n*-u64":
        return len(shape) == 2 and shape[0] == n and dtype == "uint64"
    return False


def audit_wire(rows: Iterable[dict], algorithm, cfg: FedConfig, n_samples: int, *, masked: bool = False,
               partial: bool = False) -> dict:
    """Check every recorded message (rows of ``wire.jsonl``) against :func:`declared_payload`.

    Every record and key must be declared, every declared algorithm key must be present,
    every array must have its declared kind.

    Parameters
    ----------
    rows : iterable of dict
        The lines of ``wire.jsonl`` (``record-wire``), parsed.
    algorithm : str or FederatedAlgorithm
        The run's algorithm.
    cfg : FedConfig
        The run's configuration.
    n_samples : int
        n, for the declared shapes.
    masked, partial : bool, default=False
        As in :func:`declared_payload`.

    Returns
    -------
    dict
        A summary: messages per kind, algorithm and diagnostic bytes per kind.

    Raises
    ------
    AuditError
        Listing every violation.
    """
    decl = declared_payload(algorithm, cfg, masked=masked, partial=partial)
    r, n = cfg.n_components, int(n_samples)
    bad: list[str] = []
    summary: dict = {}
    for i, row in enumerate(rows):
        if "error" in row:
            bad.append(f"message {i}: error reply {row['error']}")
            continue
        recs = row["records"]
        meta = recs.get(codec.META, {}).get("items", {})
        kind = meta.get("kind", {}).get("value")
        key = (row["direction"], kind)
        rnd = meta.get("round", {}).get("value")
        where = f"message {i} ({row['direction']} {kind} round {rnd}, client {row['client']})"
        if key not in decl:
            bad.append(f"{where}: undeclared message kind")
            continue
        allowed = decl[key]
        s = summary.setdefault(f"{key[0]} {key[1]}", {"messages": 0, "bytes": 0, "bytes_diagnostics": 0})
        s["messages"] += 1
        extra_meta = set(meta) - META_KEYS
        if extra_meta:
            bad.append(f"{where}: undeclared meta keys {sorted(extra_meta)}")
        for name, rec in recs.items():
            if name == codec.META:
                continue
            if name not in allowed:
                bad.append(f"{where}: undeclared record {name!r} with keys {sorted(rec['items'])}")
                continue
            for k, item in rec["items"].items():
                if k not in allowed[name]:
                    bad.append(f"{where}: undeclared key {k!r} in record {name!r}")
                    continue
                kind_k = allowed[name][k].rstrip("?")
                if kind_k != "scalar":
                    if not _shape_ok(kind_k, item, r, n):
                        want = {"rn": f"float64 ({r}, {n})", "r*": f"float64 ({r}, k <= {n})",
                                "ids": f"int64 (k <= {n},)", "n": f"float64 ({n},)",
                                "rn-u64": f"uint64 ({r}, {n})", "1-u64": "uint64 (1,)", "1": "float64 (1,)",
                                "key": "uint8 (32,)",
                                "labels": f"int64 ({n},)", "n*": f"float64 ({n}, k)", "n*-u64": f"uint64 ({n}, k)",
                                "labels*": f"int64 ({n},) or (k, {n})", "k": "float64 (k,)", "k-u64": "uint64 (k,)",
                                "keys": "uint8 (k, 32)"}[kind_k]
                        bad.append(f"{where}: {name}[{k!r}] has shape {item.get('shape')} dtype "
                                   f"{item.get('dtype')}, declared {want}")
                elif "shape" in item:
                    bad.append(f"{where}: {name}[{k!r}] is an array, declared a scalar")
                s["bytes_diagnostics" if name.startswith("fedsonmf.diag") else "bytes"] += int(item["bytes"])
        for name, keys in allowed.items():
            required = {k for k, kind_k in keys.items() if not kind_k.endswith("?")}
            missing = required - set(recs.get(name, {}).get("items", {}))
            if missing:
                bad.append(f"{where}: declared {name} keys {sorted(missing)} are missing")
    if bad:
        raise AuditError(f"{len(bad)} wire audit violation(s):\n" + "\n".join(bad[:50]))
    return summary
