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

__all__ = ["AVAILABLE", "reweighted", "greedy", "penalty"]


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


def _fg_py(U, As, B, Uk, rho1, G, cj, U_old, G_old, acc):
    """P_sigma(U) (constants dropped) and its gradient into ``G``: ``ustep_penalty.penalty``'s ``fg``.

    ``As = A + c2 1 1^T`` (c2 = 2 sigma / r) carries the penalty term: U As = U A + c2 (U 1) 1^T,
    and <U As, U> = <U A, U> + c2 ||U 1||^2, so
        f = -<U, B> + 1/2 <U As, U> + rho1/2 ||U - Uk||^2,   G = U As - B + rho1 (U - Uk),
    the NumPy form's terms regrouped.  U As by BLAS, then one pass over the rows for f, G, the
    column products cj = sum_i U_ij G_ij (the Riemannian gradient's) and, from the previous
    iterate (``U_old``, ``G_old``), ss = ||U - U_old||^2 and sy = <U - U_old, G - G_old>.
    Every sum is accumulated per column (``acc``, 3 x r, so the row loop vectorises), then
    over the columns.  Returns ``(f, ss, sy)``.
    """
    d, r = U.shape
    UA = np.dot(U, As)  # BLAS, as U @ A in NumPy
    for j in range(r):
        cj[j] = 0.0
        acc[0, j] = 0.0
        acc[1, j] = 0.0
        acc[2, j] = 0.0
    prox = rho1 != 0.0  # rho1 = 0 (the default): the proximal terms are exact zeros, Uk is not read
    for i in range(d):
        for j in range(r):
            u = U[i, j]
            ua = UA[i, j]
            g = ua - B[i, j]
            fij = 0.5 * ua * u - u * B[i, j]
            if prox:
                dd = u - Uk[i, j]
                g += rho1 * dd
                fij += 0.5 * rho1 * (dd * dd)
            G[i, j] = g
            cj[j] += u * g
            acc[0, j] += fij
            sv = u - U_old[i, j]
            acc[1, j] += sv * sv
            acc[2, j] += sv * (g - G_old[i, j])
    f = 0.0
    ss = 0.0
    sy = 0.0
    for j in range(r):
        f += acc[0, j]
        ss += acc[1, j]
        sy += acc[2, j]
    return f, ss, sy


def _proj_ob_py(U, G, t, out):
    """``proj_ob(U - t G)`` into ``out`` (``ustep_patterns.proj_ob``; the column norm is taken
    of the clipped column itself and applied as one multiplication, not after a division by
    the column's largest entry: the entries here are O(1), so nothing under- or overflows)."""
    d, r = U.shape
    colmax = np.zeros(r)
    nrm = np.zeros(r)
    for i in range(d):
        for j in range(r):
            y = max(U[i, j] - t * G[i, j], 0.0)
            out[i, j] = y
            colmax[j] = max(colmax[j], y)
            nrm[j] += y * y
    for j in range(r):
        if not colmax[j] > 0.0:  # no positive entry: the unit vector at the argmax of Y
            best, bi = U[0, j] - t * G[0, j], 0
            for i in range(1, d):
                y = U[i, j] - t * G[i, j]
                if y > best:
                    best, bi = y, i
            for i in range(d):
                out[i, j] = 0.0
            out[bi, j] = 1.0
            nrm[j] = 1.0
        nrm[j] = 1.0 / np.sqrt(nrm[j])
    for i in range(d):
        for j in range(r):
            out[i, j] *= nrm[j]


