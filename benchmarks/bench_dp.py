"""Clustering accuracy against the privacy budget epsilon (differential privacy of each client's view).

For each data set and each target epsilon, ``FedMultiViewClustering`` with its label-free defaults
and ``dp_epsilon=eps`` (the DP setting's own defaults: ``dp_rounds`` rounds, ``dp_clip``,
``dp_delta``; the noise multiplier calibrated by dp-accounting), over a few seeds.  Two reference
lines: the non-private default (up to 200 rounds, tol 1e-4) and the same number of rounds as a DP
run without noise (what the fewer rounds alone cost).

    .venv/bin/python benchmarks/bench_dp.py            # BBCSport and 3Sources, 2 seeds, 7 budgets
    .venv/bin/python benchmarks/bench_dp.py --quick    # BBCSport, 1 seed, 3 budgets (about a minute)
    # or one process per data set (two cores), then one figure:
    .venv/bin/python benchmarks/bench_dp.py --datasets BBCSport --out /tmp/dp-BBCSport.json --png /tmp/b.png &
    .venv/bin/python benchmarks/bench_dp.py --datasets 3Sources --out /tmp/dp-3Sources.json --png /tmp/s.png
    .venv/bin/python benchmarks/bench_dp.py --merge /tmp/dp-BBCSport.json /tmp/dp-3Sources.json

Writes ``benchmarks/results/dp.json`` and ``docs/figures/dp-acc-vs-epsilon.png`` (``--quick``:
``dp-quick.json`` / ``dp-quick.png`` beside them, so a quick run never replaces the full result).
Labels are used only to score.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from fedsonmf._io import new_private_dir, save_figure_atomic, write_json_atomic
from fedsonmf.datasets import default_data_dir, load_mat
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.estimators.options import from_flat  # noqa: E402
from fedsonmf.metrics import clustering_scores
from fedsonmf.protocol.params import default

DATASETS = {"BBCSport": ("BBCSport", "zskong", "BBCSport.mat"),
            "3Sources": ("3Sources", "ChuanbinZhang", "3Sources.mat")}
EPSILONS = (1e1, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8)
QUICK_EPSILONS = (1e2, 1e5, 1e8)


def fit(ds, seed: int, **params) -> dict:
    t0 = time.perf_counter()
    model = FedMultiViewClustering(ds.n_classes, random_state=seed, **from_flat(params)).fit(ds.views)
    sc = clustering_scores(ds.labels, model.labels_)
    row = {"seed": seed, "acc": sc["acc"], "nmi": sc["nmi"], "n_rounds": model.n_rounds_,
           "seconds": time.perf_counter() - t0}
    if model.privacy_ is not None:
        p = model.privacy_
        row.update({k: p[k] for k in ("epsilon", "epsilon_secagg", "epsilon_all_views", "delta",
                                      "noise_multiplier", "clip", "noise_std", "releases_per_client")})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="BBCSport, 1 seed, 3 budgets")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 2, quick 1)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=None,
                    help="data sets to run (default: both; quick: BBCSport)")
    ap.add_argument("--epsilons", nargs="+", type=float, default=None, help="target epsilons (default: the grid)")
    ap.add_argument("--merge", nargs="+", type=Path, default=None,
                    help="no fitting: combine the data sets of these result files into --out and plot them")
    args = ap.parse_args()
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        merged = {"settings": parts[0]["settings"], "datasets": {}}
        for part in parts:
            merged["datasets"].update(part["datasets"])
        out_path = args.out or Path("benchmarks/results/dp.json")
        png = args.png or Path("docs/figures/dp-acc-vs-epsilon.png")
        write_json_atomic(out_path, merged)
        plot(merged, png)
        print(f"wrote {out_path} and {png}")
        return
    quick = args.quick
    seeds = range(args.seeds or (1 if quick else 2))
    epsilons = tuple(args.epsilons) if args.epsilons else (QUICK_EPSILONS if quick else EPSILONS)
    names = args.datasets or (["BBCSport"] if quick else list(DATASETS))
    out_path = args.out or Path("benchmarks/results") / ("dp-quick.json" if quick else "dp.json")
    png = args.png or Path("docs/figures") / ("dp-quick.png" if quick else "dp-acc-vs-epsilon.png")
    root = default_data_dir()
    if root is None:
        raise SystemExit("shared data folder not found (set FEDSONMF_DATA)")
    rounds = default("dp_rounds")
    result = {"settings": {"dp_rounds": rounds, "dp_clip": default("dp_clip"), "dp_delta": default("dp_delta"),
                           "seeds": list(seeds), "epsilons": list(epsilons),
                           "estimator": "FedMultiViewClustering, label-free defaults"},
              "datasets": {}}
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            ds = load_mat(root.joinpath(*DATASETS[name]))
            res = {"n_samples": ds.n_samples, "n_views": ds.n_views, "n_classes": ds.n_classes,
                   "non_private": [fit(ds, s) for s in seeds],
                   "non_private_dp_rounds": [fit(ds, s, max_rounds=rounds, tol=0.0) for s in seeds],
                   # what a DP run is without its noise and clip: one fit, no refinement, dp_rounds rounds
                   "dp_pipeline_no_noise": [fit(ds, s, max_rounds=rounds, tol=0.0, n_init=1, refine="none")
                                            for s in seeds],
                   "dp": {}}
            print(f"{name}: non-private ACC {100 * np.mean([r['acc'] for r in res['non_private']]):.1f}, "
                  f"{rounds} rounds no noise {100 * np.mean([r['acc'] for r in res['non_private_dp_rounds']]):.1f}, "
                  f"the DP pipeline without noise or clip "
                  f"{100 * np.mean([r['acc'] for r in res['dp_pipeline_no_noise']]):.1f}", flush=True)
            result["datasets"][name] = res
            for eps in epsilons:
                rows = [fit(ds, s, dp_epsilon=eps) for s in seeds]
                res["dp"][repr(eps)] = rows
                write_json_atomic(out_path, result)  # after every budget: a long run keeps what it has
                print(f"{name}: epsilon {eps:g} (secagg {rows[0]['epsilon_secagg']:.3g}): noise multiplier "
                      f"{rows[0]['noise_multiplier']:.4g}, ACC {100 * np.mean([r['acc'] for r in rows]):.1f} "
                      f"± {100 * np.std([r['acc'] for r in rows]):.1f}", flush=True)
    plot(result, png)
    print(f"wrote {out_path} and {png}")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = result["datasets"]
    fig, axes = plt.subplots(1, len(data), figsize=(5.6 * len(data), 4.2), squeeze=False)
    rounds = result["settings"]["dp_rounds"]
    for ax, (name, res) in zip(axes[0], data.items()):
        eps = sorted(float(e) for e in res["dp"])
        acc = np.array([[r["acc"] for r in res["dp"][repr(e)]] for e in eps]) * 100
        ax.errorbar(eps, acc.mean(axis=1), yerr=acc.std(axis=1), marker="o", capsize=3, color="tab:blue",
                    label=f"DP ({rounds} rounds), mean ± std over seeds")
        ax.axhline(100 * np.mean([r["acc"] for r in res["non_private"]]), color="black", ls="--",
                   label="non-private default")
        ax.axhline(100 * np.mean([r["acc"] for r in res["non_private_dp_rounds"]]), color="gray", ls=":",
                   label=f"non-private, {rounds} rounds")
        if "dp_pipeline_no_noise" in res:
            ax.axhline(100 * np.mean([r["acc"] for r in res["dp_pipeline_no_noise"]]), color="tab:green", ls=":",
                       label=f"{rounds} rounds, one fit, no refinement (a DP run without noise or clip)")
        ax.axhline(100.0 / res["n_classes"], color="tab:red", ls="-.", lw=0.8, label="1 / classes")
        ax.set_xscale("log")
        ax.set_ylim(0, 100)
        ax.set_xlabel(f"epsilon (one client's whole view, delta = {result['settings']['dp_delta']:g})")
        ax.set_ylabel("ACC %")
        ax.set_title(f"{name} (n = {res['n_samples']}, {res['n_views']} views)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    new_private_dir(path.parent)
    save_figure_atomic(fig, path, dpi=110)


if __name__ == "__main__":
    main()
