import dataclasses

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from fedsonmf.datasets.mat import (
    LABEL_KEYS,
    MultiViewDataset,
    default_data_dir,
    find_datasets,
    load_mat,
)
from fedsonmf.exceptions import InputError

# local path -> (n_samples, view widths, n_classes, class sizes or None), from the data README.
EXPECTED = {
    "3Sources/ChuanbinZhang/3Sources.mat": (169, [3560, 3631, 3068], 6, [56, 21, 11, 18, 51, 12]),
    "3Sources/zskong/Data_3Sources.mat": (416, [3560, 3631, 3068], 6, [104, 60, 54, 49, 89, 60]),
    "3Sources/zskong-FMVACC/3-sources.mat": (169, [3560, 3631, 3068], 6, [56, 21, 11, 18, 51, 12]),
    "BBCSport/xiyu1007/BBCSport.mat": (544, [3183, 3203], 5, [62, 104, 193, 124, 61]),
    "BBCSport/zskong/BBCSport.mat": (544, [3183, 3203], 5, [62, 104, 193, 124, 61]),
    "MSRC-v1/youweiliang/MSRC_v1.mat": (210, [24, 576, 512, 256, 254], 7, [30] * 7),
    "Handwritten/ChuanbinZhang/Handwritten.mat": (
        2000, [216, 76, 64, 6, 240, 47], 10, [200] * 10),
}
SPARSE = {"3Sources/zskong-FMVACC/3-sources.mat", "BBCSport/xiyu1007/BBCSport.mat",
          "BBCSport/zskong/BBCSport.mat"}


@pytest.fixture(scope="module")
def data_root():
    root = default_data_dir()
    if root is None or not root.is_dir():
        pytest.skip("shared data folder not found (set FEDSONMF_DATA)")
    return root


@pytest.fixture(scope="module")
def loaded(data_root):
    return {str(p.relative_to(data_root)): load_mat(p) for p in find_datasets(data_root)}


def dense(v):
    return v.toarray() if sp.issparse(v) else v


# ------------------------------------------------------------------ real files


@pytest.mark.realdata
def test_find_datasets_lists_every_file_sorted(data_root):
    paths = list(find_datasets(data_root))
    assert paths == sorted(paths)
    assert {str(p.relative_to(data_root)) for p in paths} >= set(EXPECTED)


@pytest.mark.realdata
@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_real_file_shapes_and_labels(loaded, rel):
    if rel not in loaded:
        pytest.skip(f"{rel} not present")
    ds = loaded[rel]
    n, widths, c, sizes = EXPECTED[rel]
    assert isinstance(ds, MultiViewDataset)
    assert [v.shape for v in ds.views] == [(n, d) for d in widths]
    assert len(ds.view_names) == len(widths)
    for v in ds.views:
        assert v.dtype == np.float64
        assert sp.issparse(v) == (rel in SPARSE)
        if sp.issparse(v):
            assert v.format == "csr"
        else:
            assert v.flags.c_contiguous
    assert ds.labels.shape == (n,)
    assert np.issubdtype(ds.labels.dtype, np.integer)
    assert set(np.unique(ds.labels)) == set(range(c))  # 0-based and contiguous
    assert np.bincount(ds.labels).tolist() == sizes
    assert ds.name and ds.source.endswith(rel)


@pytest.mark.realdata
def test_real_files_nonnegativity(loaded):
    for rel, ds in loaded.items():
        mins = [dense(v).min() for v in ds.views]
        if rel.startswith("Handwritten"):
            assert mins[2] < 0 and all(m >= 0 for i, m in enumerate(mins) if i != 2)
        else:
            assert min(mins) >= 0, rel


@pytest.mark.realdata
def test_bbcsport_copies_share_sparsity_pattern(loaded):
    a, b = loaded.get("BBCSport/xiyu1007/BBCSport.mat"), loaded.get("BBCSport/zskong/BBCSport.mat")
    if a is None or b is None:
        pytest.skip("both BBCSport copies needed")
    np.testing.assert_array_equal(a.labels, b.labels)
    for va, vb in zip(a.views, b.views, strict=True):
        np.testing.assert_array_equal(dense(va) != 0, dense(vb) != 0)
    # xiyu1007 holds raw term counts
    assert all(np.array_equal(v.data, np.round(v.data)) for v in a.views)


