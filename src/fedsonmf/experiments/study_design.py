"""The design of the synthetic study (Figs. 2-5): its configuration and its cells.

Kept apart from the runner (:mod:`.synthetic_study`) and the report
(:mod:`.report`), which both read it, so neither imports the other.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fedsonmf.algorithms import ABLATIONS, BASELINES
from fedsonmf.protocol.params import SYNTHETIC_STUDY

__all__ = ["StudyConfig", "Cell", "study_cells", "unique_cells", "METRICS", "ONE_STEP"]
#: the four normalisations of the residual (docs/algorithm.md §7.3, History columns)
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
    mu: float = SYNTHETIC_STUDY["mu"]
    alpha: float = 0.01
    eta_g: float = 1.5
    rho1: float = SYNTHETIC_STUDY["rho1"]

    def __post_init__(self):
        from fedsonmf.algorithms import ALGORITHMS
        from fedsonmf.exceptions import ParameterError

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
    def quick(cls, **changes) -> StudyConfig:
        """A small, fast version: 2 seeds, 5 clients, n = 60, tau in {5, 10, 20}, 20 rounds (40 one-step)."""
        base = dict(seeds=(0, 1), taus=(5, 10, 20), rounds=20, rounds_one_step=40, n_clients=5, n_samples=60)
        return cls(**{**base, **changes})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> StudyConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in fields}
        return cls(**kwargs)

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

    figs: dict[str, list[Cell]] = {"fig2": [], "fig3": [], "fig4": []}
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
