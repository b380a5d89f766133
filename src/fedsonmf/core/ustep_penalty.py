"""The exact-penalty stage of the U-step (docs/algorithm.md §3.3-§3.4; Jiang et al. 2023, EP4Orth).

min over Ob_+ of phi(U) + sigma (||U v||^2 - 1), v = 1_r / sqrt(r): projected gradient with
Barzilai-Borwein steps and the Zhang-Hager nonmonotone line search, sigma raised until the
columns are orthogonal.  Its output is rounded and polished by the caller
(:func:`fedsonmf.core.ustep.solve_u`).
"""

from __future__ import annotations

import numpy as np

from fedsonmf.core import _search_kernel as _kernel
from fedsonmf.core.ustep_patterns import proj_ob

__all__ = ["penalty", "live_rows"]

#: run the penalty loops compiled (numba installed); False: the NumPy loops below
COMPILED = _kernel.AVAILABLE


def live_rows(B, Uk, rho1, U0) -> np.ndarray | None:
    """The rows (sorted indices) the penalty iteration can move, or None when that is every row.

    A row that is zero in B, in the start U0 and (when rho1 > 0) in Uk has a zero gradient at
    zero, so every iterate keeps it zero: a feature absent from every sample of the view (a
    corpus's vocabulary on a subset of its documents: 47-76 % of the columns of a 600-document
    Reuters copy) costs the iteration nothing but time.  The first r such rows are kept all the
    same: a column with no positive entry becomes the unit vector at the argmax of its step
    (``proj_ob``), which may be a zero row, at most r of them at a time, the first ones first.
    """
    live = np.any(B != 0, axis=1) | np.any(U0 != 0, axis=1)
    if rho1 != 0:
        live |= np.any(Uk != 0, axis=1)
    idle = np.flatnonzero(~live)
    r = U0.shape[1]
    if idle.size <= r:
        return None
    live[idle[:r]] = True
    return np.flatnonzero(live)


def penalty(A, B, Uk, rho1, U0, opts, eps1: float, compiled: bool | None = None, compact: bool = True):
    """Exact penalty on Ob_+ (EP4Orth's first-order subsolver, docs/algorithm.md §3.4).

    P_sigma(U) = -<U,B> + 1/2 <U A, U> + rho1/2 ||U - Uk||^2 + sigma/r ||U 1||^2
    (constants dropped; v = 1/sqrt(r) 1, p = 1, eps = 0).  A (r x r), B, Uk,
    U0 (d x r).  Called on data divided by a power of two ~ max|M| (see
    :func:`solve_u`), and every step bound is relative: sigma's floor to the
    data norm, the BB step clip to the initial step 1/L of the outer iteration
    (an absolute clip makes scaled data take far more iterations: docs/speed.md).

    ``compact``: iterate on the rows that can move only (:func:`live_rows`; the others stay
    exactly zero).  The compiled loops then give the same iterates bit for bit (they add the
    rows one by one, and a zero row adds exact zeros); the NumPy loops' BLAS sums may differ
    in the last bit.
    """
    d, r = U0.shape
    normA2 = float(np.linalg.eigvalsh(A)[-1]) if r else 0.0
    data_norm = float(np.linalg.norm(B) + np.linalg.norm(A) + rho1)  # of the whole B: sigma as without compaction
    sigma = opts.sigma0_rel * data_norm
    sigma = max(sigma, 1e-8 * max(data_norm, np.finfo(float).tiny))
    rows = live_rows(B, Uk, rho1, U0) if compact else None
    if rows is not None:
        U, n_inner, outer = _iterate(A, B[rows], Uk[rows], rho1, U0[rows], opts, eps1, sigma, data_norm,
                                     normA2, compiled)
        full = np.zeros((d, r))
        full[rows] = U
        return full, n_inner, outer
    return _iterate(A, B, Uk, rho1, U0, opts, eps1, sigma, data_norm, normA2, compiled)


def _iterate(A, B, Uk, rho1, U0, opts, eps1, sigma, data_norm, normA2, compiled):
    """The penalty's outer and inner iterations from ``U0`` (``penalty``'s loops): ``(U, n_inner, outer)``."""
    r = U0.shape[1]
    if COMPILED if compiled is None else compiled:
        return _kernel.penalty(A, B, Uk, rho1, U0, eps1, sigma, opts.sigma_max * data_norm, normA2, opts)
    U = U0
    n_inner = 0
    outer = 0
    for outer in range(1, opts.max_outer + 1):  # noqa: B007 - the count is returned after the loop
        c2 = 2.0 * sigma / r

        def fg(U, c2=c2):  # bound now: the closure is used within this outer iteration
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

