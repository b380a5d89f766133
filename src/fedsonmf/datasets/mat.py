"""Load multi-view clustering datasets stored as MATLAB ``.mat`` files.

Public multi-view datasets come in many layouts: views in a cell array (``X``, ``fea``,
``data``...) or in numbered variables (``V1``, ``V2``...), stored samples x features or
features x samples, dense or sparse, with labels under one of several names (``y``, ``Y``,
``gt``, ``truelabel``...). :func:`load_mat` finds the views and the labels, puts the sample
axis first and returns a :class:`MultiViewDataset`. MAT v4/v5/v7 files are read with
:func:`scipy.io.loadmat`, MAT v7.3 (HDF5) files with :mod:`h5py` (optional dependency).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.io
import scipy.sparse as sp

from fedsonmf.exceptions import InputError, ParameterError

__all__ = ["MultiViewDataset", "load_mat", "default_data_dir", "find_datasets"]

# Candidate names, in order of preference (matched case-sensitively first, then ignoring case).
LABEL_KEYS = ("y", "Y", "gt", "truelabel", "truelabels", "label", "labels", "gnd", "Label")
VIEW_KEYS = ("X", "fea", "data", "views", "x", "Xs")
MASK_KEYS = ("ind", "mask")
_NUMBERED = re.compile(r"^(?P<prefix>[A-Za-z]+)_?(?P<num>\d+)$")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


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
    ``X1, X2...``). Labels are read from ``labels_key`` or the first of ``y, Y, gt,
    truelabel, truelabels, label, labels, gnd, Label``; a vector or a cell array of identical
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
        How missing views are found (incomplete views, ALGORITHM.md §15.1) [C]:

        * ``"auto"`` (default): the file's availability variable (``ind``/``mask``) when it
          has one; otherwise every sample is present, and an all-zero row is a sample with
          no features (kept as data).
        * ``"mask"``: the file's availability variable when it has one; otherwise an all-zero
          row of a view marks the sample as missing from that view.
        * ``"zeros"``: no mask (``mask=None``) even if the file has one: missing views stay
          all-zero rows and are fitted as data (zero-filling, the behaviour before §15).

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
        names, raw_views = _find_views(variables, views_key, n, seen, exclude={labels_name})
        views = [_orient(v, n, name) for name, v in zip(names, raw_views, strict=True)]
        classes, labels = np.unique(labels, return_inverse=True)
        mask = None if missing == "zeros" else _find_mask(variables, n, len(views))
        if mask is None and missing == "mask":
            mask = np.column_stack([_nonzero_rows(v) for v in views])
            if mask.all():
                mask = None
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


def _check_file(path) -> Path:
    try:
        path = Path(path)
    except TypeError:
        raise ParameterError(f"path must be a str or path-like, got {path!r}") from None
    if not path.exists():
        raise InputError(f"{path}: file does not exist")
    if not path.is_file():
        raise InputError(f"{path}: not a regular file")
    return path


def _read_variables(path: Path) -> dict:
    """Read the file's variables; every read failure becomes an InputError naming the file."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2056)
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    if size == 0:
        raise InputError(f"{path}: the file is empty (0 bytes)")
    if _is_hdf5_head(head):
        try:
            variables = _read_hdf5_mat(path)
        except ImportError:
            raise
        except Exception as exc:  # h5py raises OSError/KeyError/ValueError... on damaged files
            raise InputError(
                f"{path}: corrupt or truncated MAT v7.3 (HDF5) file ({type(exc).__name__}: {exc})"
            ) from None
        if not variables:
            raise InputError(f"{path}: the MAT v7.3 (HDF5) file holds no numeric variable or cell array")
        return variables
    is_v5 = head[:6] == b"MATLAB"
    if is_v5 and size <= 128:
        raise InputError(
            f"{path}: the file holds only the {size}-byte MAT header and no variables (truncated?)"
        )
    if is_v5:
        _verify_mat5_elements(path, size)  # before scipy: its reader can crash on damaged data
    try:
        variables, n_raw = _read_mat5(path)
    except Exception as exc:  # scipy raises ValueError, IndexError, OSError, zlib.error, TypeError, ...
        what = "corrupt or truncated MAT file" if is_v5 else "not a MAT file (no MATLAB header) or a corrupt one"
        raise InputError(f"{path}: {what} ({type(exc).__name__}: {exc})") from None
    if n_raw == 0:
        raise InputError(
            f"{path}: no variables could be read ({'header only or truncated' if is_v5 else 'not a MAT file?'})"
        )
    return variables


