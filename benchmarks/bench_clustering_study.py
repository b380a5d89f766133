"""The clustering defaults study: client rules (refits) and server rules (on the same fitted V).

Each *variant* is a set of :class:`~fedsonmf.estimators.clustering.FedMultiViewClustering`
parameters; every fit's V is scored with several *server rules* (what the server does with V
before/instead of k-means), so a server rule costs no refit:

* ``km-row``: k-means on the row-normalised V^T (the default);
* ``km-raw``: k-means on V^T as learned;
* ``km-comp``: each component (row of V) to unit norm over the samples, then rows of V^T;
* ``spec-knn`` / ``spec-k5`` / ``spec-k30``: spectral clustering of the symmetric kNN graph
  of V^T (cosine; k = max(10, log2 n), 5, 30), as the ``mv-spectral`` reference builds it.

``rank_factor`` (a variant key, not an estimator parameter) sets r = factor x c with narrow views
zero-padded, as the "auto" rank rule does for factor 2.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_clustering_study.py \\
        --variant default='{}' --variant l2='{"preprocess": "l2"}' \\
        --only MSRC-v1 --only Handwritten --seeds 3 --json study.json

``docs/clustering.md`` lists the variants measured and what they gave.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bench_clustering import FILES, data_folder  # noqa: E402  (the shared data files, one map)

from fedsonmf._io import write_json_atomic  # noqa: E402
from fedsonmf.datasets.mat import load_mat  # noqa: E402
from fedsonmf.estimators import clustering as _clustering  # noqa: E402
from fedsonmf.estimators.clustering import FedMultiViewClustering  # noqa: E402
from fedsonmf.estimators.options import from_flat  # noqa: E402
from fedsonmf.experiments.references import multiview_spectral, row_normalize_view  # noqa: E402
from fedsonmf.metrics import clustering_scores  # noqa: E402
from fedsonmf.pipeline.rank_rule import resolve_rank  # noqa: E402


def _km(E, c, seed):
    from sklearn.cluster import KMeans

    return KMeans(c, n_init=10, random_state=seed).fit_predict(E)


def _component(E):
    cn = np.linalg.norm(E, axis=0)
    return row_normalize_view(E / np.where(cn > 0, cn, 1.0))


SERVER_RULES = {
    "km-row": lambda E, c, s: _km(row_normalize_view(E), c, s),
    "km-raw": lambda E, c, s: _km(E, c, s),
    "km-comp": lambda E, c, s: _km(_component(E), c, s),
    "spec-knn": lambda E, c, s: multiview_spectral([E], c, random_state=s),
    "spec-k5": lambda E, c, s: multiview_spectral([E], c, random_state=s, n_neighbors=5),
    "spec-k30": lambda E, c, s: multiview_spectral([E], c, random_state=s, n_neighbors=30),
}


def _with_rank_factor(factor):
    """Patch the estimator's rank rule to r = factor x c (narrow views padded)."""
    def rule(c, widths, _rule="auto"):
        r = int(round(factor * c))
        return r, ("views padded" if min(int(w) for w in widths) < r else None)
    _clustering.resolve_rank = rule if factor else resolve_rank


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="data folder (default: FEDSONMF_DATA or ../shared/data)")
    ap.add_argument("--variant", action="append", required=True, help="NAME=JSON parameters")
    ap.add_argument("--only", action="append")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    root = data_folder(ap, args.data)
    out = {"seeds": args.seeds, "variants": {}}
    for spec in args.variant:
        name, _, js = spec.partition("=")
        params = json.loads(js or "{}")
        _with_rank_factor(params.pop("rank_factor", None))
        rows = out["variants"].setdefault(name, {"params": params, "results": {}})["results"]
        for key, rel in FILES.items():
            if args.only and key not in args.only:
                continue
            ds = load_mat(root / rel)
            c = ds.n_classes
            acc = {rule: [] for rule in SERVER_RULES}
            secs = []
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model = FedMultiViewClustering(c, random_state=seed, **from_flat(params)).fit(ds.views)
                secs.append(time.perf_counter() - t0)
                for rule, fn in SERVER_RULES.items():
                    acc[rule].append(100 * clustering_scores(ds.labels, fn(model.embedding_, c, seed))["acc"])
            rows[key] = {"acc": {k: round(float(np.mean(v)), 2) for k, v in acc.items()},
                         "acc_per_seed": acc, "seconds": round(float(np.mean(secs)), 2)}
            print(name, key, rows[key]["acc"], f"{rows[key]['seconds']:.1f}s", flush=True)
            if args.json:
                write_json_atomic(args.json, out, indent=1)
    _with_rank_factor(None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
