"""Hostile view files: a header declaring more than the file holds or than memory allows is refused
from the header, before anything is allocated (``fedsonmf.datasets._limits``).

Each case asserts the project's InputError naming the file and the problem, and a peak of traced
Python/NumPy allocations under 200 MB during the refused read (``tracemalloc``).  Timings are not
asserted; ``python -m pytest tests/test_hostile_files.py --durations=0`` shows them.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from fedsonmf.datasets import _limits, load_mat, load_views, read_view
from fedsonmf.exceptions import InputError

PEAK = 200 << 20


def refused_cheaply(fn, *fragments):
    """Run ``fn``, expecting an InputError whose one-line message holds every fragment, with a traced
    peak allocation under 200 MB; returns the message."""
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as info:
            fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(info.value)
    assert peak < PEAK, (peak, msg)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, msg
    return msg


def npy_header(shape, descr="<f8") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


@pytest.fixture(autouse=True)
def default_limits(monkeypatch):
    monkeypatch.delenv(_limits.BUDGET_ENV, raising=False)
    monkeypatch.delenv(_limits.INFLATION_ENV, raising=False)


# ----------------------------------------------------------------------------- Matrix Market


def test_mtx_dense_header_declaring_50_by_10e9_is_refused_from_its_size_line(tmp_path):
    path = tmp_path / "bomb.mtx"
    path.write_text("%%MatrixMarket matrix array real general\n50 1000000000\n1\n")
    assert path.stat().st_size < 70
    refused_cheaply(lambda: read_view(path), str(path), "50 x 1000000000", "forged header")


def test_mtx_coordinate_declaring_5e10_entries_in_70_bytes_is_refused(tmp_path):
    path = tmp_path / "bomb.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n50 1000000000 50000000000\n1 1 1\n")
    refused_cheaply(lambda: read_view(path), str(path), "50000000000 entries", "forged header")


def test_mtx_with_honest_entries_but_10e12_rows_is_over_the_budget(tmp_path):
    path = tmp_path / "tall.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n1000000000000 3 1\n1 1 1\n")
    refused_cheaply(lambda: read_view(path), str(path), "memory", _limits.BUDGET_ENV)


def test_mtx_within_the_limits_still_reads(tmp_path):
    X = sp.random(30, 7, density=0.3, random_state=0, format="coo")
    scipy.io.mmwrite(tmp_path / "ok.mtx", X)
    got, _ = read_view(tmp_path / "ok.mtx")
    assert np.allclose(got.toarray(), X.toarray())


# ----------------------------------------------------------------------------- .npy


def test_npy_header_declaring_10e6_by_10e6_with_few_bytes_is_refused(tmp_path):
    path = tmp_path / "big.npy"
    path.write_bytes(npy_header((10**6, 10**6)) + bytes(64))
    for mmap_mode in (None, "r"):
        refused_cheaply(lambda m=mmap_mode: read_view(path, mmap_mode=m), str(path), "(1000000, 1000000)",
                        "7.28 TiB", "forged header")


def test_npy_over_the_budget_is_refused_and_reads_under_the_default(tmp_path, monkeypatch):
    path = tmp_path / "mid.npy"
    np.save(path, np.ones((512, 512)))  # 2 MiB
    monkeypatch.setenv(_limits.BUDGET_ENV, "1M")
    refused_cheaply(lambda: read_view(path), str(path), "more than the budget of 1 MiB",
                    f"{_limits.BUDGET_ENV}=1M")
    monkeypatch.delenv(_limits.BUDGET_ENV)
    X, _ = read_view(path)
    assert X.shape == (512, 512)


def test_pickled_and_object_npy_stay_refused(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([[1, "a"]], dtype=object), allow_pickle=True)
    refused_cheaply(lambda: read_view(tmp_path / "obj.npy"), "Python objects")
    np.savez(tmp_path / "obj.npz", np.array([[1, "a"]], dtype=object))
    refused_cheaply(lambda: read_view(tmp_path / "obj.npz"), "pickled")


# ----------------------------------------------------------------------------- .npz


def write_zeros_member(path, declared_shape, n_bytes: int) -> None:
    """A .npz whose one member is an .npy header then ``n_bytes`` of zeros, deflated as it is
    written (about 1 MB of archive per GB declared)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("arr_0.npy", "w", force_zip64=True) as fh:
            fh.write(npy_header(declared_shape))
            chunk = bytes(1 << 20)
            for _ in range(n_bytes >> 20):
                fh.write(chunk)


