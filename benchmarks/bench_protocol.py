"""The development/confirmation protocol: one half of benchmarks/datasets.json, set x method x seed.

Every set of the chosen half (``benchmarks/datasets.json``, split fixed before any result) is
checked against its sha256, read with :func:`fedsonmf.datasets.mat.load_mat`, and clustered
by the default ``FedMultiViewClustering(c, random_state=s)`` (``fedmvc``; ``--params`` gives a
variant) and by the four simple centralized references the project ships
(:data:`fedsonmf.experiments.references.REFERENCES`).  Each fit runs in its own child process
with a wall-clock budget (``--budget``); a fit over budget is killed and recorded as
``timeout``.  The record (``benchmarks/results/protocol_<half>[_<tag>].json``, written
atomically, 0600, after every set) holds every cell, the per-set means and the criteria of
issue 56: the mean ACC of ``fedmvc`` against the mean of the best reference per set and of
``mv-spectral``, and the sets more than 5 points behind the best reference (2-D toy sets aside).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_protocol.py --half development
    ... --half confirmation
    # a variant of the federated fit; the references are taken from the baseline record:
    ... --half development --params '{"preprocess": "l2"}' --tag l2 \\
        --references-from benchmarks/results/protocol_development.json

Choices are made on the development half only; the confirmation half is run once per adopted
change, with today's defaults beside it.  The data stay outside the repository
(``--data-dir``, default ``$FEDSONMF_MVDATA`` or ``mvdata/`` beside the checkout, as ``shared/`` is).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedsonmf._io import write_json_atomic  # noqa: E402
from fedsonmf._provenance import meta  # noqa: E402
from fedsonmf.datasets.mat import load_mat  # noqa: E402
from fedsonmf.estimators.clustering import FedMultiViewClustering  # noqa: E402  (loaded before any fork)
from fedsonmf.experiments.references import REFERENCES, run_reference  # noqa: E402
from fedsonmf.metrics import clustering_accuracy, nmi  # noqa: E402

LIST = ROOT / "benchmarks" / "datasets.json"
FED = "fedmvc"
#: a set is "behind" when the federated mean ACC is more than this many points under the best reference's
BEHIND = 5.0
#: "within" the best reference: at most this many points under it
WITHIN = 0.5


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def select(half: str, only: list[str] | None) -> list[dict]:
    """The entries of ``half`` (``development``, ``confirmation`` or ``shared``), smallest first."""
    entries = json.loads(LIST.read_text())["datasets"]
    if half == "shared":
        chosen = [e for e in entries if e["status"] == "shared"]
    else:
        chosen = [e for e in entries if e.get("half") == half]
    if only:
        chosen = [e for e in chosen if e["name"] in only]
    return sorted(chosen, key=lambda e: (e.get("n", 0) * sum(e.get("widths", [0])), e["name"]))


def _fit(method: str, views, n_clusters: int, seed: int, params: dict):
    """The labels of one fit and the distinct warning texts it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if method == FED:
            labels = FedMultiViewClustering(n_clusters, random_state=seed, **params).fit_predict(views)
        else:
            labels = run_reference(method, views, n_clusters, random_state=seed)
    texts = sorted({str(w.message)[:300] for w in caught})
    return np.asarray(labels), texts


def _child(conn, method, views, y, n_clusters, seed, params):  # pragma: no cover - runs in a child process
    try:
        t0 = time.perf_counter()
        labels, texts = _fit(method, views, n_clusters, seed, params)
        seconds = time.perf_counter() - t0
        conn.send({"acc": 100 * clustering_accuracy(y, labels), "nmi": 100 * nmi(y, labels),
                   "seconds": seconds, "warnings": texts})
    except Exception as exc:  # recorded, the run goes on
        conn.send({"error": f"{type(exc).__name__}: {exc}"[:500]})
    finally:
        conn.close()


def run_cells(tasks, views, y, n_clusters, params, budget: float, workers: int) -> dict:
    """Run ``tasks`` [(method, seed)] in child processes, at most ``workers`` at once, each within ``budget`` s."""
    ctx = mp.get_context("fork")  # the children inherit the loaded views
    pending = list(tasks)
    live: dict = {}
    out: dict = {}
    while pending or live:
        while pending and len(live) < workers:
            method, seed = pending.pop(0)
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(send, method, views, y, n_clusters, seed, params))
            proc.start()
            send.close()
            live[(method, seed)] = (proc, recv, time.perf_counter())
        time.sleep(0.05)
        for key, (proc, recv, t0) in list(live.items()):
            if recv.poll():
                try:
                    out[key] = recv.recv()
                except EOFError:
                    out[key] = {"error": f"child exited with code {proc.exitcode}"}
                proc.join()
            elif not proc.is_alive():
                out[key] = {"error": f"child exited with code {proc.exitcode}"}
            elif time.perf_counter() - t0 > budget:
                proc.kill()
                proc.join()
                out[key] = {"timeout": budget}
            else:
                continue
            recv.close()
            del live[key]
    return out


