"""Shamir secret sharing of 32-byte secrets over the prime field GF(2^256 + 297).

Used by secure aggregation's threshold recovery (:mod:`fedsonmf.federation.secagg`): a
secret ``s`` (read as an integer < 2^256 < P) is the constant term of a random polynomial
``f`` of degree ``t - 1``; the share of holder ``x`` (a nonzero field element) is ``f(x)``.
Any ``t`` shares give ``s`` by Lagrange interpolation at 0; any ``t - 1`` of them are
uniformly distributed on GF(P)^(t-1) whatever ``s`` is (the ``t - 1`` random coefficients
are uniform and the evaluation map at ``t - 1`` distinct nonzero points together with the
fixed ``f(0) = s`` is a bijection), so they say nothing about it.

Randomness: :func:`secrets.randbelow` (the OS's entropy).  The arithmetic is Python's
integers (exact); a share is 33 bytes big-endian.  No library in the dependencies offers
sharing over a prime field without flwr (pycryptodome's ``Shamir``, which flwr uses, works on
16-byte secrets over GF(2^128) in pure Python and comes with flwr only).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

from fedsonmf.exceptions import ProtocolError

__all__ = ["PRIME", "SHARE_BYTES", "split", "reconstruct", "to_bytes", "from_bytes"]

#: the field's prime, 2^256 + 297 (the smallest prime above 2^256): every 32-byte secret is an element
PRIME = 2 ** 256 + 297
#: bytes of one share (an element of GF(PRIME), big-endian)
SHARE_BYTES = 33


def _check_xs(xs: Sequence[int]) -> list[int]:
    out = [int(x) for x in xs]
    if any(not 0 < x < PRIME for x in out) or len(set(out)) != len(out):
        raise ValueError(f"Shamir holders must be distinct nonzero field elements, got {out}")
    return out


def split(secret: int | bytes, t: int, xs: Sequence[int]) -> list[int]:
    """The shares ``f(x)`` for every ``x`` in ``xs`` of ``secret`` (an int < 2^256, or 32 bytes
    big-endian) with threshold ``t`` (1 <= t <= len(xs))."""
    s = int.from_bytes(bytes(secret), "big") if isinstance(secret, (bytes, bytearray)) else int(secret)
    xs = _check_xs(xs)
    if not 0 <= s < 2 ** 256:
        raise ValueError("a Shamir secret must be below 2^256 (32 bytes)")
    if not 1 <= int(t) <= len(xs):
        raise ValueError(f"threshold {t} must lie in [1, {len(xs)}] (the number of holders)")
    coeffs = [s] + [secrets.randbelow(PRIME) for _ in range(int(t) - 1)]
    out = []
    for x in xs:
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        out.append(y)
    return out


def reconstruct(points: Mapping[int, int], t: int) -> bytes:
    """The 32-byte secret from at least ``t`` shares ``{x: f(x)}`` (the ``t`` of smallest ``x``).

    Raises :class:`~fedsonmf.exceptions.ProtocolError` with fewer than ``t`` shares, or when
    the value at 0 is not below 2^256 (only a wrong share gives that; a wrong share almost
    always gives a wrong 32-byte value instead, which secure aggregation's bound on the decoded
    sum catches: :func:`fedsonmf.federation.secagg.check_sum_bound`).
    """
    if len(points) < int(t):
        raise ProtocolError(f"Shamir: {len(points)} shares, the threshold is {t}")
    pts = sorted((int(x), int(y) % PRIME) for x, y in points.items())[: int(t)]
    _check_xs([x for x, _ in pts])
    s = 0
    for i, (xi, yi) in enumerate(pts):
        num, den = 1, 1
        for j, (xj, _) in enumerate(pts):
            if j != i:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        s = (s + yi * num * pow(den, -1, PRIME)) % PRIME
    if s >= 2 ** 256:
        raise ProtocolError("Shamir: the shares do not interpolate to a 32-byte secret (a wrong share)")
    return s.to_bytes(32, "big")


def to_bytes(y: int) -> bytes:
    return int(y).to_bytes(SHARE_BYTES, "big")


def from_bytes(b: bytes) -> int:
    if len(b) != SHARE_BYTES:
        raise ProtocolError(f"Shamir: a share is {SHARE_BYTES} bytes, got {len(b)}")
    return int.from_bytes(bytes(b), "big")
