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

from fedsonmf.exceptions import InputError, ParameterError

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


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
