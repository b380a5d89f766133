"""The Gaussian mechanism of a client's upload: clip, then add noise (pure maths).

A client releases ``ref + clip(A - ref, C) + N(0, std^2 I)`` instead of ``A``,
where ``ref`` is a point the receiver already knows (for the proposed method's
round upload: V^s, so only the client's *change* of V is clipped) and
``clip(D, C) = D * min(1, C / ||D||_F)``.  Two datasets of the client then give
clipped values at most ``2 C`` apart (L2), whatever the rest of the state: the
sensitivity that :mod:`fedsonmf.protocol.privacy` accounts for.

What this protects, and what not, is stated in :mod:`fedsonmf.protocol.privacy`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["clip_frobenius", "gaussian_release"]


def clip_frobenius(D: np.ndarray, clip: float) -> tuple[np.ndarray, float]:
    """``D * min(1, clip / ||D||_F)`` and ``||D||_F`` (before clipping).

    >>> clip_frobenius(np.array([[3.0, 4.0]]), 1.0)[0]
    array([[0.6, 0.8]])
    """
    D = np.asarray(D, dtype=np.float64)
    norm = float(np.sqrt(np.vdot(D, D)))
    if norm > clip:
        return D * (clip / norm), norm
    return D.copy(), norm


def gaussian_release(A: np.ndarray, ref: np.ndarray | None, clip: float, std: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """The released version of ``A`` (same shape) and the norm of ``A - ref`` before clipping.

    A : (r, k) the value the client would upload;  ref : (r, k) a public point, or None (zero);
    clip : C > 0;  std : the noise standard deviation per entry (the caller sets
    it to noise multiplier x sensitivity 2C);  rng : the client's own noise stream.
    """
    A = np.asarray(A, dtype=np.float64)
    base = np.zeros_like(A) if ref is None else np.asarray(ref, dtype=np.float64)
    if base.shape != A.shape:
        raise ValueError(f"reference of shape {base.shape} for an upload of shape {A.shape}")
    D, norm = clip_frobenius(A - base, clip)
    return base + D + rng.normal(0.0, std, size=A.shape), norm
