"""Federated algorithms by name.  Every driver looks algorithms up here."""

from __future__ import annotations

from .base import FederatedAlgorithm
from .proposed import FedSONMFAlgorithm

__all__ = ["FederatedAlgorithm", "get_algorithm", "ALGORITHMS"]

ALGORITHMS: dict[str, type[FederatedAlgorithm]] = {
    "fedsonmf": FedSONMFAlgorithm,
}


def get_algorithm(name: str | FederatedAlgorithm) -> FederatedAlgorithm:
    """Return an algorithm instance from its name (see ``ALGORITHMS``)."""
    if isinstance(name, FederatedAlgorithm):
        return name
    try:
        return ALGORITHMS[name]()
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}") from None
