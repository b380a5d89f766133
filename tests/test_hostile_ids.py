"""Hostile sample ids and labels (fedsonmf.datasets.files, .linkage): an id or label longer than
MAX_ID_LENGTH is refused naming the file and line before any array of them is built; an id that is
an integer beyond 64 bits is compared as text (or, as a label id beside integer sample ids, refused);
normal ids keep their arrays, order and digests."""

import re
import tracemalloc

import numpy as np
import pytest

import fedsonmf.datasets.files as files
from fedsonmf.datasets import load_views, read_view, write_assignments
from fedsonmf.datasets.files import (
    MAX_ID_LENGTH,
    align_labels,
    check_same_ids,
    ids_digest,
    read_ids,
    read_labels,
    sorted_ids,
)
from fedsonmf.datasets.linkage import canonical_id, id_tags, own_rows
from fedsonmf.exceptions import InputError

LONG = "x" * (MAX_ID_LENGTH + 1)
BIG = "9" * 5000  # beyond int()'s 4300 digits


def _npy(path, n=3):
    np.save(path, np.arange(2.0 * n).reshape(n, 2) + 1)
    return path


# ----------------------------------------------------------------------------- the length limit


def test_a_sidecar_id_over_the_limit_is_refused_naming_the_file_and_line(tmp_path):
    _npy(tmp_path / "v.npy")
    (tmp_path / "v.ids.txt").write_text(f"a\n{LONG}\nc\n")
    with pytest.raises(InputError, match=rf"v\.ids\.txt: line 2: a sample id of {MAX_ID_LENGTH + 1} characters"):
        read_view(tmp_path / "v.npy")


def test_an_id_at_the_limit_is_read(tmp_path):
    ok = "y" * MAX_ID_LENGTH
    (tmp_path / "v.ids.txt").write_text(f"a\n{ok}\nc\n")
    assert read_ids(tmp_path / "v.ids.txt").tolist() == ["a", ok, "c"]


@pytest.mark.parametrize("fast", [True, False])
def test_a_csv_id_column_over_the_limit_is_refused_naming_the_line_and_column(tmp_path, monkeypatch, fast):
    path = tmp_path / "v.csv"
    path.write_text(f"id,a,b\ns1,1,2\n{LONG},3,4\ns3,5,6\n")
    if not fast:
        monkeypatch.setattr(files, "_read_text_view_fast", lambda *a, **k: None)
    with pytest.raises(InputError, match=r"v\.csv: line 3, column 1: a sample id of 1025 characters"):
        read_view(path)


@pytest.mark.parametrize("text, line, what", [
    (f"1\n{LONG}\n2\n", 2, "label"),
    (f"id,label\na,1\nb,{LONG}\n", 3, "label"),
    (f"id,label\na,1\n{LONG},2\n", 3, "sample id"),
])
def test_a_labels_file_value_over_the_limit_is_refused(tmp_path, text, line, what):
    path = tmp_path / "lab.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=rf"lab\.csv: line {line}: a {what} of 1025 characters"):
        read_labels(path)


def test_the_cli_labels_over_the_limit_are_an_input_error_of_load_views(tmp_path):
    _npy(tmp_path / "v.npy")
    (tmp_path / "lab.txt").write_text(f"1\n{LONG}\n2\n")
    with pytest.raises(InputError, match=r"lab\.txt: line 2: a label of"):
        load_views([tmp_path / "v.npy"], labels=tmp_path / "lab.txt")


def test_npy_labels_and_given_ids_over_the_limit_are_refused(tmp_path):
    np.save(tmp_path / "lab.npy", np.array(["a", LONG, "b"]))
    with pytest.raises(InputError, match=r"lab\.npy: label 1 \(0-based\): a label of 1025"):
        read_labels(tmp_path / "lab.npy")
    _npy(tmp_path / "v.npy")
    with pytest.raises(InputError, match=r"v\.npy: ids= entry 2 \(0-based\): a sample id of 1025"):
        read_view(tmp_path / "v.npy", ids=["a", "b", LONG])


