"""Scale benchmark suite: BLAS-bound local step, round time and peak memory, scaling.

Measured side by side in one run (each case in a fresh subprocess so peak RSS
is its own):

1. ratio = time of one local iteration / time of the two products X V^T and
   U^T X alone, for a dense (n=100 000, d=500, r=20) and a sparse (n=1 000 000,
   d=1 000, density 0.5 %) view;  target <= 1.5;
2. time and peak memory of one round (m=4 views, tau=10) at those sizes;
   memory reported as peak RSS growth / unavoidable footprint (the input plus
   the r x n matrices each client and the server must keep);
3. growth of the round time with n, d_p, m and nnz (fitted exponent).

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--out benchmarks/results/scale.json]

``--quick`` divides every size by 10 (for a smoke check).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def make_views(kind: str, m: int, n: int, d: int, density: float, seed: int = 0):
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    if kind == "dense":
        return [rng.random((n, d)) for _ in range(m)]
    views = []
    for _ in range(m):
        nnz = int(n * d * density)
        rows = rng.integers(0, n, nnz)
        cols = rng.integers(0, d, nnz)
        X = sp.csr_matrix((rng.random(nnz), (rows, cols)), shape=(n, d))
        X.sum_duplicates()
        views.append(X)
    return views


def case_ratio(kind, n, d, r, density, reps=3):
    """Time of one local iteration vs the two data products alone."""
    from fedsonmf._validation import check_views
    from fedsonmf.core._linalg import ut_x, x_vt
    from fedsonmf.core.init import random_basis
    from fedsonmf.core.ustep import PenaltyOptions
    from fedsonmf.core.vstep import local_round

    (X,) = check_views(make_views(kind, 1, n, d, density), r)
    rng = np.random.default_rng(1)
    U = random_basis(d, r, rng)
    V = np.maximum(ut_x(U, X), 0.0)  # the library's projection initialisation (keeps its layout)
    # bring U and V to a consistent point first (as in a running federation)
    res = local_round(X, U, V, None, alpha=0.01, mu=0.0, tau=3, rho1=1.0, ustep=PenaltyOptions())
    U, V = res.U, np.maximum(res.Vhat, 0.0)
    C = 0.01 * (V - V.mean())  # a correction with the same layout as V

    def products():
        x_vt(X, V)
        ut_x(U, X)

    def step():
        local_round(X, U, V, C, alpha=0.01, mu=0.1, tau=5, rho1=1.0, ustep=PenaltyOptions())

    products()
    t0 = time.perf_counter()
    for _ in range(reps):
        products()
    t_prod = (time.perf_counter() - t0) / reps
    step()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    t_step = (time.perf_counter() - t0) / (5 * reps)
    return {"seconds_products": t_prod, "seconds_local_iteration": t_step, "ratio": t_step / t_prod}


def case_round(kind, m, n, d, r, density, tau=10, diagnostics=True):
    """Wall time and peak RSS growth of the setup + one round."""
    import resource

    from fedsonmf import federated_sonmf

    views = make_views(kind, m, n, d, density)
    input_bytes = sum(v.data.nbytes + v.indices.nbytes + v.indptr.nbytes if hasattr(v, "indptr") else v.nbytes
                      for v in views)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    res = federated_sonmf(views, r, tau=tau, max_rounds=1, tol=0, random_state=0, mu=0.1, diagnostics=diagnostics)
    secs = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    state = 8 * r * n * (3 * m + 2)  # per client: U^T X cache, G_prev, V_prev; server: Vbar, V
    footprint = input_bytes + state
    return {"seconds_setup_plus_round": secs, "seconds_round": res.history.rows[0]["seconds"],
            "input_bytes": input_bytes, "state_bytes": state, "peak_bytes": peak,
            "peak_over_footprint": peak / footprint, "rss_before_fit": base}


def run_sub(fn: str, **kw):
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_scale as b; "
            f"print(json.dumps(b.{fn}(**{kw!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/scale.json"))
    ap.add_argument("--skip-scaling", action="store_true")
    args = ap.parse_args()
    q = 10 if args.quick else 1
    dense = dict(kind="dense", n=100_000 // q, d=500, r=20, density=1.0)
    sparse = dict(kind="sparse", n=1_000_000 // q, d=1_000, r=20, density=0.005)
    report = {"threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}

    for name, c in (("dense", dense), ("sparse", sparse)):
        report[f"ratio_{name}"] = {**c, **run_sub("case_ratio", **c)}
        print(f"[ratio {name}] {report[f'ratio_{name}']}", flush=True)
    for name, c in (("dense", dense), ("sparse", sparse)):
        for diag in (True, False):
            key = f"round_{name}_{'diag' if diag else 'nodiag'}"
            report[key] = {**c, "m": 4, "tau": 10, "diagnostics": diag,
                           **run_sub("case_round", m=4, tau=10, diagnostics=diag, **c)}
            print(f"[{key}] {report[key]}", flush=True)

    if not args.skip_scaling:
        scaling = {}
        base = dict(kind="sparse", m=2, n=100_000 // q, d=500, r=10, density=0.01, tau=5, diagnostics=False)
        grids = {"n": [25_000 // q, 50_000 // q, 100_000 // q, 200_000 // q], "d": [250, 500, 1000, 2000],
                 "m": [1, 2, 4, 8], "density": [0.0025, 0.005, 0.01, 0.02]}
        for var, values in grids.items():
            times = [run_sub("case_round", **{**base, var: v})["seconds_round"] for v in values]
            x = np.asarray(values, float) * (base["n"] * base["d"] if var == "density" else 1)
            slope = float(np.polyfit(np.log(x), np.log(times), 1)[0])
            scaling[var if var != "density" else "nnz"] = {"values": values, "seconds_round": times, "exponent": slope}
            print(f"[scaling {var}] {values} -> {np.round(times, 3).tolist()}  exponent {slope:.2f}", flush=True)
        report["scaling"] = {"base": base, **scaling}

    from fedsonmf._io import new_private_dir, write_json_atomic  # 0600, atomic

    new_private_dir(args.out.parent)
    write_json_atomic(args.out, report, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
