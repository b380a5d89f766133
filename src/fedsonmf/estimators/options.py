"""The option objects of :class:`~fedsonmf.estimators.FedMultiViewClustering` and the constraints of
its parameters, both from the one parameter table (:mod:`fedsonmf.protocol.params`).

The estimator takes the choices most fits make as its own parameters; the others are grouped, as
``ustep=PenaltyOptions(...)`` groups the U-solver's:

* :class:`MethodOptions` -- the factorisation (mu, tau, alpha, ...), the views' Frobenius scaling,
  k-means on V and the label-free stopping rule;
* :class:`RefineOptions` -- the refinement's starts, seeded starts and spectral steps;
* :class:`PrivacyOptions` -- secure aggregation and differential privacy;
* :class:`InProcess` / :class:`Flower` -- where the federation runs (``federation=``).

Every field's default and accepted values are the table's; an option object checks its fields
when it is made, changed (``set_params``) and fitted with, with the same messages as the
estimator's own parameters (scikit-learn's ``_parameter_constraints`` form, :func:`constraints`).
They follow scikit-learn's parameter protocol, so ``clone``, ``get_params`` and searches over whole
objects (``{"refinement": [RefineOptions(starts=5), ...]}``) or single fields
(``{"refinement__starts": [5, 10]}``) work as for nested estimators.  :func:`from_flat` turns the
table's flat names (a CLI's options, a benchmark's ``--params``) into the estimator's keyword
arguments, :func:`flat` the other way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from numbers import Integral, Real
from typing import Any, ClassVar

from sklearn.utils._param_validation import (
    HasMethods,
    Interval,
    InvalidParameterError,
    StrOptions,
    validate_parameter_constraints,
)

from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.exceptions import ParameterError
from fedsonmf.protocol.params import PARAMS, Param, default, grouped

__all__ = ["MethodOptions", "RefineOptions", "PrivacyOptions", "InProcess", "Flower", "constraints", "check_params",
           "from_flat", "flat"]


class _Options:
    """An option object: its fields are the parameters of one ``group`` of the table.

    It checks its fields when it is made, when :meth:`set_params` changes them and when an estimator
    fits with it (:meth:`check`); ``get_params``/``set_params`` make its fields searchable as
    scikit-learn's nested parameters (``GridSearchCV(model, {"method__tau": [5, 10]})``)."""

    _group: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Check every field against the table (a :class:`ParameterError` names the field)."""
        params = {p.key: p for p in grouped(self._group)}
        check_params(type(self).__name__, self.get_params(), {k: _constraint_list(p) for k, p in params.items()})

    def get_params(self, deep: bool = True) -> dict:
        """The fields, by name (scikit-learn's protocol; ``deep`` changes nothing)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def set_params(self, **params) -> _Options:
        """Set fields by name, checked (scikit-learn's protocol: ``estimator.set_params(method__tau=5)``)."""
        known = self.get_params()
        for name in params:
            if name not in known:
                raise ParameterError(f"{type(self).__name__} has no field {name!r}; its fields: {sorted(known)}")
        for name, value in params.items():
            setattr(self, name, value)
        self.check()
        return self


@dataclass
class MethodOptions(_Options):
    """The method's options: the factorisation, the views' scaling, k-means on V, the stopping rule.

    Every field is :class:`~fedsonmf.FedSONMF`'s (or the clustering's) parameter of that name, with
    its default and meaning (``help(FedSONMF)``, docs/algorithm.md); ``normalize_views`` divides each
    view by its Frobenius norm, ``normalize_embedding`` row-normalises V^T before k-means,
    ``kmeans_n_init`` / ``kmeans_max_iter`` are the k-means replicates and iterations on V, and
    ``early_stop="labels"`` also stops a fit once the server's k-means of V has settled.
    """

    _group: ClassVar[str] = "method"
    mu: Any = default("mu")
    mu_scale: float = default("mu_scale")
    tau: int = default("tau")
    alpha: Any = default("alpha")
    eta_g: float = default("eta_g")
    rho1: float = default("rho1")
    correction: bool = default("correction")
    init_u: str = default("init_u")
    init_v: str = default("init_v")
    diagnostics: bool = default("diagnostics")
    ustep: PenaltyOptions | None = default("ustep")
    batch_size: Any = default("batch_size")
    normalize_embedding: bool = default("normalize_embedding")
    normalize_views: bool = default("normalize_views")
    kmeans_n_init: int = default("kmeans_n_init")
    kmeans_max_iter: int = default("kmeans_max_iter")
    early_stop: str = default("early_stop")


@dataclass
class RefineOptions(_Options):
    """The refinement's options (``refine`` chooses its stages): ``starts`` (the fit's partition and
    ``starts - 1`` partitions of k-means on V), ``seeded_starts`` (federated k-means++ starts once a
    dense view scores; 0 = none), ``spectral_steps`` (the graph stage's spectral start; 0 = none).
    docs/clustering.md says what each costs in exchanges and what the server learns."""

    _group: ClassVar[str] = "refinement"
    starts: int = default("refine_starts")
    seeded_starts: int = default("refine_seeded_starts")
    spectral_steps: int = default("refine_spectral_steps")


@dataclass
class PrivacyOptions(_Options):
    """Privacy options: ``secure_aggregation`` (the server learns only sums; always on in a Flower
    deployment; ``secagg_threshold``: its threshold recovery of rounds that lose clients, used by runs
    with partial participation -- ``run_inprocess``/``run_flower`` -- not by the estimators) and
    differential privacy of each client's whole view (``dp_epsilon`` or
    ``dp_noise_multiplier``, with ``dp_clip``, ``dp_clip_setup``, ``dp_delta``, ``dp_rounds``);
    docs/privacy.md says what each party learns in each mode."""

    _group: ClassVar[str] = "privacy"
    secure_aggregation: bool = default("secure_aggregation")
    secagg_threshold: int | None = default("secagg_threshold")
    dp_epsilon: float | None = default("dp_epsilon")
    dp_noise_multiplier: float | None = default("dp_noise_multiplier")
    dp_clip: float = default("dp_clip")
    dp_clip_setup: float = default("dp_clip_setup")
    dp_delta: float = default("dp_delta")
    dp_rounds: int = default("dp_rounds")


@dataclass
class InProcess(_Options):
    """The federation in this process (the default): every client in turn, or up to ``n_jobs`` fits at
    once in threads; ``blas_threads`` limits BLAS during the fit ("auto": one thread where that is
    faster, docs/speed.md; None leaves it)."""

    _group: ClassVar[str] = "inprocess"
    blas_threads: Any = default("blas_threads")


@dataclass
class Flower(_Options):
    """The federation on a loopback Flower deployment (a SuperLink and one SuperNode per view, separate
    processes; needs ``fedsonmf[flower]``): each view is written to its own client folder under
    ``run_dir`` (None: a new temporary folder), its node preprocesses it, and the ServerApp runs the
    fits, keeps the medoid and refines it.  The same seed gives the same labels and V as in process.

    ``deployment``: a started :class:`~fedsonmf.federation.flower.LoopbackDeployment` to fit on
    instead; its daemons stay up, so several estimators (and a grid search) fit on one start-up.
    The views given to ``fit`` must equal the files it serves (checked); ``run_dir`` is then unused
    (each fit's outputs go to ``<its run folder>/fits/<job-id>/``); ``predict``/``transform`` of such
    a fit are not available (a predict run needs nodes started with the new samples' files).
    Copies of the object (scikit-learn's ``clone``) share the deployment."""

    _group: ClassVar[str] = "flower"
    run_dir: str | os.PathLike | None = default("run_dir")
    deployment: Any = default("deployment")


#: the option objects by the name the table's ``("type", name)`` entries use
_TYPES: dict[str, type] = {"MethodOptions": MethodOptions, "RefineOptions": RefineOptions,
                           "PrivacyOptions": PrivacyOptions, "InProcess": InProcess, "Flower": Flower,
                           "PenaltyOptions": PenaltyOptions}
#: the option object of each group
_OBJECTS: dict[str, tuple[str, type]] = {"method": ("method", MethodOptions),
                                         "refinement": ("refinement", RefineOptions),
                                         "privacy": ("privacy", PrivacyOptions)}


def _constraint(spec) -> Any:
    """One entry of the table's ``accepts`` as scikit-learn's constraint."""
    if spec is None or spec == "random_state":
        return spec
    if spec == "bool":
        return "boolean"
    if spec == "path":
        return (str, os.PathLike)
    kind, *rest = spec
    if kind == "str":
        return StrOptions(set(rest))
    if kind == "int":
        low, high = rest
        closed = {(True, True): "both", (True, False): "left", (False, True): "right"}.get(
            (low is not None, high is not None), "neither")
        return Interval(Integral, low, high, closed=closed)
    if kind == "real":
        low, high, closed = rest
        return Interval(Real, low, high, closed=closed)
    if kind == "type":
        return _TYPES[rest[0]]
    if kind == "methods":
        return HasMethods(list(rest))
    raise ValueError(f"unknown constraint {spec!r} in the parameter table")


def _constraint_list(p: Param) -> list:
    out: list = []
    for spec in p.accepts:
        c = _constraint(spec)
        out.extend(c if isinstance(c, tuple) else [c])
    return out


def constraints(names, **override) -> dict[str, list]:
    """scikit-learn's ``_parameter_constraints`` of the table's parameters ``names`` (``override``:
    a parameter whose accepted values an estimator widens, e.g. the clustering's rank rules)."""
    return {n: override[n] if n in override else _constraint_list(PARAMS[n]) for n in names}


def check_params(caller: str, params: dict, spec: dict) -> None:
    """Check ``params`` against ``spec`` (``_parameter_constraints`` form); a :class:`ParameterError`
    (the project's ValueError) names the parameter, what it accepts and what it got."""
    try:
        validate_parameter_constraints(spec, params, caller_name=caller)
    except InvalidParameterError as exc:
        raise ParameterError(str(exc)) from None
    for name, value in params.items():  # scikit-learn's integer intervals take True and False
        allowed = spec.get(name, [])
        if isinstance(value, bool) and "boolean" not in allowed and any(
                isinstance(c, Interval) and c.type is Integral for c in allowed):
            raise ParameterError(f"The {name!r} parameter of {caller} must be an int, not a bool. Got {value!r} "
                                 "instead.")


def from_flat(params: dict) -> dict:
    """The estimator's keyword arguments from the table's flat names (``{"tau": 5, "refine_starts": 3,
    "dp_epsilon": 2.0, "run_dir": "run"}``): each grouped name goes into its option object (a
    ``run_dir`` or ``blas_threads`` makes the federation); the estimator's own names pass through."""
    out: dict = {}
    parts: dict[str, dict] = {}
    for name, value in params.items():
        p = PARAMS.get(name)
        if p is None:
            raise ParameterError(f"unknown parameter {name!r} (the table's names: fedsonmf.protocol.params)")
        if p.group:
            parts.setdefault(p.group, {})[p.key] = value
        else:
            out[name] = value
    for group, values in parts.items():
        if group in _OBJECTS:
            key, cls = _OBJECTS[group]
            out[key] = cls(**values)
        elif group == "flower":
            out["federation"] = Flower(**values)
        else:  # inprocess
            if "flower" in parts:
                raise ParameterError("blas_threads applies to the in-process federation, not to Flower")
            out["federation"] = InProcess(**values)
    return out


def flat(params: dict) -> dict:
    """Every table name of the clustering estimator's parameters ``params`` (``get_params()``), option
    objects opened (None: their defaults), plus ``engine`` ("inprocess" or "flower")."""
    out = {k: v for k, v in params.items() if k not in ("method", "refinement", "privacy", "federation")}
    for group, (key, cls) in _OBJECTS.items():
        obj = params.get(key) or cls()
        out.update({p.name: getattr(obj, p.key) for p in grouped(group)})
    fed = params.get("federation") or InProcess()
    out["engine"] = "flower" if isinstance(fed, Flower) else "inprocess"
    out["blas_threads"] = fed.blas_threads if isinstance(fed, InProcess) else 1
    out["run_dir"] = fed.run_dir if isinstance(fed, Flower) else None
    out["deployment"] = fed.deployment if isinstance(fed, Flower) else None
    return out
