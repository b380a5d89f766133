"""Secure aggregation with pairwise masks: the server learns sums, not one client's upload.

The protocol (Bonawitz et al., CCS 2017, full graph, with the active variant's signed keys and
consistency check; ours in the details):

1. **Keys** (setup reply): each client draws an X25519 key pair and sends its public key.
2. **Agreement** (the ``init`` exchange, before round 1): the server relays every public key;
   client p derives with each peer q the pair key ``k_pq = HKDF(X25519(sk_p, pk_q))`` (both ends
   get the same 32 bytes, the server cannot), and uploads its masked setup items (``Vproj`` or
   ``x_sqnorm``), so even V-bar^1 is only seen as a sum.
3. **Every masked exchange**: each summed item x_p (float64) is encoded in fixed point in the
   ring Z_{2^64}, ``q_p = round(x_p 2^f) mod 2^64``, and masked::

       y_p = q_p + sum_{q in cohort, q > p} M_pq - sum_{q in cohort, q < p} M_pq   (mod 2^64)

   with ``M_pq`` a ChaCha20 key stream under the exchange key ``HKDF-Expand(k_pq, label)``, the
   label naming the run, the exchange kind, the round, the cohort and a fresh server nonce, and
   the item: no mask is ever used twice.  Summed over the cohort the masks cancel exactly,
   ``sum_p y_p = sum_p q_p``, and the server decodes ``sum_p x_p`` (to the quantisation error below).
4. **Rounds that may lose clients** (partial participation): double masking with threshold
   recovery (Bonawitz et al.'s, with per-exchange keys) -- each upload also carries a self mask
   from a seed only its client knows, and the client's Shamir shares (threshold t,
   :func:`threshold`; :mod:`fedsonmf.federation.shamir`) of the keys this exchange's masks
   derive from -- its self-mask key and its pair-mask keys with every peer -- each holder's
   shares encrypted with ChaCha20-Poly1305 under a key from their pair key (:func:`deal_shares`).
   The server relays each holder its shares in an ``unmask`` step; a holder reveals, for each
   survivor (an upload the server holds), its share of that survivor's self key and of its pair
   keys with the clients that did not upload, never a share of a dropped client's self key
   (:func:`client_unmask`).  Any t holders' shares rebuild the keys (:func:`reconstruct_keys`),
   which remove exactly the masks of the survivors' sum: up to c - t clients of a cohort of c
   may drop before uploading or during the unmask step; fewer than t uploads or answers fail
   the round with nothing decoded.  A dropped client's late upload stays hidden behind its self
   mask.  The shared keys are this exchange's only (HKDF-Expand of the long-term pair key and
   self seed under the exchange's label), so a rebuild exposes no other round.

Authenticated key agreement (Bonawitz et al.'s active variant, ours in the details): with a
:class:`KeySigner` (each client's long-term Ed25519 key and the public keys of every client,
pinned where the server cannot change them -- the coordinator-signed run config on Flower, the
engine's construction in process):

* the setup reply signs the X25519 public key, bound to the session (the run's id), the run
  seed, the client's index and the cohort size (:func:`key_statement`), so a signature can be
  replayed into no other run and no other slot;
* the ``init`` exchange relays the signatures with the keys; every client verifies each peer's
  signature against that peer's pinned key *before* it derives any pair key, and refuses
  otherwise, naming the slot (:class:`KeyAgreementError`);
* the consistency check: each ``init`` reply carries the client's signed echo of the digest of
  the key list it received; the server relays all echoes with the round-1 message (partial
  rounds: with each round until every client has taken part) and every
  client compares them with its own digest before it masks anything more, so a server that
  showed different key lists to different clients fails the run, the error naming who saw
  which digest.

Bounded uploads [C]: every client refuses to mask an item beyond the exchange's public per-upload
bound ``2^e`` (``bound < 2^e`` below), and the server refuses a decoded sum beyond ``m 2^e``
(:class:`UploadBoundError`, "an upload out of bounds in round k"): an honest upload stays far
inside it (2^16 of headroom over the items' size; measured ~2^-19 of it,
``tests/test_bounded_uploads.py``), and random, shifted or stale masked values decode to sums
far beyond it.

Fixed point [C]: ``f = 61 - ceil(log2 m) - e`` with ``bound < 2^e`` and the public bound
``bound = 2^16 (L + ||V^s||_F)^degree`` of an item of homogeneity ``degree`` (1 for V-like items,
2 for f_p, 4 for r_U); ``L = 2^E``, ``E = max_p ceil(log2 ||X_p||_F)``, is the only new thing the
server learns (each client's E_p, i.e. its view's Frobenius norm to within a factor of 2; once).
Each client checks ``m max|q_p| < 2^63`` itself (so a sum can never wrap) and refuses with
:class:`SecAggRangeError` otherwise.  The rounding error of a mean is at most 2^-(f+1),
i.e. below ``2^-(44 - ceil(log2 m))`` relative to ``(L + ||V||_F)^degree``.

Flower's own primitives were checked and not used (docs/privacy.md): ``secaggplus_utils.pseudo_rand_gen``
seeds NumPy's MT19937 with a 32-bit XOR fold of the shared key (2^32 candidates; a curious server
could search them) and never draws ``num_range - 1``; ``quantization`` clips and rounds stochastically
with the global NumPy stream (not reproducible); the key agreement is the same ``cryptography``
library used here.  One implementation over ``cryptography`` serves both engines.

All functions are pure over arrays, bytes and messages; the client's keys live in its private
state (``ClientState.arrays["secagg.*"]``, saved with it, never sent).  Threat model, what each
party learns and the measurements: docs/privacy.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedsonmf.exceptions import ParameterError, PrivacyWarning, ProtocolError, warn

__all__ = [
    "SecAggRangeError", "generate_keypair", "pair_keys", "mask_stream", "frac_bits", "item_bound", "encode",
    "decode", "mask_items", "ring_sum", "exchange_label", "exchange_key", "remove_revealed", "SECAGG_KEY",
    "MASKED_PREFIX", "HEADROOM_BITS", "warn_two_parties", "KeySigner", "KeyAgreementError", "UploadBoundError",
    "key_statement", "echo_statement", "key_list_digest", "upload_limit", "check_upload_bound",
    "threshold", "exchange_secrets", "deal_shares", "open_shares", "reconstruct_keys", "commit_counted",
]

#: the downlink scalar carrying an exchange's public secure-aggregation parameters (JSON)
SECAGG_KEY = "secagg"
#: reply arrays holding masked items: ``"secagg.<field>.<key>"`` (uint64, the item's shape)
MASKED_PREFIX = "secagg."
#: factor 2^16 between an item's typical size and its bound (room for transients, weights m/c_j)
HEADROOM_BITS = 16
_SAFE_BITS = 61  # m * bound * 2^f <= 2^61 < 2^63: a sum of m encoded items cannot wrap


def warn_two_parties(m: int, dp_enabled: bool = False) -> None:
    """Warn (:class:`~fedsonmf.exceptions.PrivacyWarning`) when secure aggregation runs between exactly
    two clients: each gets the mean of the two uploads back (it is what the server broadcasts), so
    each recovers the other's upload exactly as ``2 * mean - own``; masking hides nothing between
    them, only from the server.  Differential privacy (``dp_epsilon``) is what protects the uploads
    from each other (docs/privacy.md, "Two clients")."""
    if m != 2:
        return
    dp = ("only the run's differential privacy protects them from each other" if dp_enabled
          else "set dp_epsilon (differential privacy) to protect them from each other")
    warn("secure aggregation with 2 clients hides nothing between them: each recovers the other's exact upload "
         f"from the broadcast mean (2 x mean - its own upload), the masks hide the uploads from the server only; "
         f"{dp} (docs/privacy.md, 'Two clients')", PrivacyWarning)


class SecAggRangeError(ProtocolError):
    """A client's item does not fit the fixed-point range of secure aggregation."""


