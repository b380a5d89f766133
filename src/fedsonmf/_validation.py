"""Input checks with messages that name the problem (never a deep NumPy traceback)."""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp

from fedsonmf.exceptions import InputError, ParameterError

__all__ = ["check_views", "InputError", "check_seed"]


def _as_matrix(X, p: int):
    if sp.issparse(X):
        if X.ndim != 2:
            raise InputError(f"view {p} must be 2-D, got {X.ndim}-D")
        if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool) or np.iscomplexobj(X.data):
            raise InputError(f"view {p} must hold real numbers, got dtype {X.dtype}")
        dtype = np.float32 if X.dtype == np.float32 else np.float64
        if X.format not in ("csr", "csc"):
            X = X.tocsr()
        X = X.astype(dtype, copy=False)
        if not np.all(np.isfinite(X.data)):
            raise InputError(f"view {p} contains NaN or Inf")
        return X
    if isinstance(X, (str, bytes, dict)) or X is None:
        raise InputError(f"view {p} must be an array or a scipy.sparse matrix, got {type(X).__name__}")
    try:
        A = np.asarray(X)
    except Exception as exc:  # ragged lists and the like
        raise InputError(f"view {p} cannot be read as an array: {exc}") from None
    if A.dtype == object or not (np.issubdtype(A.dtype, np.number) or A.dtype == bool):
        raise InputError(f"view {p} must hold real numbers, got dtype {A.dtype}")
    if np.iscomplexobj(A):
        raise InputError(f"view {p} must hold real numbers, got complex dtype {A.dtype}")
    if A.ndim != 2:
        raise InputError(f"view {p} must be 2-D (n_samples, n_features), got shape {A.shape}")
    A = A.astype(np.float32 if A.dtype == np.float32 else np.float64, copy=False)
    if not np.all(np.isfinite(A)):
        raise InputError(f"view {p} contains NaN or Inf")
    return A


def check_views(Xs, n_components: int | None = None) -> list:
    """Validate views given as (n_samples, d_p) and return them as (d_p, n).

    Dense views become transposed ndarrays (no copy for float32/float64
    input); sparse views become CSC matrices (no copy for CSR input).
    float32 is kept, every other real dtype becomes float64 (see
    ``fedsonmf.core._linalg``).  Negative entries are valid (only U and V are
    constrained).
    """
    if sp.issparse(Xs) or isinstance(Xs, np.ndarray) or not isinstance(Xs, (list, tuple)):
        raise InputError(
            "Xs must be a list of views, each of shape (n_samples, n_features_p); "
            f"got {type(Xs).__name__} (wrap a single view as [X])"
        )
    if len(Xs) == 0:
        raise InputError("Xs is empty: give at least one view")
    mats = [_as_matrix(X, p) for p, X in enumerate(Xs)]
    ns = [M.shape[0] for M in mats]
    if len(set(ns)) != 1:
        raise InputError(f"views have different numbers of samples (rows): {ns}")
    n = ns[0]
    out = []
    for p, M in enumerate(mats):
        d = M.shape[1]
        if n == 0 or d == 0:
            raise InputError(f"view {p} is empty (shape {M.shape})")
        nz = M.count_nonzero() if sp.issparse(M) else np.count_nonzero(M)
        if nz == 0:
            raise InputError(f"view {p} is all zeros")
        if n_components is not None and n_components > d:
            raise InputError(
                f"n_components={n_components} is larger than view {p}'s number of features ({d}); "
                "a nonnegative orthonormal basis needs n_features >= n_components"
            )
        out.append(M.T.tocsc() if sp.issparse(M) else M.T)
    return out


def check_seed(random_state) -> int | None:
    """An int seed from ``random_state`` (None, int or np.random.Generator)."""
    if random_state is None:
        return None
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2**32))
    if isinstance(random_state, np.random.RandomState):  # as scikit-learn: draw the run's seed from it
        return int(random_state.randint(np.iinfo(np.int32).max))
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ParameterError(f"random_state must be >= 0, got {random_state!r}")
        return int(random_state)
    raise ParameterError(
        f"random_state must be None, a non-negative int, a RandomState or a Generator, got {random_state!r}")