# ----------------------------------------------------------------------------- readers


def _verify_mat5_elements(path: Path, size: int) -> None:
    """Walk the top-level data elements of a MAT v5/v7 file and check them.

    Every element must fit in the file; every compressed element (MAT v7) must
    decompress completely with a valid zlib checksum and hold one matrix element.
    scipy's reader does not check the checksum and can read damaged compressed
    data into an invalid sparse matrix (a segmentation fault was observed on a
    flipped bit); a damaged file is refused here first.
    """
    import mmap
    import struct
    import zlib

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        endian = {b"IM": "<", b"MI": ">"}.get(bytes(data[126:128]))
        if endian is None:
            return  # not a v5 header: let scipy report what it is
        pos, k = 128, 0
        while pos < size:
            k += 1
            if pos + 8 > size:
                raise InputError(f"{path}: truncated MAT file: element {k} has an incomplete tag at byte {pos}")
            mtype, nbytes = struct.unpack(endian + "II", data[pos:pos + 8])
            if mtype >> 16:  # a small data element (type and size in 4 bytes)
                pos += 8
                continue
            end = pos + 8 + nbytes
            if mtype not in (14, 15):
                raise InputError(f"{path}: corrupt MAT file: element {k} at byte {pos} has type {mtype} "
                                 "(expected a matrix or a compressed matrix)")
            if end > size:
                raise InputError(f"{path}: truncated MAT file: element {k} needs {end} bytes, the file has {size}")
            if mtype == 15:
                dec = zlib.decompressobj()
                try:
                    head = dec.decompress(data[pos + 8:end], 8)
                    inner_type, inner_n = struct.unpack(endian + "II", head) if len(head) == 8 else (0, 0)
                    total = len(head)
                    while not dec.eof:
                        chunk = dec.decompress(dec.unconsumed_tail, 1 << 24)
                        if not chunk and not dec.unconsumed_tail:
                            break
                        total += len(chunk)
                    total += len(dec.flush())
                except zlib.error as exc:
                    raise InputError(f"{path}: corrupt MAT file: compressed element {k} at byte {pos} is damaged "
                                     f"(zlib: {exc})") from None
                if not dec.eof or inner_type != 14 or total < 8 + inner_n:
                    raise InputError(f"{path}: corrupt or truncated MAT file: compressed element {k} at byte {pos} "
                                     "does not hold a complete matrix")
                pos = end
            else:
                pos = end + (-nbytes % 8)


def _is_hdf5(path: Path) -> bool:
    """True if an HDF5 superblock sits at offset 0, 512, 1024 or 2048 (MAT v7.3 uses 512)."""
    with open(path, "rb") as fh:
        head = fh.read(2056)
    return _is_hdf5_head(head)


def _is_hdf5_head(head: bytes) -> bool:
    return any(head[o : o + 8] == _HDF5_MAGIC for o in (0, 512, 1024, 2048))


def _is_numeric(x) -> bool:
    return sp.issparse(x) or (
        isinstance(x, np.ndarray) and (np.issubdtype(x.dtype, np.number) or x.dtype == bool)
    )


