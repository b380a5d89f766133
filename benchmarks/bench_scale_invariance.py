"""Scale invariance: a fit on c * X gives the same bases and c * V, in about the same time.

For c in {1e-6, 1e-3, 1, 1e3, 1e6}: the same synthetic problem (10 views, n = 100, d = 20,
r = 6, h = 0.6) fitted with the library defaults (mu = "auto", rho1 = 0), a fixed number of
rounds, one core.  Reports seconds per fit and the ratio to c = 1, the largest difference of
the bases and of V / c against c = 1.

    .venv/bin/python benchmarks/bench_scale_invariance.py [--rounds 30] [--repeats 3]

Results: ``benchmarks/results/scale_invariance.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from fedsonmf import federated_sonmf
from fedsonmf._io import new_private_dir, write_json_atomic
from fedsonmf.datasets import make_synthetic

SCALES = (1e-6, 1e-3, 1.0, 1e3, 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/scale_invariance.json"))
    args = ap.parse_args()
    data = make_synthetic(n_clients=10, n_samples=100, n_features=20, rank=6, heterogeneity=0.6, random_state=0)
    runs = {}
    with threadpool_limits(1):
        for c in SCALES:
            views = [c * v for v in data.views]
            secs = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                res = federated_sonmf(views, 6, max_rounds=args.rounds, tol=0, random_state=0)
                secs.append(time.perf_counter() - t0)
            runs[c] = (res, min(secs))
    ref, t_ref = runs[1.0]
    out = []
    print(f"{'c':>8s} {'s/fit':>7s} {'ratio':>6s} {'max|U - U(1)|':>14s} {'max|V/c - V(1)|/max V(1)':>25s}")
    for c, (res, t) in runs.items():
        du = max(float(np.max(np.abs(a - b))) for a, b in zip(res.bases, ref.bases))
        dv = float(np.max(np.abs(res.V / c - ref.V)) / np.max(ref.V))
        out.append({"c": c, "seconds": t, "ratio_to_c1": t / t_ref, "max_abs_diff_U": du, "rel_diff_V_over_c": dv})
        print(f"{c:8.0e} {t:7.3f} {t / t_ref:6.2f} {du:14.2e} {dv:25.2e}")
    new_private_dir(args.out.parent)
    write_json_atomic(args.out, {"rounds": args.rounds, "repeats": args.repeats, "runs": out}, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