def test_one_long_id_among_many_short_does_not_multiply_the_memory(tmp_path):
    # a fixed-width array would be 1000 x 4 bytes x 20 000 = 80 MB for a 150 KB file
    n = 20_000
    np.save(tmp_path / "v.npy", np.zeros((n, 1)))
    long_id = "z" * 1000
    (tmp_path / "v.ids.txt").write_text(long_id + "\n" + "\n".join(f"a{i}" for i in range(n - 1)) + "\n")
    X, ids = read_view(tmp_path / "v.npy", order_by_id=True)
    assert ids.dtype == object and ids.nbytes == 8 * n
    assert ids[0] == "a0" and ids[-1] == long_id  # sorted as text, as a fixed-width array sorts
    expected = sorted([long_id] + [f"a{i}" for i in range(n - 1)])
    assert ids.tolist() == expected
    assert ids_digest(ids) == ids_digest(np.array(expected, dtype=str))


# ----------------------------------------------------------------------------- integers beyond 64 bits


def test_ids_beyond_int_digits_are_compared_as_text(tmp_path):
    for name in "ab":
        _npy(tmp_path / f"{name}.npy")
        (tmp_path / f"{name}.ids.txt").write_text(f"1\n{BIG[:1000]}\n3\n")
    ds = load_views([tmp_path / "a.npy", tmp_path / "b.npy"])
    assert ds.ids.tolist() == ["1", "3", BIG[:1000]]  # compared as text
    assert sorted_ids(["1", BIG, "3"])[1] is False  # 5000 digits: text, not int()'s ValueError
    check_same_ids(["a", "b"], [np.array(["1", BIG]), np.array([BIG, "1"])], "remedy")
    with pytest.raises(InputError, match="different sample ids"):
        check_same_ids(["a", "b"], [np.array(["1", BIG]), np.array(["1", BIG + "1"])], "remedy")


def test_an_id_past_64_bits_keeps_the_existing_text_comparison(tmp_path):
    for name in "ab":
        _npy(tmp_path / f"{name}.npy")
        (tmp_path / f"{name}.ids.txt").write_text("99999999999999999999\n1\n2\n")
    ds = load_views([tmp_path / "a.npy", tmp_path / "b.npy"])
    assert ds.ids.tolist() == ["1", "2", "99999999999999999999"]


@pytest.mark.parametrize("bad", ["99999999999999999999", "9" * 1000])
def test_a_label_id_beyond_64_bits_beside_integer_ids_is_refused(tmp_path, bad):
    _npy(tmp_path / "v.npy")
    (tmp_path / "v.ids.txt").write_text("1\n2\n3\n")
    (tmp_path / "lab.csv").write_text(f"1,a\n2,b\n{bad},c\n")
    with pytest.raises(InputError, match=r"lab\.csv: label ids .* are integers beyond 64 bits"):
        load_views([tmp_path / "v.npy"], labels=tmp_path / "lab.csv")
    ids = sorted_ids(np.array(["1", "2", "3"]))
    with pytest.raises(InputError, match="beyond 64 bits"):
        align_labels(tmp_path / "lab.csv", ids, 3)


def test_a_big_label_id_matches_a_big_view_id_as_text(tmp_path):
    big = "9" * 1000
    _npy(tmp_path / "v.npy")
    (tmp_path / "v.ids.txt").write_text(f"1\n2\n{big}\n")
    (tmp_path / "lab.csv").write_text(f"{big},c\n1,a\n2,b\n")
    ds = load_views([tmp_path / "v.npy"], labels=tmp_path / "lab.csv")
    assert ds.classes[ds.labels].tolist() == ["a", "b", "c"]


def test_int64_label_ids_still_match_integer_ids(tmp_path):
    _npy(tmp_path / "v.npy")
    (tmp_path / "v.ids.txt").write_text("9223372036854775807\n-9223372036854775808\n007\n")
    (tmp_path / "lab.csv").write_text("7,a\n+9223372036854775807,b\n-9223372036854775808,c\n")
    ds = load_views([tmp_path / "v.npy"], labels=tmp_path / "lab.csv")
    assert ds.ids.dtype == np.int64
    assert ds.classes[ds.labels].tolist() == ["c", "a", "b"]


