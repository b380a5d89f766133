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

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsonmf._io import private_dir, temp_writer_alive, write_atomic
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
    "view_fingerprint",
    "view_storage",
    "client_resume_meta",
    "verify_client_resume",
    "verify_server_state",
]

_META_KEY = "__meta_json__"
SERVER_FILE = "server.npz"


def atomic_save_npz(path, arrays: dict, meta: dict | None = None) -> Path:
    """Write ``arrays`` (+ a JSON ``meta``) to ``path`` atomically."""
    path = Path(path)
    private_dir(path.parent)
    payload = {k: np.asarray(v) for k, v in arrays.items()}
    if _META_KEY in payload:
        raise ValueError(f"array key {_META_KEY!r} is reserved")
    payload[_META_KEY] = np.array(json.dumps(meta or {}, default=json_default))
    write_atomic(path, lambda fh: np.savez(fh, **payload))  # type: ignore[arg-type]  # numpy's stub: savez(file, *args, allow_pickle, **kwds)  # temp ".<name>.<random>.tmp", fsync, replace, 0600
    _remove_stale_temps(path.parent, lambda name: name.startswith(f".{path.name}."))
    return path


_TMP_RE = re.compile(r"^\.(?P<target>.+\.npz)\.[^.]+\.tmp$")


def _remove_stale_temps(directory, select) -> list[Path]:
    """Remove temporary files ``.<target>.<random>.tmp`` left by a killed write.

    ``select(name)`` picks which ones.  A temporary file whose writer is still
    alive (its pid is in the name, :func:`fedsonmf._io.temp_writer_alive`) is
    kept: a reader in another process (e.g. a monitor polling the server
    checkpoint) must not delete a write in progress.
    """
    removed: list[Path] = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for f in entries:
        if _TMP_RE.match(f.name) and select(f.name) and not temp_writer_alive(f.name):
            try:
                f.unlink()
                removed.append(f)
            except OSError:
                pass
    return removed


def load_npz(path) -> tuple[dict[str, np.ndarray], dict]:
    """Read a file written by :func:`atomic_save_npz`: ``(arrays, meta)``.

    Before anything is read, the file's zip directory and its members' ``.npy`` headers are
    checked with the rules the view readers apply to ``.npz`` files
    (:mod:`fedsonmf.datasets._limits`): no member inflating like a zip bomb, no array declared
    larger than its member, and no more memory in all than the budget; a file that is not a
    zip archive at all is refused too.  Every failure is a :class:`CheckpointError` naming the file.
    """
    path = Path(path)
    try:
        _precheck_archive(path)
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != _META_KEY}
            meta = json.loads(str(z[_META_KEY])) if _META_KEY in z.files else {}
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} does not exist") from None
    except CheckpointError:
        raise
    except Exception as exc:  # zip/JSON damage
        raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"cannot read checkpoint file {path}: its metadata is not a JSON object")
    for k, v in arrays.items():
        if not isinstance(v, np.ndarray):  # a member that is no .npy array (np.load gives its bytes)
            raise CheckpointError(f"cannot read checkpoint file {path}: member {k!r} is not a NumPy array")
    return arrays, meta


_ZIP_MAGIC = b"PK\x03\x04"


def _precheck_archive(path: Path) -> None:
    """Refuse ``path`` from its zip directory and its members' ``.npy`` headers, before it is read
    (the size rules of a ``.npz`` view: :func:`fedsonmf.datasets.files.npz_members`, then the budget)."""
    from fedsonmf.datasets import _limits
    from fedsonmf.datasets.files import npz_members
    from fedsonmf.exceptions import InputError

    with open(path, "rb") as fh:  # FileNotFoundError: the caller's "does not exist"
        magic = fh.read(len(_ZIP_MAGIC))
    if magic != _ZIP_MAGIC:
        raise CheckpointError(f"cannot read checkpoint file {path}: not a checkpoint archive (.npz)")
    try:
        members = npz_members(path)
        if members is None:
            return  # np.load says what is wrong
        infos, arrays = members
        need = sum(_limits.prod(shape) * dtype.itemsize for _, shape, dtype in arrays.values())
        _limits.check_budget(path, max(need, sum(info.file_size for info in infos)),
                             f"the checkpoint archive ({len(infos)} members)")
    except InputError as exc:
        raise CheckpointError(f"checkpoint file {exc}") from None


# ----------------------------------------------------------------------------- config


