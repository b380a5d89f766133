"""Hyper-parameters of a federated run, validated in one place (ALGORITHM.md §11)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fedsonmf._validation import check_bool, check_choice, check_int, check_real
from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.exceptions import ParameterError

__all__ = ["FedConfig", "ParameterError"]


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
        # NumPy scalars (np.int64, np.float32, np.bool_) are accepted and stored as Python scalars,
        # so the config's JSON (checkpoints, setup messages) is the same whatever the caller passed
        set_ = object.__setattr__.__get__(self)
        set_("n_components", check_int("n_components", self.n_components, min=1, desc="a positive integer"))
        set_("mu", check_real("mu", self.mu, min=0.0))
        set_("alpha", check_real("alpha", self.alpha, min=0.0, min_inclusive=False))
        set_("eta_g", check_real("eta_g", self.eta_g, min=0.0, min_inclusive=False))
        set_("rho1", check_real("rho1", self.rho1, min=0.0))
        set_("tau", check_int("tau", self.tau, min=1))
        set_("correction", check_bool("correction", self.correction))
        set_("init_u", check_choice("init_u", self.init_u, ("random", "svd", "kmeans")))
        set_("init_v", check_choice("init_v", self.init_v, ("projection", "random")))
        set_("diagnostics", check_bool("diagnostics", self.diagnostics))
        if not isinstance(self.ustep, PenaltyOptions):
            raise ParameterError(f"ustep must be a PenaltyOptions instance, got {type(self.ustep).__name__}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["eta_tilde"] = self.eta_tilde
        return d
