"""The clustering table: data set x method, one run, the best centralized reference per set.

Runs the federated clustering with its label-free defaults and the four simple centralized
references (:mod:`fedsonmf.experiments.references`) on the shared data sets, through the same
code path as ``fedsonmf reproduce table1`` (:func:`fedsonmf.experiments.table1.run_dataset`),
and checks the targets of docs/clustering.md: ACC >= the best reference on >= 80 % of the sets, mean ACC above
the mean of the best references, no set more than 3 points behind, BBCSport >= 92, 3Sources >= 75.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_clustering.py --seeds 10 \\
        --json benchmarks/results/clustering.json
    ... --params '{"preprocess": "l2"}' --tag l2   # a variant, same table
    ... --extra ../more-data/ --only BBC4view --only MNIST-4        # other .mat files (not in CI)
    ... --no-references --graph-search approximate   # the graph stage's search above 20 000 samples, forced

``docs/clustering.md`` gives the results and the study behind the defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedsonmf._io import write_json_atomic  # noqa: E402
from fedsonmf._provenance import meta  # noqa: E402
from fedsonmf.datasets.mat import default_data_dir, load_mat  # noqa: E402
from fedsonmf.exceptions import InputError  # noqa: E402
from fedsonmf.experiments.references import REFERENCES, best_reference  # noqa: E402
from fedsonmf.experiments.table1 import run_dataset  # noqa: E402

#: the four shared data sets (one file each; the other copies hold the same matrices or are incomplete)
FILES = {
    "3Sources": "3Sources/ChuanbinZhang/3Sources.mat",
    "BBCSport": "BBCSport/zskong/BBCSport.mat",
    "MSRC-v1": "MSRC-v1/youweiliang/MSRC_v1.mat",
    "Handwritten": "Handwritten/ChuanbinZhang/Handwritten.mat",
}
FLOORS = {"BBCSport": 92.0, "3Sources": 75.0}


def data_folder(ap: argparse.ArgumentParser, given: Path | None) -> Path:
    """``--data``, else the default data folder; a usage error when there is none."""
    root = given or default_data_dir()
    if root is None:
        ap.error("no data folder: pass --data or set FEDSONMF_DATA")
    return root


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="data folder (default: FEDSONMF_DATA or ../shared/data)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--only", action="append", help="data set names (default: all four)")
    ap.add_argument("--params", default="{}", help="FedMultiViewClustering parameters (JSON)")
    ap.add_argument("--tag", default="fedsonmf", help="name of the federated row")
    ap.add_argument("--no-references", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--extra", type=Path, action="append", default=[],
                    help="further .mat files or folders of them (each file a data set named by its stem), "
                         "measured after the shared four; --only selects among them too")
    ap.add_argument("--graph-search", choices=("auto", "exact", "approximate"), default="auto",
                    help="every client's k-NN graph search (default: auto, exact up to 20 000 samples); "
                         "'approximate' measures the large-n search on these sets")
    args = ap.parse_args(argv)
    args.data = data_folder(ap, args.data)
    if args.graph_search != "auto":
        import functools

        import fedsonmf.estimators.clustering as estimator
        from fedsonmf.pipeline.graph import client_graph

        # the estimator's clients build their graphs through this name (bench_scale_clustering does the same)
        estimator.client_graph = functools.partial(client_graph, search=args.graph_search)
    params = json.loads(args.params)
    methods = ["fedsonmf"] + ([] if args.no_references else list(REFERENCES))
    out = {"params": params, "seeds": list(range(args.seeds)), "tag": args.tag, "graph_search": args.graph_search,
           "results": {}}
    t0 = time.perf_counter()
    files = {name: args.data / rel for name, rel in FILES.items()}
    for extra in args.extra:
        for f in (sorted(extra.glob("*.mat")) if extra.is_dir() else [extra]):
            files[f.stem] = f
    for name, path in files.items():
        if args.only and name not in args.only:
            continue
        rel = FILES.get(name, str(path))
        try:
            ds = load_mat(path)
        except InputError as why:
            if name in FILES:  # the shared four must load
                raise
            print(f"{name}: skipped ({why})", file=sys.stderr, flush=True)  # one bad --extra file ends nothing
            out.setdefault("skipped", {})[name] = str(why)
            continue
        res = run_dataset(ds, key=name, label=rel, methods=methods, seeds=range(args.seeds), params=params)
        row = {m: {**{k: round(v, 2) for k, v in r.summary().items()},
                   "acc_per_seed": [round(100 * a, 2) for a in r.scores["acc"]]} for m, r in res.reports.items()}
        best = best_reference({m: v["acc"] for m, v in row.items()})
        out["results"][name] = {"file": rel, "methods": row, "best_reference": best}
        line = "  ".join(f"{m} {v['acc']:.1f}±{v['acc_std']:.1f} ({v['seconds']:.1f}s)" for m, v in row.items())
        print(f"{name}: {line}", flush=True)
        if args.json:
            write_json_atomic(args.json, out, indent=1)
    out["seconds"] = time.perf_counter() - t0
    out["meta"] = meta(inputs=[(name, files[name]) for name in out["results"]], seeds=out["seeds"])
    out["targets"] = targets(out["results"])
    print(json.dumps(out["targets"], indent=1))
    print(markdown(out["results"], args.tag))
    if args.json:
        write_json_atomic(args.json, out, indent=1)
    return 0


def targets(results: dict) -> dict:
    """The targets (docs/clustering.md) on these results (None where references were not run)."""
    gaps = {k: r["methods"]["fedsonmf"]["acc"] - r["best_reference"][1]
            for k, r in results.items() if r["best_reference"]}
    if not gaps:
        return {}
    ours = [results[k]["methods"]["fedsonmf"]["acc"] for k in gaps]
    bests = [results[k]["best_reference"][1] for k in gaps]
    return {"gap_to_best_reference": {k: round(v, 2) for k, v in gaps.items()},
            "share_at_or_above_best": float(np.mean([g >= 0 for g in gaps.values()])),
            "mean_acc": round(float(np.mean(ours)), 2), "mean_best_reference": round(float(np.mean(bests)), 2),
            "worst_gap": round(min(gaps.values()), 2),
            "floors": {k: (results[k]["methods"]["fedsonmf"]["acc"], f) for k, f in FLOORS.items() if k in results}}


def markdown(results: dict, tag: str = "fedsonmf") -> str:
    methods = ["fedsonmf", *REFERENCES]
    lines = ["| data set | " + " | ".join(tag if m == "fedsonmf" else m for m in methods)
             + " | best reference | ours − best |", "|---" * (len(methods) + 3) + "|"]
    for name, r in results.items():
        cells = []
        for m in methods:
            v = r["methods"].get(m)
            cells.append("" if v is None else f"{v['acc']:.1f} ± {v['acc_std']:.1f}")
        best = r["best_reference"]
        ours = r["methods"]["fedsonmf"]["acc"]
        tail = f"{best[0]} {best[1]:.1f} | {ours - best[1]:+.1f}" if best else " | "
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {tail} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
