"""The privacy audit: what may cross the wire, and a check of a recorded wire log.

Declared payload (r = rank, n = samples; nothing else may travel):

==========  ========  ===========================================================
direction   kind      content
==========  ========  ===========================================================
down        hello     ``fedsonmf.meta`` only (handshake)
up          hello     ``fedsonmf.meta`` only (the node's partition-id and its view's
                      ``d, n``, or ``error``: why the view cannot be used)
down        setup     scalars ``seed, client, algorithm, config`` (no arrays)
up          setup     scalars ``d, n`` (+ ``x_sqnorm`` with init_v="random");
                      array ``Vproj`` (r x n) with init_v="projection"
down        round     arrays ``algorithm.downlink_keys``, each r x n
up          round     arrays ``algorithm.uplink_keys``, each r x n; with diagnostics
                      on: diagnostic array ``grad0`` (r x n, the gradient at the
                      round start, used for R_V) and scalars ``f0, rU0, rU``
==========  ========  ===========================================================

``fedsonmf.meta`` (kind, round, client index, job id, partition-id) is
transport metadata.  Note that ``d`` (a client's feature count) is disclosed
at the handshake (so the server can check r <= d_p before round 1) and at setup.  No array with a d_p dimension (X_p, U_p, X_p V^T) may ever travel.
"""

from __future__ import annotations

from typing import Iterable

from fedsonmf.algorithms import get_algorithm
from fedsonmf.federation.flower import codec
from fedsonmf.protocol.config import FedConfig

__all__ = ["declared_payload", "audit_wire", "AuditError", "DIAGNOSTIC_ARRAYS", "DIAGNOSTIC_SCALARS"]

from fedsonmf.core.residuals import DIAGNOSTIC_ARRAYS, DIAGNOSTIC_SCALARS  # noqa: E402  (declared by their producer)
from fedsonmf.exceptions import AuditError

META_KEYS = {"kind", "round", "client", "job-id", "partition-id", "d", "n", "error"}


def declared_payload(algorithm, cfg: FedConfig) -> dict:
    """``{(direction, kind): {record name: {key: "rn" | "scalar"}}}`` of what may travel."""
    alg = get_algorithm(algorithm)
    setup_arrays, setup_scalars = alg.setup_uplink(cfg)
    setup_up = {codec.SCALARS: {k: "scalar" for k in setup_scalars}}
    if setup_arrays:
        setup_up[codec.ARRAYS] = {k: "rn" for k in setup_arrays}
    round_up = {codec.ARRAYS: {k: "rn" for k in alg.uplink_keys}}
    if cfg.diagnostics:
        round_up[codec.DIAG_ARRAYS] = {k: "rn" for k in DIAGNOSTIC_ARRAYS}
        round_up[codec.DIAG_SCALARS] = {k: "scalar" for k in DIAGNOSTIC_SCALARS}
    return {
        ("down", "hello"): {},
        ("up", "hello"): {},
        ("down", "setup"): {codec.SCALARS: {k: "scalar" for k in ("seed", "client", "algorithm", "config")}},
        ("up", "setup"): setup_up,
        ("down", "round"): {codec.ARRAYS: {k: "rn" for k in alg.downlink_keys},
                            **({codec.SCALARS: {"mu": "scalar"}} if cfg.mu_is_auto else {})},
        ("up", "round"): round_up,
    }


def audit_wire(rows: Iterable[dict], algorithm, cfg: FedConfig, n_samples: int) -> dict:
    """Check every recorded message (rows of ``wire.jsonl``) against :func:`declared_payload`.

    Every record and key must be declared, every declared algorithm key must be
    present, every array must be float64 of shape (r, n).  Returns a summary
    (messages per kind, algorithm and diagnostic bytes per kind); raises
    :class:`AuditError` listing every violation.
    """
    decl = declared_payload(algorithm, cfg)
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
        where = f"message {i} ({row['direction']} {kind} round {meta.get('round', {}).get('value')}, client {row['client']})"
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
                if allowed[name][k] == "rn":
                    if item.get("shape") != [r, n] or item.get("dtype") != "float64":
                        bad.append(f"{where}: {name}[{k!r}] has shape {item.get('shape')} dtype "
                                   f"{item.get('dtype')}, declared float64 ({r}, {n})")
                elif "shape" in item:
                    bad.append(f"{where}: {name}[{k!r}] is an array, declared a scalar")
                s["bytes_diagnostics" if name.startswith("fedsonmf.diag") else "bytes"] += int(item["bytes"])
        for name, keys in allowed.items():
            missing = set(keys) - set(recs.get(name, {}).get("items", {}))
            if missing:
                bad.append(f"{where}: declared {name} keys {sorted(missing)} are missing")
    if bad:
        raise AuditError(f"{len(bad)} wire audit violation(s):\n" + "\n".join(bad[:50]))
    return summary
