"""Compiled loops of the support search (numba): the reweighting sweeps and the greedy moves.

Each function here is the loop form of a NumPy routine in :mod:`fedsonmf.core.ustep_search`
and makes the same decisions from the same floating-point values: column sums are
accumulated row by row (as ``np.bincount`` does), products, square roots and
comparisons are the same element-wise operations, and every arg-max takes the first
maximum (as ``np.argmax``).  Only the total ``sum_j sqrt(S_j)`` is summed in a
different order (NumPy sums pairwise); it enters thresholds relative at 1e-12 / 1e-13,
far above the 1e-16 the order can change.  Why compiled: at the sizes of real views
(d_p ~ 3 000, r ~ 10) one NumPy call costs more than the arithmetic it does, and the
greedy is a sequence of O(d) moves (docs/speed.md).

``AVAILABLE`` is False when numba is not installed (it is the optional extra
``fedsonmf[numba]``); the NumPy routines then run.  numba is imported and the loops are
compiled (or loaded from numba's on-disk cache) only at the first compiled call, so
``import fedsonmf`` does not pay for it (docs/speed.md).
"""

from __future__ import annotations

import importlib.util

import numpy as np

AVAILABLE = importlib.util.find_spec("numba") is not None

__all__ = ["AVAILABLE", "reweighted", "greedy"]


def _pattern_sums_py(P, a, r):
    """S_j, |J_j| and each row's own P_{i a_i} (0 for an empty row), summed in row order."""
    d = P.shape[0]
    S = np.zeros(r)
    counts = np.zeros(r, np.int64)
    own = np.zeros(d)
    for i in range(d):
        j = a[i]
        if j >= 0:
            own[i] = P[i, j]
            S[j] += P[i, j]
            counts[j] += 1
    return S, counts, own


def _repair_py(a, M):
    """``ustep_patterns._repair``: give every empty column the movable row with the largest M_ij.

    Returns ``(pattern, repaired)``; ``pattern`` is ``a`` itself when no column was empty.
    """
    d, r = M.shape
    counts = np.zeros(r, np.int64)
    for i in range(d):
        if a[i] >= 0:
            counts[a[i]] += 1
    empty = False
    for j in range(r):
        if counts[j] == 0:
            empty = True
    if not empty:
        return a, False
    a = a.copy()
    for j in range(r):
        has = False
        for i in range(d):
            if a[i] == j:
                has = True
                break
        if has:
            continue
        counts[:] = 0
        for i in range(d):
            if a[i] >= 0:
                counts[a[i]] += 1
        best_i = -1
        best = 0.0
        for i in range(d):
            if a[i] < 0 or counts[a[i]] > 1:
                if best_i < 0 or M[i, j] > best:
                    best_i = i
                    best = M[i, j]
        a[best_i] = j
    return a, True


def _value_py(S):
    total = 0.0
    for j in range(S.shape[0]):
        total += np.sqrt(S[j])
    return total


def _reweighted_py(P, a, M, has_mass, all_mass, iters, patience):
    """``ustep_search._reweighted``: sweeps "row i -> argmax_j P_ij / sqrt(S_j)"; returns (pattern, fixed)."""
    d, r = P.shape
    tiny = np.finfo(np.float64).tiny
    best = a
    best_is_cur = True
    best_val = 0.0
    have_best_val = False
    cur = a
    S, _, _ = _pattern_sums(P, cur, r)
    stale = 0
    fixed = False
    w = np.empty(r)
    raw = np.empty(d, np.int64)
    for _ in range(iters):
        for j in range(r):
            w[j] = 1.0 / np.sqrt(max(S[j], tiny))
        for i in range(d):
            if not all_mass and not has_mass[i]:
                raw[i] = cur[i]
                continue
            bj = 0
            bv = P[i, 0] * w[0]
            for j in range(1, r):
                v = P[i, j] * w[j]
                if v > bv:
                    bv = v
                    bj = j
            raw[i] = bj
        nxt, repaired = _repair(raw, M)
        same = True
        for i in range(d):
            if nxt[i] != cur[i]:
                same = False
                break
        if same:
            ok = True
            for j in range(r):
                if not S[j] >= tiny:
                    ok = False
            fixed = best_is_cur and not repaired and ok
            break
        if not have_best_val:
            best_val = _value(S)
            have_best_val = True
        cur = nxt.copy()
        S, _, _ = _pattern_sums(P, cur, r)
        val = _value(S)
        if val > best_val + 1e-12 * abs(best_val):
            best, best_val, stale = cur, val, 0
            best_is_cur = True
        else:
            best_is_cur = False
            stale += 1
            if stale >= patience:
                break
    return best.copy(), fixed


def _row_best_py(IN, OUT, a, i, r):
    """Best move (column, gain) of row i over every column but its own (first maximum)."""
    bj = -1
    bv = 0.0
    for j in range(r):
        g = -np.inf if j == a[i] else IN[i, j] + OUT[i]
        if bj < 0 or g > bv:
            bj = j
            bv = g
    return bj, bv


