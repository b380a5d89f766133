"""The paper's synthetic study (Section 4.1, Figs. 2-5) as a resumable grid of cells.

A *cell* is one federated run: (algorithm, heterogeneity h, tau, seed, rounds)
on ``make_synthetic(h, seed)`` with the run seeded by the same seed.  The
figures share cells (the proposed method at tau = 10 appears in Figs. 2, 3
and 4), so each cell runs once.  Every finished cell is written atomically to
``<out>/cells/<key>.json`` together with its full specification; a re-run
loads every cell whose stored specification equals the wanted one and
computes only the rest, so an interrupted study resumes where it stopped and
gives the same numbers (runs are deterministic; BLAS is pinned to one thread).

Entry point: :func:`run_study` (the CLI ``fedsonmf reproduce synthetic`` is a
thin wrapper); the figures and ``summary.md`` come from
:mod:`fedsonmf.experiments.report`.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import numpy as np

from fedsonmf._io import new_private_dir, write_json_atomic
from fedsonmf._provenance import meta as provenance_meta
from fedsonmf.experiments.study_design import (
    METRICS,
    Cell,
    StudyConfig,
    study_cells,
    unique_cells,
)

__all__ = ["StudyConfig", "Cell", "study_cells", "run_cell", "run_study", "load_cells", "METRICS"]

def run_cell(cell: Cell, callback: Callable[[dict], None] | None = None) -> dict:
    """Run one cell and return its JSON-able record (spec, R0, per-round rows)."""
    from threadpoolctl import threadpool_limits

    from fedsonmf.datasets import make_synthetic
    from fedsonmf.estimators.sonmf import federated_sonmf

    with threadpool_limits(limits=1):
        data = make_synthetic(heterogeneity=cell.h, random_state=cell.seed,
                              n_clients=cell.data["n_clients"], n_samples=cell.data["n_samples"],
                              n_features=cell.data["n_features"], rank=cell.data["rank"],
                              n_zero_rows=cell.data["n_zero_rows"], noise=cell.data["noise"])
        t0 = time.perf_counter()
        res = federated_sonmf(
            data.views, cell.data["rank"], tau=cell.tau, max_rounds=cell.rounds, tol=0.0,
            algorithm=cell.algorithm, random_state=cell.seed, callback=callback, **cell.method,
        )
        seconds = time.perf_counter() - t0
    keep = ("round", "objective", "R_V", "R_U", "R", "R_rel", "R_avg_rel", "R_rel0", "R_avg_rel0",
            "effective_rank", "seconds")
    rows = [{k: row[k] for k in keep if k in row} for row in res.history.rows]
    return {"key": cell.key, "spec": cell.spec(), "R0": res.history.R0, "rows": rows, "seconds": seconds,
            "stopping_reason": res.stopping_reason}


def _atomic_write_json(path: Path, obj) -> None:
    write_json_atomic(path, obj, default=float, indent=0)  # 0600, like every result of fedsonmf


def _run_and_write(cell: Cell, cells_dir: str) -> tuple[str, float]:
    rec = run_cell(cell)
    rec["meta"] = provenance_meta(seeds=[int(cell.seed)] if hasattr(cell, "seed") else None)
    _atomic_write_json(Path(cells_dir) / f"{cell.key}.json", rec)
    return cell.key, rec["seconds"]


def load_cell(path: Path, cell: Cell) -> dict | None:
    """The stored record of ``cell`` if present, readable and made with the same spec."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    # compare through JSON so tuples/lists and int/float agree
    if json.loads(json.dumps(rec.get("spec"))) != json.loads(json.dumps(cell.spec())):
        return None
    return rec


def load_cells(out_dir, cells: Iterable[Cell]) -> dict[str, dict]:
    cells_dir = Path(out_dir) / "cells"
    out = {}
    for c in cells:
        rec = load_cell(cells_dir / f"{c.key}.json", c)
        if rec is not None:
            out[c.key] = rec
    return out


# --------------------------------------------------------------------------- the study
class _NullPrinter:
    def start(self, total_cost: float, n_todo: int, n_done: int): ...
    def cell_started(self, cell: Cell): ...
    def round(self, row: dict): ...
    def cell_done(self, cell: Cell, seconds: float): ...
    def stop(self): ...


