"""The view files of a Flower deployment: written for a demo, checked before anything starts.

One file per client, samples x features, in any view format of :mod:`fedsonmf.datasets.files`
(the demo writes ``.npy``, or a sparse ``.npz``): row i of every file is sample i, or, when the
files carry sample ids, the i-th smallest id (each node sorts its rows; every file must hold the
same ids, checked here and again at the handshake); optional availability masks beside them
(``view<p>.mask.npy``, docs/algorithm.md §15.1).  :func:`check_inputs` is the one check
every launch runs (:func:`~.launcher.run_flower`, :func:`~.launcher.predict_flower`, the
CLI) before it starts a process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedsonmf._io import new_private_dir, save_npy_atomic, write_atomic
from fedsonmf.core.masks import held_columns
from fedsonmf.exceptions import InputError

__all__ = ["write_views", "write_masks", "check_inputs"]

#: what an id mismatch between view files suggests (no ``--missing`` on a deployment: docs/flower.md)
_DIFFERENT_SAMPLES = ("in any row order; for views that hold different samples, let --missing mask (`fedsonmf "
                      "flower cluster` or `flower run`) align the files over the union of their ids on this "
                      "machine (between machines: `fedsonmf flower align`), or give each node its availability "
                      "mask (--mask)")


def write_masks(masks, directory) -> list[Path | None]:
    """Save availability masks beside the views, as ``view<p>.mask.npy``.

    Parameters
    ----------
    masks : list of (array-like of bool of shape (n_samples,) or None)
        One per view; None = a complete view (no file).
    directory : path
        The folder (created).

    Returns
    -------
    list of (Path or None)
        The mask files, None for complete views (the ``mask_paths`` of :func:`run_flower`).
    """
    directory = new_private_dir(directory)
    out: list[Path | None] = []
    for p, mk in enumerate(masks):
        if mk is None:
            out.append(None)
            continue
        path = directory / f"view{p}.mask.npy"
        save_npy_atomic(path, np.asarray(mk))  # 0600: which samples an organisation holds is its own
        out.append(path)
    return out


def write_views(views, directory) -> list[Path]:
    """Save views as one file per view: ``view<p>.npy`` (dense, float64) or ``view<p>.npz`` (sparse).

    Parameters
    ----------
    views : list of {array-like, sparse matrix} of shape (n_samples, d_p)
        The views, rows = samples.
    directory : path
        The folder (created).

    Returns
    -------
    list of Path
        The files, in view order (the ``view_paths`` of :func:`run_flower`).
    """
    import scipy.sparse as sp

    directory = new_private_dir(directory)  # created 0700, files 0600: these are the raw views
    paths = []
    for p, X in enumerate(views):
        if sp.issparse(X):
            path = directory / f"view{p}.npz"
            write_atomic(path, lambda fh, X=X: sp.save_npz(fh, sp.csr_matrix(X)))
        else:
            path = directory / f"view{p}.npy"
            save_npy_atomic(path, np.asarray(X, dtype=np.float64))
        paths.append(path)
    return paths


def _view_file_shape(path) -> tuple[int, int]:
    """(n_samples, n_features) of a view file, read from its header (no data loaded for .npy)."""
    return _view_file_facts(path)[0]


def _view_file_facts(path) -> tuple[tuple[int, int], np.ndarray | None]:
    """:func:`_view_file_shape` and the file's sample ids (None: it carries none)."""
    from fedsonmf.datasets.files import read_view

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"view file {path} does not exist")
    try:
        X, ids = read_view(path, mmap_mode="r", validate=False)  # .npy: the header only (memory-mapped)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"view file {path} cannot be read: {type(exc).__name__}: {exc}") from None
    if len(X.shape) != 2:
        raise InputError(f"view file {path} holds an array of shape {X.shape}, expected (n_samples, n_features)")
    return (int(X.shape[0]), int(X.shape[1])), ids


def check_inputs(view_paths, n_components: int | None = None, *, n_clusters: int | None = None,
                 mask_paths=None, predict_paths=None) -> list[tuple[int, int]]:
    """Check the view files before any process starts; their ``(n_samples, d_p)`` shapes.

    Parameters
    ----------
    view_paths : list of path
        One view file per client.
    n_components : int or None, default=None
        The rank r, checked against every view's width (None: not checked; a clustering
        run's rank rule pads or caps instead).
    n_clusters : int or None, default=None
        c, checked against the number of samples.
    mask_paths, predict_paths : list of (path or None) or None, default=None
        Mask files (each an availability mask of its view's samples) and files of new samples,
        which must exist.

    Returns
    -------
    list of tuple of int
        ``(n_samples, d_p)`` of every view file (read from the headers: no data is loaded
        for ``.npy``).

    Raises
    ------
    InputError
        Naming the file: a missing or unreadable file, an array that is not 2-D, views with
        different n, a rank above a view's width, more clusters than samples or a mask that
        does not fit its view.
    """
    if not view_paths:
        raise InputError("no view files given: one file per client (view)")
    for kind, paths in (("view", view_paths), ("mask", mask_paths or []), ("new-sample", predict_paths or [])):
        for path in paths:
            if path is not None and not Path(path).is_file():
                raise InputError(f"{kind} file {path} does not exist")
    try:
        facts = [_view_file_facts(p) for p in view_paths]
    except FileNotFoundError as exc:
        raise InputError(str(exc)) from None
    shapes = [f[0] for f in facts]
    if n_components is not None:
        _check_view_files(view_paths, n_components, shapes)
    ns = {s[0] for s in shapes}
    if len(ns) > 1:
        raise InputError(f"the view files hold different numbers of samples (rows): {[s[0] for s in shapes]}")
    # each node sorts its rows by its file's ids (docs/flower.md, "Sample ids"): they must line up
    from fedsonmf.datasets.files import check_same_ids

    check_same_ids(view_paths, [f[1] for f in facts], _DIFFERENT_SAMPLES)
    if n_clusters is not None and not 1 <= int(n_clusters) <= min(ns):
        raise InputError(f"n_clusters={n_clusters} must be between 1 and the number of samples ({min(ns)})")
    for p, path in enumerate(mask_paths or []):  # a mask is a small vector: checked now, not at the handshake
        if path is not None:
            from fedsonmf.datasets.files import _precheck_npy

            try:
                _precheck_npy(Path(path), None)  # a header declaring more than the file holds: refused unread
                mask = np.load(path, allow_pickle=False)
            except InputError as exc:
                raise InputError(f"mask file of view {p}: {exc}") from None
            except (OSError, ValueError) as exc:
                raise InputError(f"mask file {path} of view {p} is not a .npy array: {exc}") from None
            held_columns(mask, shapes[p][0], client=p)
    return shapes


def _check_view_files(view_paths, n_components: int, shapes=None) -> None:
    shapes = [_view_file_shape(p) for p in view_paths] if shapes is None else shapes
    ns = [s[0] for s in shapes]
    if len(set(ns)) > 1:
        raise InputError(f"the view files hold different numbers of samples (rows): {ns}")
    for p, (path, (_, d)) in enumerate(zip(view_paths, shapes)):
        if d < n_components:
            raise InputError(
                f"n_components={n_components} is larger than view {p}'s number of features ({d}, file {path}); "
                "a nonnegative orthonormal basis needs n_features >= n_components"
            )
