"""The Flower codec: a fedsonmf message travels as few Flower objects, bit for bit.

Flower moves every record, array and array chunk of a message as an object of its own (one
HTTPS request each, both ways); the codec packs a message's records into ``fedsonmf.meta``.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ConfigRecord, RecordDict  # noqa: E402
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402

from fedsonmf.federation.flower import codec  # noqa: E402
from fedsonmf.protocol.messages import Message  # noqa: E402


def _msg(shape=(6, 50)):
    rng = np.random.default_rng(0)
    return Message("round", 4, {"G": np.asfortranarray(rng.random(shape)), "cols": np.arange(7),
                                "secagg.arrays.G": rng.integers(0, 2**63, shape, dtype=np.uint64)},
                   {"mu": 0.5, "secagg": "{\"cohort\": [0, 1]}", "kept_sum": True, "d": 12},
                   {"grad0": rng.random(shape), "f0": 1.25})


def test_round_trip_is_bit_exact_and_keeps_the_memory_order():
    msg = _msg()
    rd = codec.encode(msg, client=1, job_id="job")
    back, meta = codec.decode(rd)
    assert meta == {"kind": "round", "round": 4, "client": 1, "job-id": "job"}
    assert (back.kind, back.round, back.scalars) == (msg.kind, msg.round, msg.scalars)
    for k, a in msg.arrays.items():
        assert back.arrays[k].dtype == a.dtype and np.array_equal(back.arrays[k], a)
        assert back.arrays[k].tobytes(order="A") == a.tobytes(order="A")
    assert back.arrays["G"].flags.f_contiguous  # BLAS results depend on the layout: it is kept
    assert set(back.diagnostics) == {"grad0", "f0"} and back.diagnostics["f0"] == 1.25
    assert np.array_equal(back.diagnostics["grad0"], msg.diagnostics["grad0"])


def test_a_message_is_three_flower_objects():
    """Message, RecordDict and ``fedsonmf.meta``, however many arrays and records it carries."""
    rd = codec.encode(_msg(), client=0, job_id="j")
    assert list(rd.keys()) == [codec.META]
    assert len(get_all_nested_objects(rd)) == 2  # the RecordDict and its one record (+ the Message)


def test_describe_reports_the_logical_records_as_flower_arrays_would():
    msg = _msg()
    desc = codec.describe(codec.encode(msg, client=0, job_id="j"))
    assert set(desc) == {codec.META, codec.ARRAYS, codec.SCALARS, codec.DIAG_ARRAYS, codec.DIAG_SCALARS}
    assert set(desc[codec.META]["items"]) == {"kind", "round", "client", "job-id"}
    for k, a in msg.arrays.items():
        data = Array(a).data  # what Flower's Array would carry: the same bytes, the same digest
        assert desc[codec.ARRAYS]["items"][k] == {"shape": list(a.shape), "dtype": str(a.dtype), "bytes": len(data),
                                                 "sha256": hashlib.sha256(data).hexdigest()}
    assert desc[codec.SCALARS]["items"]["secagg"]["value"] == msg.scalars["secagg"]
    assert "value" not in desc[codec.SCALARS]["items"]["mu"]
    assert codec.array_bytes(codec.encode(msg, client=0, job_id="j")) == sum(
        len(Array(a).data) for a in [*msg.arrays.values(), msg.diagnostics["grad0"]])


def test_a_large_blob_travels_as_a_chunked_array():
    big = Message("round", 1, {"V": np.random.default_rng(1).random((20, 30_000))}, {})
    rd = codec.encode(big, client=0, job_id="j")
    assert codec.BLOB in rd and codec.INLINE_BLOB not in rd[codec.META]
    assert np.array_equal(codec.decode(rd)[0].arrays["V"], big.arrays["V"])
    small = codec.encode(Message("round", 1, {"V": np.ones((2, 3))}, {}), client=0, job_id="j")
    assert codec.BLOB not in small


def test_set_meta_keeps_the_packed_records():
    rd = codec.encode(_msg(), client=0, job_id="j")
    codec.set_meta(rd, {"kind": "hello+setup", "round": 0, "client": 2, "job-id": "j", "partition-id": 2})
    back, meta = codec.decode(rd)
    assert meta["partition-id"] == 2 and back.kind == "hello+setup" and "G" in back.arrays


def test_a_blob_that_does_not_match_its_index_is_refused():
    rd = codec.encode(_msg(), client=0, job_id="j")
    meta = dict(rd[codec.META])
    meta[codec.INLINE_BLOB] = meta[codec.INLINE_BLOB][:-1]
    with pytest.raises(ValueError, match="does not fit"):
        codec.decode(RecordDict({codec.META: ConfigRecord(meta)}))
    meta = dict(rd[codec.META])
    meta[codec.INLINE_BLOB] = meta[codec.INLINE_BLOB] + b"\0"
    with pytest.raises(ValueError, match="no array claims"):
        codec.decode(RecordDict({codec.META: ConfigRecord(meta)}))


def test_a_header_that_claims_more_than_its_bytes_is_refused_before_allocation():
    """A peer's npy header declaring 10^11 float64 over 16 bytes would make numpy reserve 800 GB
    before finding the data short: the codec compares the header with the bytes first."""
    import io
    import json

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False, "shape": (10**11,)})
    segment = head.getvalue() + bytes(16)
    rd = codec.encode(_msg(), client=0, job_id="j")
    meta = dict(rd[codec.META])
    index = json.loads(str(meta[codec.INDEX]))
    index = [[index[0][0], index[0][1], len(segment)]]  # one array: the hostile segment
    meta[codec.INDEX] = json.dumps(index)
    meta[codec.INLINE_BLOB] = segment
    with pytest.raises(ValueError, match="declares"):
        codec.decode(RecordDict({codec.META: ConfigRecord(meta)}))


def test_an_array_packed_twice_is_refused():
    """Two entries of one name: one of them would be hidden from the wire log and the audit."""
    rd = codec.encode(Message("round", 1, {"a": np.ones(2)}, {}), client=0, job_id="j")
    meta = dict(rd[codec.META])
    meta[codec.INDEX] = meta[codec.INDEX].replace("]]", f"], {meta[codec.INDEX][1:-1]}]")
    meta[codec.INLINE_BLOB] = meta[codec.INLINE_BLOB] * 2
    with pytest.raises(ValueError, match="twice"):
        codec.describe(RecordDict({codec.META: ConfigRecord(meta)}))


def test_a_batch_carries_packed_messages():
    contents = [codec.encode(_msg(), client=0, job_id=f"j{i}") for i in range(3)]
    packed = codec.pack(contents)
    assert list(packed.keys()) == [codec.BATCH]  # one record: Flower moves 3 objects, not 2 + one per message
    back = [codec.decode(rd) for rd in codec.unpack(packed)]
    assert [meta["job-id"] for _, meta in back] == ["j0", "j1", "j2"]
    assert all(np.array_equal(m.arrays["G"], _msg().arrays["G"]) for m, _ in back)


def test_a_batch_keeps_large_blobs_and_errors_apart_and_round_trips_exactly():
    big = Message("round", 2, {"V": np.arange(codec.INLINE_LIMIT // 8 + 1, dtype=np.float64)}, {"mu": 0.5})
    contents = [codec.encode(_msg(), client=1, job_id="a"), codec.error_content(2, "boom"),
                codec.encode(big, client=1, job_id="b"), codec.encode(_msg(), client=1, job_id="c")]
    packed = codec.pack(contents)
    assert "2:" + codec.BLOB in packed  # above the inline limit: its own record, as alone
    inline = sum(len(v) for v in packed[codec.BATCH].values() if isinstance(v, bytes))
    assert inline <= codec.INLINE_LIMIT
    back = codec.unpack(packed)
    assert [sorted(rd.keys()) for rd in back] == [sorted(rd.keys()) for rd in contents]
    assert dict(back[1][codec.ERROR]) == {"code": 2, "reason": "boom"}
    m, meta = codec.decode(back[2])
    assert meta["job-id"] == "b" and np.array_equal(m.arrays["V"], big.arrays["V"]) and m.scalars["mu"] == 0.5
    assert codec.decode(back[3])[1]["job-id"] == "c"


def test_a_batch_count_beyond_its_records_is_refused_before_anything_is_made():
    """A hostile count must not make a node allocate a message per claimed part (10^9 of them)."""
    packed = codec.pack([codec.encode(_msg(), client=0, job_id="j")])
    for count in (10**9, 2):
        packed[codec.BATCH] = ConfigRecord({**dict(packed[codec.BATCH]), "count": count})
        with pytest.raises(ValueError, match="carries|without records"):
            codec.unpack(packed)


@pytest.mark.parametrize("key", ["3|fedsonmf.meta|kind", "x|fedsonmf.meta|kind", "0|kind", "0||kind"])
def test_a_batch_key_that_names_no_message_is_refused(key):
    packed = codec.pack([codec.encode(_msg(), client=0, job_id="j")])
    packed[codec.BATCH] = ConfigRecord({**dict(packed[codec.BATCH]), key: "round"})
    with pytest.raises(ValueError, match="not one of its messages"):
        codec.unpack(packed)
