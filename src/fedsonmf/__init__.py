"""fedsonmf: federated sparse orthogonal NMF and federated multi-view clustering.

The public names are imported on first use (PEP 562), so that a Flower client
process, which runs one round and exits, imports only what a round needs.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "FedSONMF": "fedsonmf.estimators.sonmf",
    "federated_sonmf": "fedsonmf.estimators.sonmf",
    "FedMultiViewClustering": "fedsonmf.estimators.clustering",
    "SparseONMF": "fedsonmf.estimators.single",
    "MethodOptions": "fedsonmf.estimators.options",
    "RefineOptions": "fedsonmf.estimators.options",
    "PrivacyOptions": "fedsonmf.estimators.options",
    "InProcess": "fedsonmf.estimators.options",
    "Flower": "fedsonmf.estimators.options",
    "FedConfig": "fedsonmf.protocol.config",
    "FitResult": "fedsonmf.protocol.history",
    "History": "fedsonmf.protocol.history",
    "ParameterError": "fedsonmf.exceptions",
    "InputError": "fedsonmf.exceptions",
    "ConvergenceWarning": "fedsonmf.exceptions",
    "DataWarning": "fedsonmf.exceptions",
    "prox_l21_nonneg": "fedsonmf.core.prox",
}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedsonmf' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