def test_huge_integer_labels_keep_distinct_classes(tmp_path):
    _npy(tmp_path / "v.npy")
    (tmp_path / "lab.txt").write_text("100000000000000000000\n200000000000000000000\n1\n")
    ds = load_views([tmp_path / "v.npy"], labels=tmp_path / "lab.txt")
    assert len(ds.classes) == 3 and ds.labels.tolist() == [1, 2, 0]


def test_linkage_canonical_ids_beyond_int_digits():
    assert canonical_id(BIG) == BIG and canonical_id("+00" + BIG) == BIG and canonical_id("-00" + BIG) == "-" + BIG
    for s in ["0", "-0", "+0", "007", "-007", "+12", "12", "-000", "abc", " 42 "]:
        expected = str(int(s)) if s.strip().lstrip("+-").isdigit() else s.strip()
        assert canonical_id(s) == expected
    key = bytes(32)
    tags = id_tags(["1", BIG, "3"], key)
    assert tags.shape == (3,) and len(set(tags.tolist())) == 3
    with pytest.raises(InputError, match="duplicate"):
        id_tags([BIG, "00" + BIG], key)
    ids, rows = own_rows(["1", BIG, "3"], 3)
    assert rows.tolist() == [0, 2, 1]


def test_the_header_guess_survives_a_huge_integer_cell(tmp_path):
    path = tmp_path / "v.csv"
    path.write_text(f"{BIG},1,2\n3,4,5\n")  # not a header (not 0..d-1): its first cell overflows a float
    with pytest.raises(InputError, match=r"v\.csv: NaN or Inf at line 1, column 1"):
        read_view(path)


# ----------------------------------------------------------------------------- normal ids unchanged


def test_normal_ids_keep_their_fixed_width_arrays_order_and_digest(tmp_path):
    ids = ["s10", "s2", "b", "s1"]
    _npy(tmp_path / "v.npy", 4)
    (tmp_path / "v.ids.txt").write_text("\n".join(ids) + "\n")
    X, got = read_view(tmp_path / "v.npy", order_by_id=True)
    assert got.dtype.kind == "U" and got.tolist() == sorted(ids)
    assert X[:, 0].tolist() == [5.0, 7.0, 1.0, 3.0]  # b, s1, s10, s2
    assert ids_digest(got) == ids_digest(np.array(ids)) == ids_digest(ids)
    path = tmp_path / "c.csv"
    path.write_text("id,a\ns2,1\ns1,2\n")
    _, col = read_view(path)
    assert col.dtype.kind == "U" and col.tolist() == ["s2", "s1"]
    values, lab_ids = read_labels(_write(tmp_path / "l.csv", "id,label\ns1,x\ns2,y\n"))
    assert values.dtype.kind == "U" and lab_ids.dtype.kind == "U"
    out = write_assignments(tmp_path / "out.csv", got, np.arange(4))
    assert out.read_text().splitlines()[1:] == [f"{v},{k}" for k, v in enumerate(sorted(ids))]


def test_the_digest_is_the_same_for_either_storage():
    ids = ["b", "a", "7x", "c" * 200]
    obj = np.empty(4, dtype=object)
    obj[:] = ids
    assert ids_digest(obj) == ids_digest(np.array(ids)) == ids_digest(ids)
    nums = ["007", "3", "-1"]
    assert ids_digest(nums) == ids_digest(np.array(nums)) and sorted_ids(nums)[0].tolist() == [-1, 3, 7]


def _write(path, text):
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- the error-locating parse


N_BIG = 50_000  # "1\n" x 50 000: a 100 KB file; rows of lists of str would take about 9 MB


def _peak(fn):
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as err:
            fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return str(err.value), peak


