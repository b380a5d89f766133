"""The background-component effect: per round, the energy share of the largest
row of V and the clustering ACC of that round's V, old default vs new default.

Old default: r = c, no per-client preprocessing (rows of V^T normalised before k-means).
New default: ``FedMultiViewClustering``'s defaults (r = 2c, per-sample l2, dense views
centred and standardised).  Both run the same federation (mu auto, rho1 0, tau 10, ...).

    .venv/bin/python benchmarks/bench_background.py [--seeds 3] [--every 5]

Writes ``benchmarks/results/background.json`` and ``docs/figures/background-component.png``.
Labels are used only to score each round's partition (the figure), never by the method.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from fedsonmf._io import new_private_dir, save_figure_atomic, write_json_atomic
from fedsonmf._validation import check_views
from fedsonmf.datasets import default_data_dir, load_mat
from fedsonmf.estimators.clustering import FedMultiViewClustering, _check_view_structure, kmeans_on_embedding
from fedsonmf.estimators.options import from_flat  # noqa: E402
from fedsonmf.federation.inprocess import InProcessTransport
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.metrics import clustering_scores
from fedsonmf.pipeline.rank_rule import resolve_rank
from fedsonmf.protocol.config import FedConfig

DATASETS = {"BBCSport": ("BBCSport", "zskong", "BBCSport.mat"), "MSRC-v1": ("MSRC-v1", "youweiliang", "MSRC_v1.mat")}
VARIANTS = {"old default (r = c, no preprocessing)": {"n_components": "paper", "preprocess": "none"},
            "new default": {}}


def trace(ds, variant: dict, seed: int, every: int, max_rounds: int) -> list[dict]:
    """Rounds of one federated fit with the variant's client views: energy share and ACC."""
    c = int(np.unique(ds.labels).size)
    est = FedMultiViewClustering(c, random_state=seed, **from_flat(variant))
    views = _check_view_structure(ds.views)
    est._validate(views[0].shape[0])
    r, _ = resolve_rank(c, [X.shape[1] for X in views], est.n_components)
    est.n_components_, est.preprocessing_, est.view_scales_ = r, [], None
    Xs, _ = est._client_views(views, fitted=False)
    views_dn = check_views(Xs, r)
    cfg = FedConfig(r)
    clients = [ClientRuntime(X, "fedsonmf", cfg) for X in views_dn]
    rows = []

    def on_round_end(state, history):
        s = history.rows[-1]["round"]
        if s == 1 or s % every == 0:
            V = state.arrays["V"]
            energy = np.sum(V * V, axis=1)
            labels, _ = kmeans_on_embedding(V.T, c, normalize=True, random_state=seed)
            rows.append({"round": int(s), "largest_share": float(energy.max() / max(energy.sum(), 1e-300)),
                         "acc": clustering_scores(ds.labels, labels)["acc"]})

    run_federation(InProcessTransport(clients), "fedsonmf", cfg, max_rounds=max_rounds, tol=1e-4, seed=seed,
                   on_round_end=on_round_end)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/background.json"))
    ap.add_argument("--png", type=Path, default=Path("docs/figures/background-component.png"))
    args = ap.parse_args()
    root = default_data_dir()
    if root is None:
        raise SystemExit("shared data folder not found (set FEDSONMF_DATA)")
    out = {}
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, parts in DATASETS.items():
            ds = load_mat(root.joinpath(*parts))
            out[name] = {v: [trace(ds, kw, s, args.every, args.rounds) for s in range(args.seeds)]
                         for v, kw in VARIANTS.items()}
            for v, runs in out[name].items():
                last = [run[-1] for run in runs]
                print(f"{name:9s} {v:40s} final largest share {np.mean([x['largest_share'] for x in last]):.2f}  "
                      f"ACC {100 * np.mean([x['acc'] for x in last]):.1f}")
    new_private_dir(args.out.parent)
    write_json_atomic(args.out, {"seeds": args.seeds, "every": args.every, "results": out}, indent=1)
    plot(out, args.png)
    print(f"wrote {args.out} and {args.png}")


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(out), figsize=(5.5 * len(out), 6.5), squeeze=False, sharex="col")
    for j, (name, variants) in enumerate(out.items()):
        for (v, runs), color in zip(variants.items(), ("tab:red", "tab:blue")):
            for i, (key, label) in enumerate((("largest_share", "energy share of the largest row of V"),
                                              ("acc", "ACC of that round's V"))):
                ax = axes[i, j]
                for k, run in enumerate(runs):
                    ax.plot([x["round"] for x in run], [x[key] for x in run], color=color, alpha=0.7,
                            label=v if k == 0 else None)
                ax.set_ylabel(label)
                ax.set_ylim(0, 1.02)
                ax.grid(alpha=0.3)
        axes[0, j].set_title(f"{name} (one line per seed)")
        axes[1, j].set_xlabel("round")
        axes[0, j].legend(fontsize=8, loc="best")
    fig.tight_layout()
    new_private_dir(path.parent)
    save_figure_atomic(fig, path, dpi=110)


if __name__ == "__main__":
    main()
