"""fedsonmf: federated sparse orthogonal NMF and federated multi-view clustering."""

from .config import FedConfig, ParameterError
from .estimator import FedSONMF, federated_sonmf
from .federation import ConvergenceWarning
from .history import FitResult, History
from ._validation import InputError
from .prox import prox_l21_nonneg

__version__ = "0.1.0"

__all__ = [
    "FedSONMF", "federated_sonmf", "FedConfig", "FitResult", "History", "ParameterError", "InputError",
    "ConvergenceWarning", "prox_l21_nonneg", "__version__",
]