def _out_py(S, sqS, counts, own, a, i):
    c = a[i]
    if c < 0:
        return 0.0
    if counts[c] > 1:
        return np.sqrt(max(S[c] - own[i], 0.0)) - sqS[c]
    return -np.inf


def _greedy_py(P, a, max_moves, gain_rel, min_batch):
    """``ustep_search._greedy`` from scratch (its tables built from ``a``).

    Returns ``(pattern, deferred)``: with ``min_batch >= 0`` and more than ``min_batch``
    rows with an improving move, nothing is moved and ``deferred`` is True (the caller
    runs the batched phase first, as ``_bulk`` does).
    """
    d, r = P.shape
    a = a.copy()
    S, counts, own = _pattern_sums(P, a, r)
    sqS = np.sqrt(S)
    IN = np.empty((d, r))
    for i in range(d):
        for j in range(r):
            IN[i, j] = np.sqrt(S[j] + P[i, j]) - sqS[j]
    OUT = np.empty(d)
    for i in range(d):
        OUT[i] = _out(S, sqS, counts, own, a, i)
    bb = np.empty(d, np.int64)
    bg = np.empty(d)
    for i in range(d):
        bb[i], bg[i] = _row_best(IN, OUT, a, i, r)
    if max_moves <= 0:
        return a, False
    if min_batch >= 0:
        tol = gain_rel * _value(S)
        n_up = 0
        for i in range(d):
            if bg[i] > tol:
                n_up += 1
        if n_up > min_batch:
            return a, True
    full = np.zeros(d, np.bool_)
    for _ in range(max_moves):
        i = 0
        for k in range(1, d):
            if bg[k] > bg[i]:
                i = k
        tot = 0.0
        for j in range(r):
            tot += sqS[j]
        if not bg[i] > gain_rel * tot:
            break
        src = a[i]
        dst = bb[i]
        if src >= 0:
            S[src] = max(S[src] - P[i, src], 0.0)
            counts[src] -= 1
        S[dst] += P[i, dst]
        counts[dst] += 1
        a[i] = dst
        own[i] = P[i, dst]
        for c in (src, dst):
            if c < 0:
                continue
            sqS[c] = np.sqrt(S[c])
            for k in range(d):
                IN[k, c] = np.sqrt(S[c] + P[k, c]) - sqS[c]
        for k in range(d):
            in_ch = a[k] == dst or (src >= 0 and a[k] == src)
            if in_ch:
                OUT[k] = _out(S, sqS, counts, own, a, k)
            full[k] = in_ch or bb[k] == dst or (src >= 0 and bb[k] == src)
        for c in (src, dst):
            if c < 0:
                continue
            for k in range(d):
                if not full[k]:
                    g = IN[k, c] + OUT[k]
                    if g > bg[k]:
                        bb[k] = c
                        bg[k] = g
        for k in range(d):
            if full[k]:
                bb[k], bg[k] = _row_best(IN, OUT, a, k, r)
    return a, False


# the names the loops call; _build() rebinds them to the compiled versions (numba resolves a
# called global when it compiles the caller)
_pattern_sums, _repair, _value, _row_best, _out = _pattern_sums_py, _repair_py, _value_py, _row_best_py, _out_py
_reweighted_jit = _greedy_jit = None


def _build():
    """Compile (or load from the cache) every loop, once per process."""
    global _pattern_sums, _repair, _value, _row_best, _out, _reweighted_jit, _greedy_jit
    import numba

    def jit(func):
        return numba.njit(cache=True, nogil=True)(func)

    _pattern_sums, _repair, _value = jit(_pattern_sums_py), jit(_repair_py), jit(_value_py)
    _row_best, _out = jit(_row_best_py), jit(_out_py)
    _reweighted_jit, _greedy_jit = jit(_reweighted_py), jit(_greedy_py)


def reweighted(P, a, M, has_mass, iters=30, patience=3):
    """Compiled :func:`fedsonmf.core.ustep_search._reweighted`: ``(pattern, fixed)``."""
    if _reweighted_jit is None:
        _build()
    has_mass = np.ascontiguousarray(has_mass, dtype=np.bool_)
    return _reweighted_jit(np.ascontiguousarray(P), np.ascontiguousarray(a, dtype=np.int64), np.ascontiguousarray(M),
                           has_mass, bool(has_mass.all()), int(iters), int(patience))


def greedy(P, a, max_moves, gain_rel, min_batch=-1):
    """Compiled :func:`fedsonmf.core.ustep_search._greedy` from ``a``: ``(pattern, deferred)``."""
    if _greedy_jit is None:
        _build()
    return _greedy_jit(np.ascontiguousarray(P), np.ascontiguousarray(a, dtype=np.int64), int(max_moves),
                       float(gain_rel), int(min_batch))
