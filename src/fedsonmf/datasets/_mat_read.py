"""Reading a ``.mat`` file's variables, with the integrity checks that come first.

MAT v4/v5/v7 files are read with :func:`scipy.io.loadmat` after their data elements
have been walked and checked (every element inside the file, every compressed element
decompressing completely: scipy's reader does not check the zlib checksum and can
crash on a damaged file); MAT v7.3 (HDF5) files are read with :mod:`h5py`
(optional).  Every read failure becomes one :class:`~fedsonmf.exceptions.InputError`
naming the file.  Where the views and labels are inside the variables is
:mod:`._mat_layout`'s job; :func:`fedsonmf.datasets.load_mat` puts the two together.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.io
import scipy.sparse as sp

from fedsonmf._validation import compressed_index_problem, sparse_structure_problem
from fedsonmf.datasets import _limits
from fedsonmf.exceptions import InputError, ParameterError

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def _check_file(path) -> Path:
    try:
        path = Path(path)
    except TypeError:
        raise ParameterError(f"path must be a str or path-like, got {path!r}") from None
    if not path.exists():
        raise InputError(f"{path}: file does not exist")
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a regular file: pass the file(s) inside it")
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
        except (ImportError, InputError):
            raise
        except Exception as exc:  # h5py raises OSError/KeyError/ValueError... on damaged files
            raise InputError(
                f"{path}: corrupt or truncated MAT v7.3 (HDF5) file ({type(exc).__name__}: {exc})"
            ) from None
        if not variables:
            raise InputError(f"{path}: the MAT v7.3 (HDF5) file holds no numeric variable or cell array")
        _check_sparse_variables(path, variables)
        return variables
    is_v5 = head[:6] == b"MATLAB"
    if is_v5 and size <= 128:
        raise InputError(
            f"{path}: the file holds only the {size}-byte MAT header and no variables (truncated?)"
        )
    if is_v5:
        _verify_mat5_elements(path, size)  # before scipy: its reader can crash on damaged data
    else:
        _verify_mat4_matrices(path, size)
    try:
        variables, n_raw = _read_mat5(path)
    except Exception as exc:  # scipy raises ValueError, IndexError, OSError, zlib.error, TypeError, ...
        what = "corrupt or truncated MAT file" if is_v5 else "not a MAT file (no MATLAB header) or a corrupt one"
        raise InputError(f"{path}: {what} ({type(exc).__name__}: {exc})") from None
    if n_raw == 0:
        raise InputError(
            f"{path}: no variables could be read ({'header only or truncated' if is_v5 else 'not a MAT file?'})"
        )
    _check_sparse_variables(path, variables)
    return variables


def check_sparse_file(path: Path, X, what: str = "a sparse matrix") -> None:
    """Refuse (InputError naming ``path``) a scipy.sparse matrix read from it whose index arrays do not
    fit its shape (:func:`fedsonmf._validation.sparse_structure_problem`), before any scipy operation
    trusts them."""
    problem = sparse_structure_problem(X)
    if problem:
        raise InputError(f"{path}: {what} ({X.format}, shape {X.shape[0]} x {X.shape[1]}) is malformed: {problem}; "
                         "a corrupt or forged file, refused")


def _check_sparse_variables(path: Path, variables: dict) -> None:
    """:func:`check_sparse_file` on every sparse variable, and every sparse element of a cell array."""
    for name, value in variables.items():
        if sp.issparse(value):
            check_sparse_file(path, value, f"the sparse variable {name!r}")
        elif _is_cell(value):
            for k, element in enumerate(value.ravel(order="F"), start=1):
                if sp.issparse(element):
                    check_sparse_file(path, element, f"element {k} of the cell {name!r}")


def _verify_mat5_elements(path: Path, size: int) -> None:
    """Walk the top-level data elements of a MAT v5/v7 file and check them.

    Every element must fit in the file; every compressed element (MAT v7) must
    decompress completely with a valid zlib checksum and hold one matrix element.
    scipy's reader does not check the checksum and can read damaged compressed
    data into an invalid sparse matrix (a segmentation fault was observed on a
    flipped bit); a damaged file is refused here first.

    The walk also reads every array's header (class, dimensions, nested cells and
    structs) and refuses, before scipy allocates anything (:mod:`._limits`): an array
    declaring more values than its element stores, a compressed element inflating
    like a zip bomb, and arrays needing more memory in all than the view budget.
    """
    import mmap
    import struct
    import zlib

    need = [0]  # bytes the arrays declared so far need once read
    budget = _limits.view_budget()
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
                src = _Inflated(data[pos + 8:end], path, f"compressed element {k} at byte {pos}", budget)
                try:
                    head = src.read(8) if src.available(8) else b""
                    inner_type, inner_n = struct.unpack(endian + "II", head) if len(head) == 8 else (0, 0)
                    if inner_type == 14:
                        _walk_matrix(src, endian, inner_n, path, need, 0)
                    src.drain()
                    total = src.total
                except zlib.error as exc:
                    raise InputError(f"{path}: corrupt MAT file: compressed element {k} at byte {pos} is damaged "
                                     f"(zlib: {exc})") from None
                except _Short:
                    total = -1
                if not src.dec.eof or inner_type != 14 or total < 8 + inner_n:
                    raise InputError(f"{path}: corrupt or truncated MAT file: compressed element {k} at byte {pos} "
                                     "does not hold a complete matrix")
                pos = end
            else:
                try:
                    _walk_matrix(_Mapped(data, pos + 8, end), endian, nbytes, path, need, 0)
                except _Short:
                    raise InputError(f"{path}: corrupt MAT file: element {k} at byte {pos} is shorter than the "
                                     "array it declares") from None
                pos = end + (-nbytes % 8)
            _limits.check_budget(path, need[0], "its arrays")


def _verify_mat4_matrices(path: Path, size: int) -> None:
    """Read the headers of a MAT v4 file's matrices (type, rows, columns, imaginary flag, name) and
    refuse, before scipy reads them, a matrix declaring more data than the file holds or more memory
    in all than the view budget.  A file whose first header is not a v4 one is left to scipy."""
    import struct

    with open(path, "rb") as fh:
        first = fh.read(20)
        if len(first) < 20:
            return
        endian = next((e for e in "<>" if _mopt_ok(struct.unpack(e + "i", first[:4])[0])), None)
        if endian is None:
            return
        pos, need, k = 0, 0, 0
        while pos + 20 <= size:
            k += 1
            fh.seek(pos)
            mopt, rows, cols, imagf, namlen = struct.unpack(endian + "5i", fh.read(20))
            if not _mopt_ok(mopt) or min(rows, cols, namlen) < 0:
                return  # scipy says what is wrong
            count = rows * cols
            data = count * (8, 4, 4, 2, 2, 1)[(mopt // 10) % 10] * (2 if imagf else 1)
            _limits.check_holds(path, f"MAT v4 matrix {k} declaring {rows}x{cols}", pos + 20 + namlen + data, size)
            need += count * 8 * (2 if imagf else 1)
            _limits.check_budget(path, need, "its matrices")
            pos += 20 + namlen + data


def _mopt_ok(mopt: int) -> bool:
    """A MAT v4 type word: machine 0-4, 0, precision 0-5, matrix type 0-2."""
    return 0 <= mopt < 5000 and (mopt // 100) % 10 == 0 and (mopt // 10) % 10 <= 5 and mopt % 10 <= 2


class _Short(Exception):
    """A data element ended before what its headers declare."""


class _Mapped:
    """Bytes ``[start, end)`` of a mapped file, read in order."""

    def __init__(self, data, start: int, end: int):
        self.data, self.pos, self.end = data, start, end

    def available(self, n: int) -> bool:
        return self.pos + n <= self.end

    def read(self, n: int) -> bytes:
        if self.pos + n > self.end:
            raise _Short
        out = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        if self.pos + n > self.end:
            raise _Short
        self.pos += n

    def tell(self) -> int:
        return self.pos


class _Inflated:
    """A zlib stream read in order, at most 1 MiB inflated at a time; refused (InputError) once it
    inflates like a zip bomb or beyond the view budget."""

    def __init__(self, compressed: bytes, path: Path, what: str, budget: int):
        import zlib

        self.dec = zlib.decompressobj()
        self.tail, self.buf, self.total, self.consumed = compressed, b"", 0, 0
        self.path, self.what, self.budget, self.n_in = path, what, budget, len(compressed)

    def _pull(self) -> bool:
        if self.dec.eof or (not self.tail and self.dec.eof):
            return False
        chunk = self.dec.decompress(self.tail, 1 << 20)
        self.tail = self.dec.unconsumed_tail
        if not chunk and not self.tail:
            chunk = self.dec.flush()
            if not chunk:
                return False
        self.total += len(chunk)
        _limits.check_inflation(self.path, self.what, self.total, self.n_in)
        if self.total > self.budget:
            _limits.check_budget(self.path, self.total, self.what)
        self.buf += chunk
        return True

    def available(self, n: int) -> bool:
        while len(self.buf) < n:
            if not self._pull():
                return False
        return True

    def read(self, n: int) -> bytes:
        if not self.available(n):
            raise _Short
        out, self.buf = self.buf[:n], self.buf[n:]
        self.consumed += n
        return out

    def skip(self, n: int) -> None:
        while n > 0:
            if not self.buf and not self._pull():
                raise _Short
            step = min(n, len(self.buf))
            self.buf = self.buf[step:]
            self.consumed += step
            n -= step

    def tell(self) -> int:
        return self.consumed

    def drain(self) -> None:
        self.buf = b""
        while self._pull():
            self.buf = b""


#: bytes per value of the MAT data types (miINT8 ... miUINT64) and of the array classes (mxCHAR ... mxUINT64)
_TYPE_SIZE = {1: 1, 2: 1, 3: 2, 4: 2, 5: 4, 6: 4, 7: 4, 9: 8, 12: 8, 13: 8, 16: 1, 17: 2, 18: 4}
_CLASS_SIZE = {4: 4, 6: 8, 7: 4, 8: 1, 9: 1, 10: 2, 11: 2, 12: 4, 13: 4, 14: 8, 15: 8}


def _tag(src, endian: str) -> tuple[int, int, bytes | None]:
    """A sub-element's type, byte count and (small element format) its data."""
    import struct

    raw = src.read(8)
    t, n = struct.unpack(endian + "II", raw)
    if t >> 16:
        return t & 0xFFFF, t >> 16, raw[4:4 + (t >> 16)]
    return t, n, None


