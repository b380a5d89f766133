"""Incomplete views: which samples each client holds (docs/algorithm.md §15.1).

Client p holds the columns Omega_p of the shared sample index.  The helpers
here turn what a user gives (a boolean mask of length n, or an array of
sample ids) into a sorted index array ``cols`` (None when the client holds
every sample: the complete-data code path is then *literally* today's code,
which is what makes complete data bit-identical), count the holders c_j of
every sample, and aggregate per column.

Weighted objective (§15.1)::

    F = (1/m) sum_p sum_{j in Omega_p} (m / c_j) ||X_p[:, j] - U_p V[:, j]||^2 + mu ||V||_{2,1}

so client p's weights are ``w_j = m / c_j`` (all ones for complete data).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsonmf.exceptions import InputError

__all__ = ["held_columns", "column_counts", "check_coverage", "column_mean", "scatter_columns"]


def held_columns(mask, n: int, *, client: int | None = None) -> np.ndarray | None:
    """The sorted sample indices a client holds, or None when it holds all ``n``.

    ``mask`` is None (all samples), a boolean array of length ``n``, or an
    integer array of distinct sample ids in ``0..n-1``.
    """
    who = f"client {client}" if client is not None else "mask"
    if mask is None:
        return None
    a = np.asarray(mask)
    if a.ndim != 1:
        raise InputError(f"{who}: the availability mask must be one-dimensional, got shape {a.shape}")
    if a.dtype == bool:
        if a.shape[0] != n:
            raise InputError(f"{who}: the availability mask has length {a.shape[0]}, the view has {n} samples")
        cols = np.flatnonzero(a)
    elif np.issubdtype(a.dtype, np.integer):
        cols = np.unique(a.astype(np.int64))
        if cols.size != a.size:
            raise InputError(f"{who}: repeated sample ids in the sample-id array")
        if cols.size and (cols[0] < 0 or cols[-1] >= n):
            raise InputError(f"{who}: sample ids must lie in 0..{n - 1}")
    else:
        raise InputError(f"{who}: give a boolean mask or an integer sample-id array, got dtype {a.dtype}")
    if cols.size == 0:
        raise InputError(f"{who} holds no sample")
    if cols.size == n:
        return None
    return cols.astype(np.int64)


def column_counts(cols_list: Sequence[np.ndarray | None], n: int) -> np.ndarray:
    """c_j = number of clients in ``cols_list`` holding sample j (int64, length n)."""
    c = np.zeros(n, dtype=np.int64)
    for cols in cols_list:
        if cols is None:
            c += 1
        else:
            c[cols] += 1
    return c


def check_coverage(counts: np.ndarray) -> None:
    """Raise :class:`InputError` naming the samples that no client holds."""
    orphan = np.flatnonzero(counts == 0)
    if orphan.size:
        shown = ", ".join(map(str, orphan[:20])) + (", ..." if orphan.size > 20 else "")
        raise InputError(
            f"{orphan.size} sample(s) are held by no client (every sample needs at least one view): "
            f"sample index {shown}"
        )


def scatter_columns(blocks: Sequence[np.ndarray], cols_list: Sequence[np.ndarray | None], shape):
    """Column sums and holder counts: ``(S, c)`` with ``S[:, j] = sum_{p holds j} B_p[:, j]``.

    Blocks are summed in the given (client) order.
    """
    S = np.zeros(shape, dtype=np.float64)
    c = np.zeros(shape[1], dtype=np.int64)
    for B, cols in zip(blocks, cols_list):
        if cols is None:
            S += B
            c += 1
        else:
            S[:, cols] += B
            c[cols] += 1
    return S, c


def column_mean(blocks, cols_list, shape, fill: np.ndarray):
    """Per-column mean over the holders; columns nobody sent take ``fill[:, j]``.

    Returns ``(mean, c)``.  For complete blocks (every ``cols`` None) the
    plain mean of :func:`fedsonmf.core.server.aggregate` is used instead by
    the callers (bit-identical to the complete-data method).
    """
    S, c = scatter_columns(blocks, cols_list, shape)
    held = c > 0
    out = fill.astype(np.float64, copy=True)
    out[:, held] = S[:, held] / c[held]
    return out, c
