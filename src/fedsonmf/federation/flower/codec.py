"""Encode a :class:`fedsonmf.protocol.messages.Message` as a Flower ``RecordDict`` and back.

What a message carries, by logical record (the names are fixed; the audit checks them,
:func:`describe` reports them):

``fedsonmf.meta``         kind, round, client index, job id (transport metadata)
``fedsonmf.arrays``       the algorithm's matrices (``Message.arrays``)
``fedsonmf.scalars``      the algorithm's scalars (``Message.scalars``)
``fedsonmf.diag.arrays``  monitoring matrices of a reply (``Message.diagnostics``)
``fedsonmf.diag.scalars`` monitoring scalars of a reply

How it travels: in one ConfigRecord, ``fedsonmf.meta``.  Beside the metadata it holds the other
four records *packed*: their scalars, typed as they are (key ``<record>/<key>``), and every array as
its ``np.save`` bytes (bit-exact float64, the memory order kept) one after the other in one blob,
listed in order in ``arrays-index`` (record, key, length).  A blob of at most :data:`INLINE_LIMIT`
bytes rides in the record itself (``arrays-blob``); a larger one is one uint8 ``Array`` of the
ArrayRecord ``fedsonmf.blob`` (Flower cuts it into 5 MiB chunks).  Why: Flower moves every record,
array and array chunk of a message as an object of its own, one HTTPS request each, both ways (node
and ServerApp); a secure round's reply of 4 arrays in 4 records was 14 objects, now 3 (Message,
RecordDict, ``fedsonmf.meta``), and each request costs milliseconds of the SuperLink's CPU
(docs/flower.md, "The node loop").  The arrays' bytes and their SHA-256 are those Flower's ``Array``
would carry, and :func:`describe` reports the logical records, so the wire audit reads the same.

A *batch* (:func:`pack`, :func:`unpack`) is several such messages for one node in one Flower message:
``fedsonmf.batch`` (ConfigRecord: ``count``) holds every part's records, each key prefixed
``<j>|<record>|`` (``0|fedsonmf.meta|kind``, ...), while their inline bytes stay within
:data:`INLINE_LIMIT`; a record beyond that (a large blob's ArrayRecord) travels beside it as
``<j>:<record>``.  A batch reply holds the node's replies in the same order; a reply that failed is
the part's ``fedsonmf.error`` record (``code``, ``reason``).
"""

from __future__ import annotations

import hashlib
import io
import json
import numbers
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedsonmf.protocol.messages import Message

__all__ = ["encode", "decode", "describe", "META", "ARRAYS", "SCALARS", "DIAG_ARRAYS", "DIAG_SCALARS",
           "SETUP_AT_HELLO", "BROADCAST", "IDS_DIGEST", "salted_ids_digest", "BATCH", "BATCH_ACTION", "ERROR", "pack",
           "unpack",
           "error_content", "error_reason", "BLOB", "INLINE_LIMIT", "INDEX", "INLINE_BLOB", "arrays_of",
           "array_bytes", "scalars_of", "meta_of", "set_meta"]

META = "fedsonmf.meta"
ARRAYS = "fedsonmf.arrays"
SCALARS = "fedsonmf.scalars"
DIAG_ARRAYS = "fedsonmf.diag.arrays"
DIAG_SCALARS = "fedsonmf.diag.scalars"
BATCH = "fedsonmf.batch"
ERROR = "fedsonmf.error"
#: the ``fedsonmf.meta`` keys of the packed arrays' index and (small) blob
INDEX, INLINE_BLOB = "arrays-index", "arrays-blob"
#: the ArrayRecord of a blob above :data:`INLINE_LIMIT`
BLOB = "fedsonmf.blob"
#: the largest array blob carried inside ``fedsonmf.packed`` (below Flower's 5 MiB array chunk: no
#: object is larger than one Flower would send)
INLINE_LIMIT = 4 << 20
_PACKED_NAMES = (ARRAYS, SCALARS, DIAG_ARRAYS, DIAG_SCALARS)
#: the ClientApp action that answers a batch (Flower message type ``train.batch``)
BATCH_ACTION = "batch"
#: the kind of a hello (handshake) that carries the setup, and of its reply carrying the setup reply
SETUP_AT_HELLO = "hello+setup"
#: the ``client`` of a message sent alike to every node (a round's broadcast, the hello): one content for
#: all, so Flower stores and pushes its records once (object ids are content hashes); the node answers
#: as its own view (its partition-id), which the server checks on the reply
BROADCAST = -1
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