class UploadBoundError(ProtocolError):
    """An upload (or the sum of a masked exchange) lies beyond the public bound of its item."""


class KeyAgreementError(ProtocolError):
    """The relayed secure-aggregation keys are not authentic or not the same for every client."""


def _crypto():
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand
    except ImportError:  # pragma: no cover - cryptography comes with flwr and the [secagg] extra
        raise ParameterError("secure_aggregation=True needs the 'cryptography' package: "
                             "pip install 'fedsonmf[secagg]'") from None
    return hashes, X25519PrivateKey, X25519PublicKey, Cipher, algorithms, HKDF, HKDFExpand


# ----------------------------------------------------------------------------- keys


def generate_keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair ``(private 32 bytes, public 32 bytes)`` from the OS's entropy."""
    _, X25519PrivateKey, _, _, _, _, _ = _crypto()
    sk = X25519PrivateKey.generate()
    return sk.private_bytes_raw(), sk.public_key().public_bytes_raw()


def pair_keys(sk: bytes, public_keys: Sequence[bytes], me: int, context: str) -> np.ndarray:
    """The pair keys of client ``me`` with every client: uint8 array (m, 32), row ``me`` zero.

    ``k_pq = HKDF-SHA256(X25519(sk_p, pk_q), info = context | min(p,q) | max(p,q))``: the same
    bytes at both ends.  Refuses a key list whose entry ``me`` is not this client's own public
    key, or with repeated keys (a relay that mixed them up).
    """
    hashes, X25519PrivateKey, X25519PublicKey, _, _, HKDF, _ = _crypto()
    priv = X25519PrivateKey.from_private_bytes(bytes(sk))
    pks = [bytes(pk) for pk in public_keys]
    if not 0 <= me < len(pks) or pks[me] != priv.public_key().public_bytes_raw():
        raise ProtocolError(f"secure aggregation: the relayed public key of client {me} is not its own")
    if len(set(pks)) != len(pks):
        raise ProtocolError("secure aggregation: the relayed public keys are not distinct")
    out = np.zeros((len(pks), 32), dtype=np.uint8)
    for q, pk in enumerate(pks):
        if q == me:
            continue
        shared = priv.exchange(X25519PublicKey.from_public_bytes(pk))
        lo, hi = min(me, q), max(me, q)
        info = f"fedsonmf-secagg-v1 pair|{context}|{lo}|{hi}".encode()
        out[q] = np.frombuffer(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared),
                               dtype=np.uint8)
    return out


# ----------------------------------------------------------------------------- signed keys


def key_statement(session: str, seed: int, me: int, m: int, pk: bytes) -> bytes:
    """What client ``me`` signs of its X25519 public key ``pk``: the session (the run's id),
    the run seed, its index, the cohort size and the key."""
    return f"fedsonmf-secagg-v1 key|{session}|{int(seed)}|{int(me)}|{int(m)}|{bytes(pk).hex()}".encode()


def echo_statement(session: str, seed: int, me: int, digest: str) -> bytes:
    """What client ``me`` signs of the key list it received (its digest: :func:`key_list_digest`)."""
    return f"fedsonmf-secagg-v1 echo|{session}|{int(seed)}|{int(me)}|{digest}".encode()


