"""Clustering speed: a fit against the data passes it cannot avoid, before/after in one run.

Per data set -- BBCSport, 3Sources, MSRC-v1, Handwritten (the shared data), a 4-view sparse
problem of the BBC shape (700 samples, 4 views of 4 600 features at 1 % density) and a
two-view problem with n = 10^5 samples (both generated here, seeded) -- with the clustering
defaults, one core (BLAS pinned to one thread):

* seconds per fit (federation + k-means) and rounds,
* the data products the fit performed (X_p V^T and U_p^T X_p, plus ||X_p||^2), counted and
  timed in the same run by wrapping the functions that do them, and the ratio fit / products,
* ACC (mean over the seeds),
* scikit-learn NMF + k-means on the concatenated views beside it.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python \
        benchmarks/bench_realdata_speed.py [--seeds 10] [--baseline-src DIR] [--baseline-seeds 3]

``--baseline-src DIR`` also measures another checkout's ``src`` (e.g. ``git archive <commit> src``
unpacked outside the repo) in a subprocess, data set by data set, interleaved with the current
code, so the before/after table comes from one run on the same load.  Results:
``benchmarks/results/realdata_speed.json``.
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

DATASETS = {"BBCSport": ("BBCSport", "zskong", "BBCSport.mat"),
            "3Sources": ("3Sources", "ChuanbinZhang", "3Sources.mat"),
            "MSRC-v1": ("MSRC-v1", "youweiliang", "MSRC_v1.mat"),
            "Handwritten": ("Handwritten", "ChuanbinZhang", "Handwritten.mat")}
#: generated problems: name -> (generator, seeds used at most)
GENERATED = ("BBC-shape 4-view", "two-view n=1e5")


class _Data:
    def __init__(self, views, labels):
        self.views, self.labels = views, labels


def bbc_shape(seed: int = 0, n: int = 700, n_views: int = 4, d: int = 4600, density: float = 0.01, c: int = 5):
    """Sparse nonnegative "documents" of the BBC shape: each class prefers its own block of words."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    y = rng.integers(c, size=n)
    views = []
    for _ in range(n_views):
        nnz = int(density * n * d)
        rows = rng.integers(n, size=nnz)
        cols = rng.integers(d, size=nnz)
        topical = rng.random(nnz) < 0.45
        block = d // c
        cols[topical] = y[rows[topical]] * block + rng.integers(block, size=int(topical.sum()))
        X = sp.csr_matrix((rng.poisson(2.0, size=nnz) + 1.0, (rows, cols)), shape=(n, d))
        X.sum_duplicates()
        views.append(X)
    return _Data(views, y)


def two_view_large(seed: int = 0, n: int = 100_000, dims=(60, 80), c: int = 5):
    """Dense nonnegative two-view data, n = 10^5: class profiles plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(c, size=n)
    views = []
    for d in dims:
        profiles = rng.gamma(1.0, 1.0, size=(c, d))
        views.append(profiles[y] + 0.8 * rng.gamma(1.0, 1.0, size=(n, d)))
    return _Data(views, y)


def load(root: Path, name: str):
    from fedsonmf.datasets import load_mat

    if name == "BBC-shape 4-view":
        return bbc_shape()
    if name == "two-view n=1e5":
        return two_view_large()
    return load_mat(root.joinpath(*DATASETS[name]))
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


def _import_all():
    """Import every module that may hold a data function, so the meter can wrap it."""
    import importlib
    import pkgutil

    import fedsonmf

    for m in pkgutil.walk_packages(fedsonmf.__path__, "fedsonmf."):
        if ".flower" in m.name or ".cli" in m.name or m.name.endswith(".cli"):
            continue
        try:
            importlib.import_module(m.name)
        except Exception:  # optional extras
            pass


def measure(root: Path, name: str, seeds: int) -> dict:
    """This interpreter's ``fedsonmf`` (the import path decides which code) on one data set."""
    import fedsonmf
    from fedsonmf.metrics import clustering_scores

    Model = _clustering_class()
    _import_all()
    ds = load(root, name)
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
    return {
        "fedsonmf_file": fedsonmf.__file__, "n_clusters": c, "seeds": seeds, "per_seed": rows,
        "seconds": float(np.mean([r["seconds"] for r in rows])),
        "rounds": float(np.mean([r["rounds"] for r in rows])),
        "data_seconds": float(np.mean([r["data_seconds"] for r in rows])),
        "ustep_seconds": float(np.mean([r["ustep_seconds"] for r in rows])),
        "ratio_fit_to_data": float(np.mean([r["seconds"] / r["data_seconds"] for r in rows])),
        "acc": float(np.mean([r["acc"] for r in rows])),
    }


