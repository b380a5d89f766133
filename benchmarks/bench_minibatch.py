"""Benchmark: stochastic local steps (docs/algorithm.md §16) beside the full batch.

Three parts, each merged into one record (written atomically, 0600):

* ``sets``: the shared four data sets, default clustering fits (``FedMultiViewClustering(c,
  random_state=s)``) with the full batch and with mini-batches forced at the size the ``"auto"``
  rule takes above its threshold, b = ceil(n / tau): ACC, NMI, rounds and CPU seconds per seed;
* ``synthetic``: the paper's synthetic study (10 clients, n = 100, d_p = 20, r = 6, tau = 10, the
  study's mu, rho1, alpha), rounds until R^s / R^1 <= 1e-2 for h in {0, 0.3, 0.6, 0.9}, correction
  on and off, full batch beside b = ceil(n / tau);
* ``scale``: CPU seconds per round of a factorisation on a planted two-view problem (n = 1e5,
  d_p = 2 000 at 1 % density, c = 10 clusters, r = 20), full batch beside ``batch_size="auto"``
  (b = 1e4), with the objective, R / R1 and the ACC of k-means on V after the same rounds.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_minibatch.py --part all \\
        [--seeds 3] [--out benchmarks/results/minibatch.json]

The figures are CPU seconds of one process (``time.process_time``); the machine may be shared, so
wall-clock seconds are not reported.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedsonmf import federated_sonmf
from fedsonmf._io import write_json_atomic
from fedsonmf._provenance import meta
from fedsonmf.datasets import make_synthetic
from fedsonmf.datasets.mat import load_mat
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import MethodOptions
from fedsonmf.metrics import clustering_accuracy, nmi
from fedsonmf.protocol.params import SYNTHETIC_STUDY, default

FILES = {
    "3Sources": "3Sources/ChuanbinZhang/3Sources.mat",
    "BBCSport": "BBCSport/zskong/BBCSport.mat",
    "MSRC-v1": "MSRC-v1/youweiliang/MSRC_v1.mat",
    "Handwritten": "Handwritten/ChuanbinZhang/Handwritten.mat",
}
TAU = default("tau")


def part_sets(data_dir: Path, seeds: int, only=(), sweeps: int = 1) -> dict:
    out = {}
    for name, rel in FILES.items():
        if only and name not in only:
            continue
        ds = load_mat(data_dir / rel)
        y = ds.labels
        c = len(np.unique(y))
        n = y.size
        b = math.ceil(sweeps * n / TAU)
        rows = {}
        for variant, method in (("full", None), (f"b={b}", MethodOptions(batch_size=b))):
            runs = []
            for s in range(seeds):
                t0 = time.process_time()
                est = FedMultiViewClustering(c, random_state=s, method=method).fit(ds.views)
                runs.append({"seed": s, "acc": round(100 * clustering_accuracy(y, est.labels_), 2),
                             "nmi": round(100 * nmi(y, est.labels_), 2), "rounds": int(est.n_rounds_),
                             "cpu_seconds": round(time.process_time() - t0, 2)})
            acc = [r["acc"] for r in runs]
            rows[variant] = {"runs": runs, "acc_mean": round(float(np.mean(acc)), 2),
                             "acc_std": round(float(np.std(acc)), 2)}
            print(f"{name} {variant}: ACC {rows[variant]['acc_mean']:.2f} ± {rows[variant]['acc_std']:.2f} "
                  f"per seed {acc}", flush=True)
        out[name] = {"file": rel, "n": n, "batch": b, "variants": rows}
    return out


def part_synthetic(seeds: int, rounds: int) -> dict:
    out = []
    for h in (0.0, 0.3, 0.6, 0.9):
        for corr in (True, False):
            cell = {"h": h, "correction": corr}
            for variant in ("full", "minibatch"):
                per = []
                for seed in range(seeds):
                    data = make_synthetic(heterogeneity=h, random_state=seed)
                    n = data.views[0].shape[0]
                    b = "auto" if variant == "full" else math.ceil(n / TAU)
                    t0 = time.process_time()
                    res = federated_sonmf(data.views, 6, max_rounds=rounds, tol=0, correction=corr, random_state=seed,
                                          batch_size=b, **SYNTHETIC_STUDY)
                    per.append({"seed": seed, "batch": b, "rounds_R_rel": res.history.rounds_to(1e-2),
                                "final_R_rel": float(res.history.column("R_rel")[-1]),
                                "final_R": float(res.history.column("R")[-1]),
                                "cpu_seconds": round(time.process_time() - t0, 3)})
                cell[variant] = per
            out.append(cell)
            print(f"h={h:.1f} correction={corr!s:5} rounds to R/R1<=1e-2 full "
                  f"{[p['rounds_R_rel'] for p in cell['full']]} mini-batch "
                  f"{[p['rounds_R_rel'] for p in cell['minibatch']]}", flush=True)
    return {"rounds": rounds, "cells": out}


def planted_views(n: int, d: int, density: float, c: int, seed: int = 0):
    """Two sparse (n, d) views: each sample has round(d * density) nonzeros, 80 % of them in its
    cluster's block of d / c features, the rest anywhere; values Uniform[0.5, 1]."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    k = max(1, round(d * density))
    block = d // c
    views = []
    for _ in range(2):
        inside = rng.random((n, k)) < 0.8
        cols = np.where(inside, y[:, None] * block + rng.integers(0, block, (n, k)), rng.integers(0, d, (n, k)))
        X = sp.csr_matrix((rng.uniform(0.5, 1.0, n * k), (np.repeat(np.arange(n), k), cols.ravel())), shape=(n, d))
        X.sum_duplicates()
        views.append(X)
    return views, y


