"""Secure aggregation: cost per round and accuracy against the plain run.

For each size the same views, config and seed run plain and with ``secure_aggregation=True``

* in process (BLAS pinned to one thread): seconds per round, bytes up per client per round,
  the relative difference of V after the run, and the quantisation error alone -- the
  relative error of the round-1 server state V-bar^2 and of V-bar^1 (same inputs in both runs,
  so the difference is the fixed point's only);
* on a loopback Flower deployment (``--flower``; 3 views of the ``synthetic3`` size): seconds
  per round and the serialised array bytes Flower moved per round, plain and secure;
* the cost of threshold recovery (``--dropout``; m = 5, 10, 20 views of n = 100, d = 20,
  r = 6): in process, the secure run without participation (no self masks, no unmask step)
  against the partial run with Shamir shares (``Participation(min_clients=t)``) with nobody
  lost and with one client lost after uploading (before the unmask step): seconds per round,
  bytes per round by message kind (the encrypted shares ride on the round replies and the
  unmask requests; the revealed shares are the unmask replies), and the client's and the
  server's share arithmetic timed alone.

    .venv/bin/python benchmarks/bench_secagg.py [--rounds 5] [--flower] [--dropout] \
        [--out benchmarks/results/secagg.json]

Takes ~1 min in process; the Flower part ~5-8 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from fedsonmf._io import write_json_atomic
from fedsonmf._validation import check_views
from fedsonmf.datasets import make_synthetic
from fedsonmf.federation.inprocess import InProcessTransport, run_inprocess
from fedsonmf.protocol.config import FedConfig

SIZES = {
    "synthetic3": dict(n_clients=3, n_samples=100, n_features=20, rank=6),
    "synthetic": dict(n_clients=10, n_samples=100, n_features=20, rank=6),
    "large": dict(n_clients=3, n_samples=30_000, n_features=60, rank=20),
}


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _views(size: str, seed: int = 0):
    spec = SIZES[size]
    data = make_synthetic(**spec, heterogeneity=0.6, random_state=seed)
    return data.views, spec["rank"]


def bench_inprocess(size: str, rounds: int) -> dict:
    views, r = _views(size)
    views_dn = check_views(views, r)
    cfg = FedConfig(n_components=r)
    out = {"size": size, **SIZES[size], "rounds": rounds}
    res = {}
    with threadpool_limits(1):
        for name, c in (("plain", cfg), ("secure", cfg.replace(secure_aggregation=True))):
            t0 = time.perf_counter()
            run = run_inprocess(views_dn, c, max_rounds=rounds, seed=1)
            total = time.perf_counter() - t0
            one = run_inprocess(views_dn, c, max_rounds=1, seed=1)
            rows = run.history.rows
            res[name] = run
            out[name] = {
                "seconds_per_round": float(np.mean([row["seconds"] for row in rows])),
                "seconds_total": total,
                "bytes_up_per_client": rows[-1]["bytes_up"] / len(views),
                "bytes_diagnostics_per_client": rows[-1]["bytes_diagnostics"] / len(views),
                "Vbar2": one.server_state.arrays["Vbar"],
            }
    # V-bar^2 after one round: the same uploads in both runs except the V-bar^1 they start from
    p, s = out["plain"].pop("Vbar2"), out["secure"].pop("Vbar2")
    out["round1_Vbar_rel_error"] = _rel(s, p)
    out["V_rel_difference"] = _rel(res["secure"].V, res["plain"].V)
    out["objective_rel_difference"] = abs(res["secure"].history.rows[-1]["objective"]
                                          - res["plain"].history.rows[-1]["objective"]) / abs(
        res["plain"].history.rows[-1]["objective"])
    return out


def bench_flower(rounds: int) -> dict:
    from fedsonmf.federation.flower import run_flower, write_views

    views, r = _views("synthetic3")
    cfg = FedConfig(n_components=r)
    out = {"size": "synthetic3", **SIZES["synthetic3"], "rounds": rounds}
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_views(views, Path(tmp) / "views")
        for name, secure in (("plain", False), ("secure", True)):
            res = run_flower(paths, cfg, run_dir=Path(tmp) / name, max_rounds=rounds, seed=1,
                             secure_aggregation=secure)
            fl = res.extra["flower"]
            wb = [w for w in fl["wire_bytes"] if w["kind"] == "round"]
            out[name] = {
                "seconds_per_round": float(np.mean([row["seconds"] for row in res.history.rows])),
                "wall_seconds": fl["wall_seconds"],
                "wire_bytes_up_per_round": float(np.mean([w["up"] for w in wb])),
                "wire_bytes_down_per_round": float(np.mean([w["down"] for w in wb])),
                "setup_exchanges": sorted({w["kind"] for w in fl["wire_bytes"]} - {"round"}),
                "V": res.V,
            }
    out["V_rel_difference"] = _rel(out["secure"].pop("V"), out["plain"].pop("V"))
    return out


class _LosingTransport(InProcessTransport):
    """In-process transport whose ``lost`` clients upload their round-2 reply and are gone
    before its unmask request."""

    def __init__(self, clients, lost=()):
        super().__init__(clients)
        self.lost = set(lost)

    def exchange_some(self, messages):
        first = next(iter(messages.values()), None)
        if first is not None and first.kind == "unmask" and first.round == 2:
            messages = {p: m for p, m in messages.items() if p not in self.lost}
        return super().exchange_some(messages)


def bench_dropout(ms=(5, 10, 20), rounds: int = 5) -> list[dict]:
    """The cost of threshold recovery (module docstring), one row per m."""
    from fedsonmf.federation import secagg
    from fedsonmf.federation.loop import ClientRuntime, run_federation
    from fedsonmf.protocol.participation import Participation

    rows = []
    for m in ms:
        data = make_synthetic(n_clients=m, n_samples=100, n_features=20, rank=6, heterogeneity=0.6, random_state=0)
        views = check_views(data.views, 6)
        cfg = FedConfig(n_components=6, secure_aggregation=True)
        t = secagg.threshold(None, m)
        out: dict = {"m": m, "n": 100, "d": 20, "r": 6, "rounds": rounds, "threshold": t}
        Vs = {}
        with threadpool_limits(1):
            for name, part, lost in (("full_no_dropout_tolerance", None, ()),
                                     ("threshold_nobody_lost", Participation(min_clients=t, rejoin="refresh"), ()),
                                     ("threshold_one_lost_at_unmask", Participation(min_clients=t, rejoin="refresh"),
                                      (m - 1,))):
                clients = [ClientRuntime(X, "fedsonmf", cfg) for X in views]
                tr = _LosingTransport(clients, lost)
                tr.log = []
                t0 = time.perf_counter()
                res = run_federation(tr, "fedsonmf", cfg, max_rounds=rounds, seed=1, participation=part)
                total = time.perf_counter() - t0
                per_kind: dict = {}
                for d, _p, msg in tr.log:
                    if msg.kind in ("round", "unmask"):
                        key = f"{msg.kind}_{d}"
                        per_kind[key] = per_kind.get(key, 0) + msg.nbytes
                out[name] = {"seconds_per_round": float(np.mean([r["seconds"] for r in res.history.rows])),
                             "seconds_total": total,
                             "bytes_per_round": {k: v / rounds for k, v in sorted(per_kind.items())},
                             "shares_bytes_per_client_per_round": int(m * (33 * m + 16))}
                Vs[name] = res.V
        out["V_equal_bit_for_bit"] = bool(all(np.array_equal(V, Vs["full_no_dropout_tolerance"]) for V in Vs.values()))
        # the share arithmetic alone: one client's dealing, one holder's opening, the server's rebuild
        keys = [secagg.generate_keypair() for _ in range(m)]
        pairs = secagg.pair_keys(keys[0][0], [pk for _, pk in keys], 0, "bench")
        seed = bytes(32)
        t0 = time.perf_counter()
        secagg.deal_shares(pairs, seed, 0, list(range(m)), "label", t)
        out["seconds_deal_per_client"] = time.perf_counter() - t0
        from fedsonmf.federation import shamir
        t0 = time.perf_counter()
        ys = [shamir.split(bytes(32), t, range(1, m + 1)) for _ in range(m)]
        for y in ys:  # the server's rebuild of one key per survivor (no one dropped: the self keys)
            shamir.reconstruct({x: y[x - 1] for x in range(1, m + 1)}, t)
        out["seconds_split_and_rebuild_m_keys"] = time.perf_counter() - t0
        rows.append(out)
        print(json.dumps(out), flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="synthetic3,synthetic,large")
    ap.add_argument("--flower", action="store_true")
    ap.add_argument("--dropout", action="store_true", help="only the cost of threshold recovery (see above)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/secagg.json"))
    args = ap.parse_args(argv)
    machine = {"python": sys.version.split()[0], "platform": platform.platform()}
    if args.dropout:
        write_json_atomic(args.out if args.out != ap.get_default("out") else
                          Path("benchmarks/results/secagg_dropout.json"),
                          {"machine": machine, "dropout": bench_dropout(rounds=args.rounds)})
        return
    result = {"machine": machine, "inprocess": [bench_inprocess(s, args.rounds) for s in args.sizes.split(",")]}
    for row in result["inprocess"]:
        print(json.dumps(row), flush=True)
    if args.flower:
        result["flower"] = bench_flower(args.rounds)
        print(json.dumps(result["flower"]), flush=True)
    write_json_atomic(args.out, result)  # 0600, atomically


if __name__ == "__main__":
    main()