@pytest.mark.parametrize("row, last, message", [
    ("1", "x", r"line 50000, column 1: 'x' is not a number"),
    ("1", "nan", r"NaN or Inf at line 50000, column 1 \(nan\)"),
    ("1,2", "3", r"line 50000 has 1 fields, line 1 has 2 \(ragged rows"),
])
def test_the_bad_cell_of_a_large_file_is_named_in_bounded_memory(tmp_path, monkeypatch, row, last, message):
    monkeypatch.setattr(files, "_BLOCK_CELLS", 1024)  # the block, small beside the file here
    path = tmp_path / "v.csv"
    path.write_text(f"{row}\n" * (N_BIG - 1) + last + "\n")
    text, peak = _peak(lambda: read_view(path))
    assert str(path) in text and re.search(message, text)
    # the array (8 bytes a cell of 2 bytes of the file: 4 per byte) and a block, not rows of str (90 per byte)
    assert peak < 20 * path.stat().st_size


def test_the_streamed_parse_keeps_the_first_error_in_the_file_order(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_BLOCK_CELLS", 4)  # errors across several blocks
    path = tmp_path / "v.csv"
    rows = [f"s{i},{i},{i + 1}" for i in range(20)]
    rows[9] = "s9,1,oops"
    rows[15] = "s15,2,also bad"
    path.write_text("id,a,b\n" + "\n".join(rows) + "\n")
    with pytest.raises(InputError, match=r"line 11, column 3: 'oops' is not a number"):
        read_view(path)
    rows[17] = ",3,4"  # an empty id is named before any cell, as before
    path.write_text("id,a,b\n" + "\n".join(rows) + "\n")
    with pytest.raises(InputError, match=r"line 19: empty sample id \(column 2|line 19: empty sample id \(column 1"):
        read_view(path)


def test_the_streamed_parse_reads_what_the_compiled_one_cannot(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_BLOCK_CELLS", 3)
    path = tmp_path / "v.csv"
    path.write_text("id,a,b,\ns2,1,2,\n\ns1, 3 ,4e1,\ns3,5,6,\n")  # a trailing delimiter on every line
    X, ids = read_view(path, order_by_id=True)
    assert ids.tolist() == ["s1", "s2", "s3"] and X.tolist() == [[3, 40], [1, 2], [5, 6]]
    path.write_text("1,2,\n3,4,\n")
    X, ids = read_view(path)
    assert ids is None and X.tolist() == [[1, 2], [3, 4]]


def test_the_cell_by_cell_budget_counts_the_array_not_the_rows(tmp_path, monkeypatch):
    path = tmp_path / "v.csv"
    path.write_text("1,\n" * 50_000)  # 150 KB; the compiled reader cannot read it (trailing delimiters)
    monkeypatch.setenv("FEDSONMF_MAX_VIEW_BYTES", "8M")  # the array (400 KB) and a block of cells (5.2 MB)
    X, _ = read_view(path)
    assert X.shape == (50_000, 1)
    monkeypatch.setenv("FEDSONMF_MAX_VIEW_BYTES", "3M")
    with pytest.raises(InputError, match="parsed cell by cell.*refused before reading"):
        read_view(path)


def test_a_labels_file_is_refused_by_an_honest_estimate(tmp_path, monkeypatch):
    path = tmp_path / "lab.csv"
    path.write_text("1\n" * 100_000)  # 200 KB: about 23 MB as rows of str
    monkeypatch.setenv("FEDSONMF_MAX_VIEW_BYTES", "10M")
    with pytest.raises(InputError, match=r"lab\.csv: the text file .*100001 lines.* refused before reading"):
        read_labels(path)
    monkeypatch.setenv("FEDSONMF_MAX_VIEW_BYTES", "64M")
    assert read_labels(path)[0].shape == (100_000,)


def test_long_ids_are_cut_in_messages(tmp_path):
    long_id = "q" * 1000
    for name, ids in [("a", [long_id, "b", "c"]), ("b", ["b", "c", "d"])]:
        _npy(tmp_path / f"{name}.npy")
        (tmp_path / f"{name}.ids.txt").write_text("\n".join(ids) + "\n")
    with pytest.raises(InputError, match=r"lacks 1 \(q{40}\.\.\.\)") as err:
        load_views([tmp_path / "a.npy", tmp_path / "b.npy"])
    assert len(str(err.value)) < 400
    with pytest.raises(InputError, match=r"duplicate sample ids.*: q{40}\.\.\.$"):
        id_tags([long_id, long_id], bytes(32))
