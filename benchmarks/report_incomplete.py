"""Render benchmarks/results/incomplete.json as the markdown tables of docs/incomplete-and-partial.md.

    python benchmarks/report_incomplete.py [benchmarks/results/incomplete.json]
"""

import json
import sys
from collections import defaultdict

import numpy as np


def fmt_rounds(vals):
    got = [v for v in vals if v is not None]
    miss = len(vals) - len(got)
    s = f"{np.mean(got):.1f}" if got else "—"
    if got and len(got) > 1:
        s += f" ({min(got)}–{max(got)})"
    return s + (f", {miss}/{len(vals)} not reached" if miss else "")


def main(path="benchmarks/results/incomplete.json"):
    res = json.load(open(path))
    if "threesources" in res:
        t = res["threesources"]
        print(f"### Incomplete 3Sources ({t['n_samples']} stories, views present {t['views_present']}, "
              f"{t['seeds']} seeds, ≤ {t['max_rounds']} rounds, tol 1e-4)\n")
        print("| method | ACC | NMI | purity | s/seed |")
        print("|---|---|---|---|---|")
        names = {"masks": "fedsonmf with masks (§15.1)", "zero_filled": "fedsonmf, zero-filled views (before §15)",
                 "concat_nmf": "scikit-learn NMF, zero-filled concatenated views"}
        for k, runs in t["runs"].items():
            cells = [f"{100 * np.mean([r[m] for r in runs]):.2f} ± {100 * np.std([r[m] for r in runs]):.2f}"
                     for m in ("acc", "nmi", "purity")]
            print(f"| {names[k]} | " + " | ".join(cells) + f" | {np.mean([r['seconds'] for r in runs]):.1f} |")
        print()
    if "synthetic" in res:
        s = res["synthetic"]
        g = defaultdict(list)
        for r in s["rows"]:
            g[(r["removed"], r["variant"])].append(r)
        seeds = len({r["seed"] for r in s["rows"]})
        print(f"### Synthetic, samples removed from each view ({s['setting']}; {seeds} seeds)\n")
        print("| removed per view | variant | V recovery error (mean, max) | rounds to R/R¹ ≤ 1e-4 "
              "| uploaded floats/round |")
        print("|---|---|---|---|---|")
        for (frac, var), rows in sorted(g.items()):
            e = [r["V_recovery_error"] for r in rows]
            print(f"| {int(frac * 100)} % | {var} | {np.mean(e):.4f}, {np.max(e):.4f} | "
                  f"{fmt_rounds([r['rounds_to_1e-4'] for r in rows])} | {rows[0]['upload_floats_per_round']} |")
        print()
    if "partial" in res:
        p = res["partial"]
        g = defaultdict(list)
        for r in p["rows"]:
            g[(r["fraction"], r["rule"])].append(r)
        seeds = len({r["seed"] for r in p["rows"]})
        print(f"### Partial participation ({p['setting']}; {seeds} seeds, ≤ {p['max_rounds']} rounds)\n")
        rules = ["refresh", "server", "drop", "stale", "none"]
        print("| clients per round | " + " | ".join(
            {"refresh": "(a) refresh", "server": "(b) server-kept G_p", "drop": "(c) drop after a gap",
             "stale": "stale G_p (no handling)", "none": "no correction"}[x] for x in rules) + " |")
        print("|---" * (len(rules) + 1) + "|")
        for frac in sorted({k[0] for k in g}, reverse=True):
            cells = []
            for rule in rules:
                rows = g.get((frac, rule))
                if not rows and frac == 1.0 and rule in ("server", "drop", "stale"):
                    rows = g.get((frac, "refresh"))
                cells.append(fmt_rounds([r["rounds_to_1e-4"] for r in rows]) if rows else "—")
            print(f"| {int(frac * 100)} % | " + " | ".join(cells) + " |")
        print()
        print(f"R/R¹ at the end (median over seeds; the run stops at 1e-4 or after {p['max_rounds']} rounds):\n")
        print("| clients per round | " + " | ".join(rules) + " |")
        print("|---" * (len(rules) + 1) + "|")
        for frac in sorted({k[0] for k in g}, reverse=True):
            cells = []
            for rule in rules:
                rows = g.get((frac, rule)) or (g.get((frac, "refresh")) if frac == 1.0 and rule != "none" else None)
                cells.append(f"{np.median([r['final_R_rel'] for r in rows]):.2g}" if rows else "—")
            print(f"| {int(frac * 100)} % | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main(*sys.argv[1:])
