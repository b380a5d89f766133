"""Result files: atomic writes and private modes, in one place.

Every result, status, checkpoint, key and ``--json`` output of fedsonmf goes
through :func:`write_atomic`: the bytes go to a temporary file in the target's
own folder (same file system, so the rename is atomic), are flushed and
``fsync``-ed, get their mode, and then replace the target with ``os.replace``;
the folder is ``fsync``-ed too.  A crash or a full disk at any point leaves the
old file or the new one, never a torn one.

Files are created 0600 and folders 0700 (our choice: a run folder holds
private views' fingerprints, node state and keys; nobody but the owner needs
to read it).  :func:`check_private_file` refuses a key or secret that group or
others may read (:class:`PrivateFileError`, the one check every key and secret goes through).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Union

from fedsonmf.exceptions import InputError

__all__ = ["write_atomic", "temp_writer_alive", "write_json_atomic", "save_npy_atomic", "save_figure_atomic",
           "private_dir", "new_private_dir", "open_private", "check_private_file", "PrivateFileError",
           "MissingPrivateFileError", "FILE_MODE", "DIR_MODE"]

FILE_MODE = 0o600
DIR_MODE = 0o700

Payload = Union[bytes, str, Callable]


def private_dir(path, mode: int = DIR_MODE) -> Path:
    """Create a folder (and its missing parents) with ``mode``; an existing folder gets ``mode`` too.

    Parameters
    ----------
    path : path-like
        The folder.
    mode : int, default=0o700
        Its permission bits.

    Returns
    -------
    Path
        ``path``.
    """
    path = Path(path)
    _make_missing(path, mode, chmod_existing=True)  # the parents we create get ``mode`` too
    os.chmod(path, mode)
    return path


def new_private_dir(path, mode: int = DIR_MODE) -> Path:
    """Create ``path`` and its missing parents with ``mode``; folders that exist keep their mode.

    The folders of our outputs: a user's existing folder (the working directory, ``results/``)
    is not ours to change, but what we create for private files is 0700.

    Parameters
    ----------
    path : path-like
        The folder.
    mode : int, default=0o700
        The permission bits of the folders created.

    Returns
    -------
    Path
        ``path``.
    """
    _make_missing(Path(path), mode, chmod_existing=False)
    return Path(path)


def _make_missing(path: Path, mode: int, *, chmod_existing: bool) -> None:
    """Create ``path``'s missing folders, outermost first, each chmod-ed to ``mode`` (mkdir's mode is cut
    by the umask; the umask never widens it).  A folder another writer made meanwhile is chmod-ed only
    with ``chmod_existing`` (else it is theirs, as it is)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=mode)
        except FileExistsError:
            if not chmod_existing:
                continue
        os.chmod(p, mode)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. a platform without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path, data: Payload, *, mode: int = FILE_MODE) -> Path:
    """Write ``data`` to ``path`` atomically and give it ``mode``.

    The temporary file is ``.<name>.<pid>-<random>.tmp`` in the same folder (the pid tells
    a cleaner whether its writer is still alive, see :func:`temp_writer_alive`); it is
    removed when the write fails, and the old ``path`` (if any) stays as it was.

    Parameters
    ----------
    path : path-like
        The target (its folder, if missing, is created 0700 with :func:`new_private_dir`).
    data : bytes, str or callable
        The content: bytes, a str (UTF-8), or ``data(fh)`` that writes to the open binary
        file (e.g. ``lambda fh: np.save(fh, a)``).
    mode : int, default=0o600
        The file's permission bits.

    Returns
    -------
    Path
        ``path``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> write_atomic(d / "a.txt", "hello").read_text()
    'hello'
    >>> oct((d / "a.txt").stat().st_mode & 0o777)
    '0o600'
    """
    path = Path(path)
    new_private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def temp_writer_alive(name: str) -> bool:
    """Whether the process writing temporary file ``name`` (from :func:`write_atomic`) is alive.

    Parameters
    ----------
    name : str
        A file name ``.<target>.<pid>-<random>.tmp``.

    Returns
    -------
    bool
        True while that pid runs; False for names without a pid (older writers).
    """
    middle = name[:-len(".tmp")].rsplit(".", 1)[-1] if name.endswith(".tmp") else ""
    pid, sep, _ = middle.partition("-")
    if not sep or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return int(pid) != 0