def set_summary(cells: dict, methods: list[str], seeds: list[int]) -> dict:
    """Per method: mean ACC/NMI over the seeds, or the reason it has none."""
    summary = {}
    for m in methods:
        got = [cells.get(m, {}).get(str(s), {}) for s in seeds]
        if all("acc" in g for g in got):
            summary[m] = {"acc": float(np.mean([g["acc"] for g in got])),
                          "nmi": float(np.mean([g["nmi"] for g in got])),
                          "seconds": float(np.mean([g["seconds"] for g in got]))}
        else:
            summary[m] = {"missing": [g.get("error") or (f"timeout {g['timeout']} s" if "timeout" in g else "not run")
                                      for g in got if "acc" not in g]}
    return summary


def criteria(rows: dict, entries: dict) -> dict:
    """Issue 56's criteria over the sets where every method finished every seed."""
    complete = {k: r for k, r in rows.items() if all("acc" in v for v in r["mean"].values())}
    if not complete:
        return {"sets": 0}
    fed, best, spec, gap, behind, within = [], [], [], {}, [], 0
    for name, r in complete.items():
        refs = {m: v["acc"] for m, v in r["mean"].items() if m in REFERENCES}
        b = max(refs.values())
        f = r["mean"][FED]["acc"]
        fed.append(f)
        best.append(b)
        spec.append(r["mean"].get("mv-spectral", {}).get("acc", np.nan))
        gap[name] = round(f - b, 2)
        within += f >= b - WITHIN
        toy = "toy" in entries[name].get("kind", "") or max(entries[name].get("widths", [3])) <= 2
        if f < b - BEHIND and not toy:
            behind.append(name)
    return {"sets": len(complete), "incomplete": sorted(set(rows) - set(complete)),
            "fedmvc_mean": float(np.mean(fed)), "best_reference_mean": float(np.mean(best)),
            "mv_spectral_mean": float(np.nanmean(spec)), "median_gap": float(np.median(list(gap.values()))),
            "within_0.5": int(within), f"behind_more_than_{BEHIND:g}": sorted(behind), "gap": gap,
            "meets_best_reference_mean": bool(np.mean(fed) >= np.mean(best)),
            "meets_mv_spectral_mean": bool(np.mean(fed) >= np.nanmean(spec))}


