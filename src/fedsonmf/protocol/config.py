"""Hyper-parameters of a federated run, validated in one place (docs/algorithm.md §11).

Defaults come from the parameter table :data:`fedsonmf.protocol.params.PARAMS`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from fedsonmf._validation import check_bool, check_choice, check_int, check_real
from fedsonmf.core.init import INIT_U
from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.exceptions import ParameterError
from fedsonmf.protocol.params import default

__all__ = ["FedConfig", "ParameterError", "resolve_mu", "auto_alpha", "STEP_CONTRACTION"]


#: the per-round contraction of the V-error that ``alpha="auto"`` aims at (docs/speed.md)
STEP_CONTRACTION = 0.3
#: the Lipschitz constant of grad_V f_p = 2 (V - U_p^T X_p) for orthonormal U_p (docs/algorithm.md §1)
L_V = 2.0


def auto_alpha(tau: int, eta_g: float, contraction: float = STEP_CONTRACTION) -> float:
    """The local step of ``alpha="auto"``: the round contracts the V-error by ``contraction``.

    With orthonormal bases grad_V f_p = L (V - U_p^T X_p), L = 2, whatever the data.  For
    fixed bases one local step maps the error E = V - U^T X to (1 - L alpha) E, tau steps to
    (1 - L alpha)^tau E, and the server's V-bar = V + eta_g (mean Vhat - V) leaves
        q = 1 - eta_g (1 - (1 - L alpha)^tau)
    of it.  Solving q = ``contraction`` gives
        alpha = (1 - (1 - (1 - q) / eta_g)^(1 / tau)) / L,
    scale-free and in closed form (0.0304 at tau = 10, eta_g = 1.5, q = 0.3: server step
    eta_tilde = eta_g tau alpha = 0.456 < 2 / L, the prox-gradient descent bound).  When
    eta_g <= 1 - q the target is out of reach; alpha then makes the tau local steps halve the
    error ((1 - L alpha)^tau = 1/2).  Derivation and the measurement that chose q: docs/speed.md.
    """
    x = 1.0 - (1.0 - contraction) / eta_g
    if not x > 0.0:
        x = 0.5
    return float((1.0 - x ** (1.0 / tau)) / L_V)


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
    alpha : float > 0 or "auto"
        Local step size.  "auto" (the default): :func:`auto_alpha` from the known
        curvature L = 2 of the V-block and this config's ``tau`` and ``eta_g``; the
        field then holds that number and ``alpha_rule == "auto"``.  ``replace`` keeps
        the number (the ablations change tau at the same alpha, docs/algorithm.md §9.4, and
        every party of a deployment rebuilds the config from its JSON, which holds it).
    tau : int >= 1
        Local steps per round.
    eta_g : float > 0
        Global (server) step multiplier.
    rho1 : float >= 0
        Proximal weight of the U-subproblem (7).
    correction : bool
        Drift correction on/off (off gives the "no correction" ablation).
    init_u : {"auto", "random", "svd"}
        Initial bases (§6): random balanced supports, the nonnegative
        rounding of the leading singular vectors of X_p, or supports from a
        spherical k-means of X_p's features (computed by each client alone);
        "auto" is "random" here (a factorisation) and "svd" in a clustering
        fit, which resolves it before building its configuration
        (:func:`fedsonmf.core.init.resolve_init_u`).
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
    batch_size : "auto" or int >= 1
        Samples whose V-columns a local step moves (stochastic local steps,
        docs/algorithm.md §16): "auto" = all n below
        :data:`fedsonmf.core.vstep.AUTO_BATCH_MIN_SAMPLES`, else ceil(n / tau); an int
        at least ceil(n / tau) (so every sample moves in every round), >= n = all.
        Resolved against n by each client (:func:`fedsonmf.core.vstep.resolve_batch`).
    mu_scale : float >= 0
        The fraction used by ``mu="auto"``.
    secure_aggregation : bool
        Every upload the server only sums travels masked with pairwise masks
        (:mod:`fedsonmf.federation.secagg`): the server learns the sums, not
        one client's upload.  Costs one extra exchange before round 1 (key
        agreement + the masked V-bar^1 upload).
    secagg_threshold : int >= 1 or None
        Threshold recovery of secure aggregation in rounds that may lose
        clients (``participation``): any t of a round's c clients hold enough
        Shamir shares to remove the masks of the uploads the server received.
        None = ceil(2c/3); an exchange refuses t > c and t <= c/2
        (:func:`fedsonmf.federation.secagg.threshold`).
    dp_epsilon, dp_noise_multiplier : float > 0 or None
        Differential privacy of each client's whole view
        (:mod:`fedsonmf.protocol.privacy`): the target epsilon of the run (the
        noise multiplier is calibrated to it over ``dp_rounds`` rounds) or the
        noise multiplier itself; at most one; both None = no DP.
    dp_clip, dp_clip_setup : float > 0
        Frobenius bound C of a round upload's change (V-hat_p - V^s) and of the
        setup upload V_proj; each release's noise std = multiplier x 2C (its own C).
    dp_delta : float in (0, 1)
    dp_rounds : int >= 1
        Rounds of a DP run (the accountant composes over them).  A DP run sends
        no diagnostics (``diagnostics`` must be False) and needs
        ``init_v="projection"`` (its setup upload is noised; "random" would send
        ||X_p||_F^2 in the clear).

    NumPy scalars are accepted and stored as Python scalars.
    """

    n_components: int = default("n_components")
    mu: float | str = default("mu")
    alpha: float = default("alpha")  # a number or "auto" when given; always the number after __post_init__
    tau: int = default("tau")
    eta_g: float = default("eta_g")
    rho1: float = default("rho1")
    correction: bool = default("correction")
    init_u: str = default("init_u")
    init_v: str = default("init_v")
    diagnostics: bool = default("diagnostics")
    ustep: PenaltyOptions = field(default_factory=PenaltyOptions)
    batch_size: int | str = default("batch_size")
    mu_scale: float = default("mu_scale")
    secure_aggregation: bool = default("secure_aggregation")
    secagg_threshold: int | None = default("secagg_threshold")
    dp_epsilon: float | None = default("dp_epsilon")
    dp_noise_multiplier: float | None = default("dp_noise_multiplier")
    dp_clip: float = default("dp_clip")
    dp_clip_setup: float = default("dp_clip_setup")
    dp_delta: float = default("dp_delta")
    dp_rounds: int = default("dp_rounds")

    @property
    def eta_tilde(self) -> float:
        """Server step eta_g * tau * alpha."""
        return self.eta_g * self.tau * self.alpha

    @property
    def alpha_rule(self) -> str | None:
        """``"auto"`` when ``alpha`` was derived by :func:`auto_alpha`, else None (a given number)."""
        return self.__dict__.get("_alpha_rule")

    def replace(self, **changes) -> FedConfig:
        return dataclasses.replace(self, **changes)

    @property
    def dp_enabled(self) -> bool:
        """Differential privacy on (a target epsilon or a noise multiplier is set)."""
        return self.dp_epsilon is not None or self.dp_noise_multiplier is not None

    @property
    def dp_sigma(self) -> float | None:
        """The noise multiplier in force: given, or calibrated to ``dp_epsilon`` over
        ``dp_rounds`` rounds (+ the setup upload) by the accountant; None without DP.
        Every party computes the same number from the config (deterministic, cached)."""
        if self.dp_noise_multiplier is not None:
            return self.dp_noise_multiplier
        if self.dp_epsilon is None:
            return None
        from fedsonmf.protocol.privacy import calibrate_noise_multiplier, releases

        return calibrate_noise_multiplier(self.dp_epsilon, self.dp_delta,
                                          releases(self.dp_rounds, self.init_v == "projection"))

    @property
    def mu_is_auto(self) -> bool:
        return isinstance(self.mu, str) and self.mu == "auto"

    @property
    def mu_value(self) -> float:
        """The l2,1 weight as a number; a config still at ``mu="auto"`` has none yet (the
        server resolves it from V-bar^1 at setup: :meth:`resolved`)."""
        if isinstance(self.mu, str):
            raise ParameterError("mu='auto' is resolved by the server at setup; this config has no number yet")
        return float(self.mu)

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
        set_("eta_g", check_real("eta_g", self.eta_g, min=0.0, min_inclusive=False))
        set_("tau", check_int("tau", self.tau, min=1))
        alpha = self.alpha
        if isinstance(alpha, str) and alpha != "auto":
            try:  # a number given as text (the command line)
                alpha = float(alpha)
            except ValueError:
                raise ParameterError(f"alpha must be a finite real number > 0 or 'auto', got {self.alpha!r}") from None
        if isinstance(alpha, str):
            set_("_alpha_rule", "auto")
            set_("alpha", auto_alpha(self.tau, self.eta_g))
        else:
            set_("alpha", check_real("alpha", alpha, min=0.0, min_inclusive=False))
        set_("rho1", check_real("rho1", self.rho1, min=0.0))
        set_("correction", check_bool("correction", self.correction))
        set_("init_u", check_choice("init_u", self.init_u, INIT_U))
        set_("init_v", check_choice("init_v", self.init_v, ("projection", "random")))
        set_("diagnostics", check_bool("diagnostics", self.diagnostics))
        set_("secure_aggregation", check_bool("secure_aggregation", self.secure_aggregation))
        if self.secagg_threshold is not None:
            set_("secagg_threshold", check_int("secagg_threshold", self.secagg_threshold, min=1))
        for name in ("dp_epsilon", "dp_noise_multiplier"):
            value = getattr(self, name)
            if value is not None:
                set_(name, check_real(name, value, min=0.0, min_inclusive=False,
                                      desc="None or a finite real number > 0"))
        if self.dp_epsilon is not None and self.dp_noise_multiplier is not None:
            raise ParameterError(f"give dp_epsilon or dp_noise_multiplier, not both (got dp_epsilon={self.dp_epsilon!r}"
                                 f" and dp_noise_multiplier={self.dp_noise_multiplier!r})")
        set_("dp_clip", check_real("dp_clip", self.dp_clip, min=0.0, min_inclusive=False))
        set_("dp_clip_setup", check_real("dp_clip_setup", self.dp_clip_setup, min=0.0, min_inclusive=False))
        set_("dp_delta", check_real("dp_delta", self.dp_delta, min=0.0, max=1.0, min_inclusive=False,
                                    max_inclusive=False))
        set_("dp_rounds", check_int("dp_rounds", self.dp_rounds, min=1))
        if self.dp_enabled:
            if self.diagnostics:
                raise ParameterError("differential privacy needs diagnostics=False: the diagnostics are per-client "
                                     "uploads (U_p^T X_p every round) that the noise does not cover")
            if self.init_v != "projection":
                raise ParameterError(f"differential privacy needs init_v='projection' (its setup upload is noised); "
                                     f"init_v={self.init_v!r} sends ||X_p||_F^2 in the clear")
        if isinstance(self.batch_size, str):
            if self.batch_size != "auto":
                raise ParameterError(f"batch_size must be a positive integer or 'auto', got {self.batch_size!r}")
        else:
            set_("batch_size", check_int("batch_size", self.batch_size, min=1, desc="a positive integer or 'auto'"))
        if self.ustep is None:  # the table's default: the U-solver's own defaults
            set_("ustep", PenaltyOptions())
        if not isinstance(self.ustep, PenaltyOptions):
            raise ParameterError(
                f"ustep must be None or a fedsonmf.core.ustep.PenaltyOptions instance, got {type(self.ustep).__name__}")

    def resolved(self, mu: float) -> FedConfig:
        """This config with ``mu="auto"`` replaced by the number the server computed."""
        return self.replace(mu=float(mu)) if self.mu_is_auto else self

    def to_dict(self) -> dict:
        """Every field (``ustep`` as a dict) plus the derived ``eta_tilde``; JSON-ready."""
        d = dataclasses.asdict(self)
        d["eta_tilde"] = self.eta_tilde
        return d

    @classmethod
    def from_dict(cls, d: dict) -> FedConfig:
        """The config of :meth:`to_dict` (or of its JSON): unknown and derived keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names and k != "ustep"}
        u = d.get("ustep")
        if u is not None:
            kwargs["ustep"] = u if isinstance(u, PenaltyOptions) else PenaltyOptions(**u)
        return cls(**kwargs)
