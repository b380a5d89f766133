"""Dense or sparse storage of a mostly-zero view: the two data products side by side.

For a dense (n, d) array with a given share of nonzeros, one core, the time of the fit's two
products with the view (``U^T X`` and ``X V^T``, :mod:`fedsonmf.core._linalg`) when the view is
kept as the transposed array and when it is stored CSC -- the choice
:data:`fedsonmf._validation.SPARSE_STORAGE_DENSITY` makes -- and the ratio dense / sparse.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_storage.py [--out benchmarks/results/storage.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedsonmf._io import write_json_atomic  # noqa: E402
from fedsonmf._provenance import meta  # noqa: E402
from fedsonmf._validation import SPARSE_STORAGE_DENSITY  # noqa: E402
from fedsonmf.core._linalg import ut_x, x_vt  # noqa: E402

SHAPES = [(3000, 3000, 14), (3000, 3000, 40), (2000, 1000, 200), (5000, 500, 20)]
DENSITIES = [0.01, 0.02, 0.05, 0.1, 0.2, 0.3]


def seconds(f, reps: int = 5) -> float:
    f()
    best = np.inf
    for _ in range(reps):  # the best of a few: the machine is shared
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/storage.json")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    print(f"line: stored sparse at <= {SPARSE_STORAGE_DENSITY:.0%} nonzeros")
    print(f"{'n':>6} {'d':>6} {'r':>4} {'density':>8} {'dense ms':>9} {'CSC ms':>8} {'dense/CSC':>9}")
    for n, d, r in SHAPES:
        for density in DENSITIES:
            X = (rng.random((n, d)) < density) * rng.random((n, d))
            dense, csc = X.T, sp.csr_array(X).T  # the two internal forms (d, n)
            U, V = rng.random((d, r)), rng.random((r, n))
            td = seconds(lambda: (ut_x(U, dense), x_vt(dense, V)))
            ts = seconds(lambda: (ut_x(U, csc), x_vt(csc, V)))
            rows.append({"n": n, "d": d, "r": r, "density": density, "dense_s": td, "csc_s": ts, "ratio": td / ts})
            print(f"{n:>6} {d:>6} {r:>4} {density:>8.2f} {1e3 * td:>9.1f} {1e3 * ts:>8.1f} {td / ts:>9.1f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, {"line": SPARSE_STORAGE_DENSITY, "cases": rows, "meta": meta(seeds=0)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