def sklearn_reference(root: Path, name: str, seeds: int) -> dict:
    from fedsonmf.experiments.evaluation import concat_nmf
    from fedsonmf.metrics import clustering_scores
    from fedsonmf.preprocessing import normalize_views

    ds = load(root, name)
    c = int(np.unique(ds.labels).size)
    views = normalize_views(ds.views)
    secs, accs = [], []
    for seed in range(seeds):
        t0 = time.perf_counter()
        labels = concat_nmf(views, c, random_state=seed)
        secs.append(time.perf_counter() - t0)
        accs.append(clustering_scores(ds.labels, labels)["acc"])
    return {"seconds": float(np.mean(secs)), "acc": float(np.mean(accs)), "seeds": seeds}


def _seeds_for(name: str, seeds: int, big_seeds: int) -> int:
    return min(seeds, big_seeds) if name in GENERATED else seeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--baseline-seeds", type=int, default=3, help="seeds of the --baseline-src runs.")
    ap.add_argument("--big-seeds", type=int, default=2, help="seeds at most on the generated problems.")
    ap.add_argument("--datasets", default=",".join([*DATASETS, *GENERATED]))
    ap.add_argument("--baseline-src", type=Path, default=None, help="src folder of another checkout to compare.")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/realdata_speed.json"))
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from fedsonmf.datasets import default_data_dir

    root = default_data_dir()
    if root is None:
        raise SystemExit("shared data folder not found (set FEDSONMF_DATA)")
    names = args.datasets.split(",")
    if args._child:
        with threadpool_limits(1), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            print(json.dumps(measure(root, args._child, args.seeds)))
        return
    from fedsonmf._io import new_private_dir, write_json_atomic  # the parent's code, 0600, atomic

    result = {"seeds": args.seeds, "baseline_seeds": args.baseline_seeds, "big_seeds": args.big_seeds,
              "current": {}, "baseline": {}, "sklearn_nmf_concat_kmeans": {}, "loadavg": {}}
    for name in names:  # interleaved: current, baseline, scikit-learn, data set by data set
        result["loadavg"][name] = os.getloadavg()
        with threadpool_limits(1), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result["current"][name] = measure(root, name, _seeds_for(name, args.seeds, args.big_seeds))
        if args.baseline_src is not None:
            env = {**os.environ, "PYTHONPATH": str(args.baseline_src.resolve()), "OMP_NUM_THREADS": "1",
                   "OPENBLAS_NUM_THREADS": "1"}
            proc = subprocess.run([sys.executable, __file__, "--seeds",
                                   str(_seeds_for(name, args.baseline_seeds, args.big_seeds)), "--_child", name],
                                  env=env, capture_output=True, text=True, check=True)
            result["baseline"][name] = json.loads(proc.stdout.strip().splitlines()[-1])
            result["baseline_src"] = str(args.baseline_src)
        with threadpool_limits(1), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result["sklearn_nmf_concat_kmeans"][name] = sklearn_reference(
                root, name, _seeds_for(name, args.seeds, args.big_seeds))
        print(f"{name} done (load {result['loadavg'][name][0]:.2f})", file=sys.stderr, flush=True)
        new_private_dir(args.out.parent)
        write_json_atomic(args.out, result, indent=1)
    print(table(result))
    print(f"wrote {args.out}")


def table(result: dict) -> str:
    """The before/after table (markdown)."""
    lines = ["| data set | code | seeds | s / fit | rounds | data s | fit / data | U-step s | ACC % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in result["current"]:
        for label in ("baseline", "current"):
            r = result[label].get(name)
            if r is None:
                continue
            lines.append(f"| {name} | {'before' if label == 'baseline' else 'after'} | {len(r['per_seed'])} | "
                         f"{r['seconds']:.2f} | {r['rounds']:.1f} | {r['data_seconds']:.2f} | "
                         f"{r['ratio_fit_to_data']:.1f} | {r['ustep_seconds']:.2f} | {100 * r['acc']:.1f} |")
        sk = result["sklearn_nmf_concat_kmeans"][name]
        lines.append(f"| {name} | sklearn NMF + k-means | {sk['seeds']} | {sk['seconds']:.2f} | | | | | "
                     f"{100 * sk['acc']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
