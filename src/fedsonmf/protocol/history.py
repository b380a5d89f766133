"""Per-round history and the result object of a federated run."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

import numpy as np

from fedsonmf._io import write_atomic, write_json_atomic
from fedsonmf.core.residuals import normalised

__all__ = ["History", "FitResult", "json_default"]

#: columns of one history row, in order (``R_*`` are absent without diagnostics)
COLUMNS = (
    "round", "objective", "R_V", "R_U", "R", "R_rel", "R_avg_rel", "R_rel0", "R_avg_rel0", "R_step", "R_step_rel",
    "effective_rank", "bytes_up", "bytes_down", "bytes_diagnostics", "participants", "n_participants", "seconds",
)


class History:
    """Rows of per-round numbers (round s: the iterate at the start of round s).

    ``R_rel = R^s/R^1``, ``R_avg_rel = mean_{t<=s} R^t / R^1`` (the paper's printed
    metric), ``R_rel0``/``R_avg_rel0`` the same over R^0 (residual at the
    initial point).  ``R_step_rel = R_step^s / R_step^1``, the server's step residual
    (:func:`fedsonmf.core.residuals.step_residual`) over the first round's.  ``effective_rank``
    counts nonzero rows of V^{s+1}, the output of the round; ``seconds`` is the wall time of the
    round.
    """

    def __init__(self, rows: list[dict] | None = None, R0: float | None = None):
        self.rows: list[dict] = list(rows or [])
        self.R0 = R0

    def __len__(self) -> int:
        return len(self.rows)

    def append(self, row: dict) -> dict:
        if "R" in row:
            R = [r["R"] for r in self.rows] + [row["R"]]
            if self.R0 is None:
                self.R0 = row["R_start"]
            for key, ref, average in (("R_rel", R[0], False), ("R_avg_rel", R[0], True),
                                      ("R_rel0", self.R0, False), ("R_avg_rel0", self.R0, True)):
                row[key] = float(normalised(R, ref, average)[-1])
        if "R_step" in row:
            first = self.rows[0].get("R_step", row["R_step"]) if self.rows else row["R_step"]
            row["R_step_rel"] = float(row["R_step"] / max(first, 1e-12))  # the guard of normalised()
        self.rows.append(row)
        return row

    def column(self, name: str) -> np.ndarray:
        return np.array([row.get(name, np.nan) for row in self.rows], dtype=float)

    def rounds_to(self, target: float, metric: str = "R_rel") -> int | None:
        """First round whose ``metric`` is <= target, or None."""
        for row in self.rows:
            if row.get(metric, np.inf) <= target:
                return int(row["round"])
        return None

    def to_records(self) -> list[dict]:
        return [{k: row[k] for k in COLUMNS if k in row} for row in self.rows]

    def to_csv(self, path) -> None:
        recs = self.to_records()
        cols = [c for c in COLUMNS if recs and c in recs[0]]
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        w.writerows(recs)
        write_atomic(path, buf.getvalue())


@dataclass
class FitResult:
    """What a federated run returns (pymanopt-style result object).

    Attributes
    ----------
    V : ndarray of shape (r, n)
        Final post-proximal shared representation V^{T+1}.
    bases : list of ndarray (d_p, r) or None
        The clients' final bases (available only where the driver runs the
        clients in the same process: in a real federation they never leave
        their owners).
    history : History
    n_rounds : int
    stopping_reason : str
    converged : bool
    seed : int
        The seed actually used (drawn and recorded when none was given).
    config : dict
        Every parameter of the run.
    seconds : float
    mu : float
        The l2,1 weight the run used (``mu="auto"`` resolved by the server from V-bar^1).
    """

    V: np.ndarray
    bases: list | None
    history: History
    n_rounds: int
    stopping_reason: str
    converged: bool
    seed: int
    config: dict
    seconds: float
    extra: dict = field(default_factory=dict)
    server_state: object = None  # final ServerState (for resuming), not serialised
    mu: float | None = None  # the l2,1 weight in force (mu="auto" resolved by the server); also config["mu_value"]

    def to_json_dict(self) -> dict:
        return {
            "config": self.config,
            "seed": self.seed,
            "n_rounds": self.n_rounds,
            "converged": self.converged,
            "stopping_reason": self.stopping_reason,
            "seconds": self.seconds,
            "R0": self.history.R0,
            "history": self.history.to_records(),
            **self.extra,
        }

    def save_json(self, path, *, inputs=None) -> None:
        """Write :meth:`to_json_dict` with a ``meta`` block (:func:`fedsonmf._provenance.meta`: versions,
        command line, time, seed, SHA-256 of each input -- ``inputs``, else the views hashed at fit time)."""
        from fedsonmf._provenance import meta

        hashed = self.extra.get("input_sha256", ()) if inputs is None else inputs
        doc = {k: v for k, v in self.to_json_dict().items() if k != "input_sha256"}
        doc["meta"] = meta(inputs=hashed, seeds=[self.seed])
        write_json_atomic(path, doc, default=json_default)  # temp file, fsync, replace; 0600


def json_default(o):
    """``json.dumps(..., default=json_default)``: NumPy scalars and arrays as Python values."""
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot serialise {type(o).__name__}")
