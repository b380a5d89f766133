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

import dataclasses
import json
import os
import platform
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..algorithms import ABLATIONS, BASELINES

__all__ = ["StudyConfig", "Cell", "study_cells", "run_cell", "run_study", "load_cells", "METRICS"]

#: the four normalisations of the residual (ALGORITHM.md §7.3, History columns)
METRICS = {
    "R_rel": "R^s / R^1",
    "R_avg_rel": "mean_{t<=s} R^t / R^1 (paper's printed formula)",
    "R_rel0": "R^s / R^0",
    "R_avg_rel0": "mean_{t<=s} R^t / R^0",
}
#: algorithms that take a single U-step per round (they get ``rounds_one_step``)
ONE_STEP = ("server_update", "local_tau1", "server_update_etag")


@dataclass(frozen=True)
class StudyConfig:
    """Everything that defines the study (written to ``config.json``).

    Data: ``make_synthetic`` sizes (§8 defaults).  Method: FedConfig values
    (§11 defaults).  ``rounds`` is the budget of every cell except the one-step
    ablation variants, which move V ~10x less per round and get
    ``rounds_one_step``.  ``target`` is the residual target of Fig. 5.
    """

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    heterogeneity: tuple[float, ...] = (0.0, 0.3, 0.6, 0.9)
    taus: tuple[int, ...] = (5, 10, 20, 30)
    tau_main: int = 10
    rounds: int = 40
    rounds_one_step: int = 200
    baselines: tuple[str, ...] = BASELINES
    ablations: tuple[str, ...] = ABLATIONS
    target: float = 1e-2
    figure_metric: str = "R_rel"
    n_clients: int = 10
    n_samples: int = 100
    n_features: int = 20
    rank: int = 6
    n_zero_rows: int = 2
    noise: float = 0.01
    mu: float = 1.0
    alpha: float = 0.01
    eta_g: float = 1.5
    rho1: float = 1.0

    def __post_init__(self):
        from ..algorithms import ALGORITHMS
        from ..config import ParameterError

        for name in self.baselines + self.ablations:
            if name not in ALGORITHMS:
                raise ParameterError(f"unknown algorithm {name!r} in the study; choose from {sorted(ALGORITHMS)}")
        if not self.seeds:
            raise ParameterError("seeds must not be empty")
        if any(not (0.0 <= h <= 1.0) for h in self.heterogeneity):
            raise ParameterError(f"heterogeneity levels must be in [0, 1], got {self.heterogeneity!r}")
        for name in ("rounds", "rounds_one_step", "tau_main"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ParameterError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if any(not isinstance(t, int) or t < 1 for t in self.taus):
            raise ParameterError(f"taus must be integers >= 1, got {self.taus!r}")
        if self.figure_metric not in METRICS:
            raise ParameterError(f"figure_metric must be one of {sorted(METRICS)}, got {self.figure_metric!r}")

    @classmethod
    def quick(cls, **changes) -> "StudyConfig":
        """A small, fast version: 2 seeds, 5 clients, n = 60, tau in {5, 10, 20}, 20 rounds (40 one-step)."""
        base = dict(seeds=(0, 1), taus=(5, 10, 20), rounds=20, rounds_one_step=40, n_clients=5, n_samples=60)
        return cls(**{**base, **changes})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StudyConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in fields})

    def data_spec(self) -> dict:
        return {k: getattr(self, k) for k in ("n_clients", "n_samples", "n_features", "rank", "n_zero_rows", "noise")}

    def method_spec(self) -> dict:
        return {k: getattr(self, k) for k in ("mu", "alpha", "eta_g", "rho1")}


@dataclass(frozen=True)
class Cell:
    """One federated run of the study."""

    algorithm: str
    h: float
    tau: int
    seed: int
    rounds: int
    data: dict = field(default_factory=dict, compare=False, hash=False)
    method: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        return f"{self.algorithm}_h{self.h:g}_tau{self.tau}_seed{self.seed}"

    def spec(self) -> dict:
        """Everything the numbers of this cell depend on."""
        return {"algorithm": self.algorithm, "h": self.h, "tau": self.tau, "seed": self.seed,
                "rounds": self.rounds, "data": self.data, "method": self.method}

    @property
    def cost(self) -> float:
        """Rough relative cost (U-steps x clients) for progress and scheduling."""
        steps = 1 if self.algorithm in ONE_STEP else self.tau
        return float(steps * self.rounds * self.data.get("n_clients", 1))


def study_cells(cfg: StudyConfig) -> dict[str, list[Cell]]:
    """The cells of each figure (``fig2``..``fig4``; Fig. 5 reuses Fig. 4's)."""

    def cell(alg, h, tau, seed):
        rounds = cfg.rounds_one_step if alg in ONE_STEP else cfg.rounds
        return Cell(alg, float(h), int(tau), int(seed), int(rounds), cfg.data_spec(), cfg.method_spec())

    figs = {"fig2": [], "fig3": [], "fig4": []}
    for seed in cfg.seeds:
        for h in cfg.heterogeneity:
            figs["fig2"] += [cell("fedsonmf", h, tau, seed) for tau in cfg.taus]
            figs["fig3"] += [cell(a, h, cfg.tau_main, seed) for a in ("fedsonmf",) + tuple(cfg.baselines)]
            figs["fig4"] += [cell(a, h, cfg.tau_main, seed) for a in cfg.ablations]
    return figs


def unique_cells(figs: dict[str, list[Cell]]) -> list[Cell]:
    seen: dict[str, Cell] = {}
    for cells in figs.values():
        for c in cells:
            seen.setdefault(c.key, c)
    return list(seen.values())


# --------------------------------------------------------------------------- one cell
def run_cell(cell: Cell, callback: Callable[[dict], None] | None = None) -> dict:
    """Run one cell and return its JSON-able record (spec, R0, per-round rows)."""
    from threadpoolctl import threadpool_limits

    from ..datasets import make_synthetic
    from ..estimator import federated_sonmf

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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=0, default=float)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _run_and_write(cell: Cell, cells_dir: str) -> tuple[str, float]:
    rec = run_cell(cell)
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
        from rich.progress import (BarColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

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
            self._p.update(self._task, advance=cell.cost, info=f"{self._n}/{self._n_todo}  last: {cell.key} {seconds:.1f}s")

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
    cells_dir = out / "cells"
    cells_dir.mkdir(parents=True, exist_ok=True)
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
    }
    _atomic_write_json(out / "config.json", meta)
    if report and complete:
        from .report import write_report

        write_report(out, cfg, figs, records, meta)
    return {"computed": len(todo), "reused": len(done), "seconds": seconds, "complete": complete}


def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return None