class RichPrinter(_NullPrinter):
    """Live progress with rich: cells done, cost-weighted bar with ETA, current round."""

    def __init__(self, console=None):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._p = None

    def start(self, total_cost, n_todo, n_done):
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=self.console)
        self._p.__enter__()
        self._n_todo, self._n = n_todo, 0
        self.console.print(f"synthetic study: {n_done} cells reused, {n_todo} to run")
        self._task = self._p.add_task("cells", total=max(total_cost, 1e-9), info=f"0/{n_todo}")
        self._cur = self._p.add_task("round", total=1, info="", visible=False)

    def cell_started(self, cell):
        if self._p is not None:
            self._p.update(self._cur, description=cell.key, total=cell.rounds, completed=0, visible=True, info="")

    def round(self, row):
        if self._p is not None:
            self._p.update(self._cur, completed=row["round"], info=f"R/R1={row.get('R_rel', float('nan')):.2e}")

    def cell_done(self, cell, seconds):
        if self._p is not None:
            self._n += 1
            self._p.update(self._task, advance=cell.cost,
                           info=f"{self._n}/{self._n_todo}  last: {cell.key} {seconds:.1f}s")

    def stop(self):
        if self._p is not None:
            self._p.__exit__(None, None, None)
            self._p = None


def run_study(out_dir, cfg: StudyConfig, *, jobs: int = 1, printer=None, report: bool = True,
              max_cells: int | None = None) -> dict:
    """Run (or resume) the study into ``out_dir`` and write its outputs.

    Parameters
    ----------
    out_dir : path
        ``cells/`` (one JSON per finished cell), ``config.json``, ``rounds.csv``,
        ``rounds_to_target.csv``, ``fig2..fig5`` PNGs and ``summary.md``.
    cfg : StudyConfig
    jobs : int
        Worker processes (1: run in this process, with per-round progress).
    printer : RichPrinter or None
        Progress display; None shows nothing.
    report : bool
        Write the figures, CSVs and ``summary.md`` at the end.
    max_cells : int, optional
        Stop after computing this many new cells (for tests of resuming).

    Returns
    -------
    dict with ``computed``, ``reused``, ``seconds`` and ``complete``.
    """
    out = Path(out_dir)
    cells_dir = new_private_dir(out / "cells")
    printer = printer or _NullPrinter()
    figs = study_cells(cfg)
    cells = unique_cells(figs)
    done = load_cells(out, cells)
    todo = sorted((c for c in cells if c.key not in done), key=lambda c: -c.cost)
    if max_cells is not None:
        todo = todo[:max_cells]
    t0 = time.perf_counter()
    load_start = _loadavg()
    printer.start(sum(c.cost for c in todo), len(todo), len(done))
    try:
        if jobs <= 1:
            for c in todo:
                printer.cell_started(c)
                rec = run_cell(c, callback=printer.round)
                _atomic_write_json(cells_dir / f"{c.key}.json", rec)
                printer.cell_done(c, rec["seconds"])
        else:
            by_key = {c.key: c for c in todo}
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                pending = {pool.submit(_run_and_write, c, str(cells_dir)) for c in todo}
                while pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        key, secs = fut.result()
                        printer.cell_done(by_key[key], secs)
    finally:
        printer.stop()
    seconds = time.perf_counter() - t0
    records = load_cells(out, cells)
    complete = len(records) == len(cells)
    meta = {
        "study": cfg.to_dict(),
        "run": {
            "cells_total": len(cells), "cells_computed": len(todo), "cells_reused": len(done),
            "seconds_this_invocation": seconds, "jobs": jobs, "cpu_count": os.cpu_count(),
            "loadavg_start": load_start, "loadavg_end": _loadavg(), "python": platform.python_version(),
            "numpy": np.__version__, "complete": complete,
        },
        "metrics": METRICS,
        "meta": provenance_meta(seeds=sorted({int(c.seed) for c in cells if hasattr(c, "seed")}) or None),
    }
    _atomic_write_json(out / "config.json", meta)
    if report and complete:
        from fedsonmf.experiments.report import write_report

        write_report(out, cfg, figs, records, meta)
    return {"computed": len(todo), "reused": len(done), "seconds": seconds, "complete": complete}


def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return None
