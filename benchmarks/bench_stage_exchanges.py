"""The clustering stages' round trips per kind, per data set and seed, and what the spectral step's
settling tolerance does to them and to the labels.

For every shared data set and seed: the default fit, its ``fit_report_["stage_exchanges"]`` (the
round trips of the k-means refinement, the graph refinement, spectral blocks alone, the spectral
candidate's own refinement and the score exchange), the spectral steps made, ACC and a digest of the
labels.  With ``--tol`` the stages after the fits are replayed on the same fits for each tolerance of
the orthogonal iteration (:data:`fedsonmf.pipeline.spectral.SUBSPACE_TOL`; 0 runs every step), and
each row says how many labels moved against the first tolerance given.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_stage_exchanges.py --seeds 2 \\
        --tol 0 --tol 0.01 --tol 0.02 --tol 0.05

docs/clustering.md ("Fewer exchanges") gives the results.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_clustering import FILES, data_folder  # noqa: E402

from fedsonmf._io import write_json_atomic  # noqa: E402
from fedsonmf.datasets.mat import load_mat  # noqa: E402
from fedsonmf.estimators import FedMultiViewClustering  # noqa: E402
from fedsonmf.metrics import clustering_accuracy  # noqa: E402
from fedsonmf.pipeline import spectral, stages  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="data folder (default: FEDSONMF_DATA or ../shared/data)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--only", action="append", help="data set names (default: all four)")
    ap.add_argument("--tol", type=float, action="append", default=[],
                    help="replay the stages with this settling tolerance (repeatable; the first is the reference)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    root = data_folder(ap, args.data)
    replays: dict = {}
    finish = stages.finish_clustering

    def replayed(*a, **k):  # the same fit's stages once per tolerance; the default's result is returned
        replays.clear()
        default = spectral.SUBSPACE_TOL
        try:
            for tol in args.tol:
                spectral.SUBSPACE_TOL = tol
                replays[tol] = finish(*a, **k)
        finally:
            spectral.SUBSPACE_TOL = default
        return finish(*a, **k)

    if args.tol:
        stages.finish_clustering = replayed
    out: dict = {}
    for name, rel in FILES.items():
        if args.only and name not in args.only:
            continue
        ds = load_mat(root / rel)
        for seed in range(args.seeds):
            m = FedMultiViewClustering(ds.n_classes, random_state=seed).fit(ds.views)
            rep = m.fit_report_
            row = {"acc": round(100 * clustering_accuracy(ds.labels, m.labels_), 2),
                   "labels_sha256": hashlib.sha256(np.asarray(m.labels_, dtype=np.int64).tobytes()).hexdigest()[:16],
                   "exchanges": rep["stage_exchanges"], "total": sum(rep["stage_exchanges"].values()),
                   "spectral_steps": rep["spectral_steps"]}
            print(f"{name} seed {seed}: {json.dumps(row)}", flush=True)
            out[f"{name}/{seed}"] = row
            if args.tol:
                first = replays[args.tol[0]][0]
                for tol, (labels, _, report) in replays.items():
                    counts = report["exchanges"]
                    sub = {"acc": round(100 * clustering_accuracy(ds.labels, labels), 2),
                           "moved": int(np.sum(labels != first)), "exchanges": counts,
                           "total": sum(counts.values()), "spectral_steps": report["spectral_steps"]}
                    print(f"    tol {tol:g}: {json.dumps(sub)}", flush=True)
                    row.setdefault("tolerances", {})[f"{tol:g}"] = sub
    if args.json:
        write_json_atomic(args.json, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
