"""fedsonmf: federated sparse orthogonal NMF and federated multi-view clustering."""

from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.estimators.sonmf import FedSONMF, federated_sonmf
from fedsonmf.exceptions import ConvergenceWarning, InputError, ParameterError
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import FitResult, History

__version__ = "0.1.0"

__all__ = [
    "FedSONMF", "federated_sonmf", "FedConfig", "FitResult", "History", "ParameterError", "InputError",
    "ConvergenceWarning", "prox_l21_nonneg", "__version__",
]
