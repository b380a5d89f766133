"""Checkpoints: the server's state + history and every client's private state.

Used by both engines (in-process and Flower) so that a stopped run can be
resumed and end with the same V as an uninterrupted one.

Layout of a checkpoint directory::

    server.npz               ServerState arrays + JSON (round, history, run info)
    client-<p>-r<s>.npz      client p's ClientState after round s (s = 0: setup)

Every file is written atomically (temporary file in the same directory,
``fsync``, ``os.replace``), so a crash leaves either the old or the new file,
never a torn one.  Client files are kept for the last two rounds: when a run
stops during round s+1, some clients may already have finished it, but the
server resumes at round s+1 and every client reloads its round-s state.

Arrays are stored with ``np.savez`` (no pickle); float64 round-trips bit-exactly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.exceptions import CheckpointError
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import History, json_default
from fedsonmf.protocol.messages import ClientState, ServerState

__all__ = [
    "CheckpointError",
    "ServerCheckpoint",
    "atomic_save_npz",
    "load_npz",
    "save_server_checkpoint",
    "load_server_checkpoint",
    "has_server_checkpoint",
    "check_resume_matches",
    "save_client_state",
    "load_client_state",
    "client_state_path",
    "config_from_dict",
]

_META_KEY = "__meta_json__"
SERVER_FILE = "server.npz"


def atomic_save_npz(path, arrays: dict, meta: dict | None = None) -> Path:
    """Write ``arrays`` (+ a JSON ``meta``) to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {k: np.asarray(v) for k, v in arrays.items()}
    if _META_KEY in payload:
        raise ValueError(f"array key {_META_KEY!r} is reserved")
    payload[_META_KEY] = np.array(json.dumps(meta or {}, default=json_default))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def load_npz(path) -> tuple[dict[str, np.ndarray], dict]:
    """Read a file written by :func:`atomic_save_npz`: ``(arrays, meta)``."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != _META_KEY}
            meta = json.loads(str(z[_META_KEY])) if _META_KEY in z.files else {}
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} does not exist") from None
    except Exception as exc:  # zip/JSON damage
        raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from None
    return arrays, meta


# ----------------------------------------------------------------------------- config


def config_from_dict(d: dict) -> FedConfig:
    """Rebuild a :class:`FedConfig` from ``FedConfig.to_dict()`` (or its JSON)."""
    names = {f.name for f in dataclasses.fields(FedConfig)}
    kwargs = {k: v for k, v in d.items() if k in names and k != "ustep"}
    if "ustep" in d:
        u = d["ustep"]
        kwargs["ustep"] = u if isinstance(u, PenaltyOptions) else PenaltyOptions(**u)
    return FedConfig(**kwargs)


# ----------------------------------------------------------------------------- server


@dataclass
class ServerCheckpoint:
    """What :func:`load_server_checkpoint` returns.

    ``run`` holds the run's identity (algorithm, config dict, seed, number of
    clients); a resume must match it.
    """

    state: ServerState
    history: History
    run: dict

    @property
    def completed_rounds(self) -> int:
        return self.state.round - 1


def save_server_checkpoint(directory, state: ServerState, history: History, run: dict) -> Path:
    """Save the server state after a completed round (``state.round`` = next round)."""
    meta = {"round": int(state.round), "history": history.rows, "R0": history.R0, "run": run}
    return atomic_save_npz(Path(directory) / SERVER_FILE, state.arrays, meta)


def has_server_checkpoint(directory) -> bool:
    return (Path(directory) / SERVER_FILE).is_file()


def load_server_checkpoint(directory) -> ServerCheckpoint:
    arrays, meta = load_npz(Path(directory) / SERVER_FILE)
    try:
        state = ServerState(int(meta["round"]), arrays)
        history = History([dict(r) for r in meta["history"]], R0=meta.get("R0"))
        run = dict(meta["run"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"server checkpoint in {directory} is incomplete: {exc}") from None
    if len(history) != state.round - 1:
        raise CheckpointError(
            f"server checkpoint in {directory}: state is at round {state.round} but the history has "
            f"{len(history)} rows"
        )
    return ServerCheckpoint(state, history, run)


def check_resume_matches(ckpt: ServerCheckpoint, run: dict) -> None:
    """Raise :class:`CheckpointError` when ``run`` differs from the checkpoint's run."""
    for key in ("algorithm", "config", "seed", "n_clients"):
        if key in run and key in ckpt.run and _norm(run[key]) != _norm(ckpt.run[key]):
            raise CheckpointError(
                f"cannot resume: {key} of this run ({run[key]!r}) differs from the checkpoint's "
                f"({ckpt.run[key]!r})"
            )


def _norm(x):
    return json.loads(json.dumps(x, default=json_default))


# ----------------------------------------------------------------------------- clients

_CLIENT_RE = re.compile(r"^client-(\d+)-r(\d+)\.npz$")


def client_state_path(directory, client: int, round: int) -> Path:
    return Path(directory) / f"client-{int(client)}-r{int(round)}.npz"


def save_client_state(directory, client: int, state: ClientState, meta: dict | None = None, keep: int = 2) -> Path:
    """Save client ``client``'s state after round ``state.round``; keep the last ``keep`` rounds."""
    meta = {**(meta or {}), "round": int(state.round), "client": int(client)}
    path = atomic_save_npz(client_state_path(directory, client, state.round), state.arrays, meta)
    for f in Path(directory).iterdir():
        mt = _CLIENT_RE.match(f.name)
        if mt and int(mt.group(1)) == client and int(mt.group(2)) <= state.round - keep:
            try:
                f.unlink()
            except FileNotFoundError:
                pass
    return path


def load_client_state(directory, client: int, round: int) -> tuple[ClientState, dict]:
    """Load client ``client``'s state after round ``round``; check the round stored inside."""
    path = client_state_path(directory, client, round)
    if not path.is_file():
        have = sorted(
            int(mt.group(2))
            for f in (Path(directory).iterdir() if Path(directory).is_dir() else [])
            if (mt := _CLIENT_RE.match(f.name)) and int(mt.group(1)) == client
        )
        raise CheckpointError(
            f"client {client}: no saved state after round {round} in {directory} (saved rounds: {have or 'none'})"
        )
    arrays, meta = load_npz(path)
    if int(meta.get("round", -1)) != round or int(meta.get("client", -1)) != client:
        raise CheckpointError(
            f"client state file {path} holds client {meta.get('client')} round {meta.get('round')}, "
            f"expected client {client} round {round}"
        )
    return ClientState(round, arrays), meta
