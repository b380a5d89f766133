"""Hostile sparse views and MAT v7.3 (HDF5) files: refused with an InputError naming the file (or the
view, for data given to ``fit``) before scipy or HDF5 touches what they declare.

* index arrays that do not fit the shape (an index past it, pointers that decrease, do not start at 0
  or do not end at the number of entries): scipy's compiled routines trust them, so a forged ``.npz``
  crashed the process (SIGSEGV) or was read as silently wrong data -- ``.npz``, MAT v5, MAT v7.3 and
  scipy.sparse input alike;
* a MAT v7.3 dataset whose data is another file's (external storage, an external link, a virtual
  dataset) or that inflates like a bomb (compressed, or chunks never written);
* a ``.mtx`` comment line longer than 64 KiB hiding the size line from the size precheck;
* a view declaring so many features that a fit could not hold them;
* a ``.npz`` whose ``shape`` member is not two integers.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from fedsonmf import FedSONMF
from fedsonmf._validation import check_views, compressed_index_problem, sparse_structure_problem
from fedsonmf.datasets import _limits, read_view
from fedsonmf.exceptions import InputError

h5py = pytest.importorskip("h5py")


@pytest.fixture(autouse=True)
def default_limits(monkeypatch):
    monkeypatch.delenv(_limits.BUDGET_ENV, raising=False)
    monkeypatch.delenv(_limits.INFLATION_ENV, raising=False)


def refused(fn, *fragments) -> str:
    with pytest.raises(InputError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, msg
    return msg


def savez_sparse(path, fmt, shape, data, indices, indptr):
    np.savez(path, format=np.array(fmt), shape=np.array(shape), data=np.asarray(data, dtype=float),
             indices=np.asarray(indices, dtype=np.int32), indptr=np.asarray(indptr, dtype=np.int32))
    return path


def matify(path):
    """Give an HDF5 file written with a 512-byte user block the MAT v7.3 header."""
    with open(path, "r+b") as fh:
        fh.write(b"MATLAB 7.3 MAT-file".ljust(116, b" ") + bytes(8) + b"\x00\x02IM")
    return path


# ----------------------------------------------------------------------------- malformed index arrays


def test_npz_index_past_the_shape_is_refused_not_a_segfault(tmp_path):
    path = savez_sparse(tmp_path / "oob.npz", "csc", [20, 5], np.ones(20), np.r_[np.zeros(19), 1.5e9],
                        np.arange(0, 21, 4))
    refused(lambda: read_view(path), str(path), "row index 1500000000 out of range for 20 rows")
    path = savez_sparse(tmp_path / "neg.npz", "csr", [20, 5], np.ones(20), np.r_[np.zeros(19), -7], np.arange(21))
    refused(lambda: read_view(path), str(path), "column index -7 out of range for 5 columns")


@pytest.mark.parametrize("indptr, fragment", [
    (np.r_[0, 19, np.arange(2, 21)], "decrease at row 1 (19 then 2)"),
    (np.r_[3, np.arange(1, 21)], "index pointer should start with 0"),  # (scipy's own check, rephrased)
    (np.r_[np.arange(20), 18], "decrease at row 19"),
    (np.arange(11), "index pointer size 11 should be 21"),
])
def test_npz_pointers_that_do_not_fit_are_refused_not_read_silently(tmp_path, indptr, fragment):
    path = savez_sparse(tmp_path / "bad.npz", "csr", [20, 5], np.ones(20), np.zeros(20), indptr)
    refused(lambda: read_view(path), str(path), fragment)


@pytest.mark.parametrize("indptr, indices, fragment", [
    ([3, 4, 5], [0, 1], "start at 3, not 0"),
    ([0, 1], [0], "2 row pointers (indptr) for 2 rows (expected 3)"),
    ([0, 1, 1], [0, 1], "end at 1 but there are 2 column indices"),
    ([0, 1, 2], [0.0, 1.0], "not integers"),
])
def test_the_structural_check_names_each_problem(indptr, indices, fragment):
    problem = compressed_index_problem(np.array(indptr), np.array(indices), 2, (2, 3), by_rows=True)
    assert problem is not None and fragment in problem, problem


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_valid_sparse_npz_still_reads_identically(tmp_path, fmt):
    X = sp.random(30, 7, density=0.3, random_state=1, format=fmt)
    sp.save_npz(tmp_path / "ok.npz", X)
    Y, _ = read_view(tmp_path / "ok.npz")
    assert Y.format == "csr" and Y.shape == (30, 7)
    np.testing.assert_array_equal(Y.toarray(), X.toarray())


def test_mat5_sparse_index_past_the_shape_is_refused(tmp_path):
    X = sp.random(20, 5, density=0.5, random_state=0, format="csc")
    path = tmp_path / "sp5.mat"
    scipy.io.savemat(path, {"X": X}, do_compression=False)
    Y, _ = read_view(path)  # the valid file reads identically
    np.testing.assert_array_equal(Y.toarray(), X.toarray())
    raw = bytearray(path.read_bytes())
    k = raw.find(X.indices.astype("<i4").tobytes())
    raw[k:k + 4] = np.int32(1_500_000_000).tobytes()
    path.write_bytes(bytes(raw))
    refused(lambda: read_view(path), str(path), "'X'", "row index 1500000000 out of range for 20 rows")


def write_mat73_sparse(path, ir, jc, n_rows=5):
    with h5py.File(path, "w", userblock_size=512) as fh:
        g = fh.create_group("X")
        g.attrs["MATLAB_class"] = np.bytes_("double")
        g.attrs["MATLAB_sparse"] = np.uint64(n_rows)
        g["jc"], g["ir"], g["data"] = np.asarray(jc, np.uint64), np.asarray(ir, np.uint64), np.arange(1.0, len(ir) + 1)
    return matify(path)


def test_mat73_sparse_index_past_the_shape_is_refused(tmp_path):
    jc = np.arange(0, 41, 2)  # the MATLAB 5 x 20 matrix: 20 columns of 2 entries
    ir = np.tile([0, 3], 20)
    Y, _ = read_view(write_mat73_sparse(tmp_path / "ok73.mat", ir, jc))
    want = np.zeros((5, 20))
    want[ir, np.repeat(np.arange(20), 2)] = np.arange(1.0, 41)
    np.testing.assert_array_equal(Y.toarray(), want)
    ir[7] = 1_000_000_000
    path = write_mat73_sparse(tmp_path / "oob73.mat", ir, jc)
    refused(lambda: read_view(path), str(path), "'/X'", "row index 1000000000 out of range for 5 rows")
    path = write_mat73_sparse(tmp_path / "dec73.mat", np.tile([0, 3], 20), np.r_[0, 30, jc[2:]])
    refused(lambda: read_view(path), str(path), "decrease at column 1")


def test_sparse_input_to_fit_with_an_index_past_the_shape_is_refused():
    rng = np.random.default_rng(0)
    X = sp.csr_matrix((rng.random(20), np.r_[np.zeros(19), 10**9].astype(np.int32), np.arange(21)), shape=(20, 5))
    with pytest.raises(InputError, match=r"view 0: .*column index 1000000000 out of range for 5 columns"):
        FedSONMF(2, max_rounds=2, random_state=0).fit([X, rng.random((20, 6))])
    C = sp.coo_array(sp.random(20, 5, density=0.5, random_state=0))
    C.coords[0][0] = 20
    assert sparse_structure_problem(C) == "row index 20 out of range for 20 rows"
    with pytest.raises(InputError, match=r"view 1: .*row index 20 out of range"):
        check_views([rng.random((20, 3)), C])
    R = sp.random(20, 5, density=0.5, random_state=0, format="csr")
    R.indptr[3] = R.indptr[5]
    with pytest.raises(InputError, match=r"view 0: .*indptr\) decrease"):
        check_views([R])


def test_valid_sparse_input_is_unchanged_by_the_check():
    X = sp.random(20, 6, density=0.4, random_state=2, format="csr")
    assert sparse_structure_problem(X) is None
    assert sparse_structure_problem(X.tocsc()) is None and sparse_structure_problem(X.tocoo()) is None
    (internal,) = check_views([X])
    np.testing.assert_array_equal(internal.toarray(), X.toarray().T)


# ----------------------------------------------------------------------------- MAT v7.3 (HDF5) data


def write_mat73(path, **dataset):
    with h5py.File(path, "w", userblock_size=512) as fh:
        ds = fh.create_dataset("X", **dataset)
        ds.attrs["MATLAB_class"] = np.bytes_("double")
    return matify(path)


def test_mat73_external_storage_is_refused_not_read_from_the_other_file(tmp_path):
    secret = tmp_path / "other_org_secret.npy"
    np.save(secret, np.arange(100.0).reshape(20, 5) + 1)
    path = write_mat73(tmp_path / "ext73.mat", shape=(5, 20), dtype="f8", external=[(str(secret), 128, 800)])
    refused(lambda: read_view(path), str(path), "'/X'", "external file", "other_org_secret.npy")


def test_mat73_external_storage_on_a_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    path = write_mat73(tmp_path / "fifo73.mat", shape=(5, 20), dtype="f8", external=[(str(fifo), 0, 800)])
    refused(lambda: read_view(path), str(path), "external file")


def test_mat73_external_and_soft_links_leaving_the_file_are_refused(tmp_path):
    target = tmp_path / "target.h5"
    with h5py.File(target, "w") as fh:
        fh.create_group("G").create_dataset("Y", data=np.ones((5, 20))).attrs["MATLAB_class"] = np.bytes_("double")
    path = tmp_path / "link73.mat"
    with h5py.File(path, "w", userblock_size=512) as fh:
        fh["X"] = h5py.ExternalLink(str(target), "/G/Y")
    refused(lambda: read_view(matify(path)), str(path), "'/X' is an external link", "target.h5")
    with h5py.File(path, "w", userblock_size=512) as fh:
        fh["E"] = h5py.ExternalLink(str(target), "/G")
        fh["X"] = h5py.SoftLink("/E/Y")
    refused(lambda: read_view(matify(path), key="X"), str(path), "'/E'")


def test_mat73_virtual_dataset_is_refused(tmp_path):
    source = tmp_path / "source.h5"
    with h5py.File(source, "w") as fh:
        fh["Y"] = np.ones((5, 20))
    layout = h5py.VirtualLayout(shape=(5, 20), dtype="f8")
    layout[:] = h5py.VirtualSource(str(source), "Y", shape=(5, 20))
    path = tmp_path / "vds73.mat"
    with h5py.File(path, "w", userblock_size=512) as fh:
        fh.create_virtual_dataset("X", layout).attrs["MATLAB_class"] = np.bytes_("double")
    refused(lambda: read_view(matify(path)), str(path), "'/X' is a virtual dataset")


def test_mat73_unwritten_and_compressed_datasets_follow_the_inflation_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(_limits, "INFLATION_FLOOR", 1 << 10)  # the rule at a small scale: no large file here
    path = write_mat73(tmp_path / "fill73.mat", shape=(200, 500), dtype="f8", chunks=(100, 100), fillvalue=1.0)
    refused(lambda: read_view(path), str(path), "'/X'", "fill value", "more than 100", _limits.INFLATION_ENV)
    path = write_mat73(tmp_path / "gz73.mat", data=np.zeros((200, 500)), chunks=(100, 100), compression="gzip")
    refused(lambda: read_view(path), str(path), "'/X' (compressed)", "more than 100")
    monkeypatch.setenv(_limits.INFLATION_ENV, "1e6")
    X, _ = read_view(path, validate=False)
    assert X.shape == (500, 200) and not X.any()
    monkeypatch.delenv(_limits.INFLATION_ENV)
    path = write_mat73(tmp_path / "ok73.mat", data=np.arange(1.0, 101).reshape(5, 20))
    X, _ = read_view(path)  # contiguous, fully written: read as before
    np.testing.assert_array_equal(X, np.arange(1.0, 101).reshape(5, 20).T)


# ----------------------------------------------------------------------------- .mtx size line


def test_mtx_comment_longer_than_64k_does_not_hide_the_size_line(tmp_path, monkeypatch):
    path = tmp_path / "t.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n%" + "a" * 70000 + "\n300000000 3 1\n1 1 1\n")
    monkeypatch.setenv(_limits.BUDGET_ENV, "500M")
    refused(lambda: read_view(path), str(path), "300000000 x 3", "more than the budget of 500 MiB")
    path.write_text("%%MatrixMarket matrix coordinate real general\n%" + "a" * 70000 + "\n3 2 1\n2 1 4.5\n")
    X, _ = read_view(path)
    np.testing.assert_array_equal(X.toarray(), [[0, 0], [4.5, 0], [0, 0]])


@pytest.mark.parametrize("size_line", ["3 x 1", "3 2", "3 2 -1", "3 2 1 7"])
def test_mtx_size_line_that_cannot_be_parsed_is_refused(tmp_path, size_line):
    path = tmp_path / "t.mtx"
    path.write_text(f"%%MatrixMarket matrix coordinate real general\n{size_line}\n1 1 1\n")
    refused(lambda: read_view(path), str(path), "size line", repr(size_line))


# ----------------------------------------------------------------------------- features a fit must hold


def test_view_with_more_features_than_a_fit_can_hold_is_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setenv(_limits.BUDGET_ENV, "1G")
    X = sp.csr_array((np.ones(20), (np.arange(20), np.arange(20) * 10**7)), shape=(20, 2 * 10**8))
    sp.save_npz(tmp_path / "wide.npz", X, compressed=False)
    refused(lambda: read_view(tmp_path / "wide.npz"), "wide.npz", "20 x 200000000", "191 GiB",
            "more than the budget of 1 GiB", "refused before reading")
    path = tmp_path / "wide.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n20 100000000000 1\n1 1 1\n")
    refused(lambda: read_view(path), str(path), "20 x 100000000000", "more than the budget")
    with pytest.raises(InputError, match=r"view 0: its shape 20 x 200000000 .* budget of 1 GiB"):
        FedSONMF(2, max_rounds=2, random_state=0).fit([X, np.ones((20, 3))])
    ok = sp.random(20, 100_000, density=1e-4, random_state=0, format="csr")  # 100 MB for a fit: kept
    sp.save_npz(tmp_path / "ok.npz", ok)
    assert read_view(tmp_path / "ok.npz")[0].shape == (20, 100_000)


# ----------------------------------------------------------------------------- .npz shape member


@pytest.mark.parametrize("shape", [np.array([[20, 5]]), np.array(20), np.array([20, 5, 1]), np.array([20.0, 5.0])])
def test_npz_shape_member_that_is_not_two_integers_is_refused(tmp_path, shape):
    path = tmp_path / "s.npz"
    np.savez(path, format=np.array("csr"), shape=shape, data=np.ones(20), indices=np.zeros(20, np.int32),
             indptr=np.arange(21, dtype=np.int32))
    refused(lambda: read_view(path), str(path), "'shape' member")