def key_list_digest(public_keys: Sequence[str], signatures: Sequence[str]) -> str:
    """sha256 (hex) of the relayed key list: every slot's public key and signature, in order."""
    body = json.dumps([[str(k) for k in public_keys], [str(g) for g in signatures]], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


class KeySigner:
    """A client's long-term Ed25519 signing key and the pinned public keys of every client.

    Parameters
    ----------
    private_key : bytes (32, raw) or cryptography Ed25519PrivateKey
        This client's signing key.
    pinned : sequence of bytes (32, raw)
        The public signing key of every client, by client index, from a source the server
        cannot change (the coordinator-signed run config; the in-process engine's construction).
    session : str
        The run's identity the signatures are bound to (the Flower job id; a fresh random id
        per in-process run).
    me : int
        This client's index; ``pinned[me]`` must be the public half of ``private_key``.
    """

    def __init__(self, private_key, pinned: Sequence[bytes], session: str, me: int):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

        self._key = (private_key if isinstance(private_key, Ed25519PrivateKey)
                     else Ed25519PrivateKey.from_private_bytes(bytes(private_key)))
        try:
            self._pinned = [Ed25519PublicKey.from_public_bytes(bytes(k)) for k in pinned]
        except ValueError as exc:
            raise ParameterError(f"secure aggregation: a pinned signing key is not a 32-byte Ed25519 key ({exc})") \
                from None
        self.session, self.me, self.m = str(session), int(me), len(self._pinned)
        if not 0 <= self.me < self.m:
            raise ParameterError(f"secure aggregation: client {me} has no pinned signing key ({self.m} pinned)")
        if self.public_bytes(self._key) != bytes(pinned[self.me]):
            raise ParameterError(f"secure aggregation: the pinned signing key of client {me} is not the public "
                                 "half of this client's signing key")

    @staticmethod
    def public_bytes(key) -> bytes:
        """The raw 32 bytes of an Ed25519 key's public half."""
        from cryptography.hazmat.primitives import serialization

        return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @classmethod
    def group(cls, m: int, session: str | None = None) -> list[KeySigner]:
        """Fresh signers of ``m`` clients that pin each other (the in-process engine)."""
        import secrets as _secrets

        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        session = _secrets.token_hex(16) if session is None else session
        keys = [Ed25519PrivateKey.generate() for _ in range(int(m))]
        pinned = [cls.public_bytes(k) for k in keys]
        return [cls(k, pinned, session, p) for p, k in enumerate(keys)]

    def sign(self, statement: bytes) -> str:
        return self._key.sign(statement).hex()

    def verify(self, q: int, statement: bytes, signature: str) -> bool:
        """Whether ``signature`` (hex) is client ``q``'s pinned key's signature of ``statement``."""
        from cryptography.exceptions import InvalidSignature

        if not 0 <= int(q) < self.m:
            return False
        try:
            self._pinned[int(q)].verify(bytes.fromhex(str(signature)), statement)
        except (InvalidSignature, ValueError, TypeError):
            return False
        return True

    def check_keys(self, seed: int, public_keys: Sequence[str], signatures) -> str:
        """Verify every slot's signed public key; return the digest of the list (for the echo).

        Raises :class:`KeyAgreementError` naming the first slot whose key is not signed by its
        pinned signing key for this run's session id, seed, slot and cohort size.
        """
        if signatures is None:
            raise KeyAgreementError("secure aggregation: the init message carries no signatures of the public keys, "
                                    "but this client verifies them (its peers' signing keys are pinned): refused")
        sigs = [str(g) for g in signatures]
        if len(public_keys) != self.m or len(sigs) != self.m:
            raise KeyAgreementError(f"secure aggregation: the init message relays {len(public_keys)} public keys and "
                                    f"{len(sigs)} signatures, but {self.m} clients are pinned: refused")
        for q, (pk, sig) in enumerate(zip(public_keys, sigs)):
            try:
                raw = bytes.fromhex(str(pk))
            except ValueError:
                raw = b""
            if not self.verify(q, key_statement(self.session, seed, q, self.m, raw), sig):
                raise KeyAgreementError(
                    f"secure aggregation: the public key relayed for client {q} ({str(pk)[:16]}...) is not signed by "
                    f"client {q}'s pinned signing key for this run and slot: the server (or the network) substituted "
                    "or replayed it; no mask was derived, the run is refused")
        return key_list_digest(public_keys, sigs)

    def check_echoes(self, seed: int, mine: str, echoes) -> None:
        """The consistency check: every client's signed echo of the key-list digest it received
        must verify and equal ``mine``; raises :class:`KeyAgreementError` naming who saw what."""
        if echoes is None:
            raise KeyAgreementError("secure aggregation: the round-1 message carries no key-list echoes, but this "
                                    "client checks that every client received the same keys: refused")
        try:
            pairs = [(str(e["digest"]), str(e["sig"])) for e in echoes]
        except (KeyError, TypeError):
            raise KeyAgreementError("secure aggregation: malformed key-list echoes: refused") from None
        if len(pairs) != self.m:
            raise KeyAgreementError(f"secure aggregation: {len(pairs)} key-list echoes for {self.m} clients: refused")
        for q, (digest, sig) in enumerate(pairs):
            if not self.verify(q, echo_statement(self.session, seed, q, digest), sig):
                raise KeyAgreementError(f"secure aggregation: the key-list echo relayed for client {q} is not signed "
                                        f"by client {q}'s pinned signing key: refused")
        seen = {q: d for q, (d, _) in enumerate(pairs)}
        differ = sorted(q for q, d in seen.items() if d != mine)
        if differ:
            raise KeyAgreementError(
                f"secure aggregation: the server showed different key lists to different clients: client {self.me} "
                f"received key list {mine[:16]}..., but " + ", ".join(f"client {q} received {seen[q][:16]}..."
                                                                        for q in differ)
                + ": the run is refused")


def mask_stream(key: bytes, label: str, count: int) -> np.ndarray:
    """``count`` uniform elements of Z_{2^64} (uint64): ChaCha20 under ``HKDF-Expand(key, label)``."""
    hashes, _, _, Cipher, algorithms, _, HKDFExpand = _crypto()
    k = HKDFExpand(algorithm=hashes.SHA256(), length=32, info=f"fedsonmf-secagg-v1 mask|{label}".encode()).derive(
        bytes(key))
    enc = Cipher(algorithms.ChaCha20(k, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(enc.update(bytes(8 * count)), dtype="<u8").astype(np.uint64, copy=False)


def exchange_key(root: bytes, label: str) -> bytes:
    """The 32-byte key of one exchange derived from a long-term ``root`` (a pair key or a
    client's self-mask seed): revealing it reveals that exchange's masks only."""
    hashes, _, _, _, _, _, HKDFExpand = _crypto()
    return HKDFExpand(algorithm=hashes.SHA256(), length=32,
                      info=f"fedsonmf-secagg-v1 exchange|{label}".encode()).derive(bytes(root))


def exchange_label(context: str, kind: str, round: int, cohort: Sequence[int], nonce: str = "") -> str:
    """The label of one exchange: run, kind, round, cohort and the server's fresh nonce, so
    that no two exchanges (a retried or resumed round included) share a mask."""
    digest = hashlib.sha256(",".join(map(str, sorted(cohort))).encode()).hexdigest()[:16]
    return f"{context}|{kind}|{int(round)}|{digest}|{nonce}"


# ----------------------------------------------------------------------------- fixed point


def item_bound(degree: int, L: float, vnorm: float = 0.0) -> float:
    """The public bound ``2^16 (L + ||V||_F)^degree`` of an item of homogeneity ``degree``."""
    return float(2.0 ** HEADROOM_BITS * (float(L) + float(vnorm)) ** int(degree))


def frac_bits(bound: float, m: int) -> int:
    """Fractional bits f with ``m * bound * 2^f <= 2^61`` (the scale is a power of two: exact)."""
    if not (math.isfinite(bound) and bound > 0):
        raise SecAggRangeError(f"secure aggregation: no finite positive bound ({bound!r}) for the fixed point")
    e = math.frexp(bound)[1]  # bound < 2^e
    return _SAFE_BITS - math.ceil(math.log2(max(int(m), 1))) - e


def upload_limit(bits: int, m: int) -> float:
    """The public per-upload bound ``2^e`` of an item masked at ``bits`` fractional bits in a
    cohort of ``m``: :func:`frac_bits` chose ``bits = 61 - ceil(log2 m) - e`` with the item's
    bound ``< 2^e``, so ``m`` uploads within it sum to at most ``m 2^e <= 2^(61 - bits)``."""
    return math.ldexp(1.0, _SAFE_BITS - math.ceil(math.log2(max(int(m), 1))) - int(bits))


def check_upload_bound(x, bits: int, m: int, name: str = "item") -> None:
    """A client's check of its own item before masking: finite and within :func:`upload_limit`.

    Raises :class:`SecAggRangeError` (nothing is masked or sent).  The bound has 2^16 of
    headroom over the item's size at the round's ``||V||``, so an honest upload reaches it only
    when the run blows up within one round.
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise SecAggRangeError(f"secure aggregation: {name} holds NaN/Inf (the run diverged); not masked, not sent")
    limit = upload_limit(bits, m)
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak > limit:
        raise SecAggRangeError(
            f"secure aggregation: {name} reaches |x| = {peak:.3g}, beyond its public bound {limit:.3g} (beyond the "
            f"fixed-point range of {m} clients' sum); not masked, not sent (the run is diverging: reduce the steps)")


def encode(x, bits: int, m: int, name: str = "item") -> np.ndarray:
    """``round(x 2^bits)`` as uint64 (two's complement), same shape as ``x``.

    Raises :class:`SecAggRangeError` when ``x`` is not finite or ``m`` such values could wrap
    the ring (``m max|q| >= 2^63``).
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise SecAggRangeError(f"secure aggregation: {name} holds NaN/Inf (the run diverged)")
    q = np.rint(np.ldexp(x, int(bits)))
    limit = float((2 ** 63 - 1) // max(int(m), 1))
    peak = float(np.max(np.abs(q))) if q.size else 0.0
    if peak > limit:
        raise SecAggRangeError(
            f"secure aggregation: {name} reaches |x| = {peak * 2.0 ** -bits:.3g}, beyond the fixed-point range "
            f"{limit * 2.0 ** -bits:.3g} of {m} clients (the run is diverging: reduce the steps)")
    return q.astype(np.int64).view(np.uint64)


def decode(s: np.ndarray, bits: int) -> np.ndarray:
    """The float64 value of a ring element (uint64 two's complement) at scale 2^-bits."""
    return np.ldexp(np.asarray(s, dtype=np.uint64).view(np.int64).astype(np.float64), -int(bits))


# ----------------------------------------------------------------------------- masking


def mask_items(items: Mapping[str, np.ndarray], bits: Mapping[str, int], keys: np.ndarray, me: int,
               cohort: Sequence[int], label: str, self_seed: bytes | None = None) -> dict[str, np.ndarray]:
    """Encode and mask client ``me``'s items for the ``cohort`` (which includes ``me``).

    ``items``: name -> float64 array; ``keys``: (m, 32) pair keys of :func:`pair_keys`;
    ``self_seed``: add the client's own self mask too (partial rounds, where it is what
    keeps a dropped client's late upload hidden; removed after the round when the client
    reveals its exchange key).  Returns name -> uint64 array of the same shape.
    """
    cohort = sorted(int(q) for q in cohort)
    if me not in cohort:
        raise ProtocolError(f"secure aggregation: client {me} is not in the exchange's cohort {cohort}")
    m = len(cohort)
    pair_ek = {q: exchange_key(keys[q].tobytes(), "pair|" + label) for q in cohort if q != me}
    self_ek = None if self_seed is None else exchange_key(self_seed, "self|" + label)
    out = {}
    for name in sorted(items):
        if name not in bits:
            raise ProtocolError(f"secure aggregation: the server sent no scale for {name!r}")
        check_upload_bound(items[name], bits[name], m, name)
        y = encode(items[name], bits[name], m, name).ravel().copy()
        for q, ek in pair_ek.items():
            M = mask_stream(ek, name, y.size)
            if me < q:
                y += M  # uint64: wraps mod 2^64
            else:
                y -= M
        if self_ek is not None:
            y += mask_stream(self_ek, name, y.size)
        out[name] = y.reshape(np.shape(items[name]))
    return out


def remove_revealed(total: np.ndarray, name: str, self_keys: Mapping[int, bytes],
                    pair_keys_revealed: Mapping[tuple[int, int], bytes]) -> np.ndarray:
    """Take the revealed masks out of a ring sum: every survivor's self mask and, for each
    survivor p and dropped client q, the pair mask p added for q (whose own upload is missing)."""
    out = np.array(total, dtype=np.uint64, copy=True).ravel()
    for _p, ek in sorted(self_keys.items()):
        out -= mask_stream(ek, name, out.size)
    for (p, q), ek in sorted(pair_keys_revealed.items()):
        M = mask_stream(ek, name, out.size)
        if p < q:
            out -= M
        else:
            out += M
    return out.reshape(np.shape(total))


def ring_sum(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Sum in Z_{2^64} (uint64, wrapping)."""
    if not arrays:
        raise ValueError("no masked uploads to sum")
    out = np.array(arrays[0], dtype=np.uint64, copy=True)
    for a in arrays[1:]:
        out += np.asarray(a, dtype=np.uint64)
    return out


def params_json(cohort: Sequence[int], bits: Mapping[str, int], **extra) -> str:
    """The downlink scalar :data:`SECAGG_KEY` of one masked exchange."""
    return json.dumps({"cohort": [int(q) for q in cohort], "bits": {k: int(v) for k, v in bits.items()}, **extra},
                      sort_keys=True)


def parse_params(text) -> dict:
    try:
        d = json.loads(str(text))
        d["cohort"] = [int(q) for q in d["cohort"]]
        d["bits"] = {str(k): int(v) for k, v in d["bits"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"secure aggregation: malformed '{SECAGG_KEY}' parameters ({exc})") from None
    return d


# ----------------------------------------------------------------------------- threshold recovery


def threshold(value, cohort: int) -> int:
    """The threshold t of an exchange of ``cohort`` clients: ``value`` (an int) or, None, the
    default ``ceil(2 c / 3)``.

    Refused (:class:`~fedsonmf.exceptions.ParameterError`): ``t > c`` (no exchange could
    complete) and ``2 t <= c``: two disjoint groups of t clients would then exist, and a
    server that showed them different survivor lists could collect the self-mask shares of a
    client from one group and its pair-key shares from the other, i.e. unmask it."""
    c = int(cohort)
    t = math.ceil(2 * c / 3) if value is None else value
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise ParameterError(f"secagg_threshold must be None or an integer, got {value!r}")
    t = int(t)
    if t > c or 2 * t <= c:
        raise ParameterError(f"secagg_threshold = {t} does not fit a cohort of {c} clients: it must exceed half "
                             f"the cohort (so that no two disjoint groups of t clients exist) and not exceed it, "
                             f"i.e. lie in [{c // 2 + 1}, {c}]")
    return t


def _share_key(root: bytes, label: str, dealer: int, holder: int) -> bytes:
    """The ChaCha20-Poly1305 key of the shares ``dealer`` deals to ``holder`` in one exchange:
    from their pair key (the dealer's self-mask seed for its own share), so only the holder
    (and the dealer) can read them, never the server that relays them."""
    return exchange_key(root, f"share|{label}|{int(dealer)}|{int(holder)}")


def _share_aad(label: str, dealer: int, holder: int) -> bytes:
    return f"fedsonmf-secagg-v1 share|{label}|{int(dealer)}|{int(holder)}".encode()


def exchange_secrets(pairs: np.ndarray, self_seed: bytes, me: int, cohort: Sequence[int], label: str) -> list[bytes]:
    """What client ``me`` shares in one exchange: its self-mask key, then its pair-mask keys
    with every other client of the cohort (in cohort order) -- the exact keys its masks of this
    exchange derive from (:func:`mask_items`), nothing long-term."""
    out = [exchange_key(self_seed, "self|" + label)]
    out += [exchange_key(pairs[q].tobytes(), "pair|" + label) for q in cohort if q != me]
    return out


def deal_shares(pairs: np.ndarray, self_seed: bytes, me: int, cohort: Sequence[int], label: str,
                t: int) -> np.ndarray:
    """Client ``me``'s Shamir shares (threshold ``t``) of :func:`exchange_secrets`, one
    authenticated ciphertext per holder of the cohort (itself included), for the server to relay:
    uint8 array (|C|, 33 |C| + 16), row i for ``cohort[i]`` (its x-coordinate: index + 1)."""
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    from fedsonmf.federation import shamir

    cohort = sorted(int(q) for q in cohort)
    xs = [q + 1 for q in cohort]
    per_secret = [shamir.split(sec, t, xs) for sec in exchange_secrets(pairs, self_seed, me, cohort, label)]
    rows = []
    for i, h in enumerate(cohort):
        plain = b"".join(shamir.to_bytes(ys[i]) for ys in per_secret)
        root = bytes(self_seed) if h == me else pairs[h].tobytes()
        rows.append(ChaCha20Poly1305(_share_key(root, label, me, h)).encrypt(bytes(12), plain,
                                                                             _share_aad(label, me, h)))
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(cohort), -1).copy()


def open_shares(pairs: np.ndarray, self_seed: bytes, me: int, cohort: Sequence[int], label: str,
                dealers: Sequence[int], inbox) -> list[list[int]]:
    """Holder ``me`` decrypts the shares each of ``dealers`` dealt it (``inbox`` row i from
    ``dealers[i]``): per dealer the |C| field elements, in :func:`exchange_secrets`' order.

    Raises :class:`ProtocolError` naming the dealer when a ciphertext does not authenticate
    (altered, or moved from another dealer, holder or exchange by the relay)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    from fedsonmf.federation import shamir

    c = len(cohort)
    box = np.asarray(inbox) if inbox is not None else None
    width = c * shamir.SHARE_BYTES + 16
    if box is None or box.dtype != np.uint8 or box.shape != (len(dealers), width):
        raise ProtocolError(f"secure aggregation: the unmask request carries no shares of shape "
                            f"({len(dealers)}, {width}) for client {me}: refused")
    out = []
    for i, p in enumerate(dealers):
        root = bytes(self_seed) if p == me else pairs[p].tobytes()
        try:
            plain = ChaCha20Poly1305(_share_key(root, label, p, me)).decrypt(bytes(12), box[i].tobytes(),
                                                                             _share_aad(label, p, me))
        except InvalidTag:
            raise ProtocolError(f"secure aggregation: the shares relayed from client {p} to client {me} do not "
                                "authenticate (altered or moved by the relay): refused, nothing revealed") from None
        out.append([shamir.from_bytes(plain[k * shamir.SHARE_BYTES:(k + 1) * shamir.SHARE_BYTES]) for k in range(c)])
    return out


# ----------------------------------------------------------------------------- the client's side

#: the client's private-state arrays of the protocol (never sent)
STATE_SK, STATE_PAIRS, STATE_ME, STATE_SEED = "secagg.sk", "secagg.pairs", "secagg.me", "secagg.seed"
STATE_SELF, STATE_PENDING = "secagg.self", "secagg.pending."
STATE_LAST, STATE_REVEALED = "secagg.last", "secagg.revealed"  # JSON (uint8) of the last masked / revealed exchange
STATE_DIGEST, STATE_CHECKED = "secagg.digest", "secagg.checked"  # the key list's digest; the echoes checked
#: setup-reply scalar: the signature of the public key; init-reply scalars: the key list's digest, its signed echo
SIG_KEY, DIGEST_KEY, ECHO_KEY = "secagg_sig", "secagg_digest", "secagg_echo"
#: reply arrays of the unmask step (partial rounds)
SELF_KEY, PAIR_KEYS = MASKED_PREFIX + "self_key", MASKED_PREFIX + "pair_keys"
#: threshold recovery: a round reply's encrypted shares (uint8 (|C|, |C| 33 + 16), row h for holder h),
#: the unmask request's shares addressed to its holder (uint8 (|U|, same)), the revealed shares
#: (uint8 (|U|, 1 + |D|, 33): per survivor its self key's share, then its pair keys' with the dropped)
SHARES_KEY, SHARES_IN_KEY, REVEALED_KEY = MASKED_PREFIX + "shares", MASKED_PREFIX + "shares_in", \
    MASKED_PREFIX + "revealed"
_PROTOCOL_ARRAYS = (SELF_KEY, PAIR_KEYS, SHARES_KEY, SHARES_IN_KEY, REVEALED_KEY)


def _bytes(a) -> bytes:
    return np.asarray(a, dtype=np.uint8).tobytes()


def _json_bytes(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj, sort_keys=True).encode(), dtype=np.uint8).copy()


def _json_of(a):
    return json.loads(_bytes(a).decode())


def split_summed(reply, spec: Mapping[str, tuple[str, int]], cols=None, n: int | None = None):
    """``(reply without the summed items, {"field.key": float64 array})``.

    Scalars become shape-(1,) arrays; the r x |Omega_p| column blocks of an incomplete view
    are scattered into r x n zeros (every client's array then has one shape, which the
    pairwise masks need; the column counts are public membership).
    """
    from fedsonmf.protocol.messages import Message

    fields = {"arrays": dict(reply.arrays), "scalars": dict(reply.scalars), "diagnostics": dict(reply.diagnostics)}
    items = {}
    for key, (field, _deg) in spec.items():
        if key not in fields[field]:
            raise ProtocolError(f"secure aggregation: the reply carries no {field} item {key!r} to sum")
        v = np.asarray(fields[field].pop(key), dtype=np.float64)
        if v.ndim == 0:
            v = v.reshape(1)
        elif cols is not None and n is not None and v.ndim == 2 and v.shape[1] == len(cols) != n:
            full = np.zeros((v.shape[0], int(n)), dtype=np.float64)
            full[:, cols] = v
            v = full
        items[f"{field}.{key}"] = v
    plain = Message(reply.kind, reply.round, fields["arrays"], fields["scalars"], fields["diagnostics"])
    return plain, items


def _with_arrays(msg, arrays: Mapping[str, np.ndarray], scalars: Mapping | None = None):
    from fedsonmf.protocol.messages import Message

    return Message(msg.kind, msg.round, {**msg.arrays, **arrays}, {**msg.scalars, **(scalars or {})}, msg.diagnostics)


def client_setup(state, reply, spec, *, me: int, seed: int, x_sqnorm: float, cols=None, n=None,
                 signer: KeySigner | None = None):
    """Setup reply of a client under secure aggregation: a fresh key pair (the private key and
    the summed setup items stay in the private state until the ``init`` exchange) and the
    public key + the exponent ``E_p`` (||X_p||_F < 2^E_p) in place of the summed items; with a
    ``signer``, also the signature ``secagg_sig`` of the public key (:func:`key_statement`)."""
    if signer is not None and int(me) != signer.me:
        raise KeyAgreementError(f"secure aggregation: the setup message names this client {me}, but its pinned "
                                f"signing key is client {signer.me}'s: refused")
    plain, items = split_summed(reply, spec, cols, n)
    sk, pk = generate_keypair()
    arrays = dict(state.arrays)
    arrays[STATE_SK] = np.frombuffer(sk, dtype=np.uint8).copy()
    arrays[STATE_ME], arrays[STATE_SEED] = np.asarray(int(me)), np.asarray(int(seed))
    arrays.update({STATE_PENDING + k: v for k, v in items.items()})
    state = type(state)(state.round, arrays)
    norm = math.sqrt(max(float(x_sqnorm), 0.0))
    exp = math.frexp(norm)[1] if norm > 0 else 0
    scalars: dict[str, Any] = {"secagg_pk": pk.hex(), "secagg_exp": int(exp)}
    if signer is not None:
        scalars[SIG_KEY] = signer.sign(key_statement(signer.session, seed, me, signer.m, pk))
    return state, _with_arrays(plain, {}, scalars)


def client_init(state, msg, signer: KeySigner | None = None):
    """The ``init`` exchange: pair keys from the relayed public keys, a fresh self-mask seed,
    the masked setup items.

    With a ``signer``: every relayed key's signature is verified against its slot's pinned
    signing key before any pair key is derived (:meth:`KeySigner.check_keys`), the cohort must
    be every pinned client, and the reply carries this client's signed echo of the key list's
    digest (``secagg_digest``, ``secagg_echo``) for the consistency check of round 1."""
    import os

    from fedsonmf.protocol.messages import Message

    st = dict(state.arrays)
    if STATE_SK not in st:
        raise ProtocolError("secure aggregation: init message but this client holds no key pair (setup not run "
                            "with secure_aggregation)")
    params = parse_params(msg.scalars.get(SECAGG_KEY))
    me, seed = int(st[STATE_ME]), int(st[STATE_SEED])
    try:
        pks = [bytes.fromhex(h) for h in params["public_keys"]]
    except (KeyError, ValueError, TypeError):
        raise ProtocolError("secure aggregation: the init message carries no valid public keys") from None
    digest = None
    if signer is not None:
        if params["cohort"] != list(range(signer.m)):
            raise KeyAgreementError(f"secure aggregation: the init cohort {params['cohort']} is not the {signer.m} "
                                    "pinned clients: refused")
        digest = signer.check_keys(seed, params["public_keys"], params.get("signatures"))
    keys = pair_keys(_bytes(st.pop(STATE_SK)), pks, me, str(seed))
    st[STATE_PAIRS] = keys
    st[STATE_SELF] = np.frombuffer(os.urandom(32), dtype=np.uint8).copy()
    items = {k[len(STATE_PENDING):]: st.pop(k) for k in list(st) if k.startswith(STATE_PENDING)}
    label = exchange_label(str(seed), "init", 0, params["cohort"], params.get("nonce", ""))
    masked = mask_items(items, params["bits"], keys, me, params["cohort"], label)
    scalars: dict[str, Any] = {}
    if signer is not None and digest is not None:
        st[STATE_DIGEST] = np.frombuffer(digest.encode(), dtype=np.uint8).copy()
        scalars = {DIGEST_KEY: digest, ECHO_KEY: signer.sign(echo_statement(signer.session, seed, me, digest))}
    new = type(state)(state.round, st)
    return new, Message("init", 0, {MASKED_PREFIX + k: v for k, v in masked.items()}, scalars)


def client_mask(state, reply, msg, spec, *, cols=None, n=None, signer: KeySigner | None = None,
                threshold_cfg=None):
    """Mask a round reply's summed items for the message's cohort (plus the self mask when the
    round may lose clients: ``"self": true`` in the parameters).

    Threshold recovery (``"threshold": t`` in the parameters, which must be the t this client's
    own ``threshold_cfg`` gives for the cohort: :func:`threshold`): the reply also carries the
    client's Shamir shares of this exchange's mask keys, encrypted to each holder
    (:func:`deal_shares`, :data:`SHARES_KEY`).

    With a ``signer``, the client's first masked round first runs the consistency check of the
    key agreement (:meth:`KeySigner.check_echoes` on the relayed ``echoes``)."""
    st = dict(state.arrays)
    if STATE_PAIRS not in st:
        raise ProtocolError("secure aggregation: round message before the key agreement (init)")
    params = parse_params(msg.scalars.get(SECAGG_KEY))
    if signer is not None and STATE_CHECKED not in st:
        if STATE_DIGEST not in st:
            raise KeyAgreementError("secure aggregation: this client verifies its peers' keys, but its key agreement "
                                    "ran without signatures: refused")
        signer.check_echoes(int(st[STATE_SEED]), _bytes(st[STATE_DIGEST]).decode(), params.get("echoes"))
        st[STATE_CHECKED] = np.asarray(1)
    plain, items = split_summed(reply, spec, cols, n)
    leftover = sorted(set(plain.arrays) | {k for k, v in plain.diagnostics.items()})
    if leftover:  # privacy by construction: a round reply sends nothing in the clear but scalars
        raise ProtocolError(f"secure aggregation: the round reply would carry {leftover} unmasked; every upload "
                            "must be declared in the algorithm's summed_items")
    me, seed = int(st[STATE_ME]), int(st[STATE_SEED])
    nonce = str(params.get("nonce", ""))
    label = exchange_label(str(seed), msg.kind, msg.round, params["cohort"], nonce)
    self_seed = _bytes(st[STATE_SELF]) if params.get("self") else None
    masked = mask_items(items, params["bits"], st[STATE_PAIRS], me, params["cohort"], label, self_seed=self_seed)
    out = {MASKED_PREFIX + k: v for k, v in masked.items()}
    t = params.get("threshold")
    if t is not None:
        if self_seed is None:
            raise ProtocolError("secure aggregation: a threshold without self masks: refused")
        mine = threshold(threshold_cfg, len(params["cohort"]))
        if int(t) != mine:
            raise ProtocolError(f"secure aggregation: the server asks for threshold {t}, this client's configuration "
                                f"gives {mine} for a cohort of {len(params['cohort'])}: refused")
        out[SHARES_KEY] = deal_shares(st[STATE_PAIRS], self_seed, me, params["cohort"], label, mine)
    st[STATE_LAST] = _json_bytes({"round": int(msg.round), "cohort": params["cohort"], "nonce": nonce,
                                  "self": bool(params.get("self")), "threshold": t})
    return type(state)(state.round, st), _with_arrays(plain, out)


def client_unmask(state, msg):
    """The unmask step of a round that could lose clients: reveal this exchange's self-mask key
    and the pair-mask keys with the clients the server reports as dropped.

    Refused (:class:`ProtocolError`): a request for another exchange than this client's last,
    a survivor list without this client or outside the cohort, or a second request for the same
    exchange with another survivor list (answering both could reveal a client's self key and
    its pair keys together, i.e. its upload).
    """
    from fedsonmf.protocol.messages import Message

    st = dict(state.arrays)
    params = parse_params(msg.scalars.get(SECAGG_KEY))
    if STATE_LAST not in st:
        raise ProtocolError("secure aggregation: unmask request but this client has masked nothing")
    last = _json_of(st[STATE_LAST])
    me, seed = int(st[STATE_ME]), int(st[STATE_SEED])
    survivors = sorted(int(q) for q in params.get("survivors", []))
    if (int(msg.round), params["cohort"], str(params.get("nonce", ""))) != (last["round"], last["cohort"],
                                                                              last["nonce"]) or not last["self"]:
        raise ProtocolError(f"secure aggregation: unmask request for round {msg.round} does not match this "
                            f"client's last masked exchange (round {last['round']})")
    if me not in survivors or not set(survivors) <= set(last["cohort"]):
        raise ProtocolError(f"secure aggregation: survivor list {survivors} must hold client {me} and lie in the "
                            f"cohort {last['cohort']}")
    if STATE_REVEALED in st:
        done = _json_of(st[STATE_REVEALED])
        if (done["round"], done["nonce"]) == (last["round"], last["nonce"]) and done["survivors"] != survivors:
            raise ProtocolError(f"secure aggregation: a second unmask request for round {msg.round} with survivors "
                                f"{survivors} (first: {done['survivors']}) is refused")
    label = exchange_label(str(seed), "round", last["round"], last["cohort"], last["nonce"])
    dropped = [q for q in last["cohort"] if q not in survivors]
    if last.get("threshold") is not None:
        return _unmask_by_shares(state, st, msg, params, last, label, survivors, dropped)
    if params.get("threshold") is not None:
        raise ProtocolError("secure aggregation: a threshold unmask request for an exchange masked without one")
    self_key = np.frombuffer(exchange_key(_bytes(st[STATE_SELF]), "self|" + label), dtype=np.uint8).copy()
    pair = np.zeros((len(dropped), 32), dtype=np.uint8)
    for i, q in enumerate(dropped):
        pair[i] = np.frombuffer(exchange_key(st[STATE_PAIRS][q].tobytes(), "pair|" + label), dtype=np.uint8)
    st[STATE_REVEALED] = _json_bytes({"round": last["round"], "nonce": last["nonce"], "survivors": survivors})
    # the server counted this client's upload: commit what the algorithm kept pending on it
    for k in [k for k in st if k.endswith(".pending")]:
        st[k[: -len(".pending")]] = st.pop(k)
    return type(state)(state.round, st), Message("unmask", msg.round, {SELF_KEY: self_key, PAIR_KEYS: pair})


def _commit_pending(st: dict) -> None:
    """The server counted this client's upload: commit what the algorithm kept pending on it."""
    for k in [k for k in st if k.endswith(".pending")]:
        st[k[: -len(".pending")]] = st.pop(k)


def _unmask_by_shares(state, st: dict, msg, params: dict, last: dict, label: str, survivors: list[int],
                      dropped: list[int]):
    """Threshold recovery's unmask step at one holder: for every survivor (the ``survivors``,
    whose uploads the server holds) this holder's share of its self-mask key, and of its
    pair-mask keys with the ``dropped``; never a share of a dropped client's self-mask key, and
    one survivor list per exchange (checked by the caller), so a client's self key and its
    pair keys are never both revealed by this holder."""
    from fedsonmf.federation import shamir
    from fedsonmf.protocol.messages import Message

    t = int(last["threshold"])
    if params.get("threshold") is None or int(params["threshold"]) != t:
        raise ProtocolError(f"secure aggregation: unmask request with threshold {params.get('threshold')}, the "
                            f"exchange was masked with {t}: refused")
    if len(survivors) < t:
        raise ProtocolError(f"secure aggregation: unmask request with {len(survivors)} survivors, below the "
                            f"threshold {t}: refused, nothing revealed")
    me = int(st[STATE_ME])
    opened = open_shares(st[STATE_PAIRS], _bytes(st[STATE_SELF]), me, last["cohort"], label, survivors,
                         msg.arrays.get(SHARES_IN_KEY))
    out = np.zeros((len(survivors), 1 + len(dropped), shamir.SHARE_BYTES), dtype=np.uint8)
    for i, p in enumerate(survivors):
        peers = [q for q in last["cohort"] if q != p]
        picks = [0] + [1 + peers.index(q) for q in dropped]
        for j, k in enumerate(picks):
            out[i, j] = np.frombuffer(shamir.to_bytes(opened[i][k]), dtype=np.uint8)
    st[STATE_REVEALED] = _json_bytes({"round": last["round"], "nonce": last["nonce"], "survivors": survivors})
    _commit_pending(st)
    return type(state)(state.round, st), Message("unmask", msg.round, {REVEALED_KEY: out})


def commit_counted(state, msg):
    """Before a round: commit the pending state of this client's last masked exchange when the
    round message says the server counted it (``"counted": {client: last round counted}`` in its
    parameters) -- a survivor whose upload was summed but that missed the unmask step, which a
    threshold round completes without it."""
    text = msg.scalars.get(SECAGG_KEY)
    if state is None or text is None or STATE_LAST not in state.arrays:
        return state
    counted = parse_params(text).get("counted")
    if not isinstance(counted, dict):
        return state
    st = dict(state.arrays)
    last = _json_of(st[STATE_LAST])
    try:
        mine = int(counted.get(str(int(st[STATE_ME])), -1))
    except (TypeError, ValueError):
        raise ProtocolError("secure aggregation: malformed 'counted' parameter") from None
    if mine != int(last["round"]) or not any(k.endswith(".pending") for k in st):
        return state
    _commit_pending(st)
    return type(state)(state.round, st)


def keep_protocol_state(old, new):
    """Carry the protocol's private arrays from ``old`` into the algorithm's ``new`` state."""
    for k, v in old.arrays.items():
        if k.startswith("secagg.") and k not in new.arrays:
            new.arrays[k] = v
    return new


# ----------------------------------------------------------------------------- the server's side


def server_bits(spec: Mapping[str, tuple[str, int]], exp: int, vnorm: float, m: int) -> dict[str, int]:
    """Fractional bits of every summed item from public numbers: the run's exponent E
    (L = 2^E), ||V^s||_F of the broadcast and the cohort size m."""
    L = math.ldexp(1.0, int(exp))
    return {f"{field}.{key}": frac_bits(item_bound(deg, L, vnorm), m) for key, (field, deg) in spec.items()}


def fixed_point_sum(items: Sequence[np.ndarray], degree: int = 1, exp: int | None = None) -> np.ndarray:
    """The sum the server decodes from the masked ``items`` (one per client) of an exchange in
    which each client's exponent is that of its own item's norm (a predict's ``U_p^T X_p^new``),
    or the public ``exp`` when given (the graph refinement's: 0): the masks cancel in the ring, so
    this is ``decode(sum_p encode(item_p))`` at the exchange's fixed point -- what an in-process
    run with secure aggregation reproduces bit for bit."""
    from fedsonmf.core._linalg import sqnorm

    m = len(items)
    if exp is None:
        norms = [math.sqrt(max(float(sqnorm(a)), 0.0)) for a in items]  # as each client computes its E_p
        exp = max(math.frexp(v)[1] if v > 0 else 0 for v in norms)
    bits = server_bits({"x": ("arrays", degree)}, exp, 0.0, m)["arrays.x"]
    return decode(ring_sum([encode(a, bits, m) for a in items]), bits)


def masked_names(reply) -> set[str]:
    return {k[len(MASKED_PREFIX):] for k in reply.arrays if k.startswith(MASKED_PREFIX)
            and k not in _PROTOCOL_ARRAYS}


def aggregate_masked(replies, clients: Sequence[int], kind: str, round: int, bits: Mapping[str, int],
                     unmask: Mapping[int, Any] | None = None, cohort: Sequence[int] | None = None,
                     threshold: int | None = None):
    """The :class:`~fedsonmf.protocol.messages.Aggregate` of masked replies (one per client of
    ``clients``): ring sums, decoded at the exchange's scale.

    ``unmask`` (rounds with self masks): the unmask replies of the survivors ``clients``
    (``{client: reply}``), whose revealed keys remove every self mask and the pair masks with
    the clients of ``cohort`` that dropped.  With a ``threshold`` t the replies hold shares
    instead (:func:`reconstruct_keys`) and any t of the survivors suffice.
    """
    from fedsonmf.protocol.messages import Aggregate

    self_keys: dict[int, bytes] = {}
    pair_revealed: dict[tuple[int, int], bytes] = {}
    if unmask is not None and threshold is not None:
        self_keys, pair_revealed = reconstruct_keys(unmask, clients, cohort or clients, int(threshold), round)
    elif unmask is not None:
        dropped = [q for q in sorted(cohort or clients) if q not in set(clients)]
        for p in clients:
            rep = unmask.get(p)
            if rep is None or SELF_KEY not in rep.arrays or PAIR_KEYS not in rep.arrays:
                raise ProtocolError(f"secure aggregation: client {p} sent no unmask keys (round {round})")
            sk, pk = np.asarray(rep.arrays[SELF_KEY], np.uint8), np.asarray(rep.arrays[PAIR_KEYS], np.uint8)
            if sk.shape != (32,) or pk.shape != (len(dropped), 32):
                raise ProtocolError(f"secure aggregation: client {p} sent unmask keys of shapes {sk.shape}, "
                                    f"{pk.shape}; expected (32,), ({len(dropped)}, 32)")
            self_keys[p] = sk.tobytes()
            for i, q in enumerate(dropped):
                pair_revealed[(p, q)] = pk[i].tobytes()
    want = set(bits)
    n_bound = len(cohort) if cohort is not None else len(list(clients))  # the m the scales were chosen for
    shapes: dict[str, tuple] = {}
    for p, rep in zip(clients, replies):
        got = masked_names(rep)
        if got != want:
            raise ProtocolError(f"secure aggregation: client {p} sent masked items {sorted(got)}, expected "
                                f"{sorted(want)} (round {round})")
        for name in sorted(want):
            a = np.asarray(rep.arrays[MASKED_PREFIX + name])
            if a.dtype != np.uint64 or shapes.setdefault(name, a.shape) != a.shape:
                where = "the setup exchange" if kind in ("init", "setup") else f"round {int(round)}"
                raise UploadBoundError(
                    f"an upload out of bounds in {where}: client {p} sent its masked {name} as {a.dtype} of shape "
                    f"{a.shape}; a masked item is a uint64 ring element of shape {shapes[name]} (no NaN, Inf or "
                    "float can be summed in the ring): the round fails")
    sums = {}
    for name in sorted(want):
        key = name.split(".", 1)[1]
        ring = ring_sum([rep.arrays[MASKED_PREFIX + name] for rep in replies])
        if unmask is not None:
            ring = remove_revealed(ring, name, self_keys, pair_revealed)
        total = decode(ring, bits[name])
        check_sum_bound(total, bits[name], n_bound, len(replies), name, kind, round)
        # a scalar item travels as a shape-(1,) array (split_summed); every array item is 2-D
        sums[key] = float(total[0]) if total.shape == (1,) else total
    return Aggregate(kind, int(round), sums, tuple(int(p) for p in clients))


def reconstruct_keys(unmask: Mapping[int, Any], survivors: Sequence[int], cohort: Sequence[int], t: int,
                     round: int) -> tuple[dict[int, bytes], dict[tuple[int, int], bytes]]:
    """The server's side of threshold recovery: from the holders' revealed shares (``unmask``,
    ``{holder: reply}``, at least ``t`` of them) every survivor's self-mask key and its
    pair-mask keys with the dropped clients of ``cohort``, by Lagrange interpolation of the
    ``t`` holders of smallest index.  Raises :class:`ProtocolError` with fewer than ``t``
    holders (nothing is decoded) or a reply of the wrong shape, naming the holder."""
    from fedsonmf.federation import shamir

    survivors = sorted(int(p) for p in survivors)
    dropped = [q for q in sorted(int(q) for q in cohort) if q not in set(survivors)]
    holders = sorted(int(h) for h in unmask)
    if len(holders) < t:
        raise ProtocolError(f"secure aggregation: round {round}: {len(holders)} clients answered the unmask step, "
                            f"below the threshold {t}: the sum is not decoded")
    want = (len(survivors), 1 + len(dropped), shamir.SHARE_BYTES)
    shares = {}
    for h in holders[:t]:
        a = np.asarray(unmask[h].arrays.get(REVEALED_KEY))
        if a.dtype != np.uint8 or a.shape != want:
            raise ProtocolError(f"secure aggregation: client {h} revealed shares of shape {a.shape}, expected {want} "
                                f"(round {round})")
        shares[h] = a
    self_keys, pair_revealed = {}, {}
    for i, p in enumerate(survivors):
        self_keys[p] = shamir.reconstruct({h + 1: shamir.from_bytes(a[i, 0].tobytes()) for h, a in shares.items()}, t)
        for j, q in enumerate(dropped):
            pair_revealed[(p, q)] = shamir.reconstruct(
                {h + 1: shamir.from_bytes(a[i, 1 + j].tobytes()) for h, a in shares.items()}, t)
    return self_keys, pair_revealed


def check_sum_bound(total, bits: int, m_bits: int, count: int, name: str, kind: str, round: int) -> None:
    """The server's check of a decoded sum: ``count`` uploads within the public bound
    (:func:`upload_limit` at the exchange's ``m_bits``) sum to at most ``count 2^e``.

    Raises :class:`UploadBoundError` ("an upload out of bounds in round k"): some client masked a
    value beyond the bound, or sent masked values that do not cancel (random bytes, a shifted ring
    element, an upload of another exchange replayed).  Under secure aggregation the server cannot
    say which client; the round fails rather than feed the sum to the model.
    """
    limit = int(count) * upload_limit(bits, m_bits)
    arr = np.asarray(total, dtype=np.float64)
    peak = float(np.max(np.abs(arr))) if arr.size else 0.0
    if not np.isfinite(peak) or peak > limit:
        where = "the setup exchange" if kind in ("init", "setup") else f"round {int(round)}"
        raise UploadBoundError(
            f"an upload out of bounds in {where}: the decoded sum of {name} reaches |sum| = {peak:.3g}, beyond "
            f"{limit:.3g}, what {count} uploads within the public bound {upload_limit(bits, m_bits):.3g} can sum to; "
            "a client masked a value beyond the bound or sent masked values that do not cancel (random, shifted, "
            "or replayed from another exchange): the round fails and no model is updated from it")


def strip_masked(reply):
    """The reply without its masked arrays (what the algorithm may read per client)."""
    from fedsonmf.protocol.messages import Message

    return Message(reply.kind, reply.round, {k: v for k, v in reply.arrays.items() if not k.startswith(MASKED_PREFIX)},
                   reply.scalars, reply.diagnostics)
