"""Secure aggregation: cost per round and accuracy against the plain run.

For each size the same views, config and seed run plain and with ``secure_aggregation=True``

* in process (BLAS pinned to one thread): seconds per round, bytes up per client per round,
  the relative difference of V after the run, and the quantisation error alone -- the
  relative error of the round-1 server state V-bar^2 and of V-bar^1 (same inputs in both runs,
  so the difference is the fixed point's only);
* on a loopback Flower deployment (``--flower``; 3 views of the ``synthetic3`` size): seconds
  per round and the serialised array bytes Flower moved per round, plain and secure.

    .venv/bin/python benchmarks/bench_secagg.py [--rounds 5] [--flower] [--out benchmarks/results/secagg.json]

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

from fedsonmf._validation import check_views
from fedsonmf.datasets import make_synthetic
from fedsonmf.federation.inprocess import run_inprocess
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="synthetic3,synthetic,large")
    ap.add_argument("--flower", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/secagg.json"))
    args = ap.parse_args(argv)
    result = {"machine": {"python": sys.version.split()[0], "platform": platform.platform()},
              "inprocess": [bench_inprocess(s, args.rounds) for s in args.sizes.split(",")]}
    for row in result["inprocess"]:
        print(json.dumps(row), flush=True)
    if args.flower:
        result["flower"] = bench_flower(args.rounds)
        print(json.dumps(result["flower"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
