"""The support search of the U-step: maximise sum_j ||[M_{J_j, j}]_+|| over patterns (docs/algorithm.md §3.5).

For a fixed pattern the best U is known in closed form (§3.2), so the U-subproblem (7) is a
search over row -> column assignments.  Three phases, each monotone: reweighting sweeps
(every row to its argmax of P_ij / sqrt(S_j), all rows at once), batched exact moves while
many rows can improve, then best-improvement single-row moves with incrementally updated
gains.  ``duality_gap`` bounds how far a pattern can be from the global optimum.
``search_rows`` leaves out the all-zero rows no step can take (unused features), with the same result.

The sweeps and the single-row moves run as compiled loops when numba is installed
(:mod:`fedsonmf.core._search_kernel`, same decisions); the NumPy routines below are the
reference and the fallback.  Measurements: docs/speed.md.
"""

from __future__ import annotations

import numpy as np

from fedsonmf.core import _search_kernel as _kernel
from fedsonmf.core.ustep_patterns import _pow2_scale, _repair, _row_max

__all__ = ["polish", "duality_gap"]

_GAIN_REL = 1e-13  # a move must raise sum_j sqrt(S_j) (~ ||M||) by more than this fraction
_BULK_MIN = 64  # batched moves only while more rows than this can improve (see _bulk)
_SWEEPS = 30  # reweighting sweeps per search at most (see _reweighted, search_rows)
#: run the sweeps and single-row moves compiled (numba installed); False: the NumPy routines
COMPILED = _kernel.AVAILABLE


