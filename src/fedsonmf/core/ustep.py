"""The local U-subproblem (docs/algorithm.md §3) and its exact-penalty solver.

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
guaranteed (the theory's Assumption 2 assumes it), except for a square view
(d_p = r, a narrow view zero-padded up to r): there S_+ is the permutation
matrices and (7) is a linear assignment, solved exactly (:func:`solve_square`).

The solver only needs the two Gram-type products ``B = 2 X V^T`` (d x r) and
``A = 2 V V^T`` (r x r): the one pass over X_p happens in the caller.

This module is the orchestration; the pieces live in one file each:
:mod:`~fedsonmf.core.ustep_patterns` (patterns of S_+, projection, rounding),
:mod:`~fedsonmf.core.ustep_search` (the support search and its duality-gap certificate),
:mod:`~fedsonmf.core.ustep_penalty` (the exact-penalty stage).  Their public names are
importable from here.  Measurements behind the defaults: docs/speed.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from fedsonmf.core.ustep_patterns import (  # noqa: F401  (re-exported)
    _col_max,
    _normalise_columns,
    _pow2_scale,
    _repair,
    _row_max,
    assignment_from_u,
    proj_ob,
    round_st,
    stiefel_residual,
    u_from_assignment,
)
from fedsonmf.core.ustep_penalty import penalty as _penalty
from fedsonmf.core.ustep_search import (  # noqa: F401  (re-exported)
    _BULK_MIN,
    _GAIN_REL,
    _bulk,
    _column_sums,
    _greedy,
    _GreedyState,
    _pattern_sums,
    _reweighted,
    _score,
    _search,
    duality_gap,
    polish,
)

__all__ = [
    "PenaltyOptions",
    "UStepInfo",
    "solve_u",
    "solve_square",
    "proj_ob",
    "round_st",
    "polish",
    "assignment_from_u",
    "u_from_assignment",
    "stiefel_residual",
    "duality_gap",
]

# Scale-free solver: ``solve_u`` divides B, A, rho1 (hence M) by a power of two
# s ~ max|M| before doing anything, so every remaining constant is *relative* to
# the data scale, and because that division is exact in binary floating point,
# solve_u(c B, c A, U, c rho1) runs bit-for-bit the same iterations as
# solve_u(B, A, U, rho1) whenever c is a power of two (to rounding level otherwise).
_GAP_REL = 1e-4  # relative duality gap below which a pattern is accepted as optimal (see PenaltyOptions)


@dataclass(frozen=True)
class PenaltyOptions:
    """Parameters of the U-solver (docs/algorithm.md §3.4, §3.5 and §11).

    ``eps1_rel`` scales the KKT tolerance: eps1 = eps1_rel * ||M||_F (on the
    normalised data, so scale-free: an absolute floor would make small data
    solve to an absolute tolerance).
    Default 1e-2 [C] (docs/algorithm.md proposes 1e-6): the candidate is rounded
    and polished afterwards; the same brute-force optimality rate and no worse
    residuals were measured at 1e-2, for fewer penalty iterations (docs/speed.md).
    ``sigma0_rel`` scales sigma0 = sigma0_rel * (||B|| + ||A|| + rho1).
    ``use_penalty=False`` never runs the penalty stage (comparison only).
    ``certify=True`` [C] skips the penalty stage when the support search from
    a cheap start (U^k, then the row-wise argmax of M) ends in a pattern whose
    duality gap (:func:`duality_gap`) is below ``gap_rel``: that pattern is
    then within a factor gap_rel of the global optimum of (7), so the penalty
    can improve <U, M> by at most that fraction (default 1e-4, chosen by
    measurement: docs/speed.md).
    ``argmax_start`` polishes the row-wise argmax of M as a second cheap start
    before the penalty (default False: it changes which of several near-equal
    local optima is returned, and with it the federated trajectory).  Without
    it the argmax start is still polished when the penalty output cannot be
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
    source: str  # "penalty", "previous", "argmax", "assignment" (d = r) or "safeguard"
    gain: float  # <U_new - U_prev, M> = phi(U_prev) - phi(U_new) >= 0
    certified: bool = False



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
       a fixed point that needed no repair (most warm calls), no exact move can
       gain and the gap is exactly 0 (:func:`_reweighted`), so bulk, greedy and
       the gap are skipped;
    2. the same from the row-wise argmax of M (only with ``argmax_start``);
    3. the exact penalty (§3.4) warm-started at U^k, rounded and polished.
    The best candidate under the exact objective <U, M> wins; the safeguard
    returns U^k if none beats it (sufficient descent, §3.4 last line).

    A square view (d_p = r: a view narrower than r padded with zero features) is solved
    exactly instead (:func:`solve_square`): there S_+ is the set of permutation matrices.

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
    base = float(np.vdot(U_prev, Mn))  # score of U_prev; phi = const - s * score
    if Mn.shape[0] == Mn.shape[1]:
        return solve_square(Mn, U_prev, base, s)
    P = np.square(np.maximum(Mn, 0.0))
    has_mass = _row_max(P) > 0

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


def solve_square(Mn: np.ndarray, U_prev: np.ndarray, base: float, s: float) -> tuple[np.ndarray, UStepInfo]:
    """(7) for d_p = r, exactly: the assignment max_pi sum_j Mn[pi(j), j] (O(r^3)).

    Why [C]: the r columns of a U in S_+ have disjoint nonempty supports, so with d = r rows
    each column is one unit entry and U is a permutation matrix; then <U, M> = sum_j M_{pi(j) j}
    is a linear assignment, which ``scipy.optimize.linear_sum_assignment`` solves to global
    optimality.  The penalty stage instead crawled towards a vertex: 524 s for one 100Leaves
    fit (64-feature views padded to r = 200) against 10-13 s for the others.
    ``Mn`` is M divided by the power of two ``s``; ``base`` = <U_prev, Mn>.
    """
    rows, cols = linear_sum_assignment(Mn, maximize=True)
    score = float(Mn[rows, cols].sum())
    if not score > base + 1e-14 * abs(base):  # U^k is optimal too: keep it (no churn between ties)
        return U_prev, UStepInfo(0, 0, False, "safeguard", 0.0, True)
    U = np.zeros_like(Mn)
    U[rows, cols] = 1.0
    return U, UStepInfo(0, 0, False, "assignment", s * (score - base), True)
