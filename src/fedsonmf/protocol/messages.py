"""What travels between the server and the clients.

A :class:`Message` is the *only* thing a driver moves.  ``arrays`` and
``scalars`` are the algorithm's payload (for the proposed method: one r x n
matrix each way per round, docs/algorithm.md §5); ``diagnostics`` are optional
monitoring values a client adds to its reply (objective, residual pieces)
and are counted separately so the algorithm's traffic stays visible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

__all__ = ["Message", "Aggregate", "ClientState", "ServerState", "Scalar"]

Scalar = Union[int, float, bool, str]


def _nbytes(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, object]) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays.values())) + 8 * len(scalars)


@dataclass(frozen=True)
class Message:
    """One message: a kind ("setup" or "round"), the round number, payload.

    Parameters
    ----------
    kind : str
        "setup" (initialisation exchange before round 1) or "round".
    round : int
        Round number s (0 for setup).  Every reply carries the round of the
        request, and clients refuse a message whose round does not follow
        their state.
    arrays : mapping of str to ndarray
        Algorithm payload, e.g. ``{"Vbar": (r, n)}`` down, ``{"Vhat": (r, n)}`` up.
    scalars : mapping of str to int/float/bool/str
        Small algorithm payload (seeds, configuration on setup).
    diagnostics : mapping of str to ndarray or float
        Monitoring values of an uplink reply (not used by the algorithm).
    """

    kind: str
    round: int
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    scalars: Mapping[str, Scalar] = field(default_factory=dict)
    diagnostics: Mapping[str, object] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of the algorithm payload (arrays + 8 per scalar)."""
        return _nbytes(self.arrays, self.scalars)

    @property
    def diagnostics_nbytes(self) -> int:
        arrays = {k: v for k, v in self.diagnostics.items() if isinstance(v, np.ndarray)}
        return _nbytes(arrays, {k: v for k, v in self.diagnostics.items() if k not in arrays})


@dataclass(frozen=True)
class Aggregate:
    """The sums of the reply items the server only averages (one exchange).

    Built by the loop from plain replies, or decoded from securely aggregated
    (masked) uploads: in both cases the server step, the setup and the round
    metrics read only this object for those items.

    Parameters
    ----------
    kind, round : str, int
        The exchange ("setup" / "round") and its round number.
    sums : mapping of str to ndarray or float
        ``sums[key] = sum_p item_p`` in client order.  Column blocks of an
        incomplete view (r x |Omega_p|) are summed into their columns of an
        r x n array (zeros elsewhere); scalars are floats.
    clients : tuple of int
        The clients whose items are in the sums (``count = len(clients)``).
    """

    kind: str
    round: int
    sums: Mapping[str, Any] = field(default_factory=dict)  # ndarray or float per item
    clients: tuple = ()

    @property
    def count(self) -> int:
        return len(self.clients)


@dataclass
class ClientState:
    """A client's private state between rounds: never sent anywhere.

    ``round`` is the last round this state has completed (0 after setup).
    """

    round: int
    arrays: dict[str, np.ndarray]


@dataclass
class ServerState:
    """The server's state: round s about to start, the global matrices and the l2,1 weight.

    ``mu`` is the number in force (``mu="auto"`` resolved by the server from V-bar^1 at setup,
    docs/algorithm.md §11); every round message carries it.
    """

    round: int
    arrays: dict[str, np.ndarray]
    mu: float | None = None

    def next(self, arrays: dict[str, np.ndarray]) -> ServerState:
        """The state of the following round: new ``arrays``, the same ``mu``."""
        return ServerState(self.round + 1, arrays, self.mu)
