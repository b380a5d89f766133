"""Load multi-view clustering datasets stored as MATLAB ``.mat`` files.

Public multi-view datasets come in many layouts: views in a cell array (``X``, ``fea``,
``data``...) or in numbered variables (``V1``, ``V2``...), stored samples x features or
features x samples, dense or sparse, with labels under one of several names (``y``, ``Y``,
``gt``, ``truelabel``...). :func:`load_mat` finds the views and the labels, puts the sample
axis first and returns a :class:`MultiViewDataset`. MAT v4/v5/v7 files are read with
:func:`scipy.io.loadmat`, MAT v7.3 (HDF5) files with :mod:`h5py` (optional dependency).

One job per file: :mod:`._mat_read` reads the variables (and checks the file's
integrity first), :mod:`._mat_layout` finds the views, labels and mask among them;
this module is the public entry, which validates its arguments once (:mod:`.files`
reads ``.mat`` view files with the same reader).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedsonmf.datasets._mat_layout import (
    LABEL_KEYS,
    MASK_KEYS,
    VIEW_KEYS,
    _describe,
    _expand_triplets,
    _fill_missing_rows,
    _find_labels,
    _find_mask,
    _find_views,
    _nonzero_rows,
    _orient,
)
from fedsonmf.datasets._mat_read import _check_file, _read_variables
from fedsonmf.exceptions import InputError, ParameterError

__all__ = ["MultiViewDataset", "load_mat", "default_data_dir", "find_datasets", "LABEL_KEYS", "VIEW_KEYS", "MASK_KEYS"]

@dataclass(frozen=True)
class MultiViewDataset:
    """A multi-view dataset whose views share the sample axis (axis 0).

    Attributes
    ----------
    views : list of {ndarray, scipy.sparse.csr_array}
        ``views[p]`` has shape (n_samples, d_p) and dtype float64.
    labels : ndarray of shape (n_samples,) or None
        Integer class labels, relabelled to ``0..n_classes-1``.
    view_names : list of str
        One name per view, e.g. ``"X{1}"`` (MATLAB cell element) or ``"V1"`` (variable).
    name : str
        Short dataset name (the file stem for loaded files).
    source : str
        Path of the file the dataset was read from ("" if not from a file).
    mask : ndarray of bool of shape (n_samples, n_views) or None
        View-availability mask of an incomplete dataset (``mask[i, p]`` is False when sample
        ``i`` is missing from view ``p``), or None when every sample has every view.
    ids : ndarray of shape (n_samples,) or None
        Sample ids of the rows (int64 or str), when the files carry them
        (:func:`fedsonmf.datasets.load_views`); None otherwise (the ids are then ``0..n-1``).
    paths : tuple of str
        The file(s) read: one ``.mat`` file, or one file per view.
    view_info : tuple of dict
        One dict per view: the file, its format, the shape and dtype as read, where the ids came from.
    classes : ndarray or None
        The original label values: ``labels == k`` is class ``classes[k]``.
    """

    views: list
    labels: np.ndarray | None
    view_names: list[str]
    name: str
    source: str = ""
    mask: np.ndarray | None = None
    ids: np.ndarray | None = None
    paths: tuple = ()
    view_info: tuple = ()
    classes: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        """Number of samples (rows of every view)."""
        return self.views[0].shape[0]

    @property
    def n_views(self) -> int:
        """Number of views."""
        return len(self.views)

    @property
    def n_features(self) -> list[int]:
        """Number of features ``d_p`` of each view."""
        return [v.shape[1] for v in self.views]

    @property
    def masks(self) -> list | None:
        """The availability mask as the per-view list ``fit(Xs, masks=...)`` takes, or None."""
        return None if self.mask is None else [self.mask[:, p].copy() for p in range(self.n_views)]

    @property
    def n_classes(self) -> int | None:
        """Number of classes, or None when there are no labels."""
        return None if self.labels is None else int(self.labels.max()) + 1

    def __repr__(self) -> str:
        """One line: name, samples, each view's name, shape and storage, classes, availability."""
        views = ", ".join(f"{name} {_view_summary(X)}" for name, X in zip(self.view_names, self.views))
        classes = "no labels" if self.labels is None else f"{self.n_classes} classes"
        held = "complete" if self.mask is None else (
            "incomplete, held per view " + "/".join(str(int(k)) for k in self.mask.sum(axis=0)))
        return (f"MultiViewDataset({self.name!r}: {self.n_samples} samples, {self.n_views} views [{views}], "
                f"{classes}, {held})")


