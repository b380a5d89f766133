"""Support patterns of the nonnegative Stiefel set S_+ and the rounding onto it (docs/algorithm.md §3.2-§3.4).

A U in S_+ has at most one positive entry per row, so it is a *pattern* (row i -> column a_i,
or -1 for an empty row) plus positive values.  Here: the projection onto the oblique set
Ob_+ and EP4Orth's rounding ``round_st`` (Jiang et al. 2023), the pattern of a U and the best
U of a pattern (the closed form of §3.2), the repair that gives every column a row.

Scale: the helpers test positivity exactly (> 0) and normalise columns after dividing by
their largest entry, so they neither underflow nor overflow at any scale; ``_pow2_scale``
gives the power of two the solver divides its data by (exact in binary floating point).
"""

from __future__ import annotations

import numpy as np

__all__ = ["proj_ob", "round_st", "assignment_from_u", "u_from_assignment", "stiefel_residual"]


def _pow2_scale(*arrays: np.ndarray) -> float:
    """A power of two s with max|entries| / s in [0.5, 1) (1.0 if all are 0).

    Dividing by s is exact in binary floating point (barring subnormals), which
    is what makes the solver's output independent of the data scale.
    """
    m = max((float(np.max(np.abs(x))) if x.size else 0.0) for x in arrays)
    if not np.isfinite(m):
        raise ValueError("U-step data contain inf or NaN")
    if m == 0.0:
        return 1.0
    return float(np.ldexp(1.0, int(np.frexp(m)[1])))


def _col_max(U: np.ndarray) -> np.ndarray:
    """``U.max(axis=0)`` (exact), ~7x faster for a C-ordered d x r with small r.

    numpy reduces a C-ordered (d, r) array along axis 0 with one strided inner
    loop per row; the Fortran copy reduces contiguous columns.
    """
    return np.asfortranarray(U).max(axis=0)


def _row_max(P: np.ndarray) -> np.ndarray:
    """``P.max(axis=1)`` (exact), ~10x faster for a C-ordered d x r with small r."""
    return np.asfortranarray(P).max(axis=1)


def _normalise_columns(U: np.ndarray, colmax: np.ndarray | None = None) -> np.ndarray:
    """Divide each column of the nonnegative U (no zero column) by its 2-norm, in place.

    The column is first divided by its largest entry, so the squares lie in
    [0, 1] and cannot overflow or underflow at any data scale.  ``colmax``:
    ``U.max(axis=0)`` if the caller has it.
    """
    U /= _col_max(U) if colmax is None else colmax
    U /= np.sqrt(np.einsum("ij,ij->j", U, U))
    return U


def proj_ob(Y: np.ndarray) -> np.ndarray:
    """Projection onto Ob_+ = {U >= 0, unit columns}; Y and U of shape (d, r).

    A column with no positive entry becomes the unit vector at its argmax.
    Scale-free: the test is "some entry > 0" (no absolute threshold).
    """
    U = np.maximum(Y, 0.0)
    colmax = _col_max(U)
    bad = ~(colmax > 0.0)
    if bad.any():
        cols = np.flatnonzero(bad)
        U[:, cols] = 0.0
        U[np.argmax(Y[:, cols], axis=0), cols] = 1.0
        colmax[cols] = 1.0  # the column is now a unit vector
    return _normalise_columns(U, colmax)


def round_st(U: np.ndarray) -> tuple[np.ndarray, bool]:
    """Keep each row's largest entry, zero the rest, normalise the columns.

    U of shape (d, r).  Returns ``(U_rounded, ok)``; ``ok`` is False when some
    column keeps no positive entry (rounding fails, EP4Orth's
    ``can_round = false``).
    """
    d, r = U.shape
    rows = np.arange(d)
    j = np.argmax(U, axis=1)
    R = np.zeros_like(U)
    R[rows, j] = U[rows, j]
    if not np.all(_col_max(R) > 0.0):
        return U, False
    return _normalise_columns(R), True


def assignment_from_u(U: np.ndarray) -> np.ndarray:
    """Row -> column assignment (shape (d,)) of a support pattern (-1 for an empty row).

    A row is empty when it has no positive entry (exact test: U in S_+ comes
    with exact zeros, and a threshold would not be scale-free).
    """
    a = np.argmax(U, axis=1)
    a[~(U[np.arange(U.shape[0]), a] > 0.0)] = -1
    return a


def u_from_assignment(M: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Best U in S_+ (shape (d, r)) with the support pattern ``a`` (§3.2 closed form).

    Column j is ``[M_{J_j, j}]_+`` normalised on its row set J_j; if that part
    is zero, a single 1 at the row of J_j with the largest M_ij.  Every column
    must own at least one row.
    """
    d, r = M.shape
    rows = np.flatnonzero(a >= 0)
    cols = a[rows]
    vals = np.maximum(M[rows, cols], 0.0)
    U = np.zeros_like(M)
    U[rows, cols] = vals
    colmax = _col_max(U)
    for j in np.flatnonzero(~(colmax > 0.0)):
        Jj = np.flatnonzero(a == j)
        U[Jj[np.argmax(M[Jj, j])], j] = 1.0
        colmax[j] = 1.0
    return _normalise_columns(U, colmax)


def _repair(a: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Give every column at least one row (d >= r makes this possible)."""
    r = M.shape[1]
    if np.all(np.bincount(a[a >= 0], minlength=r) > 0):
        return a
    a = a.copy()
    for j in range(r):
        if np.any(a == j):
            continue
        counts = np.bincount(a[a >= 0], minlength=r)
        movable = (a < 0) | (counts[np.maximum(a, 0)] > 1)
        cand = np.flatnonzero(movable)
        a[cand[np.argmax(M[cand, j])]] = j
    return a



def stiefel_residual(U: np.ndarray) -> float:
    """``||U^T U - I||_F`` (0 on the Stiefel manifold)."""
    return float(np.linalg.norm(U.T @ U - np.eye(U.shape[1])))

