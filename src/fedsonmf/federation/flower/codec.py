"""Encode a :class:`fedsonmf.protocol.messages.Message` as a Flower ``RecordDict`` and back.

The records of one Flower message (names are fixed, the audit checks them):

``fedsonmf.meta``         ConfigRecord: kind, round, client index, job id (transport metadata)
``fedsonmf.arrays``       ArrayRecord: the algorithm's matrices (``Message.arrays``)
``fedsonmf.scalars``      ConfigRecord: the algorithm's scalars (``Message.scalars``)
``fedsonmf.diag.arrays``  ArrayRecord: monitoring matrices of a reply (``Message.diagnostics``)
``fedsonmf.diag.scalars`` ConfigRecord: monitoring scalars of a reply

Empty records are left out.  Arrays travel as ``np.save`` bytes (bit-exact float64).

A *batch* (:func:`pack`, :func:`unpack`) is several such messages for one node in one Flower message:
their records side by side, each name prefixed ``<j>:`` (``0:fedsonmf.meta``, ``1:fedsonmf.arrays``,
...), and ``fedsonmf.batch`` (ConfigRecord: ``count``).  A batch reply holds the node's replies in
the same order; a reply that failed is ``<j>:fedsonmf.error`` (ConfigRecord: ``code``, ``reason``).
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedsonmf.protocol.messages import Message

__all__ = ["encode", "decode", "describe", "META", "ARRAYS", "SCALARS", "DIAG_ARRAYS", "DIAG_SCALARS",
           "SETUP_AT_HELLO", "IDS_DIGEST", "salted_ids_digest", "BATCH", "BATCH_ACTION", "ERROR", "pack", "unpack",
           "error_content", "error_reason"]

META = "fedsonmf.meta"
ARRAYS = "fedsonmf.arrays"
SCALARS = "fedsonmf.scalars"
DIAG_ARRAYS = "fedsonmf.diag.arrays"
DIAG_SCALARS = "fedsonmf.diag.scalars"
BATCH = "fedsonmf.batch"
ERROR = "fedsonmf.error"
#: the ClientApp action that answers a batch (Flower message type ``train.batch``)
BATCH_ACTION = "batch"
#: the kind of a hello (handshake) that carries the setup, and of its reply carrying the setup reply
SETUP_AT_HELLO = "hello+setup"
#: the hello reply's fingerprint of the node's set of sample ids, salted with the job id
#: (only from a view file that carries ids; docs/flower.md, "Sample ids")
IDS_DIGEST = "ids-digest"


def salted_ids_digest(digest: str, job_id: str) -> str:
    """What a node sends of its ids: SHA-256 of the job id and the ids' digest
    (:func:`fedsonmf.datasets.files.ids_digest`).  Equal for two nodes exactly when their id sets are;
    the job id makes one run's digests unrelated to another's."""
    return hashlib.sha256(f"{job_id}\0{digest}".encode()).hexdigest()


def _scalar(v):
    """Python scalar for a ConfigRecord (NumPy scalars are not accepted)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    if isinstance(v, str):
        return v
    raise TypeError(f"cannot send scalar of type {type(v).__name__}")


def _layout_kept(v) -> np.ndarray:
    """``v`` as is when C- or Fortran-contiguous (``np.save`` keeps the order, so the receiver
    computes with the layout the in-process engine has: BLAS results depend on it, bit for bit),
    else a C-contiguous copy."""
    v = np.asarray(v)
    return v if v.flags.c_contiguous or v.flags.f_contiguous else np.ascontiguousarray(v)


def _arrays(d) -> ArrayRecord:
    return ArrayRecord({k: Array(_layout_kept(v)) for k, v in d.items()})


def encode(msg: Message, *, client: int, job_id: str) -> RecordDict:
    """The Flower RecordDict of a fedsonmf message.

    Parameters
    ----------
    msg : Message
        The message (kind, round, arrays, scalars, diagnostics).
    client : int
        The view index it is addressed to or comes from (in the ``fedsonmf.meta`` record).
    job_id : str
        The run's job id (in the ``fedsonmf.meta`` record).

    Returns
    -------
    RecordDict
        Arrays in an ArrayRecord, scalars and metadata in ConfigRecords, diagnostics apart.
    """
    rd = RecordDict({META: ConfigRecord({"kind": msg.kind, "round": int(msg.round), "client": int(client),
                                         "job-id": str(job_id)})})
    if msg.arrays:
        rd[ARRAYS] = _arrays(msg.arrays)
    if msg.scalars:
        rd[SCALARS] = ConfigRecord({k: _scalar(v) for k, v in msg.scalars.items()})
    diag_arrays = {k: v for k, v in msg.diagnostics.items() if isinstance(v, np.ndarray)}
    diag_scalars = {k: _scalar(v) for k, v in msg.diagnostics.items() if k not in diag_arrays}
    if diag_arrays:
        rd[DIAG_ARRAYS] = _arrays(diag_arrays)
    if diag_scalars:
        rd[DIAG_SCALARS] = ConfigRecord(diag_scalars)
    return rd