def _view_summary(X) -> str:
    """``169x3560 sparse 4.1% nonzero`` or ``210x24 dense`` (no pass over a dense view's entries)."""
    shape = "x".join(str(k) for k in X.shape)
    if sp.issparse(X):
        size = X.shape[0] * X.shape[1]
        return f"{shape} sparse {100 * X.nnz / size:.2g}% nonzero" if size else f"{shape} sparse"
    return f"{shape} dense"


def default_data_dir() -> Path | None:
    """Return the folder holding the shared ``.mat`` datasets, or None.

    Looks, in order, at the environment variable ``FEDSONMF_DATA`` (returned as given, even if
    it does not exist), ``../shared/data`` relative to the current directory, and
    ``shared/data`` next to the repository root of this source tree.

    Returns
    -------
    path : pathlib.Path or None
    """
    env = os.environ.get("FEDSONMF_DATA")
    if env:
        return Path(env).expanduser()
    repo_root = Path(__file__).resolve().parents[3]
    for cand in (Path.cwd() / ".." / "shared" / "data", repo_root.parent / "shared" / "data"):
        if cand.is_dir():
            return cand.resolve()
    return None


def find_datasets(root: str | os.PathLike) -> Iterator[Path]:
    """Yield every ``.mat`` file under ``root`` (recursively), in sorted order.

    Parameters
    ----------
    root : str or path-like
        Folder to search.

    Yields
    ------
    path : pathlib.Path
    """
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(f"not a directory: {root}")
    yield from sorted(p for p in root.rglob("*") if p.suffix.lower() == ".mat" and p.is_file())


