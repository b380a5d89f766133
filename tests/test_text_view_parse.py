"""CSV/TSV views are parsed by numpy's compiled reader in about the memory of the array, and give
the same view, ids and messages as the cell-by-cell parse, which still reads every file the
compiled one cannot (and names the problem)."""

import tracemalloc

import numpy as np
import pytest

import fedsonmf.datasets.files as files
from fedsonmf.datasets.files import read_view
from fedsonmf.exceptions import InputError


def _slow(monkeypatch, path, **kw):
    with monkeypatch.context() as m:
        m.setattr(files, "_read_text_view_fast", lambda *a, **k: None)
        return read_view(path, **kw)


@pytest.mark.parametrize("text, kw", [
    ("a,b,c\n1,2,3\n4,5.5,-6e-3\n", {}),
    ("1,2,3\n4,5,6\n", {}),
    ("id,x,y\ns1, 1.5 ,2\n\ns2,3,4\n", {}),  # blank line, spaces around a number, ids by header name
    ('"sample_id","x"\n"a b",1\n"c",2\n', {}),  # quoted ids and header
    ("x\ty\n1\t2\n3\t4\n", {"delimiter": "\t"}),
    ("k,1,2\nq,3,4\n", {"id_column": 0, "header": False}),
    ("0,1,2\n7,8,9\n", {}),  # pandas' default column names: a header
    ("a,id,b\n1,x,2\n3,y,4\n", {}),  # the id column between two others
    ("id,a\n12,1.5\n13,2.5\n", {}),  # numeric ids
])
def test_the_compiled_parse_gives_the_cell_by_cell_result(tmp_path, monkeypatch, text, kw):
    path = tmp_path / ("v.tsv" if kw.get("delimiter") == "\t" else "v.csv")
    path.write_text(text)
    X, ids = read_view(path, **kw)
    Xs, ids_s = _slow(monkeypatch, path, **kw)
    assert np.array_equal(np.asarray(X), np.asarray(Xs))
    assert (ids is None and ids_s is None) or np.array_equal(ids, ids_s)


@pytest.mark.parametrize("text, message", [
    ("a,b\n1,2\n3,x\n", r"line 3, column 2: 'x' is not a number"),
    ("a,b\n1,2\n3\n", r"line 3 has 1 fields"),
    ("a,b\n1,2\n3,\n", r"line 3, column 2: an empty cell"),
    ("a,b\n1,2\n3,inf\n", r"line 3, column 2"),  # a non-finite value: located through the slow parse
    # a row longer than the first: numpy's reader with `usecols` would drop its extra cells without a word
    ("1,2\n3,4\n5,6,7\n", r"line 3 has 3 fields, line 1 has 2"),
    ("id,a,b\nx,1,2\ny,3,4\nz,5,6,7\n", r"line 4 has 4 fields, line 1 has 3"),
    ("a,id,b\n1,x,2\n3,y,4,5\n", r"line 3 has 4 fields"),
])
def test_bad_files_keep_their_precise_messages(tmp_path, text, message):
    path = tmp_path / "v.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        read_view(path)


def test_a_large_view_is_read_in_about_the_memory_of_its_array(tmp_path):
    rng = np.random.default_rng(0)
    A = np.round(rng.random((20_000, 50)), 6)
    path = tmp_path / "big.csv"
    np.savetxt(path, A, delimiter=",", fmt="%.6f")
    tracemalloc.start()
    try:
        X, _ = read_view(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.allclose(np.asarray(X), A)
    # the cell-by-cell parse needed about 8.5 bytes per byte of the file (~75 MB here)
    assert peak < 3 * A.nbytes