def decode(rd: RecordDict) -> tuple[Message, dict]:
    """The fedsonmf message in a RecordDict made by :func:`encode`.

    Parameters
    ----------
    rd : RecordDict
        A message's content.

    Returns
    -------
    message : Message
    meta : dict
        The ``fedsonmf.meta`` record (kind, round, client, job id, ...).

    Raises
    ------
    ValueError
        ``rd`` is not a fedsonmf message.
    """
    if META not in rd:
        raise ValueError(f"not a fedsonmf message: records {sorted(rd.keys())}")
    meta: dict[str, Any] = dict(cast(ConfigRecord, rd[META]))
    arrays = {k: a.numpy() for k, a in cast(ArrayRecord, rd[ARRAYS]).items()} if ARRAYS in rd else {}
    scalars: dict[str, Any] = dict(cast(ConfigRecord, rd[SCALARS])) if SCALARS in rd else {}
    diag: dict[str, Any] = {}
    if DIAG_ARRAYS in rd:
        diag.update({k: a.numpy() for k, a in cast(ArrayRecord, rd[DIAG_ARRAYS]).items()})
    if DIAG_SCALARS in rd:
        diag.update(dict(cast(ConfigRecord, rd[DIAG_SCALARS])))
    return Message(str(meta["kind"]), int(meta["round"]), arrays, scalars, diag), meta


def error_reason(ex: BaseException) -> str:
    """Flower's own text of a ClientApp exception (``"<class 'X'>:<'text'>"``, as ``flwr-clientapp``
    reports it)."""
    return str(type(ex)) + ":<'" + str(ex) + "'>"


def error_content(code: int, reason: str) -> RecordDict:
    """The content that stands for a failed reply inside a batch reply (Flower's ``Error`` fields)."""
    return RecordDict({ERROR: ConfigRecord({"code": int(code), "reason": str(reason)})})


def pack(contents: list[RecordDict]) -> RecordDict:
    """One RecordDict carrying ``contents`` (each a message's content) side by side, in order."""
    rd = RecordDict({BATCH: ConfigRecord({"count": len(contents)})})
    for j, content in enumerate(contents):
        for name, rec in content.items():
            rd[f"{j}:{name}"] = rec
    return rd


def unpack(rd: RecordDict) -> list[RecordDict]:
    """The contents :func:`pack` put in ``rd``, in order.

    Raises
    ------
    ValueError
        ``rd`` is not a batch, or a record's name is not one of its parts'.
    """
    if BATCH not in rd:
        raise ValueError(f"not a fedsonmf batch: records {sorted(rd.keys())}")
    count = int(cast(int, cast(ConfigRecord, rd[BATCH])["count"]))
    parts: list[RecordDict] = [RecordDict() for _ in range(count)]
    for name, rec in rd.items():
        if name == BATCH:
            continue
        j, sep, inner = name.partition(":")
        if not sep or not j.isdigit() or int(j) >= count:
            raise ValueError(f"record {name!r} of a batch of {count} is not one of its messages'")
        parts[int(j)][inner] = rec
    return parts


def describe(rd: RecordDict) -> dict:
    """What a RecordDict carries, for the wire audit: per record, per key,
    the type, shape, dtype, the number of serialised bytes and their SHA-256 (arrays) or the value
    type (scalars).  Values of scalars are kept only for ``fedsonmf.meta`` and the public
    secure-aggregation parameters (the scalar ``secagg``: cohort, scales, public keys)."""
    out = {}
    for name, rec in rd.items():
        items: dict[str, dict] = {}
        entry = {"type": type(rec).__name__, "items": items}
        if isinstance(rec, ArrayRecord):
            for k, a in rec.items():
                items[k] = {"shape": list(a.shape), "dtype": str(a.dtype), "bytes": len(a.data),
                            "sha256": hashlib.sha256(a.data).hexdigest()}
        else:
            for k, v in rec.items():
                item = {"type": type(v).__name__, "bytes": len(v) if isinstance(v, (str, bytes)) else 8}
                if name == META or (name == SCALARS and k == "secagg"):  # public protocol parameters
                    item["value"] = v
                items[k] = item
        out[name] = entry
    return out
