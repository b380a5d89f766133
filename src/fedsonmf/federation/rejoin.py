"""Loading the saved state of a client that missed rounds (docs/algorithm.md §15.2).

With partial participation a client's newest state may be older than the
server's last round; it resumes from its own newest saved state (a node
restarted with its saved state).  Uses the file names of
:mod:`fedsonmf.federation.checkpoint` without changing that module.
"""

from __future__ import annotations

import re
from pathlib import Path

from fedsonmf.exceptions import CheckpointError
from fedsonmf.federation import checkpoint as ckpt

__all__ = ["latest_client_round", "load_latest_client_state"]

_NAME = re.compile(r"^client-(\d+)-r(\d+)\.npz$")


def latest_client_round(directory, client: int, upto: int) -> int | None:
    """The newest round <= ``upto`` with a saved state of ``client`` (None: none)."""
    d = Path(directory)
    if not d.is_dir():
        return None
    rounds = [int(mt.group(2)) for f in d.iterdir()
              if (mt := _NAME.match(f.name)) and int(mt.group(1)) == client and int(mt.group(2)) <= upto]
    return max(rounds) if rounds else None


def load_latest_client_state(directory, client: int, upto: int):
    """``load_client_state`` of the newest saved round <= ``upto``."""
    r = latest_client_round(directory, client, upto)
    if r is None:
        raise CheckpointError(f"client {client}: no saved state up to round {upto} in {directory}")
    return ckpt.load_client_state(directory, client, r)