@pytest.mark.realdata
def test_3sources_dense_and_sparse_copies_agree(loaded):
    a = loaded.get("3Sources/ChuanbinZhang/3Sources.mat")
    b = loaded.get("3Sources/zskong-FMVACC/3-sources.mat")
    if a is None or b is None:
        pytest.skip("both 3Sources copies needed")
    np.testing.assert_array_equal(a.labels, b.labels)
    for va, vb in zip(a.views, b.views, strict=True):
        np.testing.assert_array_equal(va, vb.toarray())


@pytest.mark.realdata
def test_incomplete_3sources_mask(loaded):
    ds = loaded.get("3Sources/zskong/Data_3Sources.mat")
    if ds is None:
        pytest.skip("Data_3Sources.mat not present")
    assert ds.view_names == ["V1", "V2", "V3"]
    assert ds.mask.shape == (416, 3) and ds.mask.dtype == bool
    assert ds.mask.sum(axis=0).tolist() == [352, 302, 294]
    assert np.bincount(ds.mask.sum(axis=1)).tolist() == [0, 53, 194, 169]
    for p, v in enumerate(ds.views):  # a missing view is an all-zero row
        np.testing.assert_array_equal(np.abs(v).sum(axis=1) > 0, ds.mask[:, p])


# ------------------------------------------------------------------ synthetic files


@pytest.fixture
def views_and_labels():
    rng = np.random.default_rng(0)
    n = 12
    labels = np.repeat([3, 5, 9], 4)  # 1-based-ish, non-contiguous
    views = [rng.random((n, 7)), rng.integers(0, 5, (n, 4)).astype(np.uint8)]
    return views, labels


