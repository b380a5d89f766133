"""Federated algorithms by name.  Every driver looks algorithms up here.

``ALGORITHMS`` maps a name to a class or a zero-argument factory; the instance
it builds has ``.name`` equal to that key, so a remote driver can rebuild the
same algorithm from the name in the setup message and the run's FedConfig.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from fedsonmf.algorithms.ablations import LocalCopy, ServerUpdateV
from fedsonmf.algorithms.base import FederatedAlgorithm
from fedsonmf.algorithms.efimvc import efimvc_cluster
from fedsonmf.algorithms.fedmavg import FedMAvg
from fedsonmf.algorithms.fedmgs import FedMGS
from fedsonmf.algorithms.fedmvl import fedmvl_cluster
from fedsonmf.algorithms.fedvra import FedVRA
from fedsonmf.algorithms.proposed import FedSONMFAlgorithm
from fedsonmf.algorithms.psfedml import psfedml_cluster

__all__ = [
    "FederatedAlgorithm", "get_algorithm", "ALGORITHMS", "BASELINES", "ABLATIONS", "CLUSTERING_METHODS",
    "FedSONMFAlgorithm", "FedMAvg", "FedMGS", "FedVRA", "ServerUpdateV", "LocalCopy",
]

ALGORITHMS: dict[str, Callable[[], FederatedAlgorithm]] = {
    "fedsonmf": FedSONMFAlgorithm,
    # adapted baselines (docs/algorithm.md §9.1-9.3)
    "fedmavg": partial(FedMAvg, "constant", name="fedmavg"),
    "fedmavg_decreasing": partial(FedMAvg, "decreasing", name="fedmavg_decreasing"),
    "fedmgs": partial(FedMGS, "last", name="fedmgs"),
    "fedmgs_avg": partial(FedMGS, "average", name="fedmgs_avg"),
    "fedvra": partial(FedVRA, name="fedvra"),
    # ablation variants (§9.4)
    "server_update": partial(ServerUpdateV, "alpha", name="server_update"),
    "server_update_etag": partial(ServerUpdateV, "eta_g_alpha", name="server_update_etag"),
    "local_tau1": partial(LocalCopy, 1, True, name="local_tau1"),
    "no_correction": partial(LocalCopy, None, False, name="no_correction"),
}

#: federated multi-view clustering methods with a model of their own (not an ONMF with U_p and V): each is
#: ``fn(views, n_clusters, random_state=seed) -> labels``, run in process as a comparison method of Table 1
CLUSTERING_METHODS: dict[str, Callable] = {
    "fedmvl": fedmvl_cluster,  # Huang et al. 2019 (fedsonmf.algorithms.fedmvl)
    "efimvc": efimvc_cluster,  # Liu et al. 2025 (fedsonmf.algorithms.efimvc)
    "psfedml": psfedml_cluster,  # Li et al. 2024 (fedsonmf.algorithms.psfedml)
}

#: the three adapted baselines of Fig. 3
BASELINES = ("fedmavg", "fedmgs", "fedvra")
#: the four ablation variants of Fig. 4-5 (the last is the proposed method)
ABLATIONS = ("server_update", "local_tau1", "no_correction", "fedsonmf")


def get_algorithm(name: str | FederatedAlgorithm) -> FederatedAlgorithm:
    """Return an algorithm instance from its name (see ``ALGORITHMS``)."""
    if isinstance(name, FederatedAlgorithm):
        return name
    try:
        return ALGORITHMS[name]()
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}") from None