def config_from_dict(d: dict) -> FedConfig:
    """Rebuild a :class:`FedConfig` from ``FedConfig.to_dict()`` (or its JSON): :meth:`FedConfig.from_dict`."""
    return FedConfig.from_dict(d)


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
    meta = {"round": int(state.round), "mu": state.mu, "history": history.rows, "R0": history.R0, "run": run}
    return atomic_save_npz(Path(directory) / SERVER_FILE, state.arrays, meta)


def has_server_checkpoint(directory) -> bool:
    return (Path(directory) / SERVER_FILE).is_file()


def load_server_checkpoint(directory) -> ServerCheckpoint:
    """Load and check the server checkpoint of ``directory`` (:func:`verify_server_state` with the
    checkpoint's own run: its algorithm, r and number of clients; n is checked by the resume, which
    knows the data)."""
    _remove_stale_temps(directory, lambda name: name.startswith(f".{SERVER_FILE}."))
    path = Path(directory) / SERVER_FILE
    arrays, meta = load_npz(path)
    try:
        mu = meta.get("mu")
        if mu is None and "mu" in arrays:  # written before the server state had its own field
            mu = arrays.pop("mu")
        state = ServerState(int(meta["round"]), arrays, None if mu is None else float(mu))
        history = History([dict(r) for r in meta["history"]], R0=meta.get("R0"))
        run = dict(meta["run"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CheckpointError(f"server checkpoint in {directory} is incomplete: {exc}") from None
    if len(history) != state.round - 1:
        raise CheckpointError(
            f"server checkpoint in {directory}: state is at round {state.round} but the history has "
            f"{len(history)} rows"
        )
    verify_server_state(state, run, path)
    return ServerCheckpoint(state, history, run)


#: server-state arrays of shape (r, n), beside V (docs/algorithm.md §5, §15.2): any sign
_SERVER_RN = ("Vbar", "V_prev", "G_sum")
#: server-state integer exponents (0-d): secure aggregation's and a plain run's upload bounds
_SERVER_EXPONENTS = ("secagg_exp", "bound_exp")


def verify_server_state(state: ServerState, run: dict, path, *, n_samples: int | None = None,
                        algorithm=None) -> None:
    """Check a loaded server state before a run resumes from it.

    Refuses (:class:`CheckpointError` naming ``path`` and the array) a state that the run could
    not have written: V missing, or any array the algorithm broadcasts (V-bar for fedsonmf);
    V not (r, n) float64 and finite; V negative where the algorithm's V is a proximal output
    (``server_v_nonnegative``; V-bar, the pre-proximal matrix, may be negative); V-bar, V_prev,
    G_sum not of V's shape, G_kept not (m, r, n), membership not (m, n) booleans with every
    sample held, G_have not (m,) booleans; exponents that are not small integers; a NaN or Inf
    anywhere; mu not a number >= 0.

    ``run`` is the checkpoint's run (its ``config.n_components`` is r, its ``n_clients`` m, its
    ``algorithm`` names the algorithm when ``algorithm`` is not given; a run that names none is held
    to V alone); ``n_samples``, when given, is the n the resumed run's data has.
    """
    arrays = state.arrays
    where = f"server checkpoint {path}"
    if algorithm is None and run.get("algorithm") is not None:  # every run the library writes names it
        from fedsonmf.algorithms import get_algorithm

        try:
            algorithm = get_algorithm(str(run["algorithm"]))
        except (ValueError, TypeError):
            algorithm = None  # an algorithm given as an instance: the resume checks again with it
    if state.mu is not None and not (np.isfinite(state.mu) and state.mu >= 0):
        raise CheckpointError(f"{where}: mu = {state.mu!r}, not a number >= 0")
    required = ["V", *([] if algorithm is None else [k for k in algorithm.downlink_keys if k != "V"])]
    for key in required:
        if key not in arrays:
            raise CheckpointError(f"{where}: the server state has no array {key!r}")
    for key, A in arrays.items():
        if A.dtype.kind in "fc" and not np.all(np.isfinite(A)):
            raise CheckpointError(f"{where}: saved {key} holds NaN or Inf")
    V = arrays["V"]
    config = run.get("config")
    config = config if isinstance(config, dict) else {}
    r = config.get("n_components")
    r = int(r) if isinstance(r, int) and not isinstance(r, bool) else (V.shape[0] if V.ndim == 2 else None)
    n = int(n_samples) if n_samples is not None else (V.shape[1] if V.ndim == 2 else None)
    m = run.get("n_clients")
    m = int(m) if isinstance(m, int) and not isinstance(m, bool) else None

    def check(key: str, shape: tuple, kind: str, what: str) -> None:
        A = arrays[key]
        if A.shape != shape:
            raise CheckpointError(f"{where}: saved {key} has shape {A.shape}, expected {what} = {shape}")
        if kind == "f" and A.dtype != np.float64:
            raise CheckpointError(f"{where}: saved {key} is {A.dtype}, expected float64")
        if kind == "b" and A.dtype != np.bool_:
            raise CheckpointError(f"{where}: saved {key} is {A.dtype}, expected booleans")

    check("V", (r, n), "f", "(r, n)")
    if getattr(algorithm, "server_v_nonnegative", False) and V.size and V.min() < 0:
        raise CheckpointError(f"{where}: saved V has negative entries (min {V.min():.3g}); V is the proximal "
                              f"output of {algorithm.name}, >= 0")
    for key in _SERVER_RN:
        if key in arrays:
            check(key, (r, n), "f", "(r, n)")
    mm = m
    if "membership" in arrays:
        member = arrays["membership"]
        mm = mm if mm is not None else (member.shape[0] if member.ndim == 2 else None)
        check("membership", (mm, n), "b", "(m, n)")
        if not np.all(member.any(axis=0)):
            raise CheckpointError(f"{where}: saved membership leaves samples no client holds")
    for key, shape, kind, what in (("G_kept", (mm, r, n), "f", "(m, r, n)"), ("G_have", (mm,), "b", "(m,)")):
        if key in arrays:
            if mm is None:
                mm = arrays[key].shape[0] if arrays[key].ndim >= 1 else None
                shape = (mm, *shape[1:])
            check(key, shape, kind, what)
    if "partial_prev" in arrays:
        check("partial_prev", (), "b", "a boolean")
    for key in _SERVER_EXPONENTS:
        if key in arrays:
            A = arrays[key]
            if A.shape != () or A.dtype.kind not in "iu" or not -1100 <= int(A) <= 1100:
                raise CheckpointError(f"{where}: saved {key} is not a small integer exponent")
    if "secagg_echoes" in arrays:  # the clients' key-list echoes: JSON bytes, relayed every masked round
        A = arrays["secagg_echoes"]
        try:
            if A.ndim != 1 or A.dtype != np.uint8:
                raise ValueError(f"{A.dtype} array of shape {A.shape}")
            json.loads(A.tobytes().decode())
        except (ValueError, RecursionError) as exc:
            raise CheckpointError(f"{where}: saved secagg_echoes is not the JSON the run wrote ({exc})") from None


def check_resume_matches(ckpt: ServerCheckpoint, run: dict) -> None:
    """Raise :class:`CheckpointError` when ``run`` differs from the checkpoint's run.

    The message names every differing field, e.g.
    ``config.tau: 10 in the checkpoint, 5 now``.
    """
    for key in ("algorithm", "config", "seed", "n_clients"):
        if key in run and key in ckpt.run and _norm(run[key]) != _norm(ckpt.run[key]):
            diffs = _diff(_norm(ckpt.run[key]), _norm(run[key]), key)
            raise CheckpointError(
                f"cannot resume: the {key} of this run differs from the checkpoint's: " + "; ".join(diffs)
            )


def _diff(saved, now, prefix: str) -> list[str]:
    if isinstance(saved, dict) and isinstance(now, dict):
        out = []
        for k in sorted(set(saved) | set(now), key=str):
            if k not in saved:
                out.append(f"{prefix}.{k}: not in the checkpoint, {now[k]!r} now")
            elif k not in now:
                out.append(f"{prefix}.{k}: {saved[k]!r} in the checkpoint, absent now")
            elif saved[k] != now[k]:
                out.extend(_diff(saved[k], now[k], f"{prefix}.{k}"))
        return out
    return [f"{prefix}: {saved!r} in the checkpoint, {now!r} now"]


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
    _remove_stale_temps(directory, lambda name: name.startswith(f".client-{int(client)}-r"))
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
    _remove_stale_temps(directory, lambda name: name.startswith(f".client-{int(client)}-r"))
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


# ----------------------------------------------------------------------------- resume safety (client-side)


def view_fingerprint(X) -> str:
    """SHA-256 of a client's view (d_p, n): shape, storage kind, dtype and data.

    Computed by the client on its own data; only this digest is written to
    the client's own state file, and only the client compares it (the server
    never sees data or the digest).  Dense views hash their C-ordered bytes;
    sparse views their canonical CSC arrays (sorted indices, duplicates
    summed), so the fingerprint does not depend on the memory layout.
    """
    import hashlib

    import scipy.sparse as sp

    h = hashlib.sha256()
    if sp.issparse(X):
        C = sp.csc_matrix(X, copy=True)
        C.sum_duplicates()
        C.sort_indices()
        h.update(f"sparse-csc|{C.shape[0]}x{C.shape[1]}|{C.dtype.str}|".encode())
        h.update(np.ascontiguousarray(C.indptr, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(C.indices, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(C.data).tobytes())
    else:
        A = np.asarray(X)
        h.update(f"dense|{A.shape[0]}x{A.shape[1]}|{A.dtype.str}|".encode())
        # hash row blocks: no full C-ordered copy of a large (F-ordered) view
        step = max(1, (1 << 24) // max(1, A.shape[1] * A.itemsize))
        for i in range(0, A.shape[0], step):
            h.update(np.ascontiguousarray(A[i:i + step]).tobytes())
    return h.hexdigest()


def view_storage(X) -> str:
    """``"dense float64"``, ``"sparse float32"``, ...: the storage the fingerprint covers."""
    import scipy.sparse as sp

    return f"{'sparse' if sp.issparse(X) else 'dense'} {np.dtype(X.dtype).name}"


def client_resume_meta(X, fingerprint: str) -> dict:
    """What a client stores with its state so that it can check a resume itself."""
    return {"fingerprint": fingerprint, "view_shape": [int(X.shape[0]), int(X.shape[1])],
            "view_storage": view_storage(X)}


def verify_client_resume(client: int, X, state: ClientState, meta: dict, n_components: int,
                         fingerprint: str | None = None, n_cols: int | None = None) -> None:
    """Check, on the client, that a loaded state may be used with the view ``X``.

    Refuses (:class:`CheckpointError` naming the client and the field) when
    the state was saved for other data (fingerprint, shape) or is damaged:
    U must be (d_p, r), finite, >= 0 with U^T U = I to 1e-8; every other
    matrix must be (r, n) and finite.
    """
    d, n = X.shape
    r = int(n_components)
    saved_fp = meta.get("fingerprint")
    if saved_fp is None:
        raise CheckpointError(
            f"client {client}: the saved state has no data fingerprint (written by an older version?); "
            "cannot check that it was made on this client's data"
        )
    if fingerprint is None:
        fingerprint = view_fingerprint(X)
    if saved_fp != fingerprint:
        shape, storage = meta.get("view_shape"), meta.get("view_storage")
        if shape is not None and tuple(shape) != (d, n):
            what = f"the checkpoint was made on a view of shape {tuple(shape)}, this one is {(d, n)}"
        elif storage is not None and storage != view_storage(X):
            what = (f"the checkpoint was made on a {storage} view, this one is {view_storage(X)}; the fingerprint "
                    "covers the storage: pass the view as it was stored then")
        else:
            what = "same shape, different values (other data, rescaled, or views swapped?)"
        raise CheckpointError(
            f"client {client}: refusing to resume on other data: this client's view does not match the "
            f"data its checkpoint was made with ({what})"
        )
    arrays = state.arrays
    if "U" not in arrays:
        raise CheckpointError(f"client {client}: the saved state has no field U")
    U = np.asarray(arrays["U"])
    if U.shape != (d, r):
        raise CheckpointError(f"client {client}: saved U has shape {U.shape}, expected (d_p, r) = {(d, r)}")
    if U.dtype.kind != "f" or not np.all(np.isfinite(U)):
        raise CheckpointError(f"client {client}: saved U holds NaN/Inf or is not floating-point")
    if np.any(U < 0):
        raise CheckpointError(f"client {client}: saved U has negative entries (min {U.min():.3g}); U must be >= 0")
    gram_err = float(np.max(np.abs(U.T @ U - np.eye(r)))) if r else 0.0
    if not gram_err <= 1e-8:
        raise CheckpointError(
            f"client {client}: saved U is not orthonormal (max |U^T U - I| = {gram_err:.3g} > 1e-8)"
        )
    for key, A in arrays.items():
        if key == "U":
            continue
        A = np.asarray(A)
        if key.startswith("secagg."):  # the secure-aggregation protocol's arrays (pair keys: m x 32 uint8, ...)
            if A.dtype.kind in "fc" and not np.all(np.isfinite(A)):
                raise CheckpointError(f"client {client}: saved {key} holds NaN or Inf")
            continue
        # r x n matrices; a client holding only some samples (§15.1) keeps r x |held| ones
        if A.ndim == 2 and A.shape != (r, n) and (n_cols is None or A.shape != (r, n_cols)):
            raise CheckpointError(f"client {client}: saved {key} has shape {A.shape}, expected (r, n) = {(r, n)}")
        if A.dtype.kind in "fc" and not np.all(np.isfinite(A)):
            raise CheckpointError(f"client {client}: saved {key} holds NaN or Inf")
