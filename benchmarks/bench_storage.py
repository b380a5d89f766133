"""Dense or sparse storage of a mostly-zero view: the two data products side by side.

For a dense (n, d) array with a given share of nonzeros, one core, the time of the fit's two
products with the view (``U^T X`` and ``X V^T``, :mod:`fedsonmf.core._linalg`) when the view is
kept as the transposed array and when it is stored CSC -- the choice
:data:`fedsonmf._validation.SPARSE_STORAGE_DENSITY` makes -- and the ratio dense / sparse.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_storage.py [--out benchmarks/results/storage.json] \
        [--fit FILE.mat ...]

``--fit`` also times one clustering fit (``n_init=1``, the other defaults) of each data set with the
rule and with every dense view kept dense (the line set to 0), alternating in one process, and
says whether the two gave the same labels.
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

from fedsonmf._io import new_private_dir, write_json_atomic  # noqa: E402
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


def fit_both_ways(path: Path) -> dict:
    """One fit of a data set with the storage rule and with every dense view kept dense."""
    import warnings

    import fedsonmf._validation as validation
    from fedsonmf import FedMultiViewClustering
    from fedsonmf.datasets.mat import load_mat

    ds = load_mat(path)
    c = int(np.unique(ds.labels).size)
    density = [None if sp.issparse(X) else float(np.count_nonzero(X) / X.size) for X in ds.views]
    out = {"data": path.stem, "dense_view_density": density}
    labels = {}
    for how, line in (("dense", 0.0), ("rule", SPARSE_STORAGE_DENSITY)):
        validation.SPARSE_STORAGE_DENSITY = line
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = FedMultiViewClustering(c, n_init=1, random_state=0).fit(ds.views)
        out[f"{how}_s"] = time.perf_counter() - t
        labels[how] = m.labels_
    validation.SPARSE_STORAGE_DENSITY = SPARSE_STORAGE_DENSITY
    out["same_labels"] = bool(np.array_equal(labels["dense"], labels["rule"]))
    print(f"{path.stem}: kept dense {out['dense_s']:.1f} s, the rule {out['rule_s']:.1f} s "
          f"({out['dense_s'] / out['rule_s']:.1f}x), same labels: {out['same_labels']}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/storage.json")
    ap.add_argument("--fit", type=Path, action="append", default=[], help="a .mat data set to fit both ways")
    ap.add_argument("--skip-products", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    print(f"line: stored sparse at <= {SPARSE_STORAGE_DENSITY:.0%} nonzeros")
    print(f"{'n':>6} {'d':>6} {'r':>4} {'density':>8} {'dense ms':>9} {'CSC ms':>8} {'dense/CSC':>9}")
    for n, d, r in ([] if args.skip_products else SHAPES):
        for density in DENSITIES:
            X = (rng.random((n, d)) < density) * rng.random((n, d))
            dense, csc = X.T, sp.csr_array(X).T  # the two internal forms (d, n)
            U, V = rng.random((d, r)), rng.random((r, n))
            td = seconds(lambda U=U, V=V, X=dense: (ut_x(U, X), x_vt(X, V)))
            ts = seconds(lambda U=U, V=V, X=csc: (ut_x(U, X), x_vt(X, V)))
            rows.append({"n": n, "d": d, "r": r, "density": density, "dense_s": td, "csc_s": ts, "ratio": td / ts})
            print(f"{n:>6} {d:>6} {r:>4} {density:>8.2f} {1e3 * td:>9.1f} {1e3 * ts:>8.1f} {td / ts:>9.1f}", flush=True)
    fits = [fit_both_ways(path) for path in args.fit]
    new_private_dir(args.out.parent)
    write_json_atomic(args.out, {"line": SPARSE_STORAGE_DENSITY, "cases": rows, "fits": fits,
                                 "meta": meta(seeds=0, inputs=args.fit)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
