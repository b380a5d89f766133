"""Issue 6 reference point: our federated fit + clustering on BBCSport vs scikit-learn NMF +
k-means on the concatenated views (time and ACC), side by side in one run.

    .venv/bin/python benchmarks/bench_bbcsport.py [--seeds 3] [--out benchmarks/results/bbcsport.json]

Needs the shared data folder (``$FEDSONMF_DATA`` or ``../shared/data``).  Same views,
preprocessing (Frobenius per view) and seeds for both; BLAS pinned to one thread.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from fedsonmf._io import new_private_dir, write_json_atomic
from fedsonmf.datasets import default_data_dir, load_mat
from fedsonmf.estimators.clustering import FedMultiViewClustering
from fedsonmf.experiments.evaluation import concat_nmf
from fedsonmf.metrics import clustering_scores
from fedsonmf.preprocessing import normalize_views


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bbcsport.json"))
    args = ap.parse_args()
    root = default_data_dir()
    if root is None:
        raise SystemExit("shared data folder not found (set FEDSONMF_DATA)")
    ds = load_mat(root / "BBCSport" / "zskong" / "BBCSport.mat")
    views = normalize_views(ds.views)
    k = int(ds.labels.max()) + 1
    methods = {
        "fedsonmf (label-free default)": lambda s: FedMultiViewClustering(k, random_state=s).fit_predict(ds.views),
        "sklearn NMF concat + k-means": lambda s: concat_nmf(views, k, random_state=s),
    }
    out = {}
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, fn in methods.items():
            secs, accs = [], []
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                labels = fn(seed)
                secs.append(time.perf_counter() - t0)
                accs.append(clustering_scores(ds.labels, labels)["acc"])
            out[name] = {"seconds_mean": float(np.mean(secs)), "acc_mean": float(np.mean(accs)),
                         "acc_per_seed": accs, "seconds_per_seed": secs}
            print(f"{name:32s} ACC {100 * np.mean(accs):5.1f} ± {100 * np.std(accs):4.1f}   "
                  f"{np.mean(secs):6.2f} s/seed")
    base = out["sklearn NMF concat + k-means"]["seconds_mean"]
    for v in out.values():
        v["time_ratio_to_sklearn_nmf"] = v["seconds_mean"] / base
    new_private_dir(args.out.parent)
    write_json_atomic(args.out, {"dataset": "BBCSport/zskong", "seeds": args.seeds, "results": out}, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