def _sub(src, endian: str) -> tuple[int, int, bytes]:
    """A small sub-element (flags, dimensions, a name): its type, byte count and data."""
    t, n, small = _tag(src, endian)
    if small is not None:
        return t, n, small
    if n > 1 << 24:
        raise _Short  # a header sub-element (flags, dimensions, names) of more than 16 MiB: not a MAT file's
    body = src.read(n)
    src.skip(-n % 8)
    return t, n, body


def _walk_matrix(src, endian: str, nbytes: int, path: Path, need: list, depth: int) -> None:
    """Read the headers of one miMATRIX element of ``nbytes`` (``src`` after its tag), adding to
    ``need[0]`` the memory its arrays take once read; InputError for a declaration the element
    cannot hold."""
    import struct

    end = src.tell() + nbytes
    if nbytes == 0:
        return
    if depth > 64:
        raise InputError(f"{path}: MAT arrays nested more than 64 deep; refused")
    _, _, flags = _sub(src, endian)
    if len(flags) < 4:
        raise _Short
    cls = flags[0] if endian == "<" else flags[3]
    is_complex = bool(struct.unpack(endian + "I", flags[:4])[0] & 0x800)
    if not 1 <= cls <= 15 or src.tell() + 16 > end:  # function handles, opaque objects: not views; skipped
        src.skip(end - src.tell())
        return
    t, n, dims_raw = _sub(src, endian)
    dims = struct.unpack(f"{endian}{n // 4}i", dims_raw[:n - n % 4]) if t == 5 else ()
    count = _limits.prod(max(d, 0) for d in dims)
    _sub(src, endian)  # the name
    left = end - src.tell()
    shown = "x".join(map(str, dims))
    if cls in (1, 2, 3):  # cell, struct, object: nested matrix elements of at least 8 bytes each
        n_fields = 1
        if cls in (2, 3):
            if cls == 3:
                _sub(src, endian)  # the class name
            _, _, flen = _sub(src, endian)
            length = struct.unpack(endian + "i", flen[:4])[0] if len(flen) >= 4 else 0
            _, fn, _ = _sub(src, endian)
            n_fields = fn // length if length > 0 else 0
            left = end - src.tell()
        elements = count * n_fields
        _limits.check_holds(path, f"a {shown} cell or struct array ({elements} elements)", 8 * elements, left,
                            where="its MAT element holds")
        need[0] += 8 * elements
        for _ in range(elements):
            t, sub_n, _ = _tag(src, endian)
            if t != 14:
                raise _Short
            _walk_matrix(src, endian, sub_n, path, need, depth + 1)
            src.skip(-sub_n % 8)
    elif src.tell() + 8 > end:  # no data sub-element (an empty array)
        pass
    elif cls == 5:  # sparse: row indices, column pointers, values
        rows, cols = (dims + (0, 0))[:2]
        t, ir_n, small = _tag(src, endian)
        nnz = ir_n // 4
        if small is None:
            src.skip(ir_n + (-ir_n % 8))
        t, jc_n, small = _tag(src, endian)
        if small is None:
            src.skip(jc_n + (-jc_n % 8))
        _limits.check_holds(path, f"a {shown} sparse array ({cols} columns)", 4 * (max(cols, 0) + 1), jc_n,
                            where="its column pointers hold")
        need[0] += nnz * (8 + 8) * 2 + 8 * (max(rows, 0) + 1) + 8 * (max(cols, 0) + 1)
    elif cls in _CLASS_SIZE:  # numeric or char: the stored values, then the imaginary part
        t, pr_n, small = _tag(src, endian)
        stored = pr_n // _TYPE_SIZE.get(t, 1)
        if stored < count and count > 0:
            raise InputError(f"{path}: a {shown} MAT array declares {count} values but stores {stored}: a "
                             "truncated file or a forged header; refused before reading")
        need[0] += count * (_CLASS_SIZE[cls] + 8) * (2 if is_complex else 1)
    rest = end - src.tell()
    if rest < 0:
        raise _Short  # sub-elements running past their matrix element
    src.skip(rest)


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
            f"{path} is a MAT v7.3 (HDF5) file; reading it needs h5py, a dependency of fedsonmf "
            "missing from this environment (pip install h5py)"
        ) from exc

    def attr(obj, key):
        val = obj.attrs.get(key)
        return val.decode() if isinstance(val, bytes) else val

    need = [0]
    size = path.stat().st_size

    def member(group, key: str):
        """``group[key]``, refusing a link that leaves the file before HDF5 follows it (an external
        link opens another file -- or blocks forever on a FIFO).  A soft link is followed only through
        hard links of this file (MATLAB writes neither kind)."""
        name = f"{group.name.rstrip('/')}/{key}"
        link = group.get(key, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            raise InputError(f"{path}: {name!r} is an external link to {link.filename!r} ({link.path}): a view "
                             "file must hold its own data, not another file's; refused")
        if not isinstance(link, h5py.SoftLink):
            return guard(group[key])
        here = group.file if link.path.startswith("/") else group
        for part in (p for p in link.path.split("/") if p):
            if not isinstance(here.get(part, getlink=True), h5py.HardLink):
                raise InputError(f"{path}: {name!r} is a soft link to {link.path!r}, which is missing or passes "
                                 f"through another link at {part!r}; refused")
            here = here[part]
        return guard(here)

    def guard(obj):
        """Refuse a dataset whose data is not this file's own (external storage, a virtual dataset,
        another file), before anything reads it."""
        if not isinstance(obj, h5py.Dataset):
            return obj
        name = obj.name
        if obj.file.filename != fh.filename:
            raise InputError(f"{path}: the dataset {name!r} is in another file ({obj.file.filename!r}); refused")
        if obj.external is not None:
            shown = ", ".join(str(e[0].decode() if isinstance(e[0], bytes) else e[0]) for e in obj.external)
            raise InputError(f"{path}: the dataset {name!r} keeps its data in external file(s) ({shown}): a view "
                             "file must hold its own data, not another file's; refused")
        if obj.is_virtual:
            raise InputError(f"{path}: the dataset {name!r} is a virtual dataset (data mapped from other "
                             "datasets or files); refused")
        return obj

    def read(ds, dtype=None) -> np.ndarray:
        """The values of the dataset ``ds``, refused first if it inflates like a bomb (compressed, or
        chunks never written: HDF5 returns its fill value for them) -- the rule of the other
        compressed formats (:func:`._limits.check_inflation`), stored bytes against declared."""
        declared = _limits.prod(ds.shape) * ds.dtype.itemsize
        stored = min(int(ds.id.get_storage_size()), size)
        if ds.compression is not None or stored < declared:
            how = "compressed" if ds.compression is not None else "unwritten data read as its fill value"
            _limits.check_inflation(path, f"the dataset {ds.name!r} ({how})", declared, stored)
        return np.asarray(ds, dtype=dtype)

    def declare(what: str, nbytes: int) -> None:  # every dataset's declared shape, before it is read
        need[0] += nbytes
        _limits.check_budget(path, need[0], what)

    def convert(obj):
        cls = attr(obj, "MATLAB_class")
        if isinstance(obj, h5py.Group):
            if "MATLAB_sparse" not in obj.attrs:
                return None  # struct or object: not supported
            n_rows = int(obj.attrs["MATLAB_sparse"])
            parts = {k: member(obj, k) for k in ("jc", "ir", "data") if k in obj}
            declare(f"the sparse array {obj.name!r} ({n_rows} rows)",
                    2 * sum(_limits.prod(d.shape) * 8 for d in parts.values() if isinstance(d, h5py.Dataset))
                    + 16 * (max(n_rows, 0) + 1))
            jc = read(parts["jc"], np.int64).ravel()
            if "data" in parts:  # absent when the matrix has no nonzeros
                data, ir = read(parts["data"]).ravel(), read(parts["ir"]).ravel()
            else:
                data, ir = np.zeros(0), np.zeros(0)
            ir = ir.astype(np.int64)  # (a uint64 index past int64 wraps negative: refused below)
            problem = compressed_index_problem(jc, ir, data.size, (n_rows, max(jc.size - 1, 0)), by_rows=False)
            if problem:
                raise InputError(f"{path}: the sparse array {obj.name!r} ({n_rows} x {max(jc.size - 1, 0)}, "
                                 f"MATLAB_sparse) is malformed: {problem}; a corrupt or forged file, refused")
            return sp.csc_array((data, ir, jc), shape=(n_rows, jc.size - 1))
        if cls == "cell":
            refs = read(obj)
            out = np.empty(refs.shape, dtype=object)
            for idx, ref in np.ndenumerate(refs):
                out[idx] = convert(guard(obj.file[ref]))
            return out.T
        if cls == "char" or "MATLAB_empty" in obj.attrs or obj.dtype.names is not None:
            return None  # text, empty or complex
        if isinstance(obj, h5py.Dataset):
            n = _limits.prod(obj.shape)
            declare(f"the array {obj.name!r} of shape {obj.shape[::-1]} ({obj.dtype})", n * (obj.dtype.itemsize + 8))
        return read(obj).T

    with h5py.File(path, "r") as fh:
        items = {k: convert(member(fh, k)) for k in fh if not k.startswith("#")}
    return {k: v for k, v in items.items() if v is not None}
