"""Hyper-parameters of a federated run, validated in one place (ALGORITHM.md §11)."""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field

from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.exceptions import ParameterError

__all__ = ["FedConfig", "ParameterError"]


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class FedConfig:
    """Parameters shared by the server and every client.

    The server step ``eta_tilde = eta_g * tau * alpha`` is derived, never set
    on its own: the drift-correction identity sum_p C_p = 0 needs it (§4.2).

    Parameters
    ----------
    n_components : int
        Rank r (rows of V, columns of every U_p).
    mu : float >= 0
        Weight of ||V||_{2,1}.
    alpha : float > 0
        Local step size.
    tau : int >= 1
        Local steps per round.
    eta_g : float > 0
        Global (server) step multiplier.
    rho1 : float >= 0
        Proximal weight of the U-subproblem (7).
    correction : bool
        Drift correction on/off (off gives the "no correction" ablation).
    init_u : {"random", "svd", "kmeans"}
        Initial bases (§6): random balanced supports, the nonnegative
        rounding of the leading singular vectors of X_p, or supports from a
        spherical k-means of X_p's features (computed by each client alone).
    init_v : {"projection", "random"}
        Initial pre-proximal V-bar^1: mean_p max(U_p^T X_p, 0) (one extra
        upload of an r x n matrix per client before round 1) or Uniform[0,1]
        scaled to the data's norm (one extra scalar per client).
    diagnostics : bool
        Clients report f_p, U^T X-based gradients and r_U so the server can
        compute the objective and residuals each round.  Costs one extra
        r x n matrix upload per client per round (counted separately).
    ustep : PenaltyOptions
        Options of the U-solver.
    """

    n_components: int
    mu: float = 1.0
    alpha: float = 0.01
    tau: int = 10
    eta_g: float = 1.5
    rho1: float = 1.0
    correction: bool = True
    init_u: str = "random"
    init_v: str = "projection"
    diagnostics: bool = True
    ustep: PenaltyOptions = field(default_factory=PenaltyOptions)

    @property
    def eta_tilde(self) -> float:
        """Server step eta_g * tau * alpha."""
        return self.eta_g * self.tau * self.alpha

    def replace(self, **changes) -> "FedConfig":
        return dataclasses.replace(self, **changes)

    def __post_init__(self):
        if not _is_int(self.n_components) or self.n_components < 1:
            raise ParameterError(f"n_components must be a positive integer, got {self.n_components!r}")
        checks = [
            ("mu", self.mu, lambda v: v >= 0, ">= 0"),
            ("alpha", self.alpha, lambda v: v > 0, "> 0"),
            ("eta_g", self.eta_g, lambda v: v > 0, "> 0"),
            ("rho1", self.rho1, lambda v: v >= 0, ">= 0"),
        ]
        for name, value, ok, what in checks:
            if not _is_real(value) or value != value or value in (float("inf"), float("-inf")):
                raise ParameterError(f"{name} must be a finite real number, got {value!r}")
            if not ok(value):
                raise ParameterError(f"{name} must be {what}, got {value!r}")
        if not _is_int(self.tau) or self.tau < 1:
            raise ParameterError(f"tau must be an integer >= 1, got {self.tau!r}")
        if not isinstance(self.correction, bool):
            raise ParameterError(f"correction must be True or False, got {self.correction!r}")
        if self.init_u not in ("random", "svd", "kmeans"):
            raise ParameterError(f"init_u must be 'random', 'svd' or 'kmeans', got {self.init_u!r}")
        if self.init_v not in ("projection", "random"):
            raise ParameterError(f"init_v must be 'projection' or 'random', got {self.init_v!r}")
        if not isinstance(self.ustep, PenaltyOptions):
            raise ParameterError("ustep must be a PenaltyOptions instance")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["eta_tilde"] = self.eta_tilde
        return d
