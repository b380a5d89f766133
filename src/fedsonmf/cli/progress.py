"""Live progress of a federated run (one swappable printer; the maths never prints).

A rounds bar measures how far the run is from its end, which is whichever comes
first: the round budget or the tolerance.  With ``tol > 0`` the bar follows
R/R1 (a clustering fit: R_step/R_step1, docs/algorithm.md §7.5) on a log scale from 1
down to tol (so it does not crawl to 80 of 200 rounds and stop); the text beside it
says ``round k/K`` and ``R/R1 = ... -> tol``.  Every bar shows elapsed time and an ETA.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["RoundProgress", "progress_columns", "round_fraction", "round_status"]

#: units of a rounds bar (a fraction of the way to the end of the run)
UNITS = 1000


def progress_columns():
    """The columns of every fedsonmf bar: name, bar, status text, elapsed, ETA."""
    return (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())


def round_fraction(row: dict, max_rounds: int, tol: float | None) -> float:
    """How far the run is from its end after ``row``: rounds / budget, or log(R/R1) / log(tol) if further."""
    frac = row["round"] / max(int(max_rounds), 1)
    rel = row.get("R_rel", row.get("R_step_rel"))  # a clustering fit's rows carry only the step's
    if tol and tol > 0 and rel is not None and rel > 0 and math.isfinite(rel):
        frac = max(frac, min(1.0, max(0.0, math.log(rel) / math.log(tol))))
    return min(frac, 1.0)


def round_status(row: dict, max_rounds: int, tol: float | None) -> str:
    """``round k/K  R/R1=...  [-> tol]  F=...  rank=...``."""
    text = f"round {row['round']}/{max_rounds}"
    if "R_rel" in row:
        text += f"  R/R1={row['R_rel']:.2e}" + (f" -> {tol:.0e}" if tol and tol > 0 else "")
        text += f"  F={row['objective']:.5g}"
    elif "R_step_rel" in row:
        text += f"  R_step/R_step1={row['R_step_rel']:.2e}" + (f" -> {tol:.0e}" if tol and tol > 0 else "")
    return text + f"  rank={row['effective_rank']}"


class RoundProgress:
    """A rich progress bar fed with history rows via :meth:`update`.

    Use as a context manager; ``enabled=False`` makes it a no-op.  ``tol``: the
    run's tolerance (the bar then also follows R/R1 towards it).
    """

    def __init__(self, total: int, *, enabled: bool = True, title: str = "rounds", console: Console | None = None,
                 tol: float | None = None):
        self.enabled = enabled
        self.total = total
        self.tol = tol
        self.title = title
        self._progress = None
        self._task = None
        self._console = console or Console(stderr=True)

    def __enter__(self):
        if self.enabled:
            self._progress = Progress(*progress_columns(), console=self._console, transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task(self.title, total=UNITS, status=f"round 0/{self.total}")
        return self

    def update(self, row: dict) -> None:
        if self._progress is None:
            return
        self._progress.update(self._task, completed=UNITS * round_fraction(row, self.total, self.tol),
                              status=round_status(row, self.total, self.tol))

    def __exit__(self, *exc):
        if self._progress is not None:
            if exc[0] is None:  # the run ended (budget or tolerance): the bar is full
                self._progress.update(self._task, completed=UNITS)
            self._progress.__exit__(*exc)
        return False
