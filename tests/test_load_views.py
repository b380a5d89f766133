"""One view per file (fedsonmf.datasets.files): formats, ids, masks, labels, bad input, the CLI."""

import csv
import os
import pickle
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from fedsonmf.datasets import load_mat, load_views, read_view, write_assignments
from fedsonmf.datasets.files import SUPPORTED_FORMATS, read_ids, read_labels
from fedsonmf.datasets.mat import default_data_dir
from fedsonmf.exceptions import InputError

# ----------------------------------------------------------------------------- writers


def write_csv(path, X, *, ids=None, header=True, delimiter=",", id_name="id"):
    X = np.asarray(X)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, delimiter=delimiter, lineterminator="\n")
        if header:
            w.writerow(([id_name] if ids is not None else []) + [f"f{j}" for j in range(X.shape[1])])
        for i, row in enumerate(X.tolist()):
            w.writerow(([ids[i]] if ids is not None else []) + [repr(float(v)) for v in row])
    return Path(path)


def write_view(path, X, ids=None):
    """Write view X to ``path`` in the format its extension names (ids as the sidecar, or CSV id column)."""
    path = Path(path)
    ext = path.suffix
    if ext in (".csv", ".tsv"):
        dense = X.toarray() if sp.issparse(X) else X
        return write_csv(path, dense, ids=ids, delimiter="," if ext == ".csv" else "\t")
    if ext == ".npy":
        np.save(path, X.toarray() if sp.issparse(X) else X)
    elif ext == ".npz":
        if sp.issparse(X):
            sp.save_npz(path, sp.csr_matrix(X))
        else:
            np.savez(path, X)
    elif ext == ".mtx":
        scipy.io.mmwrite(path, sp.coo_matrix(X) if sp.issparse(X) else X)
    elif ext == ".mat":
        scipy.io.savemat(path, {"X": sp.csc_matrix(X) if sp.issparse(X) else X})
    if ids is not None:
        path.with_name(path.stem + ".ids.txt").write_text("\n".join(map(str, ids)) + "\n")
    return path


def dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


@pytest.fixture
def views():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(15, 4))  # dense with negative entries
    A[3, 2] = 0.0
    B = sp.random(15, 7, density=0.4, random_state=1, format="csr")
    B.data -= 0.3  # sparse with negative entries
    B = B.tolil()
    B[5] = 0.0  # an all-zero sample is valid data
    B = sp.csr_array(B.tocsr())
    B.eliminate_zeros()
    return A, B


# ----------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("ext", [".csv", ".tsv", ".npy", ".npz", ".mtx", ".mat"])
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_round_trip_every_format(tmp_path, views, ext, kind):
    X = views[0] if kind == "dense" else views[1]
    path = write_view(tmp_path / f"v{ext}", X)
    Y, ids = read_view(path)
    assert ids is None
    assert Y.shape == X.shape and Y.dtype == np.float64
    np.testing.assert_array_equal(dense(Y), dense(X))
    stays_sparse = kind == "sparse" and ext in (".npz", ".mtx", ".mat")
    assert sp.issparse(Y) == stays_sparse
    if stays_sparse:
        assert Y.format == "csr"


@pytest.mark.parametrize("ext", [".npy", ".npz", ".mat"])
def test_float32_is_kept_and_integers_become_float64(tmp_path, views, ext):
    X32 = views[0].astype(np.float32)
    Y, _ = read_view(write_view(tmp_path / f"f{ext}", X32))
    assert Y.dtype == np.float32 and np.array_equal(Y, X32)
    Xi = np.arange(12, dtype=np.int16).reshape(4, 3)
    Y, _ = read_view(write_view(tmp_path / f"i{ext}", Xi))
    assert Y.dtype == np.float64 and np.array_equal(Y, Xi)
    sparse32 = sp.csr_array(views[1].astype(np.float32))
    if ext != ".npy":
        Y, _ = read_view(write_view(tmp_path / f"s{ext}", sparse32))
        assert sp.issparse(Y) and Y.dtype == np.float32 and np.array_equal(Y.toarray(), sparse32.toarray())


def test_npy_is_memory_mapped_on_request(tmp_path, views):
    path = write_view(tmp_path / "a.npy", views[0])
    Y, _ = read_view(path, mmap_mode="r")
    assert isinstance(Y, np.memmap) and np.array_equal(Y, views[0])


