"""The server step (docs/algorithm.md §5).

Vbar^{s+1} = V^s + eta_g ((1/m) sum_p Vhat_p^{s,tau} - V^s)     (pre-proximal, broadcast)
V^{s+1}    = P_{eta_tilde mu}(Vbar^{s+1})                      (post-proximal)

Equivalently Vbar^{s+1} = V^s - eta_tilde G^s: a centralised prox-gradient step
with the trajectory-average gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsonmf.core.prox import prox_l21_nonneg, shared_prox

__all__ = ["total", "aggregate", "server_step", "server_step_from_mean", "embed_new_samples"]


def total(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Sum of the clients' matrices in the given (client) order, as float64 (a new array)."""
    if len(arrays) == 0:
        raise ValueError("no client replies to aggregate")
    out = np.array(arrays[0], dtype=np.float64, copy=True)
    for a in arrays[1:]:
        out += a
    return out


def aggregate(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Plain mean of the clients' matrices, summed in the given (client) order."""
    out = total(arrays)
    out /= len(arrays)
    return out


def server_step(V: np.ndarray, Vhats: Sequence[np.ndarray], eta_g: float, eta_tilde: float, mu: float):
    """One server update.

    Parameters
    ----------
    V : ndarray of shape (r, n), the post-proximal V^s.
    Vhats : sequence of ndarray of shape (r, n), the clients' uploads, in client order.

    Returns
    -------
    Vbar_next, V_next : ndarrays of shape (r, n)
    """
    return server_step_from_mean(V, aggregate(Vhats), eta_g, eta_tilde, mu)


def server_step_from_mean(V: np.ndarray, Vhat_mean: np.ndarray, eta_g: float, eta_tilde: float, mu: float):
    """:func:`server_step` given the mean of the uploads (r, n) -- all the server needs of them,
    which is what secure aggregation relies on.  Returns ``(Vbar_next, V_next)``, both read-only:
    they are the server's state, and in one process the clients share its V (:func:`shared_prox`)."""
    Vbar_next = np.subtract(Vhat_mean, V)  # V + eta_g (mean - V) in one r x n array, bit for bit
    Vbar_next *= eta_g
    Vbar_next += V
    Vbar_next.flags.writeable = False
    return Vbar_next, shared_prox(Vbar_next, eta_tilde * mu)


def embed_new_samples(UtXs: Sequence[np.ndarray], mu: float) -> np.ndarray:
    """The V of new samples for fixed bases: the server's half of an out-of-sample round.

    Each client p sends ``U_p^T X_p`` (r x n_new) for the new columns; the server
    returns ``P_{mu/2}(mean_p U_p^T X_p)`` (r x n_new).

    Why [C]: with U_p^T U_p = I, (1/m) sum_p ||X_p - U_p V||^2 = ||V - mean_p U_p^T X_p||^2
    + const, so ``argmin_{V >= 0} ||V - Ubar||^2 + mu ||V||_{2,1}`` is exactly the prox with
    threshold mu/2 -- the V-subproblem solved to optimality in one step.  A converged
    fit satisfies the same fixed-point equation (V = P_{eta mu}(V - eta * 2 (V - Ubar))
    holds for every eta > 0 iff V = P_{mu/2}(Ubar)), so embedding the training
    samples reproduces the fitted V at convergence.
    """
    return prox_l21_nonneg(aggregate(UtXs), 0.5 * mu)
