"""Every error and warning fedsonmf raises, in one place.

Errors follow scikit-learn's convention and subclass :class:`ValueError`
(through :class:`FedSONMFError`), so ``except ValueError`` catches bad input
and bad parameters as it does for scikit-learn estimators; the run-time
failures of a federation also subclass :class:`RuntimeError`.
:class:`ConvergenceWarning` subclasses scikit-learn's, so a user's
``warnings.filterwarnings("ignore", category=sklearn.exceptions.ConvergenceWarning)``
covers fedsonmf too.
"""

from __future__ import annotations

__all__ = [
    "FedSONMFError", "InputError", "InputTypeError", "ParameterError", "CheckpointError", "ProtocolError",
    "FederationError", "PartitionRefused",
    "FlowerRunError", "RunStopped", "AuditError", "ConvergenceWarning", "DivergenceWarning",  # noqa: F822 (module __getattr__)
    "DataWarning", "PrivacyWarning", "warn",
]


class FedSONMFError(ValueError):
    """Base class of fedsonmf's errors."""


class InputError(FedSONMFError):
    """The data given to a fit is unusable; the message says why and which view."""


class InputTypeError(InputError, TypeError):
    """Data of the wrong kind (e.g. objects that are not numbers); also a :class:`TypeError`, as NumPy's."""


class ParameterError(FedSONMFError):
    """A hyper-parameter has an invalid value; the message names it."""


class CheckpointError(FedSONMFError, RuntimeError):
    """A checkpoint is missing, torn, or does not match the run being resumed."""


class ProtocolError(FedSONMFError, RuntimeError):
    """A message does not fit the protocol (wrong round, wrong kind, bad shape)."""


class FederationError(FedSONMFError, RuntimeError):
    """A client failed, hung or disappeared.  ``client`` and ``round`` name it
    (``client`` is the view index; None when the failure is not one client's)."""

    def __init__(self, message: str, *, client: int | None = None, round: int | None = None,
                 node_id: int | None = None):
        super().__init__(message)
        self.client = client
        self.round = round
        self.node_id = node_id


class PartitionRefused(FederationError):
    """Partitions sent to the clients were refused by a client's own policy (on Flower a node's
    ``refine-min-cluster-size``), not lost: the refinement goes on with the partitions answered."""


class FlowerRunError(FedSONMFError, RuntimeError):
    """The Flower run failed; ``status`` is the ServerApp's status.json (client, round, error)."""

    def __init__(self, message: str, status: dict | None = None):
        super().__init__(message)
        self.status = status or {}


class RunStopped(FedSONMFError, RuntimeError):
    """A Flower run was ended from outside: ``external`` (``flwr stop``) or a signal to its ServerApp process."""

    def __init__(self, message: str, *, external: bool = False):
        super().__init__(message)
        self.external = external


class AuditError(FedSONMFError, AssertionError):
    """A recorded message carries something the declaration does not allow."""


class DivergenceWarning(UserWarning):
    """The objective grew by orders of magnitude: the step sizes are too large."""


class DataWarning(UserWarning):
    """Something about the input data the user should know, handled as the message says: a view
    padded up to the rank, a degenerate view (constant, near-constant features, mostly all-zero
    rows), a precision the solver cannot keep.  The command line shows these even where it hides
    the other warnings of repeated fits."""


class PrivacyWarning(UserWarning):
    """A run whose privacy protection is weaker than its settings suggest (e.g. secure aggregation
    between two clients, which hides nothing between them); the message says what does protect.
    The command line shows these even where it hides the other warnings of repeated fits."""


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the user's line: the first caller outside fedsonmf (and
    outside scikit-learn's wrappers, e.g. the one around ``fit_transform``), however deep in the
    library the warning arises and through whichever public method it was reached."""
    import os
    import sys
    import warnings
    from types import FrameType

    pkg = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the fedsonmf package
    frame: FrameType | None = sys._getframe(0)
    level = 1
    while frame is not None and (os.path.abspath(frame.f_code.co_filename).startswith(pkg)
                                 or os.sep + "sklearn" + os.sep in frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _convergence_warning():
    from sklearn.exceptions import ConvergenceWarning as _SkConvergenceWarning

    class ConvergenceWarning(_SkConvergenceWarning):
        """The round budget ran out before the tolerance was met."""

    ConvergenceWarning.__module__ = __name__
    return ConvergenceWarning


def __getattr__(name: str):
    # ConvergenceWarning subclasses scikit-learn's; it is built on first use because importing
    # scikit-learn costs ~1 s, which a Flower client process (one round, then exit) must not pay
    if name == "ConvergenceWarning":
        globals()[name] = cls = _convergence_warning()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
