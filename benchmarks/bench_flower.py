"""Flower loopback deployment vs the in-process engine: start-up, seconds per round, bytes.

For each size, the same views, config and seed run

* in process (``run_inprocess``, BLAS pinned to one thread), and
* on a loopback Flower deployment (1 SuperLink + one SuperNode per view, separate
  processes, fast settings of FLOWER.md: own 20 ms push/pull loop,
  FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.05, BLAS pinned to one thread),

and records: fixed start-up (everything that is not a round: deployment start,
``flwr run`` submission, ServerApp spawn, handshake, setup exchange), seconds per
round, algorithm and diagnostic bytes per round per client (the library's count,
``Message.nbytes``) and the serialised array bytes Flower moved, and whether
both engines gave the same V.

    .venv/bin/python benchmarks/bench_flower.py [--rounds 3] [--sizes synthetic,large] \
        [--out benchmarks/results/flower.json]

Sizes: ``synthetic`` = make_synthetic defaults (m=10 views, n=100, d=20, r=6);
``large`` = m=3 views, n=30 000, d=60, r=20.  Takes ≈3-5 min on 2 cores.
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
from fedsonmf.federation.flower import run_flower, write_views
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.protocol.config import FedConfig

SIZES = {
    "synthetic": dict(n_clients=10, n_samples=100, n_features=20, rank=6),
    "large": dict(n_clients=3, n_samples=30_000, n_features=60, rank=20),
}


def _per_client(hist, m):
    rows = hist.rows
    return {
        "bytes_up": rows[-1]["bytes_up"] / m,
        "bytes_down": rows[-1]["bytes_down"] / m,
        "bytes_diagnostics": rows[-1]["bytes_diagnostics"] / m,
    }


def bench(size: str, rounds: int, seed: int = 0) -> dict:
    spec = SIZES[size]
    data = make_synthetic(**spec, heterogeneity=0.6, random_state=seed)
    r, m = spec["rank"], spec["n_clients"]
    cfg = FedConfig(n_components=r)
    views = check_views(data.views, r)

    t0 = time.perf_counter()
    with threadpool_limits(1):
        ref = run_inprocess(views, cfg, max_rounds=rounds, seed=seed)
    wall_in = time.perf_counter() - t0
    secs_in = [row["seconds"] for row in ref.history.rows]

    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        paths = write_views(data.views, Path(tmp) / "views")
        t0 = time.perf_counter()
        res = run_flower(paths, cfg, run_dir=Path(tmp) / "run", max_rounds=rounds, seed=seed,
                         secure_aggregation=cfg.secure_aggregation)  # the same protocol as in-process
        wall_fl = time.perf_counter() - t0
    secs_fl = [row["seconds"] for row in res.history.rows]
    fl = res.extra["flower"]
    wire = fl["wire_bytes"]
    rounds_wire = [w for w in wire if w["kind"] == "round"]
    return {
        "size": size, "spec": spec, "rounds": rounds,
        "inprocess": {
            "wall_seconds": wall_in, "startup_seconds": wall_in - sum(secs_in),
            "seconds_per_round": float(np.mean(secs_in)), "round_seconds": secs_in,
        },
        "flower": {
            "wall_seconds": wall_fl, "startup_seconds": wall_fl - sum(secs_fl),
            "deployment_start_seconds": fl["startup_seconds"], "flwr_run_seconds": fl["flwr_run_seconds"],
            "handshake_seconds": fl["handshake_seconds"],
            "seconds_per_round": float(np.mean(secs_fl)), "round_seconds": secs_fl,
            "wire_array_bytes_per_round_per_client": {
                "down": float(np.mean([w["down"] for w in rounds_wire])) / m,
                "up": float(np.mean([w["up"] for w in rounds_wire])) / m,
            },
        },
        "bytes_per_round_per_client": _per_client(res.history, m),
        "max_abs_diff_V": float(np.max(np.abs(res.V - ref.V))),
        "bit_identical": bool(np.array_equal(res.V, ref.V)),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="synthetic,large")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "flower.json")
    args = ap.parse_args(argv)
    results = []
    for size in args.sizes.split(","):
        print(f"[{size}] running ...", flush=True)
        out = bench(size, args.rounds)
        fl, inp = out["flower"], out["inprocess"]
        print(f"[{size}] in-process {inp['seconds_per_round']:.3f} s/round (start-up {inp['startup_seconds']:.2f} s); "
              f"flower {fl['seconds_per_round']:.2f} s/round (start-up {fl['startup_seconds']:.1f} s); "
              f"bytes/round/client {out['bytes_per_round_per_client']}; bit-identical {out['bit_identical']}",
              flush=True)
        results.append(out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    import flwr

    args.out.write_text(json.dumps({
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "flwr": flwr.__version__,
                    "cpus": __import__("os").cpu_count()},
        "results": results,
    }, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
