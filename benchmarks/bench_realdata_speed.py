"""Real-data speed (issue 12): a clustering fit against the data passes it cannot avoid.

For BBCSport and 3Sources with the clustering defaults, one core:

* seconds per fit (federation + k-means),
* the data products the fit performed (X_p V^T and U_p^T X_p, plus ||X_p||^2), counted and
  timed in the same run by wrapping the functions that do them,
* their ratio (target: fit <= 3x its data products), the U-step's time,
* scikit-learn NMF + k-means on the concatenated views beside it.

    .venv/bin/python benchmarks/bench_realdata_speed.py [--seeds 3] [--baseline-src DIR]

``--baseline-src DIR`` also runs the same measurement on another checkout's ``src`` (e.g. a
``git worktree`` of an older commit) in a subprocess, so the before/after table comes from one
run.  Results: ``benchmarks/results/realdata_speed.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

DATASETS = {"BBCSport": ("BBCSport", "zskong", "BBCSport.mat"), "3Sources": ("3Sources", "ChuanbinZhang", "3Sources.mat")}
#: functions that pass over a client's data, and the U-solver
DATA_FUNCS = ("x_vt", "ut_x", "sqnorm")
USTEP_FUNCS = ("solve_u",)


class Meter:
    """Wrap every ``fedsonmf`` module attribute named in ``names`` with a call counter and timer."""

    def __init__(self, names):
        self.names = names
        self.calls = dict.fromkeys(names, 0)
        self.seconds = dict.fromkeys(names, 0.0)
        self._patched = []

    def __enter__(self):
        originals = {}
        for mod_name, mod in list(sys.modules.items()):
            if not mod_name.startswith("fedsonmf") or mod is None:
                continue
            for name in self.names:
                fn = getattr(mod, name, None)
                if callable(fn):
                    orig = getattr(fn, "__wrapped_by_meter__", fn)
                    originals.setdefault((name, id(orig)), orig)
                    wrapped = self._wrap(name, orig)
                    self._patched.append((mod, name, fn))
                    setattr(mod, name, wrapped)
        return self

    def _wrap(self, name, fn):
        @functools.wraps(fn)
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        timed.__wrapped_by_meter__ = fn
        return timed

    def __exit__(self, *exc):
        for mod, name, fn in reversed(self._patched):
            setattr(mod, name, fn)
        return False


def _clustering_class():
    try:
        from fedsonmf.estimators import FedMultiViewClustering
    except ImportError:  # an older checkout (flat layout)
        from fedsonmf.clustering import FedMultiViewClustering
    return FedMultiViewClustering


def measure(root: Path, seeds: int) -> dict:
    """Measure this interpreter's ``fedsonmf`` (import path decides which code)."""
    import fedsonmf
    from fedsonmf.datasets import load_mat
    from fedsonmf.metrics import clustering_scores

    Model = _clustering_class()
    # import every module that may hold a data function, so the meter can wrap it
    import importlib
    import pkgutil

    for m in pkgutil.walk_packages(fedsonmf.__path__, "fedsonmf."):
        if ".flower" in m.name or ".cli" in m.name or m.name.endswith(".cli"):
            continue
        try:
            importlib.import_module(m.name)
        except Exception:  # optional extras
            pass
    out = {"fedsonmf_file": fedsonmf.__file__}
    for name, parts in DATASETS.items():
        ds = load_mat(root.joinpath(*parts))
        c = int(np.unique(ds.labels).size)
        rows = []
        for seed in range(seeds):
            with Meter(DATA_FUNCS) as data, Meter(USTEP_FUNCS) as ustep:
                t0 = time.perf_counter()
                model = Model(c, random_state=seed).fit(ds.views)
                secs = time.perf_counter() - t0
            acc = clustering_scores(ds.labels, model.labels_)["acc"]
            rows.append({"seconds": secs, "data_seconds": sum(data.seconds.values()), "data_calls": data.calls,
                         "ustep_seconds": ustep.seconds["solve_u"], "ustep_calls": ustep.calls["solve_u"],
                         "rounds": int(model.n_rounds_), "r": int(model.n_components_), "acc": acc})
        out[name] = {
            "n_clusters": c, "per_seed": rows,
            "seconds": float(np.mean([r["seconds"] for r in rows])),
            "data_seconds": float(np.mean([r["data_seconds"] for r in rows])),
            "ustep_seconds": float(np.mean([r["ustep_seconds"] for r in rows])),
            "ratio_fit_to_data": float(np.mean([r["seconds"] / r["data_seconds"] for r in rows])),
            "acc": float(np.mean([r["acc"] for r in rows])),
        }
    return out


def sklearn_reference(root: Path, seeds: int) -> dict:
    from fedsonmf.datasets import load_mat
    from fedsonmf.metrics import clustering_scores
    from fedsonmf.preprocessing import normalize_views

    try:
        from fedsonmf.experiments.evaluation import concat_nmf
    except ImportError:
        from fedsonmf.clustering import concat_nmf
    out = {}
    for name, parts in DATASETS.items():
        ds = load_mat(root.joinpath(*parts))
        c = int(np.unique(ds.labels).size)
        views = normalize_views(ds.views)
        secs, accs = [], []
        for seed in range(seeds):
            t0 = time.perf_counter()
            labels = concat_nmf(views, c, random_state=seed)
            secs.append(time.perf_counter() - t0)
            accs.append(clustering_scores(ds.labels, labels)["acc"])
        out[name] = {"seconds": float(np.mean(secs)), "acc": float(np.mean(accs))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--baseline-src", type=Path, default=None, help="src folder of another checkout to compare.")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/realdata_speed.json"))
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from fedsonmf.datasets import default_data_dir

    root = default_data_dir()
    if root is None:
        raise SystemExit("shared data folder not found (set FEDSONMF_DATA)")
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if args._child:
            print(json.dumps(measure(root, args.seeds)))
            return
        result = {"seeds": args.seeds, "current": measure(root, args.seeds),
                  "sklearn_nmf_concat_kmeans": sklearn_reference(root, args.seeds)}
    if args.baseline_src is not None:
        env = {**os.environ, "PYTHONPATH": str(args.baseline_src.resolve()), "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, __file__, "--seeds", str(args.seeds), "--_child"], env=env,
                              capture_output=True, text=True, check=True)
        result["baseline"] = json.loads(proc.stdout.strip().splitlines()[-1])
        result["baseline_src"] = str(args.baseline_src)
    print(f"{'dataset':10s} {'code':9s} {'s/fit':>7s} {'data s':>7s} {'fit/data':>8s} {'U-step s':>8s} {'ACC':>6s}")
    for name in DATASETS:
        for label in ("baseline", "current"):
            if label in result:
                r = result[label][name]
                print(f"{name:10s} {label:9s} {r['seconds']:7.2f} {r['data_seconds']:7.2f} {r['ratio_fit_to_data']:8.1f} "
                      f"{r['ustep_seconds']:8.2f} {100 * r['acc']:6.1f}")
        sk = result["sklearn_nmf_concat_kmeans"][name]
        print(f"{name:10s} {'sk NMF':9s} {sk['seconds']:7.2f} {'':7s} {'':8s} {'':8s} {100 * sk['acc']:6.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