def write_json_atomic(path, obj, *, default=None, indent: int | None = 1, mode: int = FILE_MODE) -> Path:
    """``json.dumps(obj)`` written with :func:`write_atomic`.

    The object is serialised first, so a bad object leaves no file.

    Parameters
    ----------
    path : path-like
        The target.
    obj : object
        Anything ``json.dumps`` accepts (with ``default``).
    default : callable or None, default=None
        ``json.dumps``'s ``default`` (e.g. :func:`fedsonmf.protocol.history.json_default`).
    indent : int or None, default=1
        ``json.dumps``'s ``indent``.
    mode : int, default=0o600
        Permission bits, as for :func:`write_atomic`.

    Returns
    -------
    Path
        The file written.
    """
    return write_atomic(path, json.dumps(obj, indent=indent, default=default), mode=mode)


def save_npy_atomic(path, array, *, mode: int = FILE_MODE) -> Path:
    """``np.save`` (no pickle) written with :func:`write_atomic`.

    Parameters
    ----------
    path : path-like
        The target ``.npy`` file.
    array : array-like
        The array (object arrays are refused, as ``allow_pickle=False`` does).
    mode : int, default=0o600
        As for :func:`write_atomic`.

    Returns
    -------
    Path
        The ``.npy`` file.
    """
    import numpy as np

    return write_atomic(path, lambda fh: np.save(fh, array, allow_pickle=False), mode=mode)


def save_figure_atomic(fig, path, *, mode: int = FILE_MODE, **savefig_kw) -> Path:
    """``fig.savefig`` written with :func:`write_atomic` (0600), the format from the suffix.

    matplotlib's own ``savefig(path)`` creates the file with the umask's mode (0644 by
    default): a plot of a private run's history would be readable by everyone on the host.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure.
    path : path-like
        The target, e.g. ``run.png`` (the suffix names the format; none: PNG).
    mode : int, default=0o600
        As for :func:`write_atomic`.
    **savefig_kw
        Passed to ``fig.savefig`` (``dpi``, ``bbox_inches``, ...).

    Returns
    -------
    Path
        The file written.
    """
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    return write_atomic(path, lambda fh: fig.savefig(fh, format=fmt, **savefig_kw), mode=mode)


def open_private(path, flags: str = "ab"):
    """Open ``path`` for appending or writing, created 0600 (logs).

    Parameters
    ----------
    path : path-like
        The file.
    flags : {"ab", "wb"}, default="ab"
        Append or truncate.

    Returns
    -------
    file object
        Binary, open for writing.
    """
    if flags not in ("ab", "wb"):
        raise ValueError(f"flags must be 'ab' or 'wb', got {flags!r}")
    os_flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if flags == "ab" else os.O_TRUNC)
    fd = os.open(path, os_flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, flags)


class PrivateFileError(InputError, PermissionError):
    """A key or secret file that is missing, not a regular file, another user's, or readable or
    writable by group/others.  Bad input (an :class:`~fedsonmf.exceptions.InputError`: exit 2 in the
    CLI) and a :class:`PermissionError` (an ``OSError``, for code that handles file errors).  A missing
    file raises the subclass :class:`MissingPrivateFileError`, also a :class:`FileNotFoundError`."""


class MissingPrivateFileError(PrivateFileError, FileNotFoundError):
    """The key or secret file does not exist (a :class:`PrivateFileError` and a :class:`FileNotFoundError`)."""


def check_private_file(path, what: str = "key file") -> Path:
    """Refuse ``path`` unless it is a regular file of this user that only its owner may read or write.

    Parameters
    ----------
    path : path-like
        The key or secret file (``~`` is expanded).
    what : str, default="key file"
        What the file is, for the message ("TLS server key", "gate pin file", ...).

    Returns
    -------
    Path
        The resolved path.

    Raises
    ------
    PrivateFileError
        Naming the file, what is wrong and the fix (``chmod 600``); :class:`MissingPrivateFileError`
        when it does not exist.
    """
    path = Path(path).expanduser().resolve()
    try:
        st = path.stat()
    except FileNotFoundError:
        raise MissingPrivateFileError(f"{what} {path} does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        raise PrivateFileError(f"{what} {path} is not a regular file")
    if st.st_mode & 0o077:
        raise PrivateFileError(f"{what} {path} is readable or writable by group/others (mode "
                               f"{stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path}")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PrivateFileError(f"{what} {path} belongs to another user (uid {st.st_uid})")
    return path