def test_csv_header_and_id_column_rules(tmp_path, views):
    A = views[0]
    ids = [f"s{i}" for i in range(15)]
    # no header, no ids
    Y, got = read_view(write_csv(tmp_path / "a.csv", A, header=False))
    assert got is None and np.array_equal(Y, A)
    # header with an 'id' column: used as ids without being asked
    Y, got = read_view(write_csv(tmp_path / "b.csv", A, ids=ids))
    assert got.tolist() == ids and np.array_equal(Y, A)
    # an id column by name, by index (int and str), and no header with text ids
    Y, got = read_view(write_csv(tmp_path / "c.csv", A, ids=ids, id_name="key"), id_column="key")
    assert got.tolist() == ids and np.array_equal(Y, A)
    for col in (0, "0"):
        Y, got = read_view(write_csv(tmp_path / "d.csv", A, ids=ids, header=False), id_column=col)
        assert got.tolist() == ids and np.array_equal(Y, A)
    # integer ids in a header-less file: a feature unless id_column says otherwise
    Y, got = read_view(write_csv(tmp_path / "e.csv", A, ids=list(range(15)), header=False))
    assert got is None and Y.shape == (15, 5)
    # header override: a numeric first row read as a header
    Y, _ = read_view(write_csv(tmp_path / "f.csv", A, header=False), header=True)
    assert np.array_equal(Y, A[1:])
    # pandas' default column names 0..d-1 are a header
    (tmp_path / "g.csv").write_text("0,1,2,3\n" + "\n".join(",".join(map(repr, r)) for r in A.tolist()))
    Y, _ = read_view(tmp_path / "g.csv")
    assert np.array_equal(Y, A)
    # a sidecar ids file beside a CSV without an id column
    (tmp_path / "f.ids.txt").write_text("\n".join(ids[1:]) + "\n")
    assert read_view(tmp_path / "f.csv", header=True)[1].tolist() == ids[1:]
    assert read_view(tmp_path / "f.csv", header=True, ids=None)[1] is None
    # another delimiter; a trailing delimiter on every line
    Y, _ = read_view(write_csv(tmp_path / "h.csv", A, delimiter=";"), delimiter=";")
    assert np.array_equal(Y, A)
    (tmp_path / "i.csv").write_text("".join(",".join(map(repr, r)) + ",\n" for r in A.tolist()))
    assert np.array_equal(read_view(tmp_path / "i.csv")[0], A)


def test_mat_view_by_key_and_cell_element(tmp_path, views):
    A, B = views
    cell = np.empty((1, 2), dtype=object)
    cell[0, 0], cell[0, 1] = A, sp.csc_matrix(B)
    path = tmp_path / "two.mat"
    scipy.io.savemat(path, {"X": cell, "y": np.arange(15)})
    np.testing.assert_array_equal(read_view(path, key="X{1}")[0], A)
    assert sp.issparse(read_view(path, key="X{2}")[0])
    with pytest.raises(InputError, match=r"two\.mat.*2 matrices.*key="):
        read_view(path)
    one = tmp_path / "one.mat"
    scipy.io.savemat(one, {"view": A, "labels": np.arange(15)})  # a vector beside the one matrix
    np.testing.assert_array_equal(read_view(one)[0], A)


# ----------------------------------------------------------------------------- ids and alignment


@pytest.mark.parametrize("exts", [(".csv", ".npz"), (".tsv", ".mtx"), (".npy", ".mat"), (".npz", ".csv")])
def test_rows_shuffled_per_file_are_aligned_by_id(tmp_path, views, exts):
    A, B = views
    rng = np.random.default_rng(5)
    ids = rng.choice(1000, size=15, replace=False)  # not 0..n-1, not sorted
    paths = []
    for p, (X, ext) in enumerate(zip((A, B), exts)):
        perm = rng.permutation(15)
        paths.append(write_view(tmp_path / f"v{p}{ext}", X[perm], ids=ids[perm]))
    ds = load_views(paths)
    order = np.argsort(ids)
    assert ds.ids.dtype == np.int64 and np.array_equal(ds.ids, ids[order])
    np.testing.assert_array_equal(dense(ds.views[0]), A[order])
    np.testing.assert_array_equal(dense(ds.views[1]), dense(B)[order])
    assert ds.mask is None and ds.masks is None and ds.paths == tuple(map(str, paths))
    assert [i["ids"] for i in ds.view_info] == [
        "id column" if e in (".csv", ".tsv") else str(tmp_path / f"v{p}.ids.txt") for p, e in enumerate(exts)]
    # the same views without shuffling give the same dataset
    ref = load_views([write_view(tmp_path / f"r{p}.npy", dense(X)[order], ids=ids[order])
                      for p, X in enumerate((A, B))])
    for a, b in zip(ds.views, ref.views):
        np.testing.assert_array_equal(dense(a), b)


def test_string_ids_sort_as_strings(tmp_path, views):
    A, _ = views
    ids = np.array([f"doc-{i}" for i in range(15)])
    perm = np.random.default_rng(1).permutation(15)
    ds = load_views([write_csv(tmp_path / "a.csv", A[perm], ids=ids[perm]),
                     write_view(tmp_path / "b.npy", A[::-1], ids=ids[::-1])])
    order = np.argsort(ids)
    assert ds.ids.tolist() == sorted(ids.tolist())
    np.testing.assert_array_equal(ds.views[0], A[order])
    np.testing.assert_array_equal(ds.views[1], A[order])


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    given = None


def _property(test):
    if given is None:
        return pytest.mark.skip(reason="hypothesis not installed")(test)
    return settings(max_examples=25, deadline=None)(given(
        n=st.integers(1, 12), n_views=st.integers(1, 3), seed=st.integers(0, 2**31), str_ids=st.booleans())(test))


