"""Aligning organisations' files of different samples without showing anyone their ids.

Organisations that hold overlapping but different samples must agree on one order of all the
samples (the union) and each know which of those it holds (its availability mask, docs/algorithm.md
§15.1) before a federation starts.  On one machine :func:`fedsonmf.datasets.load_views` does that
from the files' ids.  Between organisations the ids themselves are private (patient numbers,
customer ids), so the alignment here goes through **keyed tags**:

1. The organisations agree on a secret *linkage key* among themselves (:func:`new_key`; the
   coordinator, who runs the server, must not have it).
2. Each organisation tags its ids, ``HMAC-SHA256(key, id)`` (:func:`id_tags`), and sends the
   coordinator only the tags, sorted (:func:`write_tags`): a set of random-looking strings.
3. The coordinator takes the union of the tags, sorted, as the order of all samples, and sends each
   organisation only ``n`` and the positions of its *own* tags (:func:`positions`,
   :func:`write_positions`) -- not the other organisations' tags.
4. Each organisation places its rows at those positions (:func:`aligned_view`): an ``(n, d_p)`` view
   with zero rows for the samples it lacks, and its mask; its SuperNode serves those two files.

What each party learns [our analysis]: the coordinator learns how many samples each organisation
holds and which tags they share -- the membership pattern, which the server of a run with masks
learns anyway (docs/privacy.md) -- and no id, as long as it has no key (an id is a 256-bit HMAC
under a key it never sees; guessing ids does not help without the key).  An organisation learns
``n``, the size of the union, which every node of such a run learns anyway, and nothing of the
others' ids: it never sees their tags.  The order is that of the tags, so it says nothing about
the ids either.  Not covered: a coordinator *and* an organisation colluding (the organisation has
the key and can tag guessed ids, then look them up among the other organisations' tags); a
private set intersection protocol would be needed for that.  The key is per federation: a new key
gives new tags, so tags of two federations cannot be linked.

Ids are canonical as the files are read: an id that is an integer literal is that integer
(``007`` is ``7``), any other id is its text.  (``load_views`` decides between integers and text
for all the files together; here each organisation decides alone, id by id, so a file that mixes
``007`` with ``A1`` keys ``007`` as ``7`` here and as ``007`` there.)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedsonmf._io import check_private_file, write_atomic, write_json_atomic
from fedsonmf.datasets.files import _as_str_array, _id_keys, _short, _str_array
from fedsonmf.exceptions import InputError

__all__ = ["KEY_BYTES", "new_key", "read_key", "canonical_id", "id_tags", "tags_digest", "positions",
           "aligned_view", "own_rows", "write_tags", "read_tags", "write_positions", "read_positions"]

#: bytes of a linkage key (HMAC-SHA256's block-size-independent strength: 256 bits)
KEY_BYTES = 32
TAGS_FORMAT = "fedsonmf-linkage-tags/1"
POSITIONS_FORMAT = "fedsonmf-linkage-positions/1"
_INT = re.compile(r"[+-]?\d+")
_TAG = re.compile(r"[0-9a-f]{64}")


def new_key(path) -> Path:
    """Write a new random linkage key (32 bytes, hex) to ``path``, mode 0600; refuses to overwrite."""
    path = Path(path)
    if path.exists():
        raise InputError(f"{path} exists: a linkage key is never overwritten (the tags made with it would no "
                         "longer match)")
    return write_atomic(path, secrets.token_hex(KEY_BYTES) + "\n")


def read_key(path) -> bytes:
    """The linkage key in ``path``; refused unless only its owner may read it, and unless it is 32 bytes
    of hex (as :func:`new_key` writes)."""
    path = check_private_file(path, "linkage key")
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise InputError(f"linkage key {path} is not {KEY_BYTES} bytes of hex (make one with "
                         "`fedsonmf flower align key`)")
    return key


def canonical_id(value) -> str:
    """The text an id is tagged by: an integer literal as that integer (``007`` -> ``7``), else itself."""
    s = str(value).strip()
    if not _INT.fullmatch(s):
        return s
    digits = s.lstrip("+-").lstrip("0") or "0"  # str(int(s)), without int()'s 4300-digit limit
    return "-" + digits if s[0] == "-" and digits != "0" else digits


def id_tags(ids, key: bytes) -> np.ndarray:
    """``HMAC-SHA256(key, canonical id)`` of every id, hex, in the ids' order; (n,) array of str.

    Raises
    ------
    InputError
        Two ids with the same canonical form (a duplicate sample, or ``7`` beside ``007``).
    """
    canon = [canonical_id(v) for v in _as_str_array(ids).tolist()]
    _refuse_duplicates(_str_array(canon), "(an integer id counts as its value, 007 as 7)")
    return np.array([hmac.new(key, c.encode(), hashlib.sha256).hexdigest() for c in canon], dtype="<U64")


def tags_digest(tags) -> str:
    """SHA-256 of a set of tags (sorted, one per line): names which tag list a positions file answers."""
    return hashlib.sha256("\n".join(sorted(str(t) for t in tags)).encode()).hexdigest()


def positions(tag_lists) -> tuple[int, list[np.ndarray]]:
    """The coordinator's step: the union of every organisation's tags, sorted, is the order of all
    samples; ``(n, [positions of organisation p's tags, in its sorted order])``."""
    lists = [np.sort(np.asarray(t, dtype="<U64")) for t in tag_lists]
    union = np.unique(np.concatenate(lists)) if lists else np.array([], dtype="<U64")
    return int(union.size), [np.searchsorted(union, t).astype(np.int64) for t in lists]


def aligned_view(X, ids, key: bytes, n: int, pos, digest: str | None = None):
    """An organisation's rows placed at the coordinator's positions: ``(X_aligned (n, d), mask (n,))``.

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (m, d)
        The organisation's view, its rows in any order.
    ids : array-like of str of shape (m,)
        The rows' sample ids.
    key : bytes
        The linkage key.
    n : int
        The number of samples in all (the union).
    pos : array-like of int of shape (m,)
        The positions of the organisation's tags, in sorted tag order (:func:`positions`).
    digest : str, optional
        :func:`tags_digest` of the tags the positions answer; refused when it is not this view's.

    Returns
    -------
    X_aligned : ndarray or CSR array of shape (n, d); rows this organisation lacks are zero
    mask : ndarray of bool of shape (n,); True where it holds the sample
    """
    tags = id_tags(ids, key)
    pos = np.asarray(pos, dtype=np.int64)
    if digest is not None and digest != tags_digest(tags):
        raise InputError("the positions file answers another list of tags (another file, or another key)")
    if pos.shape != (tags.size,):
        raise InputError(f"the positions file has {pos.size} positions for {tags.size} rows")
    if tags.size and (pos.min() < 0 or pos.max() >= n or np.any(np.diff(pos) <= 0)):
        raise InputError(f"the positions file's positions are not increasing positions below n = {n}")
    order = np.argsort(tags, kind="stable")  # the rows in the order of their tags, as the positions are
    mask = np.zeros(int(n), dtype=bool)
    mask[pos] = True
    if sp.issparse(X):
        Y = sp.csr_array(X)[order]
        counts = np.zeros(int(n), dtype=np.int64)
        counts[pos] = np.diff(Y.indptr)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        return sp.csr_array((Y.data, Y.indices, indptr), shape=(int(n), Y.shape[1])), mask
    X = np.asarray(X)
    out = np.zeros((int(n), X.shape[1]), dtype=X.dtype)
    out[pos] = X[order]
    return out, mask


def own_rows(ids, n: int, key: bytes | None = None, pos=None, digest: str | None = None):
    """Where an organisation's samples are among the n rows of a run (its ``labels.csv``):
    ``(ids, rows)``, each of its ids and the row that holds that sample.

    With ``key`` and ``pos`` (files aligned by :func:`aligned_view`) row ``pos[k]`` is the sample of
    the k-th smallest tag; without, the node sorted its rows by id (integers as integers when every
    id is one, as :func:`fedsonmf.datasets.files.read_view` does), so row i is the i-th smallest id
    and the run must have exactly as many rows as the file.
    """
    ids = _as_str_array(ids)
    if key is None:
        if ids.size != int(n):
            raise InputError(f"the run has {n} samples and this file {ids.size}: for files of different samples, "
                             "give the linkage key and this organisation's positions file")
        (keyed,), _ = _id_keys([ids])  # the node's sort key of each id, in the file's order
        _refuse_duplicates(keyed, "")
        return ids, _ranks(keyed)
    tags = id_tags(ids, key)
    pos = np.asarray(pos, dtype=np.int64)
    if digest is not None and digest != tags_digest(tags):
        raise InputError("the positions file answers another list of tags (another file, or another key)")
    if pos.shape != (tags.size,) or (tags.size and (pos.min() < 0 or pos.max() >= n)):
        raise InputError(f"the positions file does not place this file's {tags.size} samples among {n}")
    return ids, pos[_ranks(tags)]


def _refuse_duplicates(values: np.ndarray, why: str) -> None:
    uniq, counts = np.unique(values, return_counts=True)
    if uniq.size < values.size:
        shown = ", ".join(_short(str(v)) for v in uniq[counts > 1][:5])
        raise InputError(f"duplicate sample ids{' ' + why if why else ''}: {shown}")


def _ranks(values: np.ndarray) -> np.ndarray:
    """The rank of each value in the sorted order (distinct values): row k of the sorted view holds it."""
    rank = np.empty(values.size, dtype=np.int64)
    rank[np.argsort(values, kind="stable")] = np.arange(values.size)
    return rank


def write_tags(path, tags) -> Path:
    """The tags an organisation sends the coordinator, sorted (JSON, 0600)."""
    return write_json_atomic(path, {"format": TAGS_FORMAT, "tags": sorted(str(t) for t in tags)}, indent=None)


def _read_json(path, fmt: str, what: str) -> dict:
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{what} file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InputError(f"{path} is not a {what} file (not JSON)") from None
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise InputError(f"{path} is not a {what} file (format {fmt!r} expected)")
    return d


def read_tags(path) -> np.ndarray:
    """The tags of one organisation's tags file; refused unless they are distinct SHA-256 hex strings."""
    tags = _read_json(path, TAGS_FORMAT, "linkage tags").get("tags")
    if not isinstance(tags, list) or not all(isinstance(t, str) and _TAG.fullmatch(t) for t in tags):
        raise InputError(f"{path}: the tags must be a list of 64 lowercase hex digits each")
    if len(set(tags)) < len(tags):
        raise InputError(f"{path}: a tag appears twice")
    return np.array(tags, dtype="<U64")


def write_positions(path, n: int, pos, tags) -> Path:
    """What the coordinator sends one organisation: ``n``, its positions and the digest of its tags (0600)."""
    return write_json_atomic(path, {"format": POSITIONS_FORMAT, "n_samples": int(n), "tags_sha256": tags_digest(tags),
                                    "positions": [int(p) for p in pos]}, indent=None)


def read_positions(path) -> tuple[int, np.ndarray, str]:
    """``(n, positions, tags digest)`` of a positions file."""
    d = _read_json(path, POSITIONS_FORMAT, "linkage positions")
    try:
        n, pos, digest = int(d["n_samples"]), np.asarray(d["positions"], dtype=np.int64), str(d["tags_sha256"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{path}: a positions file needs n_samples, positions and tags_sha256") from None
    if pos.ndim != 1:
        raise InputError(f"{path}: positions must be a list of integers")
    return n, pos, digest