def _npy(v) -> bytes:
    """The ``np.save`` bytes of ``v`` (exactly what Flower's ``Array`` carries)."""
    buf = io.BytesIO()
    np.save(buf, _layout_kept(v), allow_pickle=False)
    return buf.getvalue()


def encode(msg: Message, *, client: int, job_id: str) -> RecordDict:
    """The Flower RecordDict of a fedsonmf message.

    Parameters
    ----------
    msg : Message
        The message (kind, round, arrays, scalars, diagnostics).
    client : int
        The view index it is addressed to or comes from (in the ``fedsonmf.meta`` record), or
        :data:`BROADCAST` for a message every node receives alike.
    job_id : str
        The run's job id (in the ``fedsonmf.meta`` record).

    Returns
    -------
    RecordDict
        ``fedsonmf.meta``, and the other records packed (module docstring); empty records are left out.
    """
    rd = RecordDict()
    diag_arrays = {k: v for k, v in msg.diagnostics.items() if isinstance(v, np.ndarray)}
    diag_scalars = {k: v for k, v in msg.diagnostics.items() if k not in diag_arrays}
    packed: dict[str, Any] = {"kind": msg.kind, "round": int(msg.round), "client": int(client), "job-id": str(job_id)}
    for name, scalars in ((SCALARS, msg.scalars), (DIAG_SCALARS, diag_scalars)):
        packed.update({f"{name}/{k}": _scalar(v) for k, v in scalars.items()})
    index, parts = [], []
    for name, arrays in ((ARRAYS, msg.arrays), (DIAG_ARRAYS, diag_arrays)):
        for k, v in arrays.items():
            parts.append(_npy(v))
            index.append([name, str(k), len(parts[-1])])
    if index:
        packed[INDEX] = json.dumps(index)
        blob = b"".join(parts)
        if len(blob) <= INLINE_LIMIT:
            packed[INLINE_BLOB] = blob
        else:
            rd[BLOB] = ArrayRecord({"blob": Array(np.frombuffer(blob, dtype=np.uint8))})
    rd[META] = ConfigRecord(packed)
    return rd


def _is_packed(key: str) -> bool:
    return key in (INDEX, INLINE_BLOB) or "/" in key


def meta_of(rd: RecordDict) -> dict[str, Any]:
    """The transport metadata of ``fedsonmf.meta`` (kind, round, client, job id, ...), without the
    packed records."""
    return {k: v for k, v in cast(ConfigRecord, rd[META]).items() if not _is_packed(k)}


def set_meta(rd: RecordDict, fields: dict) -> None:
    """Replace the metadata of ``rd``'s ``fedsonmf.meta`` with ``fields``, keeping the packed records."""
    old = cast(ConfigRecord, rd[META]) if META in rd else {}
    rd[META] = ConfigRecord({**{k: v for k, v in old.items() if _is_packed(k)}, **fields})


def _segments(rd: RecordDict):
    """(record, key, np.save bytes) of every packed array, in order."""
    if META not in rd:
        return
    packed = cast(ConfigRecord, rd[META])
    if INDEX not in packed:
        return
    blob = (cast(bytes, packed[INLINE_BLOB]) if INLINE_BLOB in packed
            else cast(ArrayRecord, rd[BLOB])["blob"].numpy().tobytes())
    pos, seen = 0, set()
    for name, key, length in json.loads(str(packed[INDEX])):
        if name not in (ARRAYS, DIAG_ARRAYS) or not 0 <= int(length) <= len(blob) - pos:
            raise ValueError(f"a packed array entry {name}/{key} does not fit the message's blob")
        if (name, key) in seen:  # one of the two would be hidden from the wire log and the audit
            raise ValueError(f"the message packs the array {name}/{key} twice")
        seen.add((name, key))
        yield name, key, blob[pos:pos + int(length)]
        pos += int(length)
    if pos != len(blob):
        raise ValueError(f"the message's blob holds {len(blob) - pos} bytes no array claims")