def markdown(record: dict, variant: dict | None = None, label: str = "variant") -> str:
    """The record as a markdown table, set x method: fedmvc per seed, the references' means over the seeds."""
    refs = list(REFERENCES)
    seeds = [str(s) for s in record["seeds"]]

    def fed(cells):
        got = [cells.get(s, {}) for s in seeds]
        per = ", ".join(f"{g['acc']:.1f}" if "acc" in g else ("t/o" if "timeout" in g else "err") for g in got)
        return (f"{np.mean([g['acc'] for g in got]):.1f}" if all("acc" in g for g in got) else "--") + f" ({per})"

    head = ["set", "n", "c", "widths", f"fedmvc (seeds {', '.join(seeds)})"] + ([label] if variant else []) + refs
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in record["rows"].items():
        cols = [name, str(row["n"]), str(row["classes"]), ",".join(str(w) for w in row["widths"]),
                fed(row["cells"][FED])]
        if variant:
            vrow = variant["rows"].get(name)
            narrow = any(w < 2 * row["classes"] for w in row["widths"])
            cols.append(fed(vrow["cells"][FED]) if vrow else ("not run" if narrow else "= fedmvc"))
        cols += [f"{row['mean'][m]['acc']:.1f}" if "acc" in row["mean"][m] else "--" for m in refs]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--half", required=True, choices=("development", "confirmation", "shared"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--budget", type=float, default=240.0, help="wall-clock seconds per fit (default 240)")
    ap.add_argument("--workers", type=int, default=1, help="fits at once (default 1; the machine may be shared)")
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get("FEDSONMF_MVDATA", ROOT.parent / "mvdata")))
    ap.add_argument("--params", default="{}", help="JSON keyword arguments of FedMultiViewClustering (a variant)")
    ap.add_argument("--tag", default="", help="suffix of the record's name for a variant")
    ap.add_argument("--references-from", type=Path, default=None,
                    help="take the references' cells from this record (same half and seeds); fit fedmvc only")
    ap.add_argument("--only", action="append", default=None, help="only this set (repeatable)")
    ap.add_argument("--narrow-only", action="store_true",
                    help="only the sets with a view narrower than 2c (a change to narrow views alone)")
    ap.add_argument("--fed-only", action="store_true", help="fit fedmvc only (references from --references-from)")
    ap.add_argument("--base", type=Path, default=None,
                    help="copy the rows of the sets not run here from this record (same half and seeds)")
    ap.add_argument("--skip", action="append", default=[], help="leave this set out (repeatable)")
    ap.add_argument("--resume", type=Path, default=None,
                    help="reuse every finished cell of this record; rerun the others (timeouts, errors, new sets)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--markdown", action="store_true",
                    help="print the record of --half (with --tag: beside its variant) as a table; fit nothing")
    args = ap.parse_args(argv)
    params = json.loads(args.params)
    out = args.out or ROOT / "benchmarks" / "results" / (
        f"protocol_{args.half}" + (f"_{args.tag}" if args.tag else "") + ".json")
    if args.markdown:
        results = ROOT / "benchmarks" / "results"
        record = json.loads((results / f"protocol_{args.half}.json").read_text())
        variant = json.loads((results / f"protocol_{args.half}_{args.tag}.json").read_text()) if args.tag else None
        print(markdown(record, variant, f"fedmvc {args.tag}"))
        print("\n" + json.dumps({k: v for k, v in record.get("criteria", {}).items() if k != "gap"}))
        return 0
    seeds = list(args.seeds)
    methods = [FED, *REFERENCES]
    earlier = json.loads(args.references_from.read_text())["rows"] if args.references_from else {}
    resumed = json.loads(args.resume.read_text())["rows"] if args.resume else {}
    entries = [e for e in select(args.half, args.only) if e["name"] not in args.skip]
    if args.narrow_only:
        entries = [e for e in entries if any(d < 2 * e["classes"] for d in e["widths"])]
    by_name = {e["name"]: e for e in entries}
    rows: dict = {}
    skipped: dict = {}
    record = {"meta": meta(seeds=seeds, call=" ".join(sys.argv)), "half": args.half, "seeds": seeds,
              "budget_seconds": args.budget, "params": params, "methods": methods,
              "note": "wall times were measured on a machine shared with other jobs (2 cores, nice 10, 1 thread)",
              "rows": rows, "skipped": skipped}
    for name in args.skip:
        skipped[name] = "left out of this run (--skip)"
    for e in entries:
        path = args.data_dir / e["file"]
        if not path.is_file():
            skipped[e["name"]] = f"no file {path}"
            continue
        if sha256_of(path) != e["sha256"]:
            skipped[e["name"]] = f"{path}: sha256 differs from the list's"
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = load_mat(path)
        except Exception as exc:
            skipped[e["name"]] = f"load_mat: {type(exc).__name__}: {exc}"[:300]
            continue
        c = ds.n_classes
        cells: dict = {m: {} for m in methods}
        tasks = []
        for m in methods:
            for s in seeds:
                old = earlier.get(e["name"], {}).get("cells", {}).get(m, {}).get(str(s))
                done_before = resumed.get(e["name"], {}).get("cells", {}).get(m, {}).get(str(s), {})
                if "acc" in done_before:
                    cells[m][str(s)] = done_before
                elif m != FED and old is not None:
                    cells[m][str(s)] = old
                elif m == FED or not args.fed_only:
                    tasks.append((m, s))
        t0 = time.perf_counter()
        done = run_cells(tasks, ds.views, ds.labels, c, params, args.budget, args.workers)
        for (m, s), v in done.items():
            cells[m][str(s)] = v
        rows[e["name"]] = {"n": ds.n_samples, "widths": ds.n_features, "classes": c, "kind": e.get("kind", ""),
                           "cells": cells, "mean": set_summary(cells, methods, seeds)}
        record["criteria"] = criteria(rows, by_name)
        write_json_atomic(out, record)
        r = rows[e["name"]]["mean"]
        line = "  ".join(f"{m}={v['acc']:.1f}" if "acc" in v else f"{m}=--" for m, v in r.items())
        print(f"{e['name']:18s} {line}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.base is not None:
        base = json.loads(args.base.read_text())
        for name, row in base["rows"].items():
            if name not in rows:
                rows[name] = {**row, "copied_from": str(args.base)}
        by_name = {e["name"]: e for e in select(args.half, None)}
    record["criteria"] = criteria(rows, by_name)
    write_json_atomic(out, record)
    print(json.dumps({k: v for k, v in record["criteria"].items() if k != "gap"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