def _local_steps_seconds(view, res, r: int, minibatch: bool, reps: int = 3) -> float:
    """CPU seconds of one client's tau local steps alone (``core.vstep.local_round``) at the fit's end
    point: the part of a round the batch size changes."""
    from fedsonmf._validation import check_views
    from fedsonmf.core.init import batch_rng
    from fedsonmf.core.ustep import PenaltyOptions
    from fedsonmf.core.vstep import draw_batches, local_round
    from fedsonmf.protocol.config import auto_alpha

    (X,) = check_views([view], r)
    n = X.shape[1]
    V = np.asfortranarray(res.V)  # the clients' layout (core._linalg)
    kw = dict(alpha=auto_alpha(TAU, default("eta_g")), mu=float(res.config["mu_value"]), tau=TAU, rho1=0.0,
              ustep=PenaltyOptions())
    times = []
    for rep in range(reps):
        batches = draw_batches(n, TAU, math.ceil(n / TAU), batch_rng(0, rep)) if minibatch else None
        t0 = time.process_time()
        local_round(X, res.bases[0], V, None, batches=batches, **kw)
        times.append(time.process_time() - t0)
    return float(np.median(times))


def part_scale(n: int, d: int, density: float, c: int, rounds: int) -> dict:
    from sklearn.cluster import KMeans

    views, y = planted_views(n, d, density, c)
    r = 2 * c
    out = {"n": n, "d_p": d, "density": density, "clusters": c, "r": r, "tau": TAU, "rounds": rounds,
           "nnz_per_view": int(views[0].nnz), "variants": {}}
    for variant in ("full", "auto"):
        ticks = []
        t0 = time.process_time()
        res = federated_sonmf(views, r, max_rounds=rounds, tol=0, random_state=0,
                              batch_size=n if variant == "full" else "auto",
                              callback=lambda row, ticks=ticks: ticks.append(time.process_time()))
        total = time.process_time() - t0
        per_round = np.diff([t0] + ticks)[1:]  # the first tick also holds the setup
        E = res.V.T / np.maximum(np.linalg.norm(res.V.T, axis=1, keepdims=True), 1e-300)
        labels = KMeans(c, n_init=3, random_state=0).fit_predict(E)
        row = {"batch": n if variant == "full" else math.ceil(n / TAU),
               "cpu_seconds_per_round_median": round(float(np.median(per_round)), 3),
               "cpu_seconds_per_round": [round(float(s), 3) for s in per_round],
               "cpu_seconds_total": round(total, 2), "objective": float(res.history.column("objective")[-1]),
               "R_rel": float(res.history.column("R_rel")[-1]),
               "acc_kmeans_on_V": round(100 * clustering_accuracy(y, labels), 2)}
        row["local_steps_cpu_seconds_per_client"] = round(_local_steps_seconds(views[0], res, r, variant == "auto"), 3)
        out["variants"][variant] = row
        print(f"n={n} {variant}: {row['cpu_seconds_per_round_median']} CPU s/round (local steps "
              f"{row['local_steps_cpu_seconds_per_client']} s per client), objective {row['objective']:.6g}, "
              f"R/R1 {row['R_rel']:.3g}, ACC(k-means on V) {row['acc_kmeans_on_V']}", flush=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("sets", "synthetic", "scale", "all"), default="all")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--sweeps", type=int, default=1, help="sets part: b = ceil(sweeps n / tau), sweeps visits a round")
    ap.add_argument("--only", nargs="*", default=(), help="sets part: these data sets only (recorded as 'sets:NAME')")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of the synthetic study")
    ap.add_argument("--scale-n", type=int, default=100_000)
    ap.add_argument("--scale-rounds", type=int, default=15)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/minibatch.json"))
    args = ap.parse_args(argv)
    record = json.loads(args.out.read_text()) if args.out.is_file() else {}
    parts = ("sets", "synthetic", "scale") if args.part == "all" else (args.part,)
    for part in parts:
        t0 = time.process_time()
        if part == "sets":
            res = part_sets(args.data, args.seeds, args.only, args.sweeps)
        elif part == "synthetic":
            res = part_synthetic(args.seeds, args.rounds)
        else:
            res = part_scale(args.scale_n, 2000, 0.01, 10, args.scale_rounds)
        inputs = [(name, args.data / rel) for name, rel in FILES.items()
                  if not args.only or name in args.only] if part == "sets" else ()
        key = part if part != "sets" or not args.only else "sets:" + ",".join(args.only)
        key += f":sweeps={args.sweeps}" if part == "sets" and args.sweeps != 1 else ""
        record[key] = {"result": res, "cpu_seconds": round(time.process_time() - t0, 1),
                        "meta": meta(inputs=inputs, seeds=list(range(args.seeds))),
                        "note": "CPU seconds of one process, OMP_NUM_THREADS=1, on a machine shared with other jobs"}
        write_json_atomic(args.out, record)


if __name__ == "__main__":
    main()