def test_features_by_samples_cell_is_transposed(tmp_path, views_and_labels):
    views, labels = views_and_labels
    cell = np.empty((1, 3), dtype=object)
    cell[0, 0], cell[0, 1] = views[0].T, views[1].T
    cell[0, 2] = sp.csc_matrix(views[0][:, :5].T)
    path = tmp_path / "toy.mat"
    lab = np.empty((1, 2), dtype=object)
    lab[0, 0] = lab[0, 1] = labels[None, :]  # 1 x 2 cell of identical rows, as in BBCSport
    scipy.io.savemat(path, {"data": cell, "truelabel": lab})

    ds = load_mat(path)
    assert ds.view_names == ["data{1}", "data{2}", "data{3}"]
    np.testing.assert_array_equal(ds.views[0], views[0])
    np.testing.assert_array_equal(ds.views[1], views[1].astype(np.float64))
    assert sp.issparse(ds.views[2]) and ds.views[2].format == "csr"
    np.testing.assert_array_equal(ds.views[2].toarray(), views[0][:, :5])
    np.testing.assert_array_equal(ds.labels, np.repeat([0, 1, 2], 4))
    assert ds.name == "toy" and ds.source == str(path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.name = "other"


def test_numbered_variables_and_square_view(tmp_path, views_and_labels):
    views, labels = views_and_labels
    square = np.arange(144.0).reshape(12, 12)
    path = tmp_path / "numbered.mat"
    scipy.io.savemat(path, {"V2": views[1].T, "V1": views[0], "V3": square, "gnd": labels[:, None]})
    ds = load_mat(path)
    assert ds.view_names == ["V1", "V2", "V3"]
    np.testing.assert_array_equal(ds.views[1], views[1])
    np.testing.assert_array_equal(ds.views[2], square)  # square: kept as samples x features


def test_explicit_keys(tmp_path, views_and_labels):
    views, labels = views_and_labels
    path = tmp_path / "named.mat"
    scipy.io.savemat(path, {"img": views[0], "txt": views[1], "y": labels + 100, "cls": labels})
    ds = load_mat(path, views_key=["txt", "img"], labels_key="cls")
    assert ds.view_names == ["txt", "img"]
    np.testing.assert_array_equal(ds.views[1], views[0])
    np.testing.assert_array_equal(ds.labels, np.repeat([0, 1, 2], 4))
    with pytest.raises(ValueError, match="nope"):
        load_mat(path, views_key="nope")


def test_missing_labels_lists_variables(tmp_path, views_and_labels):
    views, _ = views_and_labels
    path = tmp_path / "nolabels.mat"
    cell = np.empty((2, 1), dtype=object)
    cell[0, 0], cell[1, 0] = views
    scipy.io.savemat(path, {"X": cell, "W": np.ones((3, 3))})
    with pytest.raises(ValueError, match=r"no label variable.*X \(cell 2x1\).*W \(3x3"):
        load_mat(path)


def test_missing_views_lists_variables(tmp_path, views_and_labels):
    _, labels = views_and_labels
    path = tmp_path / "noviews.mat"
    scipy.io.savemat(path, {"y": labels, "other": np.ones((5, 4))})
    with pytest.raises(ValueError, match=r"no views found.*other \(5x4"):
        load_mat(path)


def test_view_without_sample_axis_raises(tmp_path, views_and_labels):
    _, labels = views_and_labels
    path = tmp_path / "bad.mat"
    scipy.io.savemat(path, {"A": np.ones((5, 4)), "y": labels})
    with pytest.raises(ValueError, match="n_samples=12"):
        load_mat(path, views_key=["A"])


def _write_v73(path, variables):
    """Mimic MATLAB's -v7.3 writer: 512-byte user block with a MAT header, column-major data."""
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w", userblock_size=512) as f:
        refs = f.create_group("#refs#")

        def put(group, name, value):
            if isinstance(value, list):  # cell array (1 x k)
                ref_arr = np.empty((len(value), 1), dtype=h5py.ref_dtype)  # transposed 1 x k
                for i, item in enumerate(value):
                    ref_arr[i, 0] = put(refs, f"{name}_{i}", item).ref
                ds = group.create_dataset(name, data=ref_arr)
                ds.attrs["MATLAB_class"] = np.bytes_("cell")
                return ds
            if sp.issparse(value):
                csc = sp.csc_matrix(value)
                g = group.create_group(name)
                g.attrs["MATLAB_class"] = np.bytes_("double")
                g.attrs["MATLAB_sparse"] = np.uint64(csc.shape[0])
                g.create_dataset("data", data=csc.data)
                g.create_dataset("ir", data=csc.indices.astype(np.uint64))
                g.create_dataset("jc", data=csc.indptr.astype(np.uint64))
                return g
            ds = group.create_dataset(name, data=np.asarray(value).T)  # MATLAB n x d -> (d, n)
            ds.attrs["MATLAB_class"] = np.bytes_("double")
            return ds

        for name, value in variables.items():
            put(f, name, value)
        f.create_dataset("comment", data=np.frombuffer(b"hi", np.uint8)[:, None].astype(np.uint16))
        f["comment"].attrs["MATLAB_class"] = np.bytes_("char")
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: test HDF5 schema 1.00 ."
    with open(path, "r+b") as fh:
        fh.write(header.ljust(116, b" ") + b"\0" * 8 + b"\x00\x02" + b"IM")


def test_v73_hdf5_file(tmp_path, views_and_labels):
    views, labels = views_and_labels
    rng = np.random.default_rng(1)
    sparse_view = sp.random(12, 9, density=0.3, random_state=rng, format="csc")
    path = tmp_path / "v73.mat"
    _write_v73(path, {"fea": [views[0], sparse_view.T.tocsc()],
                      "Y": labels[:, None].astype(float)})
    assert scipy.io.matlab.matfile_version(path)[0] == 2  # really a v7.3 file
    ds = load_mat(path)
    assert ds.view_names == ["fea{1}", "fea{2}"]
    np.testing.assert_array_equal(ds.views[0], views[0])
    assert sp.issparse(ds.views[1]) and ds.views[1].format == "csr"
    np.testing.assert_array_equal(ds.views[1].toarray(), sparse_view.toarray())
    np.testing.assert_array_equal(ds.labels, np.repeat([0, 1, 2], 4))


def test_v73_numbered_variables(tmp_path, views_and_labels):
    views, labels = views_and_labels
    path = tmp_path / "v73b.mat"
    _write_v73(path, {"X1": views[0], "X2": views[1].T.astype(float), "label": labels[None, :]})
    ds = load_mat(path)
    assert ds.view_names == ["X1", "X2"]
    np.testing.assert_array_equal(ds.views[1], views[1])


def test_default_data_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDSONMF_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("FEDSONMF_DATA")
    found = default_data_dir()
    assert found is None or found.is_dir()


def test_find_datasets(tmp_path):
    for rel in ("b/z.mat", "a/y.MAT", "a/x.mat", "a/notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    assert [p.relative_to(tmp_path).as_posix() for p in find_datasets(tmp_path)] == [
        "a/x.mat", "a/y.MAT", "b/z.mat"]
    with pytest.raises(NotADirectoryError):
        list(find_datasets(tmp_path / "missing"))


@pytest.mark.realdata
def test_missing_rule_for_incomplete_files(data_root, tmp_path):
    """``missing=``: the file's ``ind`` (auto, mask), derived from all-zero rows when the file has no
    availability variable (mask), or no mask at all (zeros, zero-filling)."""
    path = data_root / "3Sources" / "zskong" / "Data_3Sources.mat"
    auto = load_mat(path)
    assert auto.mask.shape == (416, 3) and auto.mask.sum(axis=0).tolist() == [352, 302, 294]
    assert load_mat(path, missing="zeros").mask is None
    raw = {k: v for k, v in scipy.io.loadmat(path).items() if not k.startswith("__") and k != "ind"}
    stripped = tmp_path / "noind.mat"
    scipy.io.savemat(stripped, raw)
    assert load_mat(stripped).mask is None
    assert np.array_equal(load_mat(stripped, missing="mask").mask, auto.mask)
    with pytest.raises(ValueError, match="missing"):
        load_mat(path, missing="nope")


@pytest.mark.parametrize("sparse", [False, True])
def test_all_nan_rows_are_missing_samples(tmp_path, views_and_labels, sparse):
    """An all-NaN row (the IMVC-CBG files' marker of a sample a view lacks) is a missing sample under
    every rule: zeros in the view, False in the mask (unless ``missing="zeros"``), never NaN in a view."""
    views, labels = views_and_labels
    v1, v2 = views[0].T.copy(), views[1].T.astype(np.float64)  # features x samples, as such files store them
    v1[:, [2, 7]] = np.nan
    v2[:, 5] = np.nan
    cell = np.empty((2, 1), dtype=object)
    cell[0, 0] = sp.csc_matrix(v1) if sparse else v1
    cell[1, 0] = v2
    path = tmp_path / "nanrows.mat"
    scipy.io.savemat(path, {"data": cell, "truelabel": labels})
    expected = np.ones((12, 2), dtype=bool)
    expected[[2, 7], 0] = expected[5, 1] = False
    for rule in ("auto", "mask"):
        ds = load_mat(path, missing=rule)
        assert np.array_equal(ds.mask, expected), rule
        dense = [v.toarray() if sp.issparse(v) else v for v in ds.views]
        assert all(np.isfinite(v).all() for v in dense)
        assert not dense[0][[2, 7]].any() and not dense[1][5].any()
        np.testing.assert_array_equal(dense[0][expected[:, 0]], views[0][expected[:, 0]])
    zeros = load_mat(path, missing="zeros")
    assert zeros.mask is None and all(np.isfinite(v.data if sp.issparse(v) else v).all() for v in zeros.views)
    # the file's own mask is kept, and a NaN row it calls present is still missing
    scipy.io.savemat(path, {"data": cell, "truelabel": labels, "ind": np.ones((12, 2))})
    assert np.array_equal(load_mat(path).mask, expected)


def test_partly_nan_rows_and_infinities_are_refused(tmp_path, views_and_labels):
    views, labels = views_and_labels
    path = tmp_path / "bad.mat"
    partial = views[0].copy()
    partial[4, :3] = np.nan
    scipy.io.savemat(path, {"V1": partial, "V2": views[1], "y": labels})
    partly = r"bad\.mat.*'V1' has 1 row\(s\) with some but not all entries NaN \(first: sample 4\)"
    with pytest.raises(InputError, match=partly):
        load_mat(path)
    with pytest.raises(InputError, match="some but not all"):
        load_mat(path, missing="zeros")
    for inf in (np.inf, -np.inf):
        infinite = views[0].copy()
        infinite[1, 1] = inf
        for stored in (infinite, sp.csc_matrix(infinite)):
            scipy.io.savemat(path, {"V1": stored, "V2": views[1], "y": labels})
            with pytest.raises(InputError, match="'V1' contains infinite values"):
                load_mat(path)


def test_one_plain_matrix_is_a_single_view_dataset(tmp_path, views_and_labels):
    """Deng Cai's layout: one features x samples matrix ``fea`` (or ``X``) and ``gnd``."""
    views, labels = views_and_labels
    path = tmp_path / "single.mat"
    scipy.io.savemat(path, {"fea": views[0].T, "gnd": labels[:, None], "other": np.ones((3, 3))})
    ds = load_mat(path)
    assert ds.view_names == ["fea"] and ds.n_views == 1
    np.testing.assert_array_equal(ds.views[0], views[0])
    scipy.io.savemat(path, {"X": views[0], "y": labels})
    assert load_mat(path).view_names == ["X"]
    scipy.io.savemat(path, {"fea": np.ones((5, 4)), "gnd": labels})
    with pytest.raises(InputError, match="no views found.*one matrix named"):
        load_mat(path)


def test_views_stored_as_triplets_are_read_as_sparse(tmp_path, views_and_labels):
    """``[i, j, value] = find(X)`` triplets (k x 3, 1-based) in a cell: the sparse view they describe,
    in either orientation; a k x 3 matrix that is not triplets is not touched."""
    views, labels = views_and_labels
    dense = views[0] * (views[0] > 0.5)  # 12 x 7, about half zeros
    i, j = np.nonzero(dense)
    cell = np.empty((1, 2), dtype=object)
    cell[0, 0] = np.column_stack([i + 1, j + 1, dense[i, j]])  # samples x features triplets
    cell[0, 1] = np.column_stack([j + 1, i + 1, dense[i, j]])  # features x samples triplets
    path = tmp_path / "triplets.mat"
    scipy.io.savemat(path, {"X": cell, "Y": labels[:, None]})
    ds = load_mat(path)
    assert all(sp.issparse(v) and v.shape[0] == 12 for v in ds.views)
    assert all(v.indices.dtype == np.int32 for v in ds.views)  # as scipy.io reads a sparse matrix
    np.testing.assert_array_equal(ds.views[0].toarray()[:, : dense.shape[1]], dense)
    np.testing.assert_array_equal(ds.views[1].toarray(), ds.views[0].toarray())
    not_triplets = np.random.default_rng(1).random((30, 3))
    scipy.io.savemat(path, {"V1": not_triplets, "V2": views[0], "y": labels})
    with pytest.raises(InputError, match="'V1' .* has no axis of length n_samples=12"):
        load_mat(path)


# ------------------------------------------------------------------ no view dropped silently


def test_load_mat_refuses_a_view_that_does_not_fit_the_labels(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "short.mat"
    scipy.io.savemat(path, {"V1": rng.random((40, 15)), "V2": rng.random((30, 12)), "y": np.arange(40) % 4})
    with pytest.raises(InputError, match=r"short\.mat.*'V2' \(30x12 float64\) has no axis of length n_samples=40"):
        load_mat(path)
    cell = np.empty((1, 2), dtype=object)
    cell[0, 0], cell[0, 1] = rng.random((40, 15)), rng.random((30, 12))
    scipy.io.savemat(path, {"X": cell, "y": np.arange(40) % 4})
    with pytest.raises(InputError, match=r"'X\{2\}' \(30x12 float64\) has no axis"):
        load_mat(path)


def test_load_mat_records_paths_classes_and_masks(tmp_path, views_and_labels):
    views, labels = views_and_labels
    path = tmp_path / "rec.mat"
    scipy.io.savemat(path, {"V1": views[0], "V2": views[1], "y": labels, "ind": np.ones((12, 2))})
    ds = load_mat(path)
    assert ds.paths == (str(path),) and ds.ids is None
    assert ds.classes.tolist() == [3, 5, 9] and np.array_equal(ds.classes[ds.labels], labels)
    assert [i["key"] for i in ds.view_info] == ["V1", "V2"] and ds.view_info[1]["n_features"] == 4
    assert [m.tolist() for m in ds.masks] == [[True] * 12] * 2


@pytest.mark.parametrize("key", ["truth", "Truth", "gt", "GT", "labels", "Y", "y", "gnd", "truelabel",
                                 "ground_truth", "target", "class"])
def test_labels_under_every_common_name_are_found(tmp_path, views_and_labels, key):
    views, labels = views_and_labels
    path = tmp_path / "named.mat"
    scipy.io.savemat(path, {"V1": views[0], "V2": views[1], key: labels[:, None] + 1})
    ds = load_mat(path)
    assert ds.view_names == ["V1", "V2"]  # the label variable is never taken for a view
    np.testing.assert_array_equal(ds.labels, np.repeat([0, 1, 2], 4))


def test_label_names_are_tried_in_the_declared_order(tmp_path, views_and_labels):
    views, labels = views_and_labels
    path = tmp_path / "two.mat"
    other = labels[::-1].copy()
    scipy.io.savemat(path, {"X1": views[0], "X2": views[1], "truth": other[:, None], "y": labels[:, None]})
    ds = load_mat(path)
    assert LABEL_KEYS.index("y") < LABEL_KEYS.index("truth")
    np.testing.assert_array_equal(ds.labels, np.repeat([0, 1, 2], 4))
