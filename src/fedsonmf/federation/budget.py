"""The run's budget -- ``max_rounds`` and ``tol`` -- resolved once for every entry point.

:func:`~fedsonmf.federation.inprocess.run_inprocess`,
:func:`~fedsonmf.federation.flower.launcher.run_flower` and
:func:`~fedsonmf.federation.flower.simulation.run_simulation` take ``max_rounds=None``
and ``tol=None`` and resolve them here, with the same rule as the estimators
(:mod:`fedsonmf.estimators.sonmf`): the parameter table's defaults
(:data:`fedsonmf.protocol.params.PARAMS`), except that a run without residuals
cannot stop on one.

* a differentially private run lasts ``cfg.dp_rounds`` rounds and has ``tol = 0``
  (its clients send no diagnostics and the accountant fixes the rounds in advance);
* a run with ``cfg.diagnostics=False`` has ``tol = 0`` by default (the residual
  is computed from the diagnostics).

Values given explicitly are validated, never silently replaced: ``tol > 0``
without diagnostics, or more rounds than ``dp_rounds`` in a private run, raise
:class:`~fedsonmf.exceptions.ParameterError` before anything starts.
"""

from __future__ import annotations

from fedsonmf._validation import check_int, check_real
from fedsonmf.exceptions import ParameterError
from fedsonmf.protocol.params import default

__all__ = ["resolve_budget"]


def resolve_budget(cfg, max_rounds: int | None = None, tol: float | None = None) -> tuple[int, float]:
    """``(max_rounds, tol)`` of a run with config ``cfg``.

    Parameters
    ----------
    cfg : FedConfig
        The run's configuration (its ``diagnostics`` and differential-privacy settings matter).
    max_rounds : int >= 1 or None, default=None
        Communication rounds at most; None = the table's ``max_rounds`` (``cfg.dp_rounds``
        in a differentially private run).
    tol : float >= 0 or None, default=None
        Stop when R/R1 <= tol; None = the table's ``tol`` when the clients send
        diagnostics, else 0.

    Returns
    -------
    max_rounds : int
    tol : float

    Raises
    ------
    ParameterError
        A bad value, ``tol > 0`` without diagnostics or in a private run, or
        ``max_rounds > cfg.dp_rounds`` in a private run.

    Examples
    --------
    >>> from fedsonmf.protocol.config import FedConfig
    >>> resolve_budget(FedConfig(n_components=2))
    (200, 0.0001)
    >>> resolve_budget(FedConfig(n_components=2, diagnostics=False))
    (200, 0.0)
    >>> resolve_budget(FedConfig(n_components=2), max_rounds=5, tol=0)
    (5, 0.0)
    """
    dp = bool(cfg.dp_enabled)
    rounds = check_int("max_rounds", (cfg.dp_rounds if dp else default("max_rounds")) if max_rounds is None
                       else max_rounds, min=1)
    stop = check_real("tol", (0.0 if dp or not cfg.diagnostics else default("tol")) if tol is None else tol,
                      min=0.0, desc="a real number >= 0")
    assert rounds is not None and stop is not None  # allow_none=False: the checks return a value or raise
    if dp:
        if rounds > cfg.dp_rounds:
            raise ParameterError(f"max_rounds={rounds} exceeds dp_rounds={cfg.dp_rounds}: the noise is "
                                 "calibrated for dp_rounds rounds")
        if stop > 0:
            raise ParameterError("a differentially private run needs tol=0 (its clients send no diagnostics)")
    elif stop > 0 and not cfg.diagnostics:
        raise ParameterError("tol > 0 needs diagnostics=True (the residual is computed from them)")
    return int(rounds), float(stop)
