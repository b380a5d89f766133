"""Live progress of a federated run (one swappable printer; the maths never prints)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


class RoundProgress:
    """A rich progress bar fed with history rows via :meth:`update`.

    Use as a context manager; ``enabled=False`` makes it a no-op.
    """

    def __init__(self, total: int, *, enabled: bool = True, title: str = "rounds", console: Console | None = None):
        self.enabled = enabled
        self.total = total
        self.title = title
        self._progress = None
        self._task = None
        self._console = console or Console(stderr=True)

    def __enter__(self):
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=self._console, transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self.title, total=self.total, status="")
        return self

    def update(self, row: dict) -> None:
        if self._progress is None:
            return
        status = f"R/R1={row['R_rel']:.2e} F={row['objective']:.5g}" if "R_rel" in row else ""
        status += f" rank={row['effective_rank']}"
        self._progress.update(self._task, completed=row["round"], status=status)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
        return False
