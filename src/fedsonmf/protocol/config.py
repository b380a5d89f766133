"""Hyper-parameters of a federated run, validated in one place (ALGORITHM.md §11).

Defaults come from the parameter table :data:`fedsonmf.protocol.params.PARAMS`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from fedsonmf._validation import check_bool, check_choice, check_int, check_real
from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.exceptions import ParameterError
from fedsonmf.protocol.params import default

__all__ = ["FedConfig", "ParameterError", "resolve_mu"]


def resolve_mu(mu_scale: float, eta_tilde: float, Vbar1: np.ndarray) -> float:
    """The scale-free l2,1 weight of ``mu="auto"``: ``eta_tilde * mu = mu_scale * median_i ||Vbar1_i||``.

    The server prox shrinks every row of V-bar by ``eta_tilde * mu``; putting that
    threshold at a fixed fraction of the typical row norm of the initial V-bar^1
    (r x n) makes it mean the same at any data scale.  All-zero V-bar^1 gives 0.
    """
    scale = float(np.median(np.linalg.norm(Vbar1, axis=1)))
    return mu_scale * scale / eta_tilde if math.isfinite(scale) else 0.0


@dataclass(frozen=True)
class FedConfig:
    """Parameters shared by the server and every client.

    The server step ``eta_tilde = eta_g * tau * alpha`` is derived, never set
    on its own: the drift-correction identity sum_p C_p = 0 needs it (§4.2).

    Parameters
    ----------
    n_components : int
        Rank r (rows of V, columns of every U_p).
    mu : float >= 0 or "auto"
        Weight of ||V||_{2,1}.  "auto": the server sets it from V-bar^1 with
        :func:`resolve_mu` and sends the number with every round message.
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
    mu_scale : float >= 0
        The fraction used by ``mu="auto"``.
    secure_aggregation : bool
        Every upload the server only sums travels masked with pairwise masks
        (:mod:`fedsonmf.federation.secagg`): the server learns the sums, not
        one client's upload.  Costs one extra exchange before round 1 (key
        agreement + the masked V-bar^1 upload).

    NumPy scalars are accepted and stored as Python scalars.
    """

    n_components: int = default("n_components")
    mu: float | str = default("mu")
    alpha: float = default("alpha")
    tau: int = default("tau")
    eta_g: float = default("eta_g")
    rho1: float = default("rho1")
    correction: bool = default("correction")
    init_u: str = default("init_u")
    init_v: str = default("init_v")
    diagnostics: bool = default("diagnostics")
    ustep: PenaltyOptions = field(default_factory=PenaltyOptions)
    mu_scale: float = default("mu_scale")
    secure_aggregation: bool = default("secure_aggregation")

    @property
    def eta_tilde(self) -> float:
        """Server step eta_g * tau * alpha."""
        return self.eta_g * self.tau * self.alpha

    def replace(self, **changes) -> "FedConfig":
        return dataclasses.replace(self, **changes)

    @property
    def mu_is_auto(self) -> bool:
        return isinstance(self.mu, str) and self.mu == "auto"

    def __post_init__(self):
        # NumPy scalars (np.int64, np.float32, np.bool_) are accepted and stored as Python scalars,
        # so the config's JSON (checkpoints, setup messages) is the same whatever the caller passed
        set_ = object.__setattr__.__get__(self)
        set_("n_components", check_int("n_components", self.n_components, min=1, desc="a positive integer"))
        if isinstance(self.mu, str):
            if self.mu != "auto":
                raise ParameterError(f"mu must be a finite real number >= 0 or 'auto', got {self.mu!r}")
        else:
            set_("mu", check_real("mu", self.mu, min=0.0))
        set_("mu_scale", check_real("mu_scale", self.mu_scale, min=0.0))
        set_("alpha", check_real("alpha", self.alpha, min=0.0, min_inclusive=False))
        set_("eta_g", check_real("eta_g", self.eta_g, min=0.0, min_inclusive=False))
        set_("rho1", check_real("rho1", self.rho1, min=0.0))
        set_("tau", check_int("tau", self.tau, min=1))
        set_("correction", check_bool("correction", self.correction))
        set_("init_u", check_choice("init_u", self.init_u, ("random", "svd", "kmeans")))
        set_("init_v", check_choice("init_v", self.init_v, ("projection", "random")))
        set_("diagnostics", check_bool("diagnostics", self.diagnostics))
        set_("secure_aggregation", check_bool("secure_aggregation", self.secure_aggregation))
        if not isinstance(self.ustep, PenaltyOptions):
            raise ParameterError(
                f"ustep must be None or a fedsonmf.core.ustep.PenaltyOptions instance, got {type(self.ustep).__name__}")

    def resolved(self, mu: float) -> "FedConfig":
        """This config with ``mu="auto"`` replaced by the number the server computed."""
        return self.replace(mu=float(mu)) if self.mu_is_auto else self

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["eta_tilde"] = self.eta_tilde
        return d
