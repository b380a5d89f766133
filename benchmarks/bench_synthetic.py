"""Benchmark: convergence and speed on the paper's synthetic set-up.

10 clients, n = 100, d_p = 20, r = 6, tau = 10, default parameters.  Reports,
for h in {0, 0.3, 0.6, 0.9} and correction on/off, the rounds until
R^s/R^1 <= 1e-2 (and under the other normalisations), and the wall time of a
30-round run; the U-solver variants are timed side by side in the same run.

    .venv/bin/python benchmarks/bench_synthetic.py [--seeds 3] [--out benchmarks/results/synthetic.json]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info

from fedsonmf import federated_sonmf
from fedsonmf._io import new_private_dir, write_json_atomic
from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.datasets import make_synthetic
from fedsonmf.protocol.params import SYNTHETIC_STUDY

METRICS = ("R_rel", "R_avg_rel", "R_rel0", "R_avg_rel0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/synthetic.json"))
    args = ap.parse_args()

    rows = []
    for h in (0.0, 0.3, 0.6, 0.9):
        for corr in (True, False):
            per_seed = []
            for seed in range(args.seeds):
                data = make_synthetic(heterogeneity=h, random_state=seed)
                t0 = time.perf_counter()
                res = federated_sonmf(data.views, 6, max_rounds=args.rounds, tol=0, correction=corr, random_state=seed,
                                     **SYNTHETIC_STUDY)
                secs = time.perf_counter() - t0
                per_seed.append({
                    "seed": seed, "seconds": secs,
                    **{f"rounds_{m}": res.history.rounds_to(1e-2, m) for m in METRICS},
                    "final_R_rel": float(res.history.column("R_rel")[-1]),
                })
            rows.append({"h": h, "correction": corr, "runs": per_seed})
            r = [p["rounds_R_rel"] for p in per_seed]
            print(f"h={h:.1f} correction={corr!s:5}  rounds to R/R1<=1e-2 per seed: {r}  "
                  f"final R/R1 median {np.median([p['final_R_rel'] for p in per_seed]):.2e}  "
                  f"mean {np.mean([p['seconds'] for p in per_seed]):.2f} s / {args.rounds} rounds")

    # U-solver variants side by side (same data, same seed, same process)
    data = make_synthetic(heterogeneity=0.6, random_state=0)
    variants = {
        "default (eps1_rel=1e-2)": PenaltyOptions(),
        "spec eps1_rel=1e-6": PenaltyOptions(eps1_rel=1e-6),
        "polish only (no penalty)": PenaltyOptions(use_penalty=False),
    }
    timing = {}
    for name, opts in variants.items():
        t0 = time.perf_counter()
        res = federated_sonmf(data.views, 6, max_rounds=args.rounds, tol=0, random_state=0, ustep=opts,
                                 **SYNTHETIC_STUDY)
        secs = time.perf_counter() - t0
        timing[name] = {"seconds": secs, "rounds_to_1e-2": res.history.rounds_to(1e-2),
                        "final_R_rel": float(res.history.column("R_rel")[-1])}
        print(f"{name:28s} {secs:6.2f} s / {args.rounds} rounds   rounds to 1e-2: {timing[name]['rounds_to_1e-2']}")
    base = timing["default (eps1_rel=1e-2)"]["seconds"]
    for name in timing:
        timing[name]["ratio_to_default"] = timing[name]["seconds"] / base

    new_private_dir(args.out.parent)
    write_json_atomic(args.out, {
        "machine": {"python": platform.python_version(), "processor": platform.processor(),
                    "blas": [{k: i.get(k) for k in ("internal_api", "num_threads", "version")}
                             for i in threadpool_info()]},
        "setup": {"n_clients": 10, "n_samples": 100, "n_features": 20, "rank": 6, "tau": 10, "rounds": args.rounds,
                  "seeds": args.seeds},
        "convergence": rows, "ustep_variants": timing,
    }, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
