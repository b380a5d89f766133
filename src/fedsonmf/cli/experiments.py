"""CLI commands of the experiments area (registered by :mod:`fedsonmf.cli`).

``fedsonmf reproduce synthetic [--quick] [--out DIR] [--jobs N]`` runs (or
resumes) the synthetic study of Figs. 2-5 (:mod:`fedsonmf.experiments`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer


def register(app, reproduce_app) -> None:
    """Add this area's commands to the main app and to fedsonmf reproduce."""

    @reproduce_app.command("synthetic")
    def reproduce_synthetic(
        out: Optional[Path] = typer.Option(
            None, "--out", "-o", help="Output folder (default results/synthetic-study[-quick])."
        ),
        quick: bool = typer.Option(False, "--quick",
                                   help="Small fast version (2 seeds, 5 clients, n=60, tau<=20, 20 rounds)."),
        jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Worker processes (cells run in parallel)."),
        seeds: Optional[int] = typer.Option(None, help="Number of seeds (0..k-1) instead of the default."),
        rounds: Optional[int] = typer.Option(None, help="Round budget of every cell except the one-step variants."),
        rounds_one_step: Optional[int] = typer.Option(None, help="Round budget of the one-step ablation variants."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    ):
        """Figs. 2-5 of the paper's synthetic study: tau sweep, baselines, ablations, rounds to target.

        Finished cells are kept in OUT/cells/ (one JSON each); running the same
        command again resumes and recomputes nothing that is finished.
        """
        from fedsonmf.experiments.synthetic_study import (
            RichPrinter,
            StudyConfig,
            run_study,
        )

        changes: dict[str, Any] = {}
        if seeds is not None:
            changes["seeds"] = tuple(range(seeds))
        if rounds is not None:
            changes["rounds"] = rounds
        if rounds_one_step is not None:
            changes["rounds_one_step"] = rounds_one_step
        cfg = StudyConfig.quick(**changes) if quick else StudyConfig(**changes)
        out = out or Path("results") / ("synthetic-study-quick" if quick else "synthetic-study")
        info = run_study(out, cfg, jobs=jobs, printer=None if quiet else RichPrinter())
        typer.echo(
            f"{info['computed']} cells computed, {info['reused']} reused, {info['seconds']:.1f} s; "
            f"outputs in {out}" + ("" if info["complete"] else " (incomplete)")
        )
