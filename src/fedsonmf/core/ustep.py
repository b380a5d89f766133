"""The local U-subproblem (ALGORITHM.md §3) and its exact-penalty solver.

At local step k a client solves

    U^{k+1} in argmin_U  phi(U) = ||X_p - U V||_F^2 + rho1/2 ||U - U^k||_F^2
                s.t.     U >= 0,  U^T U = I_r                                   (7)

On the feasible set phi(U) = const - <U, M> with M = 2 X_p V^T + rho1 U^k, so (7)
is "maximise <U, M> over the nonnegative Stiefel set S_+" -- a combinatorial
problem (every row of U may be positive in at most one column).

Solver (§3.4): the exact penalty of Jiang et al. (2023, EP4Orth) on the
nonnegative oblique set Ob_+ (projected gradient, Barzilai-Borwein steps,
Zhang-Hager nonmonotone line search, sigma increased until feasible), rounded
onto S_+ with ``round_st``; then a greedy local search on the support pattern
(``polish``, §3.5).  Our additions [C]: the polish is also run from two cheap
feasible starts (the previous iterate U^k and the row-wise argmax of M) and
the best candidate under the exact objective is kept; a final safeguard
returns U^k if nothing beats it, which gives the sufficient-descent inequality
phi(U^{k+1}) <= phi(U^k) the theory assumes.  Global optimality is *not*
guaranteed (the theory's Assumption 2 assumes it).

The solver only needs the two Gram-type products ``B = 2 X V^T`` (d x r) and
``A = 2 V V^T`` (r x r): the one pass over X_p happens in the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "PenaltyOptions",
    "UStepInfo",
    "solve_u",
    "proj_ob",
    "round_st",
    "polish",
    "assignment_from_u",
    "u_from_assignment",
    "stiefel_residual",
    "duality_gap",
]

# Scale-free solver (issue "Nothing silently wrong at any scale"): ``solve_u``
# divides B, A, rho1 (hence M) by a power of two s ~ max|M| before doing
# anything, so every remaining constant below is *relative* to the data scale,
# and because division by a power of two is exact in binary floating point,
# solve_u(c B, c A, U, c rho1) runs bit-for-bit the same iterations as
# solve_u(B, A, U, rho1) whenever c is a power of two (and to rounding level
# otherwise).  The public helpers test positivity exactly (> 0) and normalise
# columns after dividing by their largest entry, so they neither underflow nor
# overflow at any scale (squares of 1e160 overflow, of 1e-170 underflow).
_GAIN_REL = 1e-13  # a move must raise sum_j sqrt(S_j) (~ ||M||) by more than this fraction
_BULK_MIN = 64  # batched moves only while more rows than this can improve (see _bulk)
_GAP_REL = 1e-4  # relative duality gap below which a pattern is accepted as optimal (see PenaltyOptions)


@dataclass(frozen=True)
class PenaltyOptions:
    """Parameters of the U-solver (ALGORITHM.md §3.4, §3.5 and §11).

    ``eps1_rel`` scales the KKT tolerance: eps1 = eps1_rel * ||M||_F (on the
    normalised data, so scale-free; it was max(1, ||M||_F) before, which
    made small data solve to an absolute tolerance).
    Default 1e-2 [C] (ALGORITHM.md proposes 1e-6): the candidate is rounded
    and polished afterwards, and we measured the same brute-force optimality
    rate and no worse residuals at 1e-2, for ~4x fewer penalty iterations.
    ``sigma0_rel`` scales sigma0 = sigma0_rel * (||B|| + ||A|| + rho1).
    ``use_penalty=False`` never runs the penalty stage (comparison only).
    ``certify=True`` [C] skips the penalty stage when the support search from
    a cheap start (U^k, then the row-wise argmax of M) ends in a pattern whose
    duality gap (:func:`duality_gap`) is below ``gap_rel``: that pattern is
    then within a factor gap_rel of the global optimum of (7), so the penalty
    can improve <U, M> by at most that fraction.  Default gap_rel = 1e-4 [C]:
    on 142 U-steps captured from BBCSport fits (r = 5, 10) the gaps left by the
    support search were 0 or 1e-9..4e-5; at 1e-12 / 1e-9 / 1e-6 the penalty ran
    in 30-40 % / 30 % / 12 % of the calls (8-30x slower) and never once improved
    the result (measured with the batched search of commit f503615), and on
    the 60 tiny brute-force instances the optimum count is 53/60 both at
    gap_rel = 1e-4 and 1e-12 (53/60 for the previous solver too).
    ``argmax_start`` polishes the row-wise argmax of M as a second cheap start
    before the penalty (default False, as before: it changes which of several
    near-equal local optima is returned, and with it the federated trajectory
    -- the synthetic h = 0.6 run needed 17 rounds instead of 12).  Without it
    the argmax start is still polished when the penalty output cannot be
    rounded.
    """

    eps1_rel: float = 1e-2
    sigma0_rel: float = 1e-2
    omega: float = 10.0
    sigma_max: float = 1e8
    feas_tol: float = 1e-10
    max_outer: int = 60
    max_inner: int = 500
    gamma: float = 0.85  # Zhang-Hager averaging
    armijo: float = 1e-4
    use_penalty: bool = True
    polish: bool = True
    argmax_start: bool = False
    certify: bool = True
    gap_rel: float = _GAP_REL


@dataclass(frozen=True)
class UStepInfo:
    """What one U-step did: penalty iterations and which candidate won.

    ``certified`` is True when the returned pattern's duality gap certifies
    it as a global optimum of (7) (see :func:`duality_gap`).
    """

    inner_iterations: int
    outer_iterations: int
    rounded: bool
    source: str  # "penalty", "previous", "argmax" or "safeguard"
    gain: float  # <U_new - U_prev, M> = phi(U_prev) - phi(U_new) >= 0
    certified: bool = False


# ----------------------------------------------------------------------------- helpers


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
    iters: int = 30,
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
    finishes.  Kept from the previous solver because its fixed point is exactly
    a zero-duality-gap pattern (:func:`duality_gap`), i.e. a global optimum, and
    because it keeps the federated trajectories of the previous solver.

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
    greedy (:func:`_greedy`) then finishes.  Why [C]: from a poor start (r = 40,
    d = 1e5, 5 % of the rows misplaced) the reweighting sweeps do not settle
    and O(d) greedy moves remain, each O(d) (~50 s per call); batches make
    hundreds of moves per O(d r) sweep.  With few improving rows (always the
    case at the synthetic d_p = 20, and in federated steps after the first)
    the result is exactly the greedy's, which keeps the previous solver's
    trajectories.

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
    with S_j = sum_{i in J_j} P_ij.  The previous solver rebuilt the whole
    d x r gain table for every move (O(d r) per move, O(d^2 r) per call when
    O(d) rows move).  A move changes S in two columns only, so here we keep IN,
    OUT and every row's best move (column, gain) and refresh per move:
    IN in the two columns (O(d)), OUT for the rows of those columns, and the
    full row best only for rows that belong to, or had their best move into,
    one of them; every other row just compares its best with the two new
    entries.  Same move sequence as the old greedy (ties aside), O(d) numpy
    work per move instead of O(d r).  Stops when no move gains more than
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


def _search(P, a, Mn, max_moves, has_mass=None):
    """Reweighting, bulk, greedy (see :func:`polish`); returns ``(pattern, fixed)``.

    ``fixed``: the reweighting ended at a fixed point, which no exact move
    improves (see :func:`_reweighted`): bulk and greedy are skipped, and the
    pattern's duality gap is exactly 0.
    """
    a, fixed = _reweighted(P, a, Mn, has_mass=has_mass)
    if fixed:
        return a, True
    a, state = _bulk(P, a, max_moves)
    return _greedy(P, a, max_moves, state), False


def stiefel_residual(U: np.ndarray) -> float:
    """``||U^T U - I||_F`` (0 on the Stiefel manifold)."""
    return float(np.linalg.norm(U.T @ U - np.eye(U.shape[1])))


# ----------------------------------------------------------------------------- penalty


def _penalty(A, B, Uk, rho1, U0, opts: PenaltyOptions, eps1: float):
    """Exact penalty on Ob_+ (EP4Orth's first-order subsolver, ALGORITHM.md §3.4).

    P_sigma(U) = -<U,B> + 1/2 <U A, U> + rho1/2 ||U - Uk||^2 + sigma/r ||U 1||^2
    (constants dropped; v = 1/sqrt(r) 1, p = 1, eps = 0).  A (r x r), B, Uk,
    U0 (d x r).  Called on data divided by a power of two ~ max|M| (see
    :func:`solve_u`), and every step bound is relative: sigma's floor to the
    data norm, the BB step clip to the initial step 1/L of the outer iteration
    (it was [1e-12, 1e12] absolute, which made data scaled by 1e6 take
    400-1000x more iterations).
    """
    d, r = U0.shape
    normA2 = float(np.linalg.eigvalsh(A)[-1]) if r else 0.0
    data_norm = float(np.linalg.norm(B) + np.linalg.norm(A) + rho1)
    sigma = opts.sigma0_rel * data_norm
    sigma = max(sigma, 1e-8 * max(data_norm, np.finfo(float).tiny))
    U = U0
    n_inner = 0
    outer = 0
    for outer in range(1, opts.max_outer + 1):
        c2 = 2.0 * sigma / r

        def fg(U):
            UA = U @ A
            u1 = U.sum(axis=1)
            D = U - Uk
            f = -np.vdot(U, B) + 0.5 * np.vdot(UA, U) + 0.5 * rho1 * np.vdot(D, D) + 0.5 * c2 * (u1 @ u1)
            G = UA - B + rho1 * D + c2 * u1[:, None]
            return f, G

        f, G = fg(U)
        Cref, Q = f, 1.0
        t = t_ref = 1.0 / (normA2 + rho1 + 2.0 * sigma)
        t_min, t_max = 1e-12 * t_ref, 1e12 * t_ref  # relative BB clip
        for _ in range(opts.max_inner):
            rg = G - U * np.einsum("ij,ij->j", U, G)
            kkt = np.minimum(U, rg)
            if np.vdot(kkt, kkt) <= eps1 * eps1:
                break
            n_inner += 1
            while True:
                Un = proj_ob(U - t * G)
                fn, Gn = fg(Un)
                S = Un - U
                ss = np.vdot(S, S)
                if fn <= Cref - (opts.armijo / t) * ss or t < t_min:
                    break
                t *= 0.5
            Y = Gn - G
            sy = abs(np.vdot(S, Y))
            t = min(max(ss / sy, t_min), t_max) if sy > 0 else t_max if ss == 0 else t
            Qn = opts.gamma * Q + 1.0
            Cref = (opts.gamma * Q * Cref + fn) / Qn
            Q = Qn
            U, f, G = Un, fn, Gn
            if ss == 0:
                break
        u1 = U.sum(axis=1)
        if u1 @ u1 / r - 1.0 <= opts.feas_tol:
            break
        sigma = min(opts.sigma_max * data_norm, opts.omega * sigma)
    return U, n_inner, outer


def solve_u(
    B: np.ndarray,
    A: np.ndarray,
    U_prev: np.ndarray,
    rho1: float,
    options: PenaltyOptions | None = None,
) -> tuple[np.ndarray, UStepInfo]:
    """Solve the U-subproblem (7) approximately; never worse than ``U_prev``.

    Parameters
    ----------
    B : ndarray of shape (d_p, r)
        ``2 X_p V^T`` for the current local V.
    A : ndarray of shape (r, r)
        ``2 V V^T``.
    U_prev : ndarray of shape (d_p, r)
        The prox centre U^k, feasible (U >= 0, U^T U = I).
    rho1 : float, >= 0
        Proximal weight.

    Returns
    -------
    U : ndarray of shape (d_p, r) in S_+ with phi(U) <= phi(U_prev).
    info : UStepInfo

    Stages, cheapest first, stopping at the first pattern whose duality gap
    certifies global optimality (:func:`duality_gap`, [C]):
    1. support search (:func:`polish`) from U^k's pattern -- in a federated
       run V changes little between steps, so this is usually certified after
       a few O(d r) reweighting sweeps and O(d) moves.  When the sweeps end at
       a fixed point that needed no repair (76 % / 57 % of the warm calls of
       BBCSport fits at r = 5 / 10), no exact move can gain and the gap is
       exactly 0 (:func:`_reweighted`), so bulk, greedy and the gap are
       skipped: the call costs ~20 vectorised O(d r) passes;
    2. the same from the row-wise argmax of M (only with ``argmax_start``);
    3. the exact penalty (§3.4) warm-started at U^k, rounded and polished.
    The best candidate under the exact objective <U, M> wins; the safeguard
    returns U^k if none beats it (sufficient descent, §3.4 last line).

    Scale: B, A, rho1 are divided by a power of two ~ max|M| first (exact in
    floating point), so solve_u(cB, cA, U, c rho1) returns the same U as
    solve_u(B, A, U, rho1) with the same iteration counts, and no quantity
    overflows before |M| ~ 1e308.
    """
    opts = options or PenaltyOptions()
    M = B + rho1 * U_prev
    s = _pow2_scale(M)
    if s == 1.0 and not np.any(M):  # M = 0: every feasible U is optimal; keep U^k
        return U_prev, UStepInfo(0, 0, False, "safeguard", 0.0, True)
    Mn = M / s
    P = np.square(np.maximum(Mn, 0.0))
    has_mass = _row_max(P) > 0
    base = float(np.vdot(U_prev, Mn))  # score of U_prev; phi = const - s * score

    n_inner = n_outer = 0
    rounded = certified = False
    best_src, best_U, best_score = "safeguard", U_prev, base
    max_moves = 4 * M.shape[0]
    seen: list[np.ndarray] = []

    def consider(src: str, a0: np.ndarray) -> bool:
        """Polish the start ``a0``; keep it if best; True if certified optimal."""
        nonlocal best_src, best_U, best_score
        a0 = _repair(a0, Mn)
        if any(np.array_equal(a0, b) for b in seen):  # same start, same result
            return False
        seen.append(a0)
        a, fixed = _search(P, a0, Mn, max_moves, has_mass) if opts.polish else (a0, False)
        U = u_from_assignment(Mn, a)
        score = float(np.vdot(U, Mn))
        if score > best_score + 1e-14 * abs(best_score):
            best_src, best_U, best_score = src, U, score
        if not opts.certify:
            return False
        if fixed:  # the reweighting's fixed point: gap exactly 0 (see _reweighted)
            return score >= best_score - 1e-14 * abs(best_score)
        value, gap = duality_gap(P, a)
        return gap <= opts.gap_rel * value and score >= best_score - 1e-14 * abs(best_score)

    certified = consider("previous", assignment_from_u(U_prev))
    if not certified and opts.argmax_start:
        am = np.argmax(Mn, axis=1)
        am[~(Mn[np.arange(Mn.shape[0]), am] > 0.0)] = -1
        certified = consider("argmax", am)
    if not certified and opts.use_penalty:
        eps1 = opts.eps1_rel * float(np.linalg.norm(Mn))
        Up, n_inner, n_outer = _penalty(A / s, B / s, U_prev, rho1 / s, proj_ob(U_prev), opts, eps1)
        Ur, rounded = round_st(Up)
        if rounded:
            certified = consider("penalty", assignment_from_u(Ur))
    if not certified and not rounded and not opts.argmax_start:
        am = np.argmax(Mn, axis=1)
        am[~(Mn[np.arange(Mn.shape[0]), am] > 0.0)] = -1
        certified = consider("argmax", am)
    info = UStepInfo(n_inner, n_outer, rounded, best_src, s * (best_score - base), certified)
    return best_U, info
