"""Figures, CSVs and ``summary.md`` of the synthetic study (from the stored cells only)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fedsonmf._io import save_figure_atomic, write_atomic
from fedsonmf.experiments.study_design import METRICS, Cell, StudyConfig

__all__ = ["write_report", "rounds_to", "group_curves", "LABELS"]

LABELS = {
    "fedsonmf": "proposed",
    "fedmavg": "adapted FedMAvg",
    "fedmavg_decreasing": "adapted FedMAvg (decreasing)",
    "fedmgs": "adapted FedMGS",
    "fedmgs_avg": "adapted FedMGS (avg grad)",
    "fedvra": "adapted FedVRA-U",
    "server_update": "server update of V",
    "server_update_etag": "server update of V (step eta_g alpha)",
    "local_tau1": "local copy, tau=1",
    "no_correction": "local copy, tau=10, no correction",
}
_YLABEL = {"R_rel": "$R^s/R^1$", "R_avg_rel": r"$\bar R^s/R^1$", "R_rel0": "$R^s/R^0$", "R_avg_rel0": r"$\bar R^s/R^0$"}


def _label(alg: str, tau: int | None = None) -> str:
    lab = LABELS.get(alg, alg)
    if alg == "fedsonmf" and tau is not None:
        lab += f", tau={tau}"
    return lab


def rounds_to(rows: Sequence[dict], target: float, metric: str) -> int | None:
    """First round whose ``metric`` is <= target (None if never)."""
    for row in rows:
        if row.get(metric, np.inf) <= target:
            return int(row["round"])
    return None


def group_curves(records: Sequence[dict], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Rounds and a (seeds x rounds) matrix of ``metric`` (runs share one budget)."""
    n = min(len(r["rows"]) for r in records)
    Y = np.array([[row[metric] for row in r["rows"][:n]] for r in records], dtype=float)
    return np.arange(1, n + 1), Y


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panel_plot(path, panels: Mapping[float, Mapping[str, list[dict]]], metric: str, target: float, title: str,
                xmax: int | None = None):
    """One panel per h; per label the geometric mean over seeds with a min-max band."""
    plt = _plt()
    hs = list(panels)
    fig, axes = plt.subplots(1, len(hs), figsize=(3.3 * len(hs), 3.2), dpi=90, sharey=True, squeeze=False)
    for ax, h in zip(axes[0], hs):
        for i, (label, recs) in enumerate(panels[h].items()):
            x, Y = group_curves(recs, metric)
            Yc = np.maximum(Y, 1e-16)
            mean = np.exp(np.mean(np.log(Yc), axis=0))
            color = f"C{i}"
            ax.semilogy(x, mean, color=color, lw=1.4, label=label)
            if len(recs) > 1:
                ax.fill_between(x, Yc.min(axis=0), Yc.max(axis=0), color=color, alpha=0.18, lw=0)
        ax.axhline(target, color="grey", lw=0.8, ls="--")
        if xmax is not None:
            ax.set_xlim(0, xmax + 1)
        ax.set_title(f"h = {h:g}", fontsize=9)
        ax.set_xlabel("round s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel(_YLABEL.get(metric, metric), fontsize=9)
    axes[0][-1].legend(fontsize=6, loc="best")
    fig.suptitle(title, fontsize=10)
    _save(plt, fig, path)


def _save(plt, fig, path) -> None:
    """Lay out, write atomically and close ``fig``."""
    fig.tight_layout()
    try:
        save_figure_atomic(fig, path)
    finally:
        plt.close(fig)


def _fig5_plot(path, table: dict, hs, variants, budgets, title):
    """Grouped bars: median rounds to target per variant and h (hatched: not reached in budget)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.4), dpi=90)
    w = 0.8 / len(variants)
    for i, v in enumerate(variants):
        for j, h in enumerate(hs):
            vals = table[(v, h)]
            reached = [x for x in vals if x is not None]
            med = _median_or_none(vals)
            x = j + (i - (len(variants) - 1) / 2) * w
            if med is None:
                ax.bar(x, budgets[v], w, color=f"C{i}", alpha=0.35, hatch="//", edgecolor=f"C{i}",
                       label=_label(v) if j == 0 else None)
                ax.text(x, budgets[v], f">{budgets[v]}", ha="center", va="bottom", fontsize=6)
            else:
                err = [[med - min(reached)], [max(reached) - med]]
                ax.bar(x, med, w, color=f"C{i}", yerr=err, capsize=2, label=_label(v) if j == 0 else None)
                ax.text(x, med, f"{med:g}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(hs)))
    ax.set_xticklabels([f"h = {h:g}" for h in hs])
    ax.set_ylabel("rounds to target")
    ax.set_ylim(0, 1.35 * max(budgets.values()))
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax.set_title(title, fontsize=10)
    _save(plt, fig, path)


def _median_or_none(vals):
    """Median over seeds counting 'not reached' as +inf; None if that median is inf."""
    x = np.array([np.inf if v is None else v for v in vals], dtype=float)
    med = float(np.median(x))
    return None if not np.isfinite(med) else (int(med) if med == int(med) else med)


def _fmt(vals, budget) -> str:
    med = _median_or_none(vals)
    reached = [v for v in vals if v is not None]
    k, n = len(reached), len(vals)
    if med is None:
        return f">{budget} ({k}/{n})" if k else f">{budget}"
    rng = f"{min(reached)}-{max(reached)}" if k else ""
    extra = "" if k == n else f", {k}/{n} reached"
    return f"{med:g} [{rng}{extra}]"


def write_report(out_dir, cfg: StudyConfig, figs: dict[str, list[Cell]], records: dict[str, dict], meta: dict):
    out = Path(out_dir)
    metric, target, hs = cfg.figure_metric, cfg.target, list(cfg.heterogeneity)

    # ---- raw numbers
    cols = ["key", "algorithm", "h", "tau", "seed", "round", "objective", "R_V", "R_U", "R", "R_rel", "R_avg_rel",
            "R_rel0", "R_avg_rel0", "effective_rank", "seconds"]
    rounds = io.StringIO(newline="")
    w = csv.writer(rounds)
    w.writerow(cols)
    for key in sorted(records):
        rec = records[key]
        sp = rec["spec"]
        for row in rec["rows"]:
            w.writerow([key, sp["algorithm"], sp["h"], sp["tau"], sp["seed"]] + [row.get(c, "") for c in cols[5:]])
    write_atomic(out / "rounds.csv", rounds.getvalue())
    to_target = io.StringIO(newline="")
    w = csv.writer(to_target)
    w.writerow(["key", "algorithm", "h", "tau", "seed", "budget", "R1", "R0"] + list(METRICS))
    for key in sorted(records):
        rec = records[key]
        sp = rec["spec"]
        w.writerow([key, sp["algorithm"], sp["h"], sp["tau"], sp["seed"], sp["rounds"], rec["rows"][0]["R"],
                    rec["R0"]] + [rounds_to(rec["rows"], target, m) or "" for m in METRICS])
    write_atomic(out / "rounds_to_target.csv", to_target.getvalue())

    def recs_of(cells, **sel):
        return [records[c.key] for c in cells if all(getattr(c, k) == v for k, v in sel.items())]

    # ---- figures
    fig2 = {h: {_label("fedsonmf", t): recs_of(figs["fig2"], h=h, tau=t) for t in cfg.taus} for h in hs}
    methods3 = ("fedsonmf",) + tuple(cfg.baselines)
    fig3 = {h: {_label(a): recs_of(figs["fig3"], h=h, algorithm=a) for a in methods3} for h in hs}
    fig4 = {h: {_label(a): recs_of(figs["fig4"], h=h, algorithm=a) for a in cfg.ablations} for h in hs}
    mname = METRICS[metric]
    _panel_plot(out / "fig2_tau.png", fig2, metric, target,
                f"Fig. 2: proposed method, tau = {list(cfg.taus)} ({mname})")
    _panel_plot(out / "fig3_baselines.png", fig3, metric, target,
                f"Fig. 3: proposed vs adapted baselines, tau = {cfg.tau_main}")
    _panel_plot(out / "fig4_ablation.png", fig4, metric, target,
                f"Fig. 4: ablation variants, tau = {cfg.tau_main} (first {cfg.rounds} of the one-step variants' "
                f"{cfg.rounds_one_step} rounds shown)", xmax=cfg.rounds)
    budgets = {a: recs_of(figs["fig4"], algorithm=a)[0]["spec"]["rounds"] for a in cfg.ablations}
    tab5 = {m: {(a, h): [rounds_to(r["rows"], target, m) for r in recs_of(figs["fig4"], h=h, algorithm=a)]
                for a in cfg.ablations for h in hs} for m in METRICS}
    _fig5_plot(out / "fig5_rounds_to_target.png", tab5[metric], hs, list(cfg.ablations), budgets,
               f"Fig. 5: rounds to {mname} <= {target:g} (median over {len(cfg.seeds)} seeds)")

    # ---- summary.md
    L = []
    run = meta["run"]
    L.append("# Synthetic study: summary\n")
    L.append(f"Seeds {list(cfg.seeds)}; data m={cfg.n_clients}, n={cfg.n_samples}, d={cfg.n_features}, r={cfg.rank}, "
             f"{cfg.n_zero_rows} zero rows, noise {cfg.noise}; mu={cfg.mu}, alpha={cfg.alpha}, eta_g={cfg.eta_g}, "
             f"rho1={cfg.rho1}; budgets: {cfg.rounds} rounds ({cfg.rounds_one_step} for one-step variants).  "
             f"Figures plot {mname} (geometric mean over seeds, band = min-max); target {target:g}.\n")
    L.append(f"Cells: {run['cells_total']} ({run['cells_computed']} computed in the last invocation, "
             f"{run['cells_reused']} reused); last invocation {run['seconds_this_invocation']:.1f} s with "
             f"{run['jobs']} job(s) on {run['cpu_count']} CPUs, load average at start {run['loadavg_start']}; "
             f"sum of cell run times {sum(r['seconds'] for r in records.values()):.1f} s.\n")
    L.append("Entries: median rounds to target over seeds [min-max over the seeds that reached it]; "
             "`>B` = not reached within the budget B by the median seed.\n")

    def table(title, rows_spec, cols_spec, metric_):
        L.append(f"\n### {title}\n")
        L.append("| | " + " | ".join(c for c, _ in cols_spec) + " |")
        L.append("|---" * (len(cols_spec) + 1) + "|")
        for rname, sel in rows_spec:
            cells_ = []
            for _, csel in cols_spec:
                recs = [r for r in (records[c.key] for c in unique_sel(figs, **sel, **csel))]
                vals = [rounds_to(r["rows"], target, metric_) for r in recs]
                budget = recs[0]["spec"]["rounds"] if recs else "?"
                cells_.append(_fmt(vals, budget) if recs else "-")
            L.append(f"| {rname} | " + " | ".join(cells_) + " |")

    hcols = [(f"h={h:g}", {"h": h}) for h in hs]
    L.append(f"\n## Fig. 5: rounds to target per ablation variant (tau = {cfg.tau_main}), every normalisation\n")
    for m, desc in METRICS.items():
        table(f"{m} = {desc}" + ("  (used in the figures)" if m == metric else ""),
              [(_label(a), {"algorithm": a, "tau": cfg.tau_main}) for a in cfg.ablations], hcols, m)
    L.append(f"\n## Fig. 2: proposed method per tau ({mname})\n")
    table(mname, [(f"tau={t}", {"algorithm": "fedsonmf", "tau": t}) for t in cfg.taus], hcols, metric)
    L.append(f"\n## Fig. 3: proposed vs adapted baselines, tau = {cfg.tau_main}\n")
    for m in METRICS:
        table(f"{m} = {METRICS[m]}", [(_label(a), {"algorithm": a, "tau": cfg.tau_main}) for a in methods3], hcols, m)

    L.append(f"\n## Residual after the common budget ({mname}, geometric mean over seeds)\n")
    L.append("| | " + " | ".join(c for c, _ in hcols) + " |")
    L.append("|---" * (len(hcols) + 1) + "|")
    for a in dict.fromkeys(methods3 + tuple(cfg.ablations)):
        vals = []
        for h in hs:
            recs = [records[c.key] for c in unique_sel(figs, algorithm=a, h=h, tau=cfg.tau_main)]
            s = min(cfg.rounds, min(len(r["rows"]) for r in recs))
            y = np.array([r["rows"][s - 1][metric] for r in recs])
            vals.append(f"{np.exp(np.mean(np.log(np.maximum(y, 1e-300)))):.2e} (s={s})")
        L.append(f"| {_label(a)} | " + " | ".join(vals) + " |")
    write_atomic(out / "summary.md", "\n".join(L) + "\n")


def unique_sel(figs: dict[str, list[Cell]], **sel) -> list[Cell]:
    seen: dict = {}
    for cells in figs.values():
        for c in cells:
            if all(getattr(c, k) == v for k, v in sel.items()):
                seen.setdefault(c.key, c)
    return list(seen.values())
