"""U-step benchmark (issues "Real-data speed" and "Nothing silently wrong at any scale").

Times ``solve_u`` alone, old solver (commit 24dd862, loaded from ``git show``
into a temporary module outside the repo) and new solver side by side in one
process on one core, at d_p in {1e3, 1e4, 1e5} and r in {5, 10, 20, 40}:

* "consistent": a realistic federated U-step.  X (d_p x n, n = 500) is sparse
  and nonnegative with a planted row clustering (density 1 %), V is the
  planted factor plus 10 % noise, U^k is the planted pattern with 5 % of the
  rows reassigned at random (the state of a run a few rounds in);
* "random V" (worst case, r = 10 only): V random nonnegative, U^k random.

Reports seconds per call (median of repeats), the log-log slope in d_p
(growth exponent), and whether the new solver's <U, M> is >= the old one's.
An old-solver call slower than ``--cap`` seconds stops that row (larger d_p
are then reported as null).  With ``--bbcsport`` also times a BBCSport
clustering fit (r = 5 and 10) with the old and the new solver patched into
the local step, and the share of the fit spent in the U-step (cProfile).
With ``--replay-3sources SEED`` records the U-step inputs of one default 3Sources
clustering fit and replays the calls that run the exact-penalty stage with its
NumPy loops and its compiled loops (``ustep_penalty.COMPILED``), interleaved:
seconds, and whether <U, M> and the support are the same on every call
(docs/speed.md §3, "The penalty stage compiled").

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=src \
        .venv/bin/python benchmarks/bench_ustep.py [--bbcsport] [--out benchmarks/results/ustep.json]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import fedsonmf.core.ustep as new
from fedsonmf._io import new_private_dir, write_json_atomic

OLD_COMMIT = "24dd862"


def load_old():
    """The pre-change ustep.py as a module ``ustep_old`` (temp file outside the repo)."""
    repo = Path(__file__).resolve().parents[1]
    src = subprocess.run(["git", "-C", str(repo), "show", f"{OLD_COMMIT}:src/fedsonmf/ustep.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "ustep_old.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("ustep_old", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ustep_old"] = mod
    spec.loader.exec_module(mod)
    return mod


def instance(d, r, case, seed=0, n=500, density=0.01):
    """(B, A, U^k, rho1) of one U-step; see the module docstring."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, r, d)
    labels[:r] = np.arange(r)
    V_true = np.abs(rng.standard_normal((r, n))) * (rng.random((r, n)) < 0.3)
    nnz = int(density * d * n)
    rows, cols = rng.integers(0, d, nnz), rng.integers(0, n, nnz)
    vals = rng.uniform(0.5, 1.0, nnz) * V_true[labels[rows], cols] + 0.05 * rng.random(nnz)
    X = sp.csr_array((vals, (rows, cols)), shape=(d, n))
    if case == "consistent":
        V = V_true * (1 + 0.1 * rng.standard_normal((r, n)))
        V = np.maximum(V, 0)
        a = labels.copy()
        flip = rng.random(d) < 0.05
        a[flip] = rng.integers(0, r, flip.sum())
    else:
        V = np.abs(rng.standard_normal((r, n)))
        a = rng.permutation(np.arange(d) % r)
    Uk = np.zeros((d, r))
    Uk[np.arange(d), a] = rng.uniform(0.5, 1.0, d)
    Uk /= np.linalg.norm(Uk, axis=0)
    B = 2.0 * np.asarray(X @ V.T)
    A = 2.0 * V @ V.T
    return B, A, Uk, 0.0


def time_call(mod, B, A, Uk, rho1, reps):
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = mod.solve_u(B, A, Uk, rho1)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def slope(ds, ts):
    pts = [(np.log(d), np.log(t)) for d, t in zip(ds, ts) if t is not None]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def bench_ustep(old, cap):
    rows = []
    ds = [1000, 10000, 100000]
    configs = [("consistent", r) for r in (5, 10, 20, 40)] + [("random V", 10)]
    for case, r in configs:
        res = {"case": case, "r": r, "d": ds, "old_s": [], "new_s": [], "new_ge_old": [], "new_certified": [],
               "new_source": [], "new_minus_old_rel": []}
        old_alive = True
        for d in ds:
            B, A, Uk, rho1 = instance(d, r, case)
            reps = 3 if d <= 10000 else 1
            tn, (Un, info) = time_call(new, B, A, Uk, rho1, reps)
            M = B + rho1 * Uk
            res["new_s"].append(tn)
            res["new_certified"].append(info.certified)
            res["new_source"].append(info.source)
            if old_alive:
                to, (Uo, _) = time_call(old, B, A, Uk, rho1, 1 if d > 1000 else reps)
                res["old_s"].append(to)
                so, sn = float(np.vdot(Uo, M)), float(np.vdot(Un, M))
                res["new_ge_old"].append(sn >= so - 1e-12 * abs(so))
                res["new_minus_old_rel"].append((sn - so) / abs(so))
                old_alive = to < cap
            else:
                res["old_s"].append(None)
                res["new_ge_old"].append(None)
                res["new_minus_old_rel"].append(None)
            print(f"{case:10s} r={r:2d} d={d:6d}  old {res['old_s'][-1] or float('nan'):9.4f} s  "
                  f"new {tn:8.4f} s  new-old {res['new_minus_old_rel'][-1]}  "
                  f"certified {info.certified} ({info.source})",
                  flush=True)
        res["old_exponent"] = slope(ds, res["old_s"])
        res["new_exponent"] = slope(ds, res["new_s"])
        print(f"   growth exponent in d_p: old {res['old_exponent']}, new {res['new_exponent']:.2f}", flush=True)
        rows.append(res)
    return rows


