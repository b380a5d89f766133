"""Provenance of a result: the ``meta`` block every JSON output of fedsonmf carries.

``meta(inputs=..., seeds=...)`` records the package, Python, NumPy, SciPy and
scikit-learn versions, the command line (or the Python call), the UTC time, the
seeds and the SHA-256 of each input file or in-memory view, so that a result can
be traced to exactly what produced it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

__all__ = ["meta", "sha256_file", "sha256_array", "set_command"]

#: the command line of this process when it runs the ``fedsonmf`` CLI (set by its entry point)
_COMMAND: str | None = None


def set_command(argv) -> None:
    """Record the command line ``fedsonmf <argv>`` for the ``meta`` blocks this process writes."""
    global _COMMAND
    import shlex

    _COMMAND = shlex.join(["fedsonmf", *map(str, argv)])


def sha256_file(path) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_array(X) -> str:
    """SHA-256 (hex) of an array or sparse matrix: its dtype, shape and values (CSR canonical form)."""
    h = hashlib.sha256()
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        X.sum_duplicates()
        X.sort_indices()
        h.update(f"csr{X.dtype.str}{X.shape}".encode())
        for part in (X.indptr, X.indices, X.data):
            h.update(np.ascontiguousarray(part).tobytes())
    else:
        A = np.ascontiguousarray(np.asarray(X))
        h.update(f"dense{A.dtype.str}{A.shape}".encode())
        h.update(A.tobytes())
    return h.hexdigest()


def _versions() -> dict:
    import scipy
    import sklearn

    import fedsonmf

    return {"fedsonmf": fedsonmf.__version__, "python": platform.python_version(), "numpy": np.__version__,
            "scipy": scipy.__version__, "scikit-learn": sklearn.__version__}


def meta(*, inputs=(), seeds=None, call: str | None = None) -> dict:
    """The ``meta`` block of a results JSON.

    Parameters
    ----------
    inputs : iterable of path, array, (name, path-or-array) or {"name", "sha256"}
        Each input file (hashed from its bytes) or in-memory view (hashed from its values),
        or an entry hashed before.
    seeds : int, list of int or None
        The seeds of the run(s).
    call : str, optional
        How the result was produced; default the command line (``sys.argv``).

    Returns
    -------
    dict with ``versions``, ``command``, ``cwd``, ``time_utc``, ``seeds``, ``inputs``
    (a list of ``{"name", "sha256"}``).
    """
    hashed = []
    for i, item in enumerate(inputs):
        if isinstance(item, dict) and "sha256" in item:  # hashed before (e.g. at fit time)
            hashed.append(dict(item))
            continue
        name, obj = item if isinstance(item, tuple) and len(item) == 2 else (None, item)
        if isinstance(obj, (str, os.PathLike)):
            hashed.append({"name": str(name or obj), "sha256": sha256_file(obj)})
        else:
            hashed.append({"name": str(name if name is not None else f"view {i}"), "sha256": sha256_array(obj)})
    if seeds is not None and not isinstance(seeds, (list, tuple)):
        seeds = [seeds]
    return {
        "versions": _versions(),
        "command": call if call is not None else _COMMAND or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "cwd": os.getcwd(),
        "time_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "seeds": None if seeds is None else [int(s) for s in seeds],
        "inputs": hashed,
    }
