"""PNG plots of per-round histories (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedsonmf._io import save_figure_atomic

if TYPE_CHECKING:
    from fedsonmf.protocol.history import History


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_residuals(histories: Mapping[str, History], path, metric: str = "R_rel", title: str | None = None,
                   target: float | None = 1e-2) -> Path:
    """Plot ``metric`` (default R^s/R^1) per round on a log scale, one line per history, and the
    ``target`` level as a labelled dashed line (None: no line)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, hist in histories.items():
        y = hist.column(metric)
        ax.semilogy(hist.column("round"), np.maximum(y, 1e-300), marker=".", label=label)
    ax.set_xlabel("communication round s")
    ax.set_ylabel({"R_rel": "$R^s / R^1$", "R_avg_rel": r"$\bar R^s / R^1$"}.get(metric, metric))
    if target is not None:
        ax.axhline(target, color="grey", lw=0.8, ls="--", label=f"target R/R1 = {target:g}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    try:
        save_figure_atomic(fig, path)  # 0600, like every other output of a run
    finally:
        plt.close(fig)
    return Path(path)