def load_mat(
    path: str | os.PathLike,
    *,
    views_key: str | Sequence[str] | None = None,
    labels_key: str | None = None,
    missing: str = "auto",
) -> MultiViewDataset:
    """Read a multi-view dataset from a MATLAB ``.mat`` file.

    Views are found as, in order: the cell array ``views_key`` (or the variables named in
    ``views_key`` if it is a list); a cell array named one of ``X, fea, data, views, x, Xs``;
    any other cell array of matrices; numbered variables with a common prefix (``V1, V2...``,
    ``X1, X2...``); else one plain matrix named one of those (``fea`` with ``gnd``, ``X`` with
    ``y``), read as a dataset of one view. A view stored as ``[i, j, value]`` triplets (k x 3,
    MATLAB's ``spconvert`` input, one index column reaching n_samples) is read as the sparse
    matrix it describes. Labels are read from ``labels_key`` or the first of
    :data:`LABEL_KEYS` present (``y, Y, gt, truelabel, truelabels, label, labels, gnd, Label,
    truth, ground_truth, ...``; exact names first, then ignoring case); a vector or a cell array of identical
    vectors. A 0/1 matrix ``ind`` or ``mask`` of shape (n_samples, n_views) is returned as the
    availability mask of an incomplete dataset.

    Each view is oriented so that its axis with the length of the label vector comes first.
    A square view (n_samples x n_samples) is assumed to be stored samples x features already.

    Parameters
    ----------
    path : str or path-like
        MAT file (v4, v5, v7 or v7.3/HDF5; v7.3 needs ``h5py``).
    views_key : str or sequence of str, optional
        Name of the cell array holding the views, or the names of one variable per view.
    labels_key : str, optional
        Name of the label variable.
    missing : {"auto", "mask", "zeros"}
        How missing views are found (incomplete views, docs/algorithm.md §15.1) [C]:

        * ``"auto"`` (default): the file's availability variable (``ind``/``mask``) when it
          has one; otherwise every sample is present, and an all-zero row is a sample with
          no features (kept as data).
        * ``"mask"``: the file's availability variable when it has one; otherwise an all-zero
          row of a view marks the sample as missing from that view.
        * ``"zeros"``: no mask (``mask=None``) even if the file has one: missing views stay
          all-zero rows and are fitted as data (zero-filling, the behaviour before §15).

        A row of a view that is NaN in every entry (how several public incomplete datasets
        mark a sample the view does not hold) is a missing sample under every rule: it is
        returned as zeros, and under ``"auto"`` and ``"mask"`` it is False in the mask (also
        when the file's own mask says otherwise). A row with some NaN entries but not all,
        or any infinite entry, raises an InputError naming the view.

        Pass ``[dataset.mask[:, p] for p in ...]`` as the ``masks`` of a fit.

    Returns
    -------
    dataset : MultiViewDataset
        Views of shape (n_samples, d_p), dense float64 ndarrays or float64
        ``scipy.sparse.csr_array``; labels of shape (n_samples,), int64, in ``0..c-1``.

    Raises
    ------
    InputError
        (a ValueError) naming the file: if it does not exist, is empty, not a MAT file,
        truncated or corrupt (header only, damaged compression, bit flips in the structure,
        damaged HDF5), or if the views or the labels cannot be found or do not fit together
        (the message lists the variables in the file).
    ParameterError
        If ``views_key`` or ``labels_key`` has the wrong type.
    ImportError
        If the file is MAT v7.3 and ``h5py`` is not installed.
    """
    path = _check_file(path)
    if views_key is not None and not (
        isinstance(views_key, str)
        or (isinstance(views_key, Sequence) and views_key and all(isinstance(k, str) for k in views_key))
    ):
        raise ParameterError(f"views_key must be None, a str or a non-empty list of str, got {views_key!r}")
    if labels_key is not None and not isinstance(labels_key, str):
        raise ParameterError(f"labels_key must be None or a str, got {labels_key!r}")
    variables = _read_variables(path)
    seen = ", ".join(f"{k} {_describe(v)}" for k, v in variables.items()) or "none"
    if missing not in ("auto", "mask", "zeros"):
        raise ParameterError(f"missing must be 'auto', 'mask' or 'zeros', got {missing!r}")
    try:
        labels_name, labels = _find_labels(variables, labels_key, seen)
        n = labels.shape[0]
        variables = _expand_triplets(variables, n)
        names, raw_views = _find_views(variables, views_key, n, seen, exclude={labels_name})
        filled = [_fill_missing_rows(_orient(v, n, name), name) for name, v in zip(names, raw_views, strict=True)]
        views = [v for v, _ in filled]
        nan_rows = np.column_stack([rows for _, rows in filled])  # all-NaN rows: missing samples
        classes, labels = np.unique(labels, return_inverse=True)
        mask = None if missing == "zeros" else _find_mask(variables, n, len(views))
        if mask is None and missing == "mask":
            mask = np.column_stack([_nonzero_rows(v) for v in views])  # the NaN rows are zero rows now
            if mask.all():
                mask = None
        if mask is None and missing != "zeros" and nan_rows.any():
            mask = ~nan_rows
        elif mask is not None:
            mask = mask & ~nan_rows
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:  # damaged content
        raise InputError(f"{path}: unusable content ({type(exc).__name__}: {exc}); variables: {seen}") from None
    return MultiViewDataset(
        views=views,
        labels=labels.astype(np.int64).ravel(),
        view_names=names,
        name=path.stem,
        source=str(path),
        mask=mask,
        paths=(str(path),),
        view_info=tuple({"path": str(path), "format": "mat", "key": name, "n_rows": v.shape[0],
                         "n_features": v.shape[1], "sparse": sp.issparse(v), "dtype": str(v.dtype), "ids": None}
                        for name, v in zip(names, views)),
        classes=classes,
    )