def _load(data: bytes) -> np.ndarray:
    """One packed array, from its ``np.save`` bytes. The header's shape and dtype must account for
    exactly the bytes that follow it, checked before numpy allocates the array: a peer's header
    that declares a huge shape over a few bytes is refused instead of reserving that memory."""
    fp = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fp)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read:
            raise ValueError(f"npy format version {version}")
        shape, _, dtype = read[version](fp)
    except (ValueError, TypeError, SyntaxError) as ex:
        raise ValueError(f"a packed array's header is not an npy header: {ex}") from None
    if dtype.hasobject:
        raise ValueError("a packed array holds Python objects")
    count = int(np.prod(shape, dtype=object))
    if count * dtype.itemsize != len(data) - fp.tell():
        raise ValueError(f"a packed array's header declares {shape} {dtype} but {len(data) - fp.tell()} bytes follow")
    return np.load(io.BytesIO(data), allow_pickle=False)


def arrays_of(rd: RecordDict) -> dict[str, dict[str, np.ndarray]]:
    """``{record: {key: array}}`` of the arrays a RecordDict made by :func:`encode` carries."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, key, data in _segments(rd):
        out.setdefault(name, {})[key] = _load(data)
    return out


def scalars_of(rd: RecordDict, name: str = SCALARS) -> dict[str, Any]:
    """The scalars of the logical record ``name`` (``fedsonmf.scalars`` or ``fedsonmf.diag.scalars``)."""
    if META not in rd:
        return {}
    prefix = name + "/"
    return {k[len(prefix):]: v for k, v in cast(ConfigRecord, rd[META]).items() if k.startswith(prefix)}


def array_bytes(rd: RecordDict) -> int:
    """The serialised bytes of the arrays a RecordDict carries (``np.save`` bytes, as Flower's ``Array``)."""
    return sum(len(data) for _, _, data in _segments(rd))


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
    meta = meta_of(rd)
    arrays = arrays_of(rd)
    diag: dict[str, Any] = dict(arrays.get(DIAG_ARRAYS, {}))
    diag.update(scalars_of(rd, DIAG_SCALARS))
    return Message(str(meta["kind"]), int(meta["round"]), arrays.get(ARRAYS, {}), scalars_of(rd), diag), meta


def error_reason(ex: BaseException) -> str:
    """Flower's own text of a ClientApp exception (``"<class 'X'>:<'text'>"``, as ``flwr-clientapp``
    reports it)."""
    return str(type(ex)) + ":<'" + str(ex) + "'>"


def error_content(code: int, reason: str) -> RecordDict:
    """The content that stands for a failed reply inside a batch reply (Flower's ``Error`` fields)."""
    return RecordDict({ERROR: ConfigRecord({"code": int(code), "reason": str(reason)})})


def _inline_bytes(rec: ConfigRecord) -> int:
    return sum(len(v) for v in rec.values() if isinstance(v, bytes))


def pack(contents: list[RecordDict]) -> RecordDict:
    """One RecordDict carrying ``contents`` (each a message's content) side by side, in order.

    The parts' ConfigRecords (``fedsonmf.meta``, ``fedsonmf.error``) ride in the batch's own record,
    ``fedsonmf.batch``, their keys prefixed ``<j>|<record>|``, as long as the inline bytes stay within
    :data:`INLINE_LIMIT`; any other record (a large blob's ArrayRecord, a ConfigRecord beyond the
    limit) travels beside it as ``<j>:<record>``.  Flower moves every record as an object of its own,
    one HTTPS request each way: a batch of five fits' messages is 3 objects instead of 8.
    """
    batch: dict[str, Any] = {"count": len(contents)}
    inline = 0
    rd = RecordDict()
    for j, content in enumerate(contents):
        for name, rec in content.items():
            if isinstance(rec, ConfigRecord) and inline + (size := _inline_bytes(rec)) <= INLINE_LIMIT:
                batch.update({f"{j}|{name}|{k}": v for k, v in rec.items()})
                inline += size
            else:
                rd[f"{j}:{name}"] = rec
    rd[BATCH] = ConfigRecord(batch)
    return rd


def unpack(rd: RecordDict) -> list[RecordDict]:
    """The contents :func:`pack` put in ``rd``, in order.

    Raises
    ------
    ValueError
        ``rd`` is not a batch, its count is not the number of its parts (checked before anything is
        allocated for them), or a record's or key's name is not one of its parts'.
    """
    if BATCH not in rd:
        raise ValueError(f"not a fedsonmf batch: records {sorted(rd.keys())}")
    batch = cast(ConfigRecord, rd[BATCH])
    count = batch.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"a batch's count is {count!r}, not a number of messages")
    entries = len(batch) - 1 + len(rd) - 1  # every part carries at least one; checked before allocating
    if count > entries:
        raise ValueError(f"a batch of {count} messages carries {entries} records")
    parts: list[RecordDict] = [RecordDict() for _ in range(count)]
    fields: list[dict[str, dict[str, Any]]] = [{} for _ in range(count)]
    for key, value in batch.items():
        if key == "count":
            continue
        j, sep, rest = key.partition("|")
        name, sep2, inner = rest.partition("|")
        if not (sep and sep2) or not j.isdigit() or int(j) >= count or not name:
            raise ValueError(f"key {key!r} of a batch of {count} is not one of its messages'")
        fields[int(j)].setdefault(name, {})[inner] = value
    for part, records in zip(parts, fields):
        for name, items in records.items():
            part[name] = ConfigRecord(items)
    for name, rec in rd.items():
        if name == BATCH:
            continue
        j, sep, inner = name.partition(":")
        if not sep or not j.isdigit() or int(j) >= count or inner in parts[int(j)]:
            raise ValueError(f"record {name!r} of a batch of {count} is not one of its messages'")
        parts[int(j)][inner] = rec
    if any(len(part) == 0 for part in parts):
        raise ValueError(f"a batch of {count} messages has one without records")
    return parts