def test_npz_member_inflating_like_a_zip_bomb_is_refused(tmp_path):
    path = tmp_path / "bomb.npz"
    write_zeros_member(path, ((96 << 20) // 8 // 1024, 1024), 96 << 20)  # 96 MiB of zeros, ~100 KB on disk
    assert path.stat().st_size < 1 << 20
    refused_cheaply(lambda: read_view(path), str(path), "member 'arr_0.npy'", "zip bomb")


def test_npz_member_beyond_the_budget_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "wide.npz"
    write_zeros_member(path, (1024, 1024), 8 << 20)
    monkeypatch.setenv(_limits.BUDGET_ENV, "4M")
    refused_cheaply(lambda: read_view(path), str(path), "more than the budget of 4 MiB")


def test_npz_member_header_declaring_more_than_the_member_is_refused(tmp_path):
    path = tmp_path / "forged.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("arr_0.npy", npy_header((10**6, 10**6)) + bytes(64))
    refused_cheaply(lambda: read_view(path), str(path), "member 'arr_0.npy'", "forged header")


def test_sparse_npz_declaring_10e12_rows_is_over_the_budget(tmp_path):
    path = tmp_path / "tall.npz"
    X = sp.csc_array(sp.random(5, 3, density=0.5, random_state=0))
    np.savez_compressed(path, format=np.array("csc"), shape=np.array([10**12, 3]), data=X.data,
                        indices=X.indices, indptr=X.indptr)
    refused_cheaply(lambda: read_view(path), str(path), "memory")


def test_genuine_npz_views_still_read(tmp_path):
    X = sp.random(40, 9, density=0.2, random_state=1, format="csr")
    sp.save_npz(tmp_path / "s.npz", X)
    np.savez_compressed(tmp_path / "d.npz", np.zeros((300, 300)))  # compresses ~1000x, but under 64 MiB
    assert np.allclose(read_view(tmp_path / "s.npz")[0].toarray(), X.toarray())
    assert read_view(tmp_path / "d.npz")[0].shape == (300, 300)


# ----------------------------------------------------------------------------- MAT


def mat5(elements: bytes) -> bytes:
    header = b"MATLAB 5.0 MAT-file, hostile".ljust(116, b" ") + bytes(8) + struct.pack("<H", 0x0100) + b"IM"
    return header + elements


def mat_double(name: bytes, dims, values: np.ndarray) -> bytes:
    def sub(t, body):
        return struct.pack("<II", t, len(body)) + body + bytes(-len(body) % 8)

    body = (sub(6, struct.pack("<II", 6, 0)) + sub(5, struct.pack(f"<{len(dims)}i", *dims)) + sub(1, name)
            + sub(9, values.astype("<f8").tobytes()))
    return struct.pack("<II", 14, len(body)) + body


def test_mat_array_declaring_10e10_values_it_does_not_store_is_refused(tmp_path):
    path = tmp_path / "forged.mat"
    path.write_bytes(mat5(mat_double(b"X", (100000, 100000), np.ones(4))))
    refused_cheaply(lambda: read_view(path), str(path), "100000x100000", "stores 4", "forged header")
    refused_cheaply(lambda: load_mat(path), str(path), "forged header")


def test_compressed_mat_inflating_like_a_zip_bomb_is_refused(tmp_path):
    path = tmp_path / "bomb.mat"
    scipy.io.savemat(path, {"X": np.zeros((3000, 3000)), "y": np.arange(3000)}, do_compression=True)  # 69 MiB
    assert path.stat().st_size < 1 << 20
    refused_cheaply(lambda: read_view(path, key="X"), str(path), "compressed element", "zip bomb")


def test_mat_over_the_budget_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "mid.mat"
    scipy.io.savemat(path, {"X": np.ones((400, 400))})
    monkeypatch.setenv(_limits.BUDGET_ENV, "1M")
    refused_cheaply(lambda: read_view(path), str(path), "more than the budget of 1 MiB")


def test_mat73_dataset_declaring_10e12_values_is_refused(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "big73.mat"
    with h5py.File(path, "w", userblock_size=512) as fh:
        ds = fh.create_dataset("X", shape=(10**6, 10**6), dtype="f8", chunks=(64, 64), compression="gzip")
        ds.attrs["MATLAB_class"] = np.bytes_("double")
    refused_cheaply(lambda: read_view(path), str(path), "'/X'", "memory")


# ----------------------------------------------------------------------------- paths


def test_a_directory_is_not_a_view_file(tmp_path):
    folder = tmp_path / "views"
    folder.mkdir()
    (tmp_path / "views.npy").mkdir()
    for fn in (lambda: read_view(folder), lambda: load_views([folder]), lambda: read_view(tmp_path / "views.npy")):
        refused_cheaply(fn, "is a directory", "pass the file(s) inside it")
    refused_cheaply(lambda: load_mat(folder), "is a directory")


def test_a_missing_file_is_named(tmp_path):
    for name in ("gone.npy", "gone"):
        refused_cheaply(lambda n=name: load_views([tmp_path / n]), str(tmp_path / name), "does not exist")


# ----------------------------------------------------------------------------- command line


@pytest.mark.parametrize("case", ["mtx", "npy", "dir"])
def test_cli_refuses_a_hostile_view_in_one_line_with_exit_2(tmp_path, case):
    ok = tmp_path / "ok.npy"
    np.save(ok, np.random.default_rng(0).random((20, 4)))
    if case == "mtx":
        bad = tmp_path / "bomb.mtx"
        bad.write_text("%%MatrixMarket matrix array real general\n50 1000000000\n1\n")
    elif case == "npy":
        bad = tmp_path / "big.npy"
        bad.write_bytes(npy_header((10**6, 10**6)) + bytes(64))
    else:
        bad = tmp_path / "folder"
        bad.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (_limits.BUDGET_ENV, _limits.INFLATION_ENV)}
    proc = subprocess.run([sys.executable, "-c", "from fedsonmf.cli.app import main; main()", "cluster", str(bad),
                           str(ok), "-k", "2"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(bad) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_text_view_over_the_budget_is_refused_before_parsing(tmp_path, monkeypatch):
    path = tmp_path / "v.csv"
    np.savetxt(path, np.ones((200, 20)), delimiter=",")
    monkeypatch.setenv(_limits.BUDGET_ENV, "64K")
    refused_cheaply(lambda: read_view(path), str(path), "text view", "more than the budget of 64 KiB")


def test_the_budget_is_half_the_available_memory_unless_set(monkeypatch):
    avail = _limits.available_memory()
    assert avail is None or avail > 0
    monkeypatch.setattr(_limits, "available_memory", lambda: 10 << 30)
    assert _limits.view_budget() == 5 << 30
    monkeypatch.setattr(_limits, "available_memory", lambda: None)
    assert _limits.view_budget() == 4 << 30
    monkeypatch.setenv(_limits.BUDGET_ENV, "1.5G")
    assert _limits.view_budget() == 3 << 29
    monkeypatch.setenv(_limits.BUDGET_ENV, "lots")
    with pytest.raises(InputError, match=_limits.BUDGET_ENV):
        _limits.view_budget()


def test_mat_v4_matrix_declaring_10e10_values_is_refused(tmp_path):
    path = tmp_path / "v4.mat"
    path.write_bytes(struct.pack("<5i", 0, 100000, 100000, 0, 2) + b"X\0" + bytes(8))
    refused_cheaply(lambda: read_view(path), str(path), "MAT v4 matrix 1 declaring 100000x100000", "forged header")
    scipy.io.savemat(tmp_path / "ok4.mat", {"X": np.ones((30, 5)), "y": np.arange(30.0)}, format="4")
    assert read_view(tmp_path / "ok4.mat", key="X")[0].shape == (30, 5)


def test_a_deployment_mask_file_with_a_forged_header_is_refused(tmp_path):
    from fedsonmf.federation.flower.viewfiles import check_inputs

    views = []
    for p in range(2):
        views.append(tmp_path / f"v{p}.npy")
        np.save(views[-1], np.random.default_rng(p).random((20, 5)))
    mask = tmp_path / "mask.npy"
    mask.write_bytes(npy_header((10**6, 10**6), "|b1") + bytes(64))
    refused_cheaply(lambda: check_inputs(views, 2, mask_paths=[mask, None]), "mask file of view 0", str(mask),
                    "forged header")