def _column_sums(P: np.ndarray, a: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """S_j = sum_{i in J_j} P_ij, the row counts |J_j| and each row's own P_{i a_i} (0 if empty)."""
    asg = a >= 0
    own = np.where(asg, P[np.arange(P.shape[0]), np.maximum(a, 0)], 0.0)
    S = np.bincount(a[asg], weights=own[asg], minlength=r)
    counts = np.bincount(a[asg], minlength=r)
    return S, counts, own


def duality_gap(P: np.ndarray, a: np.ndarray) -> tuple[float, float]:
    """Value of the pattern ``a`` and an upper bound on the global optimum of (7).

    P = [M]_+^2 (d x r).  Returns ``(value, gap)`` with value = sum_j sqrt(S_j).

    Why it is a bound [C, derivation]: relax the assignment to Z >= 0 with
    row sums <= 1; f(Z) = sum_j sqrt(sum_i Z_ij P_ij) >= the value of every
    pattern.  Since sqrt(S) = min_{t>0} S/(2t) + t/2, for any t > 0
        f(Z) <= g(t) = 1/2 sum_j t_j + 1/2 sum_i max_j P_ij / t_j.
    At t_j = sqrt(S_j) of the pattern this gives
        gap = g(t) - value = 1/2 sum_i (max_j P_ij / t_j - P_{i a_i} / t_{a_i}) >= 0,
    which is 0 exactly when every row sits at its argmax of P_ij / sqrt(S_j)
    (the fixed point of the reweighting sweep): such a pattern is a *global*
    optimum of (7).  ``gap = inf`` when a column with S_j = 0 could take a
    positive entry (the bound is then vacuous) or any S_j = 0.
    """
    d, r = P.shape
    S, _, own = _column_sums(P, a, r)
    t = np.sqrt(S)
    value = float(t.sum())
    if not np.all(t > 0.0):
        # S_j = 0: either the bound is vacuous (a positive P_ij could enter) or
        # the column's value is max_{i in J_j} M_ij <= 0, which the relaxation
        # does not see; certify neither.
        return value, float("inf")
    w = 1.0 / t
    asg = a >= 0
    own_q = np.where(asg, own * w[np.maximum(a, 0)], 0.0)
    gap = 0.5 * float(np.sum(_row_max(P * w) - own_q))
    return value, max(gap, 0.0)


def _score(P: np.ndarray, a: np.ndarray, r: int) -> float:
    """sum_j sqrt(S_j), S_j = sum_{i in J_j} [M_ij]_+^2 (the value of a pattern)."""
    rows = np.flatnonzero(a >= 0)
    return float(np.sqrt(np.bincount(a[rows], weights=P[rows, a[rows]], minlength=r)).sum())


def _reweighted(
    P: np.ndarray,
    a: np.ndarray,
    M: np.ndarray,
    iters: int = _SWEEPS,
    patience: int = 3,
    has_mass: np.ndarray | None = None,
) -> tuple[np.ndarray, bool]:
    """Fixed-point sweeps "row i -> argmax_j P_ij / sqrt(S_j)" (all rows at once).

    A move i: a -> b pays off when sqrt(S_b + P_ib) - sqrt(S_b) > sqrt(S_a) -
    sqrt(S_a - P_ia), i.e. to first order when P_ib / sqrt(S_b) > P_ia / sqrt(S_a):
    the sweep makes all such moves together at O(d r) each, instead of one
    move per O(d r) gain evaluation.  Keeps the best pattern seen (never worse
    than ``a``; stops after ``patience`` sweeps without improvement, which
    catches oscillation); the greedy exact moves (:func:`_greedy`) then
    finishes.  Its fixed point is exactly a zero-duality-gap pattern
    (:func:`duality_gap`), i.e. a global optimum.

    Returns ``(pattern, fixed)``; ``fixed`` is True when the returned pattern
    is a fixed point of the sweep without repair (every row with mass at its
    argmax of P_ij w_j) and every S_j >= the smallest normal float.
    Then [C] no single-row move gains: by concavity of sqrt the exact gain of
    i: a -> b is at most (P_ib / sqrt(S_b) - P_ia / sqrt(S_a)) / 2 <= 0, and
    the rounding in the computed gains and in the sweep's comparison is below
    ~15 eps * sum_j sqrt(S_j), far under the greedy's threshold _GAIN_REL = 1e-13
    times that sum; so :func:`_bulk` and :func:`_greedy` would return the
    pattern unchanged, and its duality gap is exactly 0 (every row's P_ij w_j
    is maximal at its own column, computed with the same w).  ``has_mass``:
    ``P.max(axis=1) > 0`` if the caller has it.
    """
    d, r = P.shape
    rows = np.arange(d)
    if has_mass is None:
        has_mass = _row_max(P) > 0
    tiny = np.finfo(float).tiny
    best, best_val = a, None  # scored lazily: most calls stop at the first sweep
    cur = a
    S = _pattern_sums(P, cur, r, rows)
    stale = 0
    fixed = False
    all_mass = bool(has_mass.all())
    PW = np.empty_like(P)
    for _ in range(iters):
        w = 1.0 / np.sqrt(np.maximum(S, tiny))  # P is normalised (max <= 1)
        raw = np.argmax(np.multiply(P, w, out=PW), axis=1)
        if not all_mass:
            raw = np.where(has_mass, raw, cur)
        nxt = _repair(raw, M)  # returns raw itself when no column is empty
        if np.array_equal(nxt, cur):
            # a fixed point of the sweep itself, not of the repair (a repaired
            # row is not at its argmax, and the gap / no-move claim fails there)
            fixed = best is cur and nxt is raw and bool(np.all(S >= tiny))
            break
        if best_val is None:
            best_val = float(np.sqrt(S).sum())  # = _score(P, a, r): S is a's
        cur = nxt
        S = _pattern_sums(P, cur, r, rows)
        val = float(np.sqrt(S).sum())  # = _score(P, cur, r)
        if val > best_val + 1e-12 * abs(best_val):
            best, best_val, stale = cur, val, 0
        else:
            stale += 1
            if stale >= patience:
                break
    return best, fixed


def _pattern_sums(P: np.ndarray, a: np.ndarray, r: int, rows: np.ndarray) -> np.ndarray:
    """S_j = sum_{i in J_j} P_ij, summed in the same order as :func:`_column_sums` and :func:`_score`."""
    on = a >= 0
    ao = a[on]
    return np.bincount(ao, weights=P[rows[on], ao], minlength=r)


def _bulk(P: np.ndarray, a: np.ndarray, max_sweeps: int, min_batch: int = _BULK_MIN):
    """Batched exact single-row moves on the support pattern (§3.5), monotone.

    Runs only while more than ``min_batch`` rows have an improving move; the
    greedy (:func:`_greedy`) then finishes.  Why [C]: from a poor start (large
    d, many rows misplaced) the reweighting sweeps do not settle and O(d)
    greedy moves remain, each O(d); batches make hundreds of moves per O(d r)
    sweep (docs/speed.md).  With few improving rows (always the
    case at the synthetic d_p = 20, and in federated steps after the first)
    the result is exactly the greedy's.

    P = [M]_+^2 (d x r), ``a`` (d,) a pattern in which every column owns a row.
    One sweep costs O(d r): with S_j kept per column, the exact gain of moving
    row i from a to b is
        sqrt(S_b + P_ib) - sqrt(S_b) - (sqrt(S_a) - sqrt(S_a - P_ia)),
    evaluated for all (i, b) at once.  Every row with a positive best gain
    proposes its move; moves into / out of the same column interact (sqrt is
    concave, so the joint gain is at most the sum of the single gains), hence
    the batch is accepted only if the exact value sum_j sqrt(S_j) (O(d)) rises,
    and otherwise halved (best gains first) down to the single best move,
    which is always an improvement.  Stops when no single-row move gains more
    than ``_GAIN_REL`` times the value: the same local optimality as the old
    one-move-per-O(d r) greedy (§3.5).  Never empties a column.

    Returns ``(pattern, state)``: ``state`` is the greedy's initial state
    (:class:`_GreedyState`) when the first sweep already stops, else None.
    """
    d, r = P.shape
    rows = np.arange(d)
    a = a.copy()
    S, counts, own = _column_sums(P, a, r)
    if max_sweeps > 0:
        # First sweep in the greedy's form (same S, same gains, same test):
        # when it stops here, which is the usual case, the greedy starts from
        # this state instead of recomputing it.  Equality of the tests: the
        # gain of row i here is fl(max_b IN_ib + out_i) and the greedy's is
        # max_b fl(IN_ib + OUT_i) with OUT_i = out_i; fl(. + c) is monotone.
        state = _GreedyState(P, a, S, counts, own)
        if int(np.count_nonzero(state.bg > _GAIN_REL * float(state.sqS.sum()))) <= min_batch:
            return a, state
    for _ in range(max_sweeps):
        sqS = np.sqrt(S)
        value = float(sqS.sum())
        tol = _GAIN_REL * value
        asg = a >= 0
        ai = np.maximum(a, 0)
        out = np.where(asg, np.sqrt(np.maximum(S[ai] - own, 0.0)) - sqS[ai], 0.0)
        gain = np.sqrt(S + P)
        gain -= sqS
        gain[rows[asg], a[asg]] = -np.inf  # staying is not a move
        b = np.argmax(gain, axis=1)
        g = gain[rows, b] + out
        g[asg & (counts[ai] <= 1)] = -np.inf  # never empty a column
        cand = np.flatnonzero(g > tol)
        if cand.size <= min_batch:
            break
        order = cand[np.argsort(-g[cand], kind="stable")]
        k = order.size
        while True:
            mv = order[:k]
            a_new = a.copy()
            a_new[mv] = b[mv]
            S_new, counts_new, own_new = _column_sums(P, a_new, r)
            if k == 1 or (np.all(counts_new > 0) and float(np.sqrt(S_new).sum()) > value + tol):
                break
            k //= 2
        a, S, counts, own = a_new, S_new, counts_new, own_new
    return a, None


class _GreedyState:
    """The greedy's gain tables for the pattern ``a`` (owned, modified in place by :func:`_greedy`).

    IN_ib = sqrt(S_b + P_ib) - sqrt(S_b), OUT_i (0 for an empty row, -inf for
    the last row of a column), and every row's best move (bb, bg) over the
    other columns.  O(d r).
    """

    __slots__ = ("a", "S", "counts", "own", "sqS", "IN", "OUT", "bb", "bg")

    def __init__(self, P, a, S=None, counts=None, own=None):
        d, r = P.shape
        if S is None:
            S, counts, own = _column_sums(P, a, r)
        self.a, self.S, self.counts, self.own = a, S, counts, own
        self.sqS = sqS = np.sqrt(S)
        self.IN = IN = np.sqrt(S + P) - sqS
        asg = np.flatnonzero(a >= 0)
        c = a[asg]
        OUT = np.zeros(d)  # empty rows lose nothing
        OUT[asg] = np.where(counts[c] > 1, np.sqrt(np.maximum(S[c] - own[asg], 0.0)) - sqS[c], -np.inf)
        self.OUT = OUT
        G = IN + OUT[:, None]
        G[asg, c] = -np.inf  # staying is not a move
        self.bb = np.argmax(G, axis=1)
        self.bg = G[np.arange(d), self.bb]


def _greedy(P: np.ndarray, a: np.ndarray, max_moves: int, state: _GreedyState | None = None) -> np.ndarray:
    """Best-improvement single-row moves on the support pattern (§3.5), monotone.

    P = [M]_+^2 (d x r), ``a`` (d,) a pattern in which every column owns a row.
    The exact gain of moving row i from column a to column b is
        IN_ib + OUT_i,  IN_ib = sqrt(S_b + P_ib) - sqrt(S_b),
                        OUT_i = sqrt(S_a - P_ia) - sqrt(S_a)   (-inf if |J_a| = 1),
    with S_j = sum_{i in J_j} P_ij.  A move changes S in two columns only, so we keep IN,
    OUT and every row's best move (column, gain) and refresh per move:
    IN in the two columns (O(d)), OUT for the rows of those columns, and the
    full row best only for rows that belong to, or had their best move into,
    one of them; every other row just compares its best with the two new
    entries: O(d) work per move instead of O(d r).  Stops when no move gains more than
    ``_GAIN_REL`` times the value sum_j sqrt(S_j) (relative: scale-free).
    Never empties a column.  ``state``: the initial tables for ``a`` if the
    caller has them (:func:`_bulk`); they are modified in place.
    """
    d, r = P.shape
    if state is None:
        state = _GreedyState(P, a.copy())
    a, S, counts, own = state.a, state.S, state.counts, state.own
    sqS, IN, OUT, bb, bg = state.sqS, state.IN, state.OUT, state.bb, state.bg

    def refresh_out(idx):
        """OUT for the rows idx (all assigned)."""
        c = a[idx]
        OUT[idx] = np.where(counts[c] > 1, np.sqrt(np.maximum(S[c] - own[idx], 0.0)) - sqS[c], -np.inf)

    def row_best(idx):
        """Best (column, gain) of the rows idx over all columns but their own."""
        if 4 * idx.size > d:  # same entries, without the row gathers (faster for many rows)
            G = IN + OUT[:, None]
            on = np.flatnonzero(a >= 0)
            G[on, a[on]] = -np.inf
            b = np.argmax(G, axis=1)[idx]
            return b, G[idx, b]
        G = IN[idx] + OUT[idx, None]
        ai = a[idx]
        on = ai >= 0
        G[np.flatnonzero(on), ai[on]] = -np.inf
        b = np.argmax(G, axis=1)
        return b, G[np.arange(idx.size), b]

    for _ in range(max_moves):
        i = int(np.argmax(bg))
        if not bg[i] > _GAIN_REL * float(sqS.sum()):
            break
        src, dst = int(a[i]), int(bb[i])
        if src >= 0:
            S[src] = max(S[src] - P[i, src], 0.0)
            counts[src] -= 1
        S[dst] += P[i, dst]
        counts[dst] += 1
        a[i], own[i] = dst, P[i, dst]
        ch = [dst] if src < 0 else [src, dst]
        for c in ch:
            sqS[c] = np.sqrt(S[c])
            IN[:, c] = np.sqrt(S[c] + P[:, c]) - sqS[c]
        in_ch = (a == dst) if src < 0 else (a == src) | (a == dst)
        refresh_out(np.flatnonzero(in_ch))
        full = in_ch | (bb == dst) if src < 0 else in_ch | (bb == src) | (bb == dst)
        for c in ch:  # other rows: compare their best with the refreshed columns
            g = IN[:, c] + OUT
            upd = (g > bg) & ~full
            bb[upd], bg[upd] = c, g[upd]
        idx = np.flatnonzero(full)
        bb[idx], bg[idx] = row_best(idx)
    return a


def polish(M: np.ndarray, a: np.ndarray, max_moves: int | None = None) -> np.ndarray:
    """Local search on the support pattern (§3.5): monotone, never empties a column.

    M (d x r), ``a`` (d,) a pattern (columns left empty are repaired first).
    Maximises sum_j ||[M_{J_j, j}]_+||: vectorised reweighting sweeps
    (:func:`_reweighted`), batched exact moves while many rows can improve
    (:func:`_bulk`), then best-improvement single-row moves with
    incrementally updated gains (:func:`_greedy`, O(d) per move);
    ``max_moves`` caps the moves (default 4 d).  Returns the improved assignment.
    Scale-free: M is divided by a power of two first, and the move threshold
    is relative to the current value.
    """
    d, r = M.shape
    a = _repair(a, M)
    Mn = M / _pow2_scale(M)
    P = np.square(np.maximum(Mn, 0.0))
    max_moves = 4 * d if max_moves is None else max_moves
    return _search(P, a, Mn, max_moves)[0]


def search_rows(a: np.ndarray, Mn: np.ndarray, has_mass: np.ndarray) -> np.ndarray | None:
    """The rows (sorted indices) the support search needs, or None when that is (nearly) every row.

    A row of M that is exactly zero and unassigned in ``a`` (a feature no sample of the view
    has, far the most rows of a large vocabulary) has no mass: the sweeps leave it where it is,
    and its every move gains exactly 0, so no move takes it.  Only the repair of an empty column
    can take one: the first such row (by index) when no movable row has a positive M_ij.  Each
    repair fills at most r columns, and there is one per sweep (at most ``_SWEEPS``), so the first
    ``_SWEEPS * r + 1`` of those rows are kept and the search makes the same decisions as on all
    rows: the same pattern, bit for bit (its sums add the same nonzero terms in the same order).
    """
    d, r = Mn.shape
    free = ~has_mass & (a < 0)
    if not free.any():
        return None
    idle = np.flatnonzero(free)
    idle = idle[~np.any(Mn[idle] != 0.0, axis=1)]
    keep = _SWEEPS * r + 1
    if idle.size <= keep or 2 * (idle.size - keep) < d:  # fewer than half the rows to drop: not worth a copy
        return None
    live = np.ones(d, dtype=bool)
    live[idle[keep:]] = False
    return np.flatnonzero(live)


def _search(P, a, Mn, max_moves, has_mass=None, compiled=None):
    """The support search on the rows it needs (:func:`search_rows`); returns ``(pattern, fixed)``."""
    if has_mass is None:
        has_mass = _row_max(P) > 0
    rows = search_rows(a, Mn, has_mass)
    if rows is None:
        return _search_all(P, a, Mn, max_moves, has_mass, compiled)
    b, fixed = _search_all(P[rows], a[rows], Mn[rows], max_moves, has_mass[rows], compiled)
    out = a.copy()  # the dropped rows stay unassigned
    out[rows] = b
    return out, fixed


def _search_all(P, a, Mn, max_moves, has_mass=None, compiled=None):
    """Reweighting, bulk, greedy (see :func:`polish`); returns ``(pattern, fixed)``.

    ``fixed``: the reweighting ended at a fixed point, which no exact move
    improves (see :func:`_reweighted`): bulk and greedy are skipped, and the
    pattern's duality gap is exactly 0.  ``compiled`` (default: when numba is
    installed) runs the sweeps and the single-row moves as compiled loops
    (:mod:`fedsonmf.core._search_kernel`, the same decisions); the batched
    phase stays in NumPy.
    """
    if compiled is None:
        compiled = COMPILED
    if not compiled:
        a, fixed = _reweighted(P, a, Mn, iters=_SWEEPS, has_mass=has_mass)
        if fixed:
            return a, True
        a, state = _bulk(P, a, max_moves)
        return _greedy(P, a, max_moves, state), False
    if has_mass is None:
        has_mass = _row_max(P) > 0
    a, fixed = _kernel.reweighted(P, a, Mn, has_mass, _SWEEPS)
    if fixed:
        return a, True
    a, deferred = _kernel.greedy(P, a, max_moves, _GAIN_REL, _BULK_MIN)
    if deferred:  # many rows can improve: batched moves first (as _bulk), then the greedy
        a, _ = _bulk(P, a, max_moves)
        a, _ = _kernel.greedy(P, a, max_moves, _GAIN_REL, -1)
    return a, False
