"""Incomplete views with the final clustering defaults: availability masks against zero-filling.

* ``threesources``: the incomplete 3Sources file (416 stories, its ``ind`` mask);
* ``removed``: BBCSport and MSRC-v1 with 20 / 50 / 70 % of each view's samples removed at random
  (every sample kept in at least one view: a sample left in none goes back to one view chosen
  at random), the same removal for both variants of a seed.

Each variant is :class:`~fedsonmf.estimators.clustering.FedMultiViewClustering` with its
defaults: ``masks`` = the availability masks (docs/algorithm.md §15.1: a missing sample is never read),
``zero_filled`` = the missing samples as all-zero rows and no masks.  ACC/NMI in %.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_incomplete_clustering.py --seeds 10 \\
        --json benchmarks/results/incomplete_clustering.json

``--weights coverage`` (a study, not the library): the masked fit with the weights of the
weighted objective (docs/algorithm.md §15.1) replaced by c_j / m instead of m / c_j (c_j = views
holding sample j), patched into the broadcast of this process only; ``--weights ones``: all 1.
``docs/clustering.md`` says why this is the mechanism behind zero-filling's lead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bench_clustering import FILES, data_folder  # noqa: E402  (the shared data files, one map)

from fedsonmf._io import write_json_atomic  # noqa: E402
from fedsonmf.datasets.mat import load_mat  # noqa: E402
from fedsonmf.estimators.clustering import FedMultiViewClustering  # noqa: E402
from fedsonmf.estimators.options import from_flat  # noqa: E402
from fedsonmf.metrics import clustering_scores  # noqa: E402

REMOVED = {name: FILES[name] for name in ("BBCSport", "MSRC-v1")}


def removal_masks(m: int, n: int, frac: float, rng) -> list[np.ndarray]:
    """m boolean masks of length n: each view loses round(frac n) samples; every sample kept in >= 1 view."""
    mk = np.ones((m, n), dtype=bool)
    k = int(round(frac * n))
    for p in range(m):
        mk[p, rng.choice(n, k, replace=False)] = False
    for j in np.flatnonzero(~mk.any(axis=0)):
        mk[rng.integers(m), j] = True
    return list(mk)


def patch_weights(kind: str) -> None:
    """Replace the weights m / c_j the server broadcasts with c_j / m ("coverage") or 1 ("ones")."""
    from fedsonmf.algorithms.proposed import FedSONMFAlgorithm
    from fedsonmf.protocol.messages import Message

    original = FedSONMFAlgorithm.broadcast

    def broadcast(self, state):
        msg = original(self, state)
        if "w" not in msg.arrays:
            return msg
        member = state.arrays["membership"]
        c, m = member.sum(axis=0).astype(np.float64), member.shape[0]
        w = c / m if kind == "coverage" else np.ones_like(c)
        return Message(msg.kind, msg.round, {**msg.arrays, "w": w}, msg.scalars)

    FedSONMFAlgorithm.broadcast = broadcast


def zero_fill(views, masks):
    out = []
    for X, mk in zip(views, masks):
        keep = sp.diags(mk.astype(np.float64))
        out.append(sp.csr_matrix(keep @ X) if sp.issparse(X) else np.asarray(X, dtype=np.float64) * mk[:, None])
    return out


VARIANTS = ("masks", "zero_filled")


def fit_both(views, labels, masks, c, seed, params) -> dict:
    row = {}
    for name, (vs, mk) in {"masks": (views, masks), "zero_filled": (zero_fill(views, masks), None)}.items():
        if name not in VARIANTS:
            continue
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the mostly-empty-rows hint is expected on zero-filled views
            lab = FedMultiViewClustering(c, random_state=seed, **from_flat(params)).fit_predict(vs, masks=mk)
        sc = clustering_scores(labels, lab)
        row[name] = {"acc": 100 * sc["acc"], "nmi": 100 * sc["nmi"], "seconds": time.perf_counter() - t0}
    return row


def summary(rows: list[dict]) -> dict:
    return {v: {k: [round(float(np.mean([r[v][k] for r in rows])), 2), round(float(np.std([r[v][k] for r in rows])), 2)]
                for k in ("acc", "nmi")} for v in VARIANTS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="data folder (default: FEDSONMF_DATA or ../shared/data)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--sources-seeds", type=int, default=None, help="seeds of the 3Sources part (default --seeds)")
    ap.add_argument("--parts", default="threesources,removed")
    ap.add_argument("--fractions", default="0.2,0.5,0.7")
    ap.add_argument("--params", default="{}")
    ap.add_argument("--weights", choices=("library", "coverage", "ones"), default="library")
    ap.add_argument("--masks-only", action="store_true", help="skip the zero-filled fits")
    ap.add_argument("--sets", default=",".join(REMOVED), help="data sets of the 'removed' part")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.data = data_folder(ap, args.data)
    params = json.loads(args.params)
    out = {"params": params, "seeds": args.seeds, "weights": args.weights}
    global VARIANTS
    if args.masks_only:
        VARIANTS = ("masks",)
    if args.weights != "library":
        patch_weights(args.weights)

    def save():
        if args.json:
            write_json_atomic(args.json, out, indent=1)

    if "removed" in args.parts:
        out["removed"] = {}
        for name, rel in REMOVED.items():
            if name not in args.sets.split(","):
                continue
            ds = load_mat(args.data / rel)
            for frac in (float(f) for f in args.fractions.split(",")):
                rows = []
                for seed in range(args.seeds):
                    rng = np.random.default_rng([seed, int(100 * frac)])
                    masks = removal_masks(ds.n_views, ds.n_samples, frac, rng)
                    rows.append(fit_both(ds.views, ds.labels, masks, ds.n_classes, seed, params))
                    print(name, frac, seed, {k: round(v["acc"], 1) for k, v in rows[-1].items()}, flush=True)
                out["removed"][f"{name} {int(100 * frac)}%"] = {"rows": rows, "summary": summary(rows)}
                print(name, frac, summary(rows), flush=True)
                save()
    if "threesources" in args.parts:
        ds = load_mat(args.data / "3Sources/zskong/Data_3Sources.mat")
        masks = [np.asarray(ds.mask[:, p], dtype=bool) for p in range(ds.n_views)]
        rows = []
        for seed in range(args.sources_seeds or args.seeds):
            rows.append(fit_both(ds.views, ds.labels, masks, ds.n_classes, seed, params))
            print("3Sources-incomplete", seed, {k: round(v["acc"], 1) for k, v in rows[-1].items()}, flush=True)
            out["threesources"] = {"rows": rows, "summary": summary(rows)}
            save()
        print("3Sources-incomplete", summary(rows), flush=True)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
