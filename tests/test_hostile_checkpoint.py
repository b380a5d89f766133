"""A tampered or malformed server checkpoint is refused, before the fit resumes, with one
:class:`CheckpointError` naming the file (never a raw NumPy error, never a silent resume).

Each case saves a small valid checkpoint with the library's own API, changes one thing in
``server.npz`` and resumes; the last case checks that an untouched checkpoint still resumes
bit for bit to the uninterrupted run.
"""

import io
import json
import shutil
import tracemalloc
import zipfile

import numpy as np
import pytest

from fedsonmf._validation import check_views
from fedsonmf.exceptions import CheckpointError
from fedsonmf.federation import checkpoint as ckpt
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.protocol.config import FedConfig

CFG = FedConfig(n_components=2, tau=2)
SEED = 3


@pytest.fixture(scope="module")
def views():
    rng = np.random.default_rng(0)
    return check_views([rng.random((20, d)) for d in (6, 6, 7)], 2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, views):
    base = tmp_path_factory.mktemp("ckbase")
    run_inprocess(views, CFG, max_rounds=2, seed=SEED, checkpoint_dir=base)
    return base


@pytest.fixture
def ck(saved, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(saved, d)
    return d


def _tamper(d, change):
    arrays, meta = ckpt.load_npz(d / ckpt.SERVER_FILE)
    change(arrays, meta)
    ckpt.atomic_save_npz(d / ckpt.SERVER_FILE, arrays, meta)


def _resume(views, d):
    return run_inprocess(views, CFG, max_rounds=3, seed=SEED, checkpoint_dir=d, resume=True)


def _set(key, fn):
    def change(arrays, meta):
        arrays[key] = fn(arrays[key])
    return change


def _nan_at_corner(A):
    A = A.copy()
    A[0, 0] = np.nan
    return A


def _both_negative(arrays, meta):
    for k in ("V", "Vbar"):
        arrays[k] = -1e6 * np.abs(arrays[k])


def _both_narrower(arrays, meta):
    for k in ("V", "Vbar"):
        arrays[k] = np.ascontiguousarray(arrays[k][:, :-3])


def _drop(key):
    def change(arrays, meta):
        del arrays[key]
    return change


def _meta(key, value):
    def change(arrays, meta):
        meta[key] = value
    return change


@pytest.mark.parametrize("change, match", [
    (_set("Vbar", _nan_at_corner), r"saved Vbar holds NaN or Inf"),
    (_set("V", lambda A: np.full_like(A, np.inf)), r"saved V holds NaN or Inf"),
    (_set("Vbar", lambda A: A[:, :-3]), r"saved Vbar has shape \(2, 17\), expected \(r, n\) = \(2, 20\)"),
    (_set("V", lambda A: A[:1]), r"saved V has shape \(1, 20\), expected \(r, n\) = \(2, 20\)"),
    (_both_narrower, r"saved V has shape \(2, 17\), expected \(r, n\) = \(2, 20\)"),  # n: known at resume
    (_both_negative, r"saved V has negative entries"),
    (_set("V", lambda A: A.astype(np.float32)), r"saved V is float32, expected float64"),
    (_drop("Vbar"), r"has no array 'Vbar'"),
    (_drop("V"), r"has no array 'V'"),
    (_set("bound_exp", lambda a: np.asarray(10**6)), r"saved bound_exp is not a small integer exponent"),
    (_meta("mu", float("nan")), r"mu = nan, not a number >= 0"),
    (_meta("mu", -5.0), r"mu = -5.0, not a number >= 0"),
])
def test_tampered_server_arrays_are_refused_naming_the_file(views, ck, change, match):
    _tamper(ck, change)
    with pytest.raises(CheckpointError, match=match) as ei:
        _resume(views, ck)
    assert str(ck / ckpt.SERVER_FILE) in str(ei.value) and "\n" not in str(ei.value)


def test_a_negative_vbar_is_not_damage(ck):
    """V-bar is the pre-proximal matrix (docs/algorithm.md §5): negative entries are legitimate."""
    _tamper(ck, _set("Vbar", lambda A: A - 10.0))
    assert ckpt.load_server_checkpoint(ck).state.arrays["Vbar"].min() < 0


def _write_zip(path, members):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, header_shape, payload in members:
            with zf.open(name, "w", force_zip64=True) as fh:
                buf = io.BytesIO()
                np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False,
                                                            "shape": header_shape})
                fh.write(buf.getvalue())
                for chunk in payload:
                    fh.write(chunk)