@_property
def test_property_any_row_permutation_gives_the_same_aligned_views(n, n_views, seed, str_ids):
    rng = np.random.default_rng(seed)
    ids = rng.choice(10_000, size=n, replace=False)
    ids = np.array([f"x{i}" for i in ids]) if str_ids else ids
    order = np.argsort(ids)
    Xs = [rng.normal(size=(n, int(rng.integers(1, 4)))) for _ in range(n_views)]
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for p, X in enumerate(Xs):
            perm = rng.permutation(n)
            paths.append(write_view(Path(tmp) / f"v{p}.npy", X[perm], ids=ids[perm]))
        ds = load_views(paths)
    assert ds.ids.tolist() == ids[order].tolist()
    for X, Y in zip(Xs, ds.views):
        np.testing.assert_array_equal(Y, X[order])


def test_incomplete_ids_give_the_membership_masks_and_the_estimator_takes_them(tmp_path):
    from fedsonmf.estimators.clustering import FedMultiViewClustering

    rng = np.random.default_rng(2)
    n, c = 30, 3
    y = np.repeat(np.arange(c), n // c)
    ids = np.arange(100, 100 + n)
    held = [np.ones(n, bool), rng.random(n) < 0.7, rng.random(n) < 0.7]
    held[1][:3] = held[2][3:6] = False
    full = []
    paths = []
    for p, d in enumerate((6, 9, 12)):
        X = np.kron(np.eye(c), np.ones((1, d // c)))[y] + 0.05 * rng.random((n, d))
        full.append(X)
        rows = np.flatnonzero(held[p])
        perm = rng.permutation(rows)
        paths.append(write_view(tmp_path / f"v{p}{'.npz' if p == 1 else '.npy'}",
                                sp.csr_array(X[perm]) if p == 1 else X[perm], ids=ids[perm]))
    with pytest.raises(InputError, match=r"different sample ids.*v1\.npz lacks.*missing='mask'"):
        load_views(paths)
    ds = load_views(paths, missing="mask")
    assert np.array_equal(ds.ids, ids)
    assert np.array_equal(ds.mask, np.column_stack(held))
    assert [m.tolist() for m in ds.masks] == [h.tolist() for h in held]
    for p, X in enumerate(ds.views):  # held rows as written, the others zero-filled
        np.testing.assert_array_equal(dense(X)[held[p]], full[p][held[p]])
        assert not dense(X)[~held[p]].any()
    assert sp.issparse(ds.views[1])
    zeros = load_views(paths, missing="zeros")
    assert zeros.mask is None and all(np.array_equal(dense(a), dense(b)) for a, b in zip(zeros.views, ds.views))
    # the same data as a .mat file with an availability variable: load_mat gives the same dataset
    cell = np.empty((1, 3), dtype=object)
    for p, X in enumerate(ds.views):
        cell[0, p] = dense(X)
    scipy.io.savemat(tmp_path / "inc.mat", {"X": cell, "y": y, "ind": ds.mask.astype(float)})
    ref = load_mat(tmp_path / "inc.mat")
    assert np.array_equal(ref.mask, ds.mask)
    labels = FedMultiViewClustering(c, random_state=0, max_rounds=15, tol=0.0).fit_predict(ds.views, masks=ds.masks)
    assert labels.shape == (n,) and set(labels) <= set(range(c))


def test_mask_without_ids_marks_all_zero_rows_as_load_mat_does(tmp_path, views):
    A, B = views
    ds = load_views([write_view(tmp_path / "a.npy", A), write_view(tmp_path / "b.npz", B)], missing="mask")
    assert ds.mask[:, 0].all() and ds.mask[:, 1].tolist() == dense(B).any(axis=1).tolist()
    assert not ds.mask[5, 1]
    assert load_views([tmp_path / "a.npy", tmp_path / "b.npz"]).mask is None


# ----------------------------------------------------------------------------- labels


def test_labels_by_row_and_by_id(tmp_path, views):
    A, _ = views
    y = np.array(["sport", "tech", "politics"])[np.arange(15) % 3]
    (tmp_path / "y.txt").write_text("\n".join(y) + "\n")
    ds = load_views([write_view(tmp_path / "a.npy", A)], labels=tmp_path / "y.txt")
    assert ds.classes.tolist() == ["politics", "sport", "tech"]
    assert np.array_equal(ds.classes[ds.labels], y) and ds.labels.dtype == np.int64
    # numeric labels with a header, one per row
    (tmp_path / "y.csv").write_text("label\n" + "\n".join(str(v) for v in (np.arange(15) % 3) * 10 + 1) + "\n")
    ds = load_views([tmp_path / "a.npy"], labels=tmp_path / "y.csv")
    assert ds.labels.tolist() == (np.arange(15) % 3).tolist() and ds.classes.tolist() == [1, 11, 21]
    # id,label pairs, shuffled, aligned by id to the views' sorted ids
    ids = np.arange(15) * 7 + 3
    perm = np.random.default_rng(0).permutation(15)
    write_view(tmp_path / "b.npy", A[perm], ids=ids[perm])
    perm2 = np.random.default_rng(1).permutation(15)
    (tmp_path / "yid.csv").write_text("sample_id,cluster\n" + "".join(f"{ids[i]},{y[i]}\n" for i in perm2))
    ds = load_views([tmp_path / "b.npy"], labels=tmp_path / "yid.csv")
    assert np.array_equal(ds.classes[ds.labels], y)
    # views without ids: id,label pairs use the row numbers 0..n-1
    (tmp_path / "yrow.tsv").write_text("".join(f"{i}\t{y[i]}\n" for i in perm2))
    ds = load_views([tmp_path / "a.npy"], labels=tmp_path / "yrow.tsv")
    assert np.array_equal(ds.classes[ds.labels], y)
    assert read_labels(tmp_path / "yrow.tsv")[1].tolist() == [str(i) for i in perm2]


def test_write_assignments_is_a_csv_of_ids_and_clusters(tmp_path):
    out = write_assignments(tmp_path / "out.csv", np.array(["b", "a"]), np.array([1, 0]))
    assert out.read_text() == "sample_id,cluster\nb,1\na,0\n"
    assert not list(tmp_path.glob(".*tmp"))
    write_assignments(out, None, np.array([2, 2, 0]))
    assert out.read_text().splitlines() == ["sample_id,cluster", "0,2", "1,2", "2,0"]


# ----------------------------------------------------------------------------- bad input


def _bad_cases():
    """name -> (write(tmp) -> (paths, kwargs), file named in the message, message fragment)."""
    A = np.arange(12.0).reshape(4, 3) + 1

    def files(**contents):
        def make(tmp):
            paths = []
            for name, content in contents.items():
                name = name.replace("_", ".")
                path = tmp / name
                if callable(content):
                    content(path)
                elif isinstance(content, bytes):
                    path.write_bytes(content)
                else:
                    path.write_text(content)
                if not name.endswith(".ids.txt") and not name.startswith("y."):
                    paths.append(path)
            return paths
        return make

    def npy(X, **kw):
        return lambda path: np.save(path, X, **kw)

    return {
        "unsupported-extension": (files(x_txt="1,2\n"), "x.txt", r"unsupported view file extension '\.txt'.*\.csv"),
        "pickled-npy": (files(p_npy=lambda p: p.write_bytes(pickle.dumps({"a": 1}))), "p.npy", "pickled"),
        "object-npy": (files(o_npy=npy(np.array([None, 1], dtype=object), allow_pickle=True)), "o.npy",
                       "Python objects"),
        "npz-under-npy-name": (files(z_npy=lambda p: np.savez(open(p, "wb"), a=A)), "z.npy", "rename it"),
        "1-d-npy": (files(v_npy=npy(np.arange(4.0))), "v.npy", r"shape \(4,\).*reshape"),
        "complex-npy": (files(c_npy=npy(A + 1j)), "c.npy", "complex"),
        "nan-npy": (files(n_npy=npy(np.where(A == 5, np.nan, A))), "n.npy",
                    r"NaN or Inf at row 1, column 1 \(0-based\) \(nan\)$"),
        "nan-row-npy": (files(n_npy=npy(np.where(np.arange(4)[:, None] == 2, np.nan, A))), "n.npy",
                        r"row 2, column 0 .*whole row is NaN.*leave its row and id out.*missing='mask'"),
        "empty-file": (files(e_csv=""), "e.csv", "empty"),
        "blank-csv": (files(b_csv="\n\n"), "b.csv", "no rows"),
        "header-only": (files(h_csv="a,b,c\n"), "h.csv", "no data rows"),
        "ragged-csv": (files(r_csv="1,2,3\n4,5\n"), "r.csv", r"line 2 has 2 fields, line 1 has 3"),
        "text-cell": (files(t_csv="1,2,3\n4,five,6\n"), "t.csv", r"line 2, column 2: 'five' is not a number"),
        "empty-cell": (files(t_csv="1,2,3\n4,,6\n"), "t.csv", r"line 2, column 2: an empty cell"),
        "nan-csv": (files(n_csv="a,b\n1,2\n3,nan\n"), "n.csv", r"NaN or Inf at line 3, column 2"),
        "inf-tsv": (files(i_tsv="1\t2\n3\tinf\n"), "i.tsv", r"NaN or Inf at line 2, column 2"),
        "semicolons": (files(s_csv="1;2\n3;4\n"), "s.csv", "delimiter"),
        "binary-csv": (files(b_csv=b"\xff\xfe\x00\x01\x80"), "b.csv", "not a UTF-8 text file"),
        "id-column-missing": (lambda tmp: ([write_csv(tmp / "m.csv", A)], {"id_column": "key"}), "m.csv",
                              r"no id column named 'key' \(header: f0, f1, f2\)"),
        "id-column-no-header": (lambda tmp: ([write_csv(tmp / "m.csv", A, header=False)], {"id_column": "key"}),
                                "m.csv", "no header row"),
        "pandas-index": (files(i_csv=",a,b\n0,1,2\n1,3,4\n"), "i.csv", "empty header.*id_column=0"),
        "duplicate-id": (lambda tmp: ([write_csv(tmp / "d.csv", A, ids=["a", "b", "a", "c"])], {}), "d.csv",
                         "duplicate sample ids: a"),
        "duplicate-int-id": (files(d_npy=npy(A), d_ids_txt="1\n2\n02\n3\n"), "d.npy", "duplicate sample ids: 2"),
        "ids-length": (files(d_npy=npy(A), d_ids_txt="1\n2\n3\n"), "d.ids.txt", "3 ids for 4 rows"),
        "ids-transposed": (files(d_npy=npy(A.T), d_ids_txt="1\n2\n3\n4\n"), "d.ids.txt",
                           "features x samples"),
        "different-n-without-ids": (files(a_npy=npy(A), b_csv="1,2\n3,4\n"), "a.npy 4, b.csv 2",
                                    "different numbers of rows"),
        "transposed-without-ids": (files(a_npy=npy(A), b_npy=npy(np.ones((5, 4))), c_npy=npy(A)), "b.npy",
                                   "b.npy has 4 columns: stored features x samples"),
        "ids-for-some-views": (files(a_npy=npy(A), a_ids_txt="1\n2\n3\n4\n", b_npy=npy(A)), "b.npy",
                               "for some views only"),
        "different-ids": (files(a_npy=npy(A), a_ids_txt="1\n2\n3\n4\n", b_npy=npy(A), b_ids_txt="1\n2\n3\n5\n"),
                          "b.npy lacks 1 (4)", "different sample ids"),
        "labels-length": (files(a_npy=npy(A), y_txt="1\n2\n1\n"), "y.txt", "3 labels for 4 samples"),
        "labels-transposed": (files(a_npy=npy(np.ones((3, 4))), y_txt="1\n2\n1\n2\n"), "y.txt",
                              "every view's number of columns"),
        "labels-by-row-with-ids": (files(a_npy=npy(A), a_ids_txt="1\n2\n3\n4\n", y_txt="1\n2\n1\n2\n"), "y.txt",
                                   "id,label pairs"),
        "labels-unknown-id": (files(a_npy=npy(A), a_ids_txt="1\n2\n3\n4\n", y_csv="1,a\n2,b\n3,a\n9,b\n"), "y.csv",
                              r"no label for 1 samples \(4\); 1 labels for ids no view holds \(9\)"),
        "labels-duplicate-id": (files(a_npy=npy(A), y_csv="0,a\n1,b\n1,a\n2,b\n3,a\n"), "y.csv", "duplicate ids: 1"),
        "npz-two-arrays": (files(z_npz=lambda p: np.savez(p, a=A, b=A)), "z.npz", "holds 2 arrays"),
        "corrupt-npz": (files(z_npz=b"PK\x03\x04garbage"), "z.npz", "corrupt"),
        "not-mtx": (files(m_mtx="hello\n"), "m.mtx", "Matrix Market"),
        "mat-several": (files(m_mat=lambda p: scipy.io.savemat(p, {"V1": A, "V2": A})), "m.mat", "key="),
        "not-mat": (files(m_mat="not a mat file at all" * 20), "m.mat", "MAT"),
        "missing-file": (lambda tmp: ([tmp / "nope.csv"], {}), "nope.csv", "does not exist"),
        "ids-twice": (files(t_csv="id,a\n1,5\n2,6\n", t_ids_txt="1\n2\n"), "t.csv", "ids given twice"),
    }


BAD = _bad_cases()


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_one_input_error_naming_the_file(tmp_path, name):
    make, named, frag = BAD[name]
    made = make(tmp_path)
    paths, kw = made if isinstance(made, tuple) else (made, {})
    labels = next(iter(tmp_path.glob("y.*")), None)
    with pytest.raises(InputError) as info:
        load_views(paths, labels=labels, **kw)
    msg = str(info.value)
    assert named in msg, msg
    assert __import__("re").search(frag, msg), msg
    assert "allow_pickle" not in msg and "\n" not in msg


def test_every_format_is_listed_in_the_extension_error(tmp_path):
    with pytest.raises(InputError) as info:
        read_view(tmp_path / "x.parquet")
    assert all(ext in str(info.value) for ext in SUPPORTED_FORMATS)


def test_read_ids_header_rules(tmp_path):
    (tmp_path / "a.ids.txt").write_text("sample_id\n3\n1\n")
    assert read_ids(tmp_path / "a.ids.txt").tolist() == ["3", "1"]
    (tmp_path / "b.ids.txt").write_text("name\n3\n1\n")  # a non-integer first line above integers
    assert read_ids(tmp_path / "b.ids.txt").tolist() == ["3", "1"]
    (tmp_path / "c.ids.txt").write_text("x\ny\n")
    assert read_ids(tmp_path / "c.ids.txt").tolist() == ["x", "y"]


# ----------------------------------------------------------------------------- CLI


def planted_files(tmp_path, n=60, c=3, seed=0):
    """Two planted views (a CSV with an id column, an NPZ with a sidecar), rows shuffled per file, and
    id,label pairs: returns the paths, the ids and the labels by id."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(c), n // c)
    ids = rng.choice(10_000, size=n, replace=False)
    Xs = [np.kron(np.eye(c), np.ones((1, d // c)))[y] + 0.05 * rng.random((n, d)) for d in (9, 12)]
    perm = rng.permutation(n)
    a = write_csv(tmp_path / "a.csv", Xs[0][perm], ids=ids[perm].tolist())
    perm = rng.permutation(n)
    b = write_view(tmp_path / "b.npz", sp.csr_array(Xs[1][perm]), ids=ids[perm])
    perm = rng.permutation(n)
    (tmp_path / "y.csv").write_text("id,label\n" + "".join(f"{ids[i]},class{y[i]}\n" for i in perm))
    return [a, b], ids, dict(zip(ids.tolist(), y.tolist()))


def run_main(argv, capsys):
    from fedsonmf.cli.app import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def test_cli_clusters_view_files_and_writes_the_assignments(tmp_path, capsys):
    import json

    from fedsonmf.metrics import clustering_scores

    paths, ids, truth = planted_files(tmp_path)
    out, js = tmp_path / "out.csv", tmp_path / "run.json"
    code, stdout, err = run_main(["cluster", *map(str, paths), "--clusters", "3", "--labels",
                                  str(tmp_path / "y.csv"), "--labels-out", str(out), "--seeds", "2", "-q",
                                  "--json", str(js)], capsys)
    assert code == 0, err
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["sample_id", "cluster"] and len(rows) == 1 + ids.size
    got = [int(r[0]) for r in rows[1:]]
    assert got == sorted(ids.tolist())  # every id once, in the common sorted order
    pred = np.array([int(r[1]) for r in rows[1:]])
    seed0 = clustering_scores(np.array([truth[i] for i in got]), pred)
    doc = json.loads(js.read_text())
    rep = doc["result"]["reports"]["fedsonmf"]
    assert rep["scores"]["acc"][0] == pytest.approx(seed0["acc"])  # the file holds seed 0's partition
    assert seed0["acc"] == pytest.approx(1.0)  # planted clusters are found
    assert "ACC" in stdout
    # without labels: the same assignments (seed 0), no scores
    out2 = tmp_path / "out2.csv"
    code, stdout, err = run_main(["cluster", *map(str, paths), "-k", "3", "--labels-out", str(out2), "-q"], capsys)
    assert code == 0, err
    assert out2.read_text() == out.read_text() and "no scores" in stdout


@pytest.mark.parametrize("argv, frag", [
    (["cluster", "x.txt"], "x.txt: unsupported view file extension"),
    (["cluster", "a.csv", "b.npz", "-q"], "--clusters"),
    (["cluster", "a.csv", "m.mat", "-k", "3", "-q"], "m.mat: holds 2 matrices"),
    (["cluster", "m.mat", "--labels", "y.csv", "-q"], "--labels"),
    (["cluster", "a.csv", "b.npz", "-k", "3", "--labels-key", "y", "-q"], "--labels-key"),
])
def test_cli_bad_input_is_one_error_line_exit_2(tmp_path, capsys, monkeypatch, argv, frag):
    planted_files(tmp_path)
    scipy.io.savemat(tmp_path / "m.mat", {"X": np.ones((60, 3)), "Z": np.ones((60, 4)), "y": np.arange(60) % 3})
    (tmp_path / "x.txt").write_text("1,2\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and frag in lines[0], err


def test_cli_one_mat_file_works_as_before(tmp_path, capsys):
    from fedsonmf.metrics import clustering_scores

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 20)
    cell = np.empty((1, 2), dtype=object)
    for p, d in enumerate((9, 12)):
        cell[0, p] = np.kron(np.eye(3), np.ones((1, d // 3)))[y] + 0.05 * rng.random((60, d))
    path = tmp_path / "toy.mat"
    scipy.io.savemat(path, {"X": cell, "y": y + 1})
    out = tmp_path / "out.csv"
    code, stdout, err = run_main(["cluster", str(path), "--seeds", "1", "-q", "--labels-out", str(out)], capsys)
    assert code == 0, err
    rows = list(csv.reader(out.open()))[1:]
    assert [int(r[0]) for r in rows] == list(range(60))  # no ids in a .mat file: 0..n-1
    assert clustering_scores(y, np.array([int(r[1]) for r in rows]))["acc"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- Flower node side


def test_flower_node_reads_every_format_ordered_by_id(tmp_path, views):
    pytest.importorskip("flwr")
    from fedsonmf.federation.flower.client_app import load_view
    from fedsonmf.federation.flower.viewfiles import _view_file_shape

    A, B = views
    ids = np.arange(15)[::-1] * 3  # rows stored in decreasing id order
    order = np.argsort(ids)
    for ext, X in ((".csv", A), (".npz", B), (".mtx", B), (".mat", A), (".npy", A)):
        path = write_view(tmp_path / f"v{ext}", X, ids=ids)
        internal = load_view(path)
        assert internal.shape == (X.shape[1], 15)  # the (d_p, n) internal view
        np.testing.assert_array_equal(dense(internal), dense(X)[order].T)  # the node orders its rows locally
        assert _view_file_shape(path) == X.shape
    np.save(tmp_path / "obj.npy", np.array([None], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="obj.npy: holds an array of Python objects") as info:
        _view_file_shape(tmp_path / "obj.npy")
    assert "allow_pickle" not in str(info.value)


def _touch_later(path):
    """An edit's new mtime, 1 s on (file times are coarser than two quick writes in a test)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_flower_node_keeps_a_binary_copy_of_a_parsed_view_until_the_file_changes(tmp_path, views, monkeypatch):
    """A view parsed from text or a MATLAB file is kept as a 0600 binary copy in the node's state folder
    and loaded from it by the next message's process; an edited file or ids sidecar is parsed again;
    a binary view (.npy/.npz) is read as it stands, never copied."""
    pytest.importorskip("flwr")
    import fedsonmf.datasets.files as files
    import fedsonmf.federation.flower.client_app as ca

    A, B = views
    ids = np.arange(15)[::-1] * 3
    parse = files.read_view
    for ext, X in ((".csv", A), (".mtx", B), (".mat", A), (".npy", A), (".npz", B)):
        path = write_view(tmp_path / f"v{ext}", X, ids=ids)
        copy = tmp_path / "state" / f"view-copy{ext}"
        first = ca._read(path, copy)
        np.testing.assert_array_equal(dense(first), dense(ca._read(path)))
        stored = sorted(copy.parent.glob(copy.name + ".np*"))
        if ext in (".npy", ".npz"):
            assert stored == []
            continue
        assert [f.suffix for f in stored] == [".npz" if sp.issparse(X) else ".npy"]
        assert stored[0].stat().st_mode & 0o777 == 0o600 and copy.parent.stat().st_mode & 0o777 == 0o700
        monkeypatch.setattr(files, "read_view", lambda *a, **k: pytest.fail("parsed again"))
        np.testing.assert_array_equal(dense(ca._read(path, copy)), dense(first))  # from the copy
        monkeypatch.setattr(files, "read_view", parse)
        sidecar = files.sidecar_ids_path(path)
        if sidecar.is_file():  # (a CSV view carries its ids in a column instead)
            sidecar.write_text("".join(f"{i}\n" for i in ids[::-1]))  # new ids: the rows in the other order
            _touch_later(sidecar)
            np.testing.assert_array_equal(dense(ca._read(path, copy)), dense(first)[::-1])
            sidecar.write_text("".join(f"{i}\n" for i in ids))
        write_view(path, 2.0 * X, ids=ids)  # a new content
        _touch_later(path)
        np.testing.assert_array_equal(dense(ca._read(path, copy)), 2.0 * dense(first))


def test_flower_apps_on_shuffled_csv_mtx_mat_views_give_the_inprocess_result(tmp_path, small_problem):
    """The ServerApp against a fake grid of ClientApps (test_flower_apps.FakeGrid, no processes) whose nodes hold
    their views as CSV / Matrix Market / MATLAB files with rows shuffled and ids: V equals the in-process run on
    the views in the common id order."""
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    import test_flower_apps as fa
    from fedsonmf._validation import check_views
    from fedsonmf.federation.flower.client_app import make_client_app
    from fedsonmf.federation.inprocess import run_inprocess

    views = small_problem.views[:3]
    n = views[0].shape[0]
    rng = np.random.default_rng(4)
    ids = rng.choice(10_000, size=n, replace=False)
    order = np.argsort(ids)
    nodes = {}
    for p, (X, ext) in enumerate(zip(views, (".csv", ".mtx", ".mat"))):
        perm = rng.permutation(n)
        (tmp_path / f"node{p}").mkdir()  # each node holds only its own view file (and its ids) in its folder
        path = write_view(tmp_path / f"node{p}" / f"view{ext}", (sp.csr_array(X) if ext == ".mtx" else X)[perm],
                          ids=ids[perm])
        nodes[101 * (p + 1)] = {"partition-id": p, "data-path": str(path),  # the plain protocol: allowed
                                "state-dir": str(tmp_path / f"node{p}" / "state"), "require-secure-aggregation": False}
    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1
    try:
        V, _ = fa._server(fa.FakeGrid(make_client_app(), nodes), fa._run_config(tmp_path))
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old
    aligned = [sp.csr_array(X)[order] if p == 1 else dense(X)[order] for p, X in enumerate(views)]
    ref = run_inprocess(check_views(aligned, fa.R), fa.CFG, "fedsonmf", max_rounds=3, seed=9)
    np.testing.assert_array_equal(V, ref.V)
    for p in range(3):  # each node parsed its file once and kept the binary copy in its own state folder
        assert [f.name for f in (tmp_path / f"node{p}" / "state").glob("view-copy-*.np*")] == \
            [f"view-copy-{p}.{'npz' if p == 1 else 'npy'}"]


# ----------------------------------------------------------------------------- real data

DATA = default_data_dir()
BBC = DATA / "BBCSport" / "zskong" / "BBCSport.mat" if DATA else None


@pytest.mark.realdata
@pytest.mark.skipif(BBC is None or not Path(BBC).is_file(), reason="shared data folder absent")
def test_bbcsport_as_csv_and_npz_files_clusters_as_the_mat_file(tmp_path, capsys):
    ds = load_mat(BBC)
    n = ds.n_samples
    rng = np.random.default_rng(7)
    # ids increasing with the .mat rows, so the common sorted order is the .mat order (the fit depends on it)
    ids = np.sort(rng.choice(100_000, size=n, replace=False))
    perm = rng.permutation(n)
    write_csv(tmp_path / "bbc.csv", ds.views[0][perm].toarray(), ids=ids[perm].tolist())
    perm = rng.permutation(n)
    write_view(tmp_path / "guardian.npz", ds.views[1][perm], ids=ids[perm])
    perm = rng.permutation(n)
    (tmp_path / "y.csv").write_text("id,label\n" + "".join(f"{ids[i]},{ds.labels[i]}\n" for i in perm))

    common = ["--seeds", "1", "-q", "--rounds", "20"]  # 4 fits (the scored one and seed 0 again, twice)
    code, _, err = run_main(["cluster", str(BBC), "--labels-out", str(tmp_path / "mat.csv"), *common], capsys)
    assert code == 0, err
    code, _, err = run_main(["cluster", str(tmp_path / "bbc.csv"), str(tmp_path / "guardian.npz"), "--labels",
                             str(tmp_path / "y.csv"), "--labels-out", str(tmp_path / "files.csv"), *common], capsys)
    assert code == 0, err
    mat = {int(r[0]): int(r[1]) for r in list(csv.reader((tmp_path / "mat.csv").open()))[1:]}  # row -> cluster
    files = {int(r[0]): int(r[1]) for r in list(csv.reader((tmp_path / "files.csv").open()))[1:]}  # id -> cluster
    assert len(files) == n and set(files) == set(ids.tolist())
    assert [files[int(ids[i])] for i in range(n)] == [mat[i] for i in range(n)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_views([tmp_path / "bbc.csv", tmp_path / "guardian.npz"], labels=tmp_path / "y.csv")
    order = np.argsort(ids)
    assert np.array_equal(loaded.labels, ds.labels[order])
    assert np.array_equal(loaded.views[0], ds.views[0].toarray()[order])
    assert sp.issparse(loaded.views[1]) and np.array_equal(loaded.views[1].toarray(), ds.views[1].toarray()[order])


def test_one_folder_per_client_with_the_same_file_name(tmp_path, views):
    A, _ = views
    paths = []
    for p, rows in enumerate((slice(None), slice(0, 10))):
        (tmp_path / f"client{p}").mkdir()
        paths.append(write_view(tmp_path / f"client{p}" / "view.npy", A[rows], ids=np.arange(15)[rows]))
    with pytest.raises(InputError, match=r"client1/view\.npy lacks 5"):
        load_views(paths)
    ds = load_views(paths, missing="mask")
    assert ds.view_names == [str(p) for p in paths] and ds.mask[:, 1].sum() == 10


def test_ids_digest_is_a_fingerprint_of_the_id_set_as_load_views_compares_it():
    """Equal exactly when load_views would find the same samples: any order, integer literals as
    integers (007 is 7), strings as written; what a Flower node reports (salted) at the handshake."""
    from fedsonmf.datasets.files import ids_digest

    assert ids_digest(None) is None
    a = ids_digest(np.array(["3", "1", "2"]))
    assert a == ids_digest(np.array(["1", "2", "3"])) == ids_digest(np.array(["001", "2", "03"]))
    assert a != ids_digest(np.array(["1", "2", "4"]))
    assert ids_digest(np.array(["b", "a"])) == ids_digest(np.array(["a", "b"])) != ids_digest(np.array(["a", "B"]))
    assert ids_digest(np.array(["1", "x"])) != ids_digest(np.array(["01", "x"]))  # not all integers: as written
    assert len(a) == 64 and int(a, 16) >= 0  # 64 hex digits


def test_check_same_ids_refuses_what_load_views_refuses(tmp_path):
    from fedsonmf.datasets.files import check_same_ids

    paths = [tmp_path / "a.csv", tmp_path / "b.csv"]
    check_same_ids(paths, [np.array(["2", "1"]), np.array(["1", "02"])], "remedy")
    check_same_ids(paths, [None, None], "remedy")
    with pytest.raises(InputError, match=r"a.csv lacks 1 \(3\); b.csv lacks 1 \(2\) of 3 ids in all; .* remedy"):
        check_same_ids(paths, [np.array(["1", "2"]), np.array(["1", "3"])], "remedy")
    with pytest.raises(InputError, match="sample ids for some views only: a.csv carry ids, b.csv do not"):
        check_same_ids(paths, [np.array(["1", "2"]), None], "remedy")
    with pytest.raises(InputError, match="b.csv: duplicate sample ids: 1"):
        check_same_ids(paths, [np.array(["1", "2"]), np.array(["1", "01"])], "remedy")