def describe(rd: RecordDict) -> dict:
    """What a RecordDict carries, for the wire audit: per logical record (the packed ones
    unpacked, module docstring), per key, the type, shape, dtype, the number of serialised bytes
    and their SHA-256 (arrays) or the value type (scalars).  Values of scalars are kept only for
    ``fedsonmf.meta`` and the public secure-aggregation parameters (the scalar ``secagg``: cohort,
    scales, public keys)."""
    out: dict[str, dict] = {}

    def record(name: str, type_name: str) -> dict:
        return out.setdefault(name, {"type": type_name, "items": {}})["items"]

    def scalar(name: str, k: str, v) -> None:
        item = {"type": type(v).__name__, "bytes": len(v) if isinstance(v, (str, bytes)) else 8}
        if name == META or (name == SCALARS and k == "secagg"):  # public protocol parameters
            item["value"] = v
        record(name, "ConfigRecord")[k] = item

    for name, rec in rd.items():
        if name == BLOB:
            continue
        if isinstance(rec, ArrayRecord):
            items = record(name, "ArrayRecord")
            for k, a in rec.items():
                items[k] = {"shape": list(a.shape), "dtype": str(a.dtype), "bytes": len(a.data),
                            "sha256": hashlib.sha256(a.data).hexdigest()}
        else:
            for k, v in rec.items():
                if name != META or not _is_packed(k):
                    scalar(name, k, v)
    for name in (SCALARS, DIAG_SCALARS):
        for k, v in scalars_of(rd, name).items():
            scalar(name, k, v)
    for name, k, data in _segments(rd):
        arr = _load(data)
        record(name, "ArrayRecord")[k] = {"shape": list(arr.shape), "dtype": str(arr.dtype), "bytes": len(data),
                                          "sha256": hashlib.sha256(data).hexdigest()}
    return out