def _meta_member(d):
    _, meta = ckpt.load_npz(d / ckpt.SERVER_FILE)
    buf = io.BytesIO()
    np.save(buf, np.array(json.dumps(meta)))
    return buf.getvalue()


def test_a_zip_bomb_is_refused_before_it_is_inflated(views, ck):
    meta = _meta_member(ck)
    zeros = bytes(1 << 20)
    _write_zip(ck / ckpt.SERVER_FILE, [("V.npy", (2, 9_000_000), (zeros for _ in range(70)))])
    with zipfile.ZipFile(ck / ckpt.SERVER_FILE, "a") as zf:
        zf.writestr("__meta_json__.npy", meta)
    assert (ck / ckpt.SERVER_FILE).stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"member 'V.npy' inflates .* a zip bomb\?") as ei:
            _resume(views, ck)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(ck / ckpt.SERVER_FILE) in str(ei.value)
    assert peak < 16 << 20  # nothing of the 70 MiB was inflated


def test_a_member_declaring_more_than_it_holds_is_refused(views, ck):
    _write_zip(ck / ckpt.SERVER_FILE, [("V.npy", (2, 10**9), [bytes(320)])])
    with pytest.raises(CheckpointError, match=r"declaring shape \(2, 1000000000\).*forged header"):
        _resume(views, ck)


def test_an_archive_above_the_memory_budget_is_refused(views, ck, monkeypatch):
    monkeypatch.setenv("FEDSONMF_MAX_VIEW_BYTES", "1K")
    with pytest.raises(CheckpointError, match=r"server\.npz: the checkpoint archive .* budget of 1 KiB"):
        _resume(views, ck)


def test_a_file_that_is_not_an_archive_is_refused(views, ck):
    np.save(ck / "x.npy", np.zeros((2, 20)))
    (ck / "x.npy").replace(ck / ckpt.SERVER_FILE)
    with pytest.raises(CheckpointError, match=r"server\.npz: not a checkpoint archive"):
        _resume(views, ck)


def test_a_member_that_is_not_an_array_is_refused(views, ck):
    with zipfile.ZipFile(ck / ckpt.SERVER_FILE, "a") as zf:
        zf.writestr("notes.txt", b"hello")
    with pytest.raises(CheckpointError, match=r"server\.npz: member 'notes.txt' is not a NumPy array"):
        _resume(views, ck)


def test_deeply_nested_metadata_is_refused(views, ck):
    arrays, _ = ckpt.load_npz(ck / ckpt.SERVER_FILE)
    with open(ck / ckpt.SERVER_FILE, "wb") as fh:
        np.savez(fh, **arrays, __meta_json__=np.array("[" * 100_000 + "]" * 100_000))
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint file .*server\.npz"):
        _resume(views, ck)


def test_an_untouched_checkpoint_resumes_bit_for_bit(views, ck):
    full = run_inprocess(views, CFG, max_rounds=3, seed=SEED)
    _tamper(ck, lambda arrays, meta: None)  # loaded and saved again with the library's own API
    res = _resume(views, ck)
    assert res.n_rounds == 3 and np.array_equal(res.V, full.V)
    for a, b in zip(res.bases, full.bases):
        assert np.array_equal(a, b)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(res.history.rows) == strip(full.history.rows)