def _is_cell(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == object


def _read_mat5(path: Path) -> tuple[dict, int]:
    """Numeric arrays, sparse matrices and cell arrays of a MAT v4/v5/v7 file, and the
    number of variables read (of any kind)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on some damaged headers, then raises or reads nothing
        raw = scipy.io.loadmat(path, squeeze_me=False, struct_as_record=True)
    names = [k for k in raw if not k.startswith("__")]
    return {k: raw[k] for k in names if _is_numeric(raw[k]) or _is_cell(raw[k])}, len(names)


def _read_hdf5_mat(path: Path) -> dict:
    """Numeric arrays, sparse matrices and cell arrays of a MAT v7.3 (HDF5) file.

    MATLAB writes arrays column-major, so an HDF5 dataset of shape (d, n) is the MATLAB
    n x d array: every array is transposed back here.
    """
    try:
        import h5py
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"{path} is a MAT v7.3 (HDF5) file; reading it needs h5py "
            "(pip install h5py, or pip install fedsonmf[mat73])"
        ) from exc

    def attr(obj, key):
        val = obj.attrs.get(key)
        return val.decode() if isinstance(val, bytes) else val

    def convert(obj):
        cls = attr(obj, "MATLAB_class")
        if isinstance(obj, h5py.Group):
            if "MATLAB_sparse" not in obj.attrs:
                return None  # struct or object: not supported
            n_rows = int(obj.attrs["MATLAB_sparse"])
            jc = np.asarray(obj["jc"], dtype=np.int64).ravel()
            if "data" in obj:  # absent when the matrix has no nonzeros
                data, ir = np.asarray(obj["data"]).ravel(), np.asarray(obj["ir"]).ravel()
            else:
                data, ir = np.zeros(0), np.zeros(0)
            ir = ir.astype(np.int64)
            return sp.csc_array((data, ir, jc), shape=(n_rows, jc.size - 1))
        if cls == "cell":
            refs = np.asarray(obj)
            out = np.empty(refs.shape, dtype=object)
            for idx, ref in np.ndenumerate(refs):
                out[idx] = convert(obj.file[ref])
            return out.T
        if cls == "char" or "MATLAB_empty" in obj.attrs or obj.dtype.names is not None:
            return None  # text, empty or complex
        return np.asarray(obj).T

    with h5py.File(path, "r") as fh:
        items = {k: convert(fh[k]) for k in fh if not k.startswith("#")}
    return {k: v for k, v in items.items() if v is not None}


# ----------------------------------------------------------------------------- finders


def _describe(v) -> str:
    if _is_cell(v):
        return f"(cell {'x'.join(map(str, v.shape))})"
    kind = "sparse" if sp.issparse(v) else str(v.dtype)
    return f"({'x'.join(map(str, v.shape))} {kind})"


def _lookup(variables: dict, candidates: Sequence[str]) -> str | None:
    """First candidate present in ``variables``: exact match first, then ignoring case."""
    for key in candidates:
        if key in variables:
            return key
    lower = {k.lower(): k for k in variables}
    for key in candidates:
        if key.lower() in lower:
            return lower[key.lower()]
    return None


def _as_label_vector(v) -> np.ndarray | None:
    """A dense numeric vector (any 1 x n / n x 1 shape), or None."""
    if sp.issparse(v):
        v = v.toarray()
    if not isinstance(v, np.ndarray) or not _is_numeric(v) or v.size == 0:
        return None
    if sum(s > 1 for s in v.shape) > 1:
        return None
    return v.ravel()


def _find_labels(variables: dict, labels_key: str | None, seen: str) -> tuple[str, np.ndarray]:
    if labels_key is not None:
        if labels_key not in variables:
            raise InputError(f"labels_key {labels_key!r} is not in the file; variables: {seen}")
        key = labels_key
    else:
        key = _lookup(variables, LABEL_KEYS)
        if key is None:
            raise InputError(
                f"no label variable found (looked for {', '.join(LABEL_KEYS)}); variables: {seen}"
            )
    value = variables[key]
    parts = list(value.ravel(order="F")) if _is_cell(value) else [value]
    vectors = [_as_label_vector(p) for p in parts]
    if not vectors or any(v is None for v in vectors):
        raise InputError(
            f"label variable {key!r} is not a vector or a cell of vectors; variables: {seen}"
        )
    labels = vectors[0]
    if any(v.shape != labels.shape or not np.array_equal(v, labels) for v in vectors[1:]):
        raise InputError(f"label cell {key!r} holds label vectors that differ")
    if np.issubdtype(labels.dtype, np.floating) and not np.all(labels == np.round(labels)):
        raise InputError(f"label variable {key!r} has non-integer values")
    return key, labels


def _has_sample_axis(v, n: int) -> bool:
    return _is_numeric(v) and v.ndim == 2 and n in v.shape


def _find_views(variables: dict, views_key, n: int, seen: str, exclude: set) -> tuple[list, list]:
    if views_key is not None:
        keys = [views_key] if isinstance(views_key, str) else list(views_key)
        missing = [k for k in keys if k not in variables]
        if missing:
            raise InputError(f"views_key {missing} not in the file; variables: {seen}")
        if len(keys) == 1 and _is_cell(variables[keys[0]]):
            return _cell_views(keys[0], variables[keys[0]])
        return keys, [variables[k] for k in keys]

    cells = [k for k, v in variables.items() if _is_cell(v) and k not in exclude]
    preferred = _lookup({k: None for k in cells}, VIEW_KEYS)
    for key in ([preferred] if preferred else []) + cells:
        elements = variables[key].ravel(order="F")
        if elements.size and all(_has_sample_axis(e, n) for e in elements):
            return _cell_views(key, variables[key])
    if preferred:  # the views' cell, with a matrix that does not fit the labels: never dropped silently
        elements = variables[preferred].ravel(order="F")
        if any(_has_sample_axis(e, n) for e in elements):
            names, _ = _cell_views(preferred, variables[preferred])
            _refuse_misfits(names, list(elements), n)

    groups: dict[str, list[tuple[int, str]]] = {}
    for key, v in variables.items():
        match = _NUMBERED.match(key)
        if match and key not in exclude and _is_numeric(v) and v.ndim == 2:
            groups.setdefault(match["prefix"], []).append((int(match["num"]), key))
    fitting = {prefix: sum(_has_sample_axis(variables[k], n) for _, k in members)
               for prefix, members in groups.items()}
    if groups and max(fitting.values()) > 0:
        prefix = max(groups, key=lambda g: (fitting[g], len(groups[g])))
        keys = [k for _, k in sorted(groups[prefix])]
        _refuse_misfits(keys, [variables[k] for k in keys], n)
        return keys, [variables[k] for k in keys]
    raise InputError(
        f"no views found: expected a cell array of matrices (e.g. {', '.join(VIEW_KEYS)}) or "
        f"numbered variables (V1, V2, ...) with an axis of length n_samples={n}; variables: {seen}"
    )


def _refuse_misfits(names: list, values: list, n: int) -> None:
    """An InputError naming the views none of whose axes has the labels' length n (issue 20: such a
    view used to be left out of the dataset without a word)."""
    bad = [f"{name!r} {_describe(v)}" for name, v in zip(names, values) if not _has_sample_axis(v, n)]
    if bad:
        raise InputError(
            f"view {', '.join(bad)} has no axis of length n_samples={n} (the length of the labels), unlike the "
            f"other views ({', '.join(repr(k) for k, v in zip(names, values) if _has_sample_axis(v, n))}); every "
            "view needs one row per labelled sample -- fix the file, or pick the views with views_key"
        )


def _cell_views(key: str, cell: np.ndarray) -> tuple[list, list]:
    elements = list(cell.ravel(order="F"))
    return [f"{key}{{{i + 1}}}" for i in range(len(elements))], elements


def _orient(v, n: int, name: str):
    """Return view ``v`` as (n_samples, d) float64, dense C-contiguous or CSR."""
    if not _is_numeric(v) or v.ndim != 2:
        raise InputError(f"view {name!r} is not a numeric matrix")
    if np.iscomplexobj(v.data if sp.issparse(v) else v):
        raise InputError(f"view {name!r} holds complex numbers; views must be real")
    if v.shape[0] != n:
        if v.shape[1] != n:
            raise InputError(f"view {name!r} has shape {v.shape}; no axis has n_samples={n}")
        v = v.T
    if sp.issparse(v):
        out = sp.csr_array(v, dtype=np.float64)
        out.sort_indices()
        return out
    return np.ascontiguousarray(v, dtype=np.float64)


def _nonzero_rows(v) -> np.ndarray:
    """True for the rows (samples) of ``v`` with at least one nonzero entry."""
    if sp.issparse(v):
        return np.diff(sp.csr_array(v).indptr) > 0  # stored zeros are eliminated by the loader's tocsr()
    return np.asarray(v != 0).any(axis=1)


def _find_mask(variables: dict, n: int, n_views: int) -> np.ndarray | None:
    key = _lookup(variables, MASK_KEYS)
    if key is None:
        return None
    m = variables[key]
    m = m.toarray() if sp.issparse(m) else m
    if not _is_numeric(m) or m.ndim != 2 or n_views not in m.shape or n not in m.shape:
        return None
    m = m if m.shape == (n, n_views) else m.T
    if not np.isin(m, (0, 1)).all():
        return None
    return m.astype(bool)