def bench_bbcsport(old):
    """BBCSport fit seconds and U-step share, old vs new solver patched into the local steps."""
    import fedsonmf.core.vstep as vstep
    from fedsonmf.datasets import default_data_dir, load_mat
    from fedsonmf.estimators import FedMultiViewClustering

    ds = load_mat(default_data_dir() / "BBCSport" / "zskong" / "BBCSport.mat")
    out = []
    for k in (5, 10):
        for name, mod in (("old", old), ("new", new)):
            vstep.solve_u = mod.solve_u
            pr = cProfile.Profile()
            t0 = time.perf_counter()
            pr.enable()
            FedMultiViewClustering(k, random_state=0).fit(ds.views)
            pr.disable()
            secs = time.perf_counter() - t0
            st = pstats.Stats(pr).stats
            tu = sum(v[3] for key, v in st.items() if key[2] == "solve_u")
            ncalls = sum(v[1] for key, v in st.items() if key[2] == "solve_u")
            out.append({"n_components": k, "solver": name, "fit_seconds_profiled": secs,
                        "ustep_seconds": tu, "ustep_share": tu / secs, "ustep_calls": ncalls})
            print(f"BBCSport r={k:2d} {name}: fit {secs:6.2f} s (under cProfile)  U-step {tu:6.2f} s "
                  f"({100 * tu / secs:.0f} %), {ncalls} calls", flush=True)
    vstep.solve_u = new.solve_u
    return out


def replay_3sources(seed):
    """Penalty stage, NumPy vs compiled loops, on the U-steps of one 3Sources fit (docs/speed.md §3)."""
    import fedsonmf.core.vstep as vstep
    from fedsonmf.core import ustep_penalty
    from fedsonmf.datasets import default_data_dir, load_mat
    from fedsonmf.estimators import FedMultiViewClustering

    ds = load_mat(default_data_dir() / "3Sources" / "ChuanbinZhang" / "3Sources.mat")
    calls = []

    def recording(B, A, U, rho1, opts=None):
        res = new.solve_u(B, A, U, rho1, opts)
        if res[1].outer_iterations > 0:
            calls.append((B.copy(), A.copy(), U.copy(), rho1, opts))
        return res

    vstep.solve_u = recording
    try:
        FedMultiViewClustering(len(np.unique(ds.labels)), random_state=seed).fit(ds.views)
    finally:
        vstep.solve_u = new.solve_u
    secs = {False: 0.0, True: 0.0}
    worst, same = -np.inf, 0
    new_compiled = ustep_penalty.COMPILED
    new.solve_u(*calls[0])  # compile / load the loops outside the timing
    for B, A, U, rho1, opts in calls:
        out = {}
        for compiled in (False, True):
            ustep_penalty.COMPILED = compiled
            t0 = time.perf_counter()
            Un, _ = new.solve_u(B, A, U, rho1, opts)
            secs[compiled] += time.perf_counter() - t0
            out[compiled] = (Un, float(np.vdot(Un, B + rho1 * U)))
        ustep_penalty.COMPILED = new_compiled
        worst = max(worst, (out[False][1] - out[True][1]) / abs(out[False][1]))
        same += bool(np.array_equal(out[False][0] > 0, out[True][0] > 0))
    row = {"seed": seed, "penalty_calls": len(calls), "numpy_seconds": secs[False], "compiled_seconds": secs[True],
           "ratio": secs[False] / secs[True], "max_rel_score_loss": worst, "same_support": same}
    print(f"3Sources seed {seed}: {len(calls)} penalty calls, NumPy {secs[False]:.2f} s, compiled "
          f"{secs[True]:.2f} s ({row['ratio']:.2f}x), max relative loss of <U, M> {worst:.1e}, "
          f"same support {same}/{len(calls)}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cap", type=float, default=2.0, help="stop the old solver's row above this many s/call")
    ap.add_argument("--bbcsport", action="store_true")
    ap.add_argument("--replay-3sources", type=int, default=None, metavar="SEED")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/ustep.json"))
    args = ap.parse_args()
    if args.replay_3sources is not None:  # the replay alone (no old solver needed)
        result = {"python": platform.python_version(), "numpy": np.__version__,
                  "replay_3sources": replay_3sources(args.replay_3sources)}
        new_private_dir(args.out.parent)
        write_json_atomic(args.out, result, indent=1)
        print(f"wrote {args.out}")
        return
    old = load_old()
    result = {"old_commit": OLD_COMMIT, "python": platform.python_version(), "numpy": np.__version__,
              "machine": platform.machine(), "ustep": bench_ustep(old, args.cap)}
    if args.bbcsport:
        result["bbcsport"] = bench_bbcsport(old)
    new_private_dir(args.out.parent)
    write_json_atomic(args.out, result, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
