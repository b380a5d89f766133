"""The server step (ALGORITHM.md §5).

Vbar^{s+1} = V^s + eta_g ((1/m) sum_p Vhat_p^{s,tau} - V^s)     (pre-proximal, broadcast)
V^{s+1}    = P_{eta_tilde mu}(Vbar^{s+1})                      (post-proximal)

Equivalently Vbar^{s+1} = V^s - eta_tilde G^s: a centralised prox-gradient step
with the trajectory-average gradient.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fedsonmf.core.prox import prox_l21_nonneg

__all__ = ["aggregate", "server_step"]


def aggregate(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Plain mean of the clients' matrices, summed in the given (client) order."""
    if len(arrays) == 0:
        raise ValueError("no client replies to aggregate")
    out = np.array(arrays[0], dtype=np.float64, copy=True)
    for a in arrays[1:]:
        out += a
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
    Vbar_next = V + eta_g * (aggregate(Vhats) - V)
    return Vbar_next, prox_l21_nonneg(Vbar_next, eta_tilde * mu)
