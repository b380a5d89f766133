"""Objective, gradients and the U-block stationarity measure (docs/algorithm.md §1, §7.2).

f_p(U, V) = ||X_p - U V||_F^2 (no 1/2 factor);  F = (1/m) sum_p f_p + mu ||V||_{2,1}.
"""

from __future__ import annotations

import numpy as np

from fedsonmf.core._linalg import sqnorm, ut_x
from fedsonmf.core.prox import l21_norm

__all__ = ["loss", "loss_from_products", "grad_v", "grad_v_orth", "grad_u", "objective", "stationarity_u"]


def loss_from_products(x_sqnorm: float, UtX: np.ndarray, UtU: np.ndarray, V: np.ndarray) -> float:
    """``||X - U V||^2`` from ``||X||^2``, ``U^T X`` (r x n) and ``U^T U`` (r x r)."""
    val = x_sqnorm - 2.0 * float(np.vdot(UtX, V)) + float(np.vdot(UtU, V @ V.T))
    return max(val, 0.0)


def loss(X, U: np.ndarray, V: np.ndarray) -> float:
    """``f_p(U, V) = ||X - U V||_F^2`` for X of shape (d_p, n), dense or sparse."""
    return loss_from_products(sqnorm(X), ut_x(U, X), U.T @ U, V)


def grad_v(UtU: np.ndarray, UtX: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``grad_V f_p = 2 U^T (U V - X)`` of shape (r, n), from cached products."""
    return 2.0 * (UtU @ V - UtX)


def grad_v_orth(UtX: np.ndarray, V: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``grad_V f_p = 2 (V - U^T X)`` when U^T U = I (true for every U-step output:
    disjoint supports, unit columns); saves the r x r x n product U^T U V."""
    out = np.subtract(V, UtX, out=out)
    out *= 2.0
    return out


def grad_u(U: np.ndarray, XVt: np.ndarray, VVt: np.ndarray) -> np.ndarray:
    """``grad_U f_p = 2 (U V - X) V^T = 2 (U V V^T - X V^T)`` of shape (d_p, r)."""
    return 2.0 * (U @ VVt - XVt)


def objective(Xs, Us, V: np.ndarray, mu: float) -> float:
    """``F({U_p}, V) = (1/m) sum_p ||X_p - U_p V||^2 + mu ||V||_{2,1}``.

    ``Xs`` are views of shape (d_p, n) (the internal orientation).
    """
    return float(np.mean([loss(X, U, V) for X, U in zip(Xs, Us)])) + mu * l21_norm(V)


def stationarity_u(U: np.ndarray, G: np.ndarray, tol: float = 1e-12) -> float:
    """``dist^2(0, G + N(U))`` for the regular normal cone of S_+ at U (§7.2).

    On the support J_j of column j only the part of G_{J_j, j} orthogonal to
    U_{J_j, j} counts; on zero rows of U only negative entries of G count;
    entries in a row owned by another column are free.
    """
    supp = U > tol
    lam = np.einsum("ij,ij->j", U, G)
    W = G - U * lam
    on_support = float(np.sum(np.square(W[supp])))
    zero_rows = ~supp.any(axis=1)
    off = float(np.sum(np.square(np.minimum(G[zero_rows], 0.0))))
    return on_support + off
