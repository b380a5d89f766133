"""Keyed-tag alignment of organisations' files of different samples (fedsonmf.datasets.linkage and
``fedsonmf flower align``): the aligned views and masks are ``load_views(missing="mask")``'s, up to
the one order of all samples, and no file the coordinator gets or sends holds an id or another
organisation's tags."""

import json
import os

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fedsonmf.cli.app import app
from fedsonmf.datasets import linkage as lk
from fedsonmf.datasets import load_views
from fedsonmf.exceptions import InputError

KEY = bytes(range(32))


def _files(tmp_path, n=30, drop=((), (1, 4, 7, 20), (0, 2, 29)), seed=0):
    """Three organisations' files over the ids s000..s0(n-1): each lacks the samples ``drop`` names and
    lists its rows in its own order; view 0 a CSV with an id column, views 1 (sparse) and 2 with a sidecar."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"s{k:03d}" for k in range(n)])
    full = [rng.random((n, 4)), sp.random(n, 6, density=0.5, random_state=seed, format="csr"), rng.random((n, 3))]
    paths = []
    for p, (X, lacks) in enumerate(zip(full, drop)):
        keep = rng.permutation(np.setdiff1d(np.arange(n), lacks))
        if p == 0:
            path = tmp_path / "a.csv"
            path.write_text("id,f0,f1,f2,f3\n" + "".join(f"{ids[i]}," + ",".join(repr(float(v)) for v in X[i]) + "\n"
                                                        for i in keep))
        else:
            path = tmp_path / ("b.npz" if p == 1 else "c.npy")
            if p == 1:
                sp.save_npz(path, sp.csr_matrix(X[keep]))
            else:
                np.save(path, X[keep])
            path.with_name(path.stem + ".ids.txt").write_text("\n".join(ids[keep]) + "\n")
        paths.append(path)
    return paths


def test_cli_align_gives_load_views_masks_in_the_tags_order(tmp_path):
    paths = _files(tmp_path)
    run = CliRunner()
    key = tmp_path / "link.key"
    r = run.invoke(app, ["flower", "align", "key", str(key)])
    assert r.exit_code == 0, r.output
    assert key.stat().st_mode & 0o777 == 0o600
    names = ["hospA", "hospB", "labC"]
    for name, path in zip(names, paths):
        r = run.invoke(app, ["flower", "align", "tags", str(path), "--key", str(key), "--out",
                             str(tmp_path / f"{name}.tags.json")])
        assert r.exit_code == 0, r.output
    r = run.invoke(app, ["flower", "align", "positions", *(str(tmp_path / f"{n}.tags.json") for n in names),
                         "--out-dir", str(tmp_path / "pos")])
    assert r.exit_code == 0, r.output
    assert "30 samples in all; hospA holds 30, hospB holds 26, labC holds 27" in r.output
    got = []
    for name, path in zip(names, paths):
        r = run.invoke(app, ["flower", "align", "view", str(path), "--key", str(key), "--positions",
                             str(tmp_path / "pos" / f"{name}.positions.json"), "--out", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        view = tmp_path / name / ("view.npz" if path.suffix == ".npz" else "view.npy")
        X = sp.load_npz(view) if view.suffix == ".npz" else np.load(view)
        got.append((X, np.load(tmp_path / name / "view.mask.npy")))
        for f in (view, tmp_path / name / "view.mask.npy"):
            assert f.stat().st_mode & 0o777 == 0o600
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o700
    # the same views and masks as load_views aligns on one machine, rows in the order of the ids' tags
    ds = load_views(paths, missing="mask")
    order = np.argsort(lk.id_tags(ds.ids, lk.read_key(key)))
    for p, (X, mask) in enumerate(got):
        want = ds.views[p][order]
        assert np.array_equal(sp.csr_array(X).toarray() if sp.issparse(X) else X,
                              want.toarray() if sp.issparse(want) else want)
        want_mask = np.ones(30, bool) if ds.masks[p] is None else np.asarray(ds.masks[p], bool)[order]
        assert np.array_equal(mask, want_mask)
    # what the coordinator sees and sends: no id; each organisation's file only its own positions
    for name in names:
        text = (tmp_path / f"{name}.tags.json").read_text() + (tmp_path / "pos" / f"{name}.positions.json").read_text()
        assert "s0" not in text
    # the run's labels.csv (rows 0..n-1 in the nodes' order) back to each organisation's own ids
    clusters = np.random.default_rng(3).integers(0, 4, size=30)
    (tmp_path / "labels.csv").write_text("sample_id,cluster\n" + "".join(f"{i},{k}\n" for i, k in enumerate(clusters)))
    by_id = dict(zip(np.asarray(ds.ids, dtype=str)[order], clusters))  # row i of the run is the i-th tag's sample
    for name, path in zip(names, paths):
        r = run.invoke(app, ["flower", "align", "labels", str(tmp_path / "labels.csv"), str(path), "--key", str(key),
                             "--positions", str(tmp_path / "pos" / f"{name}.positions.json"), "--out",
                             str(tmp_path / f"{name}.clusters.csv")])
        assert r.exit_code == 0, r.output
        rows = [line.split(",") for line in (tmp_path / f"{name}.clusters.csv").read_text().splitlines()[1:]]
        assert sorted(i for i, _ in rows) == sorted(lk_read(path)[1])  # every sample of its own, no other
        assert all(int(k) == by_id[i] for i, k in rows)
    pos_b = json.loads((tmp_path / "pos" / "hospB.positions.json").read_text())
    assert pos_b["n_samples"] == 30 and len(pos_b["positions"]) == 26 and set(pos_b) == {
        "format", "n_samples", "tags_sha256", "positions"}


def test_positions_of_another_file_or_key_are_refused(tmp_path):
    paths = _files(tmp_path)
    (X0, ids0), (X1, ids1) = [lk_read(p) for p in paths[:2]]
    tags0, tags1 = lk.id_tags(ids0, KEY), lk.id_tags(ids1, KEY)
    n, (pos0, pos1) = lk.positions([tags0, tags1])
    with pytest.raises(InputError, match="answers another list of tags"):
        lk.aligned_view(X1, ids1, KEY, n, pos0, lk.tags_digest(tags0))
    with pytest.raises(InputError, match="answers another list of tags"):  # another key: other tags
        lk.aligned_view(X0, ids0, bytes(32), n, pos0, lk.tags_digest(tags0))
    with pytest.raises(InputError, match="30 positions for 26 rows"):
        lk.aligned_view(X1, ids1, KEY, n, pos0)
    with pytest.raises(InputError, match="not increasing positions below n = 30"):
        lk.aligned_view(X1, ids1, KEY, n, pos1 + 4)


def lk_read(path):
    from fedsonmf.datasets import read_view

    return read_view(path)


def test_tags_are_keyed_canonical_and_refuse_duplicates():
    assert lk.id_tags(["007"], KEY)[0] == lk.id_tags(["7"], KEY)[0] != lk.id_tags(["7"], bytes(32))[0]
    assert lk.id_tags(["a7"], KEY)[0] != lk.id_tags(["7"], KEY)[0]
    assert all(len(t) == 64 for t in lk.id_tags(["x", "y"], KEY))
    with pytest.raises(InputError, match=r"duplicate sample ids \(an integer id counts as its value, 007 as 7\): 7"):
        lk.id_tags(["7", "8", "007"], KEY)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sets(st.integers(0, 60), min_size=1, max_size=25), min_size=1, max_size=4))
def test_positions_place_every_sample_of_every_organisation_once(id_sets):
    tag_lists = [lk.id_tags([str(i) for i in sorted(s)], KEY) for s in id_sets]
    n, pos = lk.positions(tag_lists)
    assert n == len(set().union(*id_sets))
    where = {}  # the same id gets the same position in every organisation, distinct ids distinct ones
    for s, tags, p in zip(id_sets, tag_lists, pos):
        assert np.all(np.diff(p) > 0) and p.min() >= 0 and p.max() < n
        by_tag = dict(zip(np.sort(tags), p))
        for i, t in zip(sorted(s), tags):
            assert where.setdefault(i, by_tag[t]) == by_tag[t]
    assert len(set(where.values())) == n


def test_key_and_files_refused_with_a_clear_error(tmp_path):
    key = tmp_path / "k"
    lk.new_key(key)
    with pytest.raises(InputError, match="never overwritten"):
        lk.new_key(key)
    os.chmod(key, 0o644)
    with pytest.raises(InputError, match="chmod 600"):
        lk.read_key(key)
    (tmp_path / "short").write_text("abcd\n")
    os.chmod(tmp_path / "short", 0o600)
    with pytest.raises(InputError, match="is not 32 bytes of hex"):
        lk.read_key(tmp_path / "short")
    (tmp_path / "t.json").write_text(json.dumps({"format": lk.TAGS_FORMAT, "tags": ["s001"]}))
    with pytest.raises(InputError, match="64 lowercase hex digits"):
        lk.read_tags(tmp_path / "t.json")
    (tmp_path / "p.json").write_text("{}")
    with pytest.raises(InputError, match="is not a linkage positions file"):
        lk.read_positions(tmp_path / "p.json")


def test_cli_align_bad_input_exits_2_with_one_error_line(tmp_path, capsys):
    from fedsonmf.cli.app import main

    np.save(tmp_path / "v.npy", np.ones((4, 3)))  # no ids
    lk.new_key(tmp_path / "k")
    cases = [(["tags", str(tmp_path / "v.npy"), "--key", str(tmp_path / "k"), "--out", str(tmp_path / "t.json")],
              "carries no sample ids"),
             (["tags", str(tmp_path / "v.npy"), "--key", str(tmp_path / "none"), "--out", str(tmp_path / "t.json")],
              "does not exist"),
             (["positions", str(tmp_path / "missing.tags.json"), "--out-dir", str(tmp_path / "pos")], "does not exist"),
             (["key", str(tmp_path / "k")], "never overwritten"),
             (["labels", str(tmp_path / "nolabels.csv"), str(tmp_path / "v.npy"), "--out", str(tmp_path / "c.csv")],
              "does not exist"),
             (["labels", str(tmp_path / "k"), str(tmp_path / "v.npy"), "--out", str(tmp_path / "c.csv")],
              "is not a run's labels.csv"),
             (["labels", str(tmp_path / "t.json"), str(tmp_path / "v.npy"), "--key", str(tmp_path / "k"), "--out",
               str(tmp_path / "c.csv")], "give --key and --positions together")]
    for args, why in cases:
        with pytest.raises(SystemExit) as exit_:
            main(["flower", "align", *args])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and why in err and err.count("error:") == 1, (args, err)
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "pos").exists()


def test_labels_of_complete_files_by_id_follow_the_nodes_sort(tmp_path):
    """Without a key: the nodes sorted their rows by id (integers as integers), so row i of labels.csv
    is the i-th smallest id, whatever order the organisation's file lists its rows in."""
    ids = np.array(["10", "9", "100", "7"])
    np.save(tmp_path / "v.npy", np.ones((4, 2)))
    (tmp_path / "v.ids.txt").write_text("\n".join(ids) + "\n")
    (tmp_path / "labels.csv").write_text("sample_id,cluster\n0,5\n1,6\n2,7\n3,8\n")  # rows: 7, 9, 10, 100
    r = CliRunner().invoke(app, ["flower", "align", "labels", str(tmp_path / "labels.csv"), str(tmp_path / "v.npy"),
                                 "--out", str(tmp_path / "c.csv")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "c.csv").read_text().splitlines() == ["sample_id,cluster", "10,7", "9,6", "100,8", "7,5"]
    (tmp_path / "short.csv").write_text("sample_id,cluster\n0,1\n1,1\n")
    with pytest.raises(InputError, match="the run has 2 samples and this file 4"):
        lk.own_rows(ids, 2)
    with pytest.raises(InputError, match="duplicate sample ids: 7"):
        lk.own_rows(["7", "8", "007"], 3)