def _penalty_py(A, B, Uk, rho1, U0, eps1, sigma, sigma_cap, normA2, omega, feas_tol, max_outer, max_inner,
                gamma, armijo):
    """The loops of ``ustep_penalty.penalty`` (see there), fused into few passes over the d x r arrays.

    Returns ``(U, n_inner, outer)``.  Same iteration, same tests, same constants; sums in another order.
    """
    d, r = U0.shape
    U = U0.copy()
    G = np.empty_like(U)
    Un = np.empty_like(U)
    Gn = np.empty_like(U)
    cj = np.empty(r)
    cjn = np.empty(r)
    acc = np.empty((3, r))
    kkv = np.empty(r)
    n_inner = 0
    outer = 0
    for it in range(1, max_outer + 1):
        outer = it
        As = A + 2.0 * sigma / r  # A + c2 1 1^T (see _fg)
        f, _, _ = _fg(U, As, B, Uk, rho1, G, cj, U, G, acc)
        Cref, Q = f, 1.0
        t = 1.0 / (normA2 + rho1 + 2.0 * sigma)
        t_min, t_max = 1e-12 * t, 1e12 * t  # relative BB clip
        for _ in range(max_inner):
            for j in range(r):
                kkv[j] = 0.0
            for i in range(d):
                for j in range(r):
                    u = U[i, j]
                    kkv[j] += min(u, G[i, j] - u * cj[j]) ** 2
            kk = 0.0
            for j in range(r):
                kk += kkv[j]
            if kk <= eps1 * eps1:
                break
            n_inner += 1
            while True:
                _proj_ob(U, G, t, Un)
                fn, ss, sy = _fg(Un, As, B, Uk, rho1, Gn, cjn, U, G, acc)
                if fn <= Cref - (armijo / t) * ss or t < t_min:
                    break
                t *= 0.5
            sy = abs(sy)
            if sy > 0:
                t = min(max(ss / sy, t_min), t_max)
            elif ss == 0:
                t = t_max
            Qn = gamma * Q + 1.0
            Cref = (gamma * Q * Cref + fn) / Qn
            Q = Qn
            U, Un = Un, U
            G, Gn = Gn, G
            cj, cjn = cjn, cj
            f = fn
            if ss == 0:
                break
        u1 = np.dot(U, np.ones(r))
        feas = np.dot(u1, u1)
        if feas / r - 1.0 <= feas_tol:
            break
        sigma = min(sigma_cap, omega * sigma)
    return U, n_inner, outer


# the names the loops call; _build() rebinds them to the compiled versions (numba resolves a
# called global when it compiles the caller)
_pattern_sums, _repair, _value, _row_best, _out = _pattern_sums_py, _repair_py, _value_py, _row_best_py, _out_py
_fg, _proj_ob = _fg_py, _proj_ob_py
_reweighted_jit = _greedy_jit = _penalty_jit = None


def _build():
    """Compile (or load from the cache) every loop, once per process."""
    global _pattern_sums, _repair, _value, _row_best, _out, _reweighted_jit, _greedy_jit
    global _fg, _proj_ob, _penalty_jit
    import numba

    def jit(func):
        return numba.njit(cache=True, nogil=True)(func)

    _pattern_sums, _repair, _value = jit(_pattern_sums_py), jit(_repair_py), jit(_value_py)
    _row_best, _out = jit(_row_best_py), jit(_out_py)
    _reweighted_jit, _greedy_jit = jit(_reweighted_py), jit(_greedy_py)
    _fg, _proj_ob = jit(_fg_py), jit(_proj_ob_py)
    _penalty_jit = jit(_penalty_py)


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


def penalty(A, B, Uk, rho1, U0, eps1, sigma, sigma_cap, normA2, opts):
    """Compiled loops of :func:`fedsonmf.core.ustep_penalty.penalty`: ``(U, n_inner, outer)``."""
    if _penalty_jit is None:
        _build()
    c = np.ascontiguousarray
    return _penalty_jit(c(A), c(B), c(Uk), float(rho1), c(U0), float(eps1), float(sigma), float(sigma_cap),
                        float(normA2), float(opts.omega), float(opts.feas_tol), int(opts.max_outer),
                        int(opts.max_inner), float(opts.gamma), float(opts.armijo))
