"""``fedsonmf flower ...`` commands that need no deployment (the launcher itself is
exercised by test_flower_deploy.py)."""

import tomllib

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("flwr")

from fedsonmf.cli.app import app  # noqa: E402


def test_flower_app_and_views_commands(tmp_path):
    r = CliRunner().invoke(app, ["flower", "app", str(tmp_path / "app")])
    assert r.exit_code == 0, r.output
    conf = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    assert conf["tool"]["flwr"]["app"]["components"]["serverapp"].endswith("server_app:app")
    r = CliRunner().invoke(app, ["flower", "views", str(tmp_path / "v"), "--clients", "2", "--samples", "30",
                                 "--features", "8", "--rank", "3"])
    assert r.exit_code == 0, r.output
    assert [np.load(tmp_path / "v" / f"view{p}.npy").shape for p in range(2)] == [(30, 8), (30, 8)]


def test_flower_run_reports_a_missing_view_file(tmp_path):
    r = CliRunner().invoke(app, ["flower", "run", str(tmp_path / "nope.npy"), "--out", str(tmp_path / "run")])
    assert r.exit_code == 2  # bad input, before anything starts
    assert "nope.npy does not exist" in r.output and "starting" not in r.output
    assert not (tmp_path / "run").exists()


def test_flower_run_resume_needs_a_saved_job(tmp_path):
    np.save(tmp_path / "v.npy", np.ones((5, 3)))
    r = CliRunner().invoke(app, ["flower", "run", str(tmp_path / "v.npy"), "--out", str(tmp_path / "run"),
                                 "--rank", "2", "--resume"])
    assert r.exit_code == 2 and "nothing to resume" in r.output  # bad input: before anything starts


def test_missing_mask_aligns_only_files_of_different_samples(tmp_path):
    """``flower cluster --missing mask``'s preparation: files of the same ids are used as they are (no
    mask, their sorted ids for the labels); files of different ids get aligned copies and masks over
    the union, with the rows of each sample where the union puts it."""
    from fedsonmf.cli.flower import _aligned_over_union

    X = np.arange(12.0).reshape(4, 3) + 1
    for name, ids, rows in (("a", ["d", "b", "a", "c"], [3, 1, 0, 2]), ("b", ["a", "b", "c", "d"], [0, 1, 2, 3]),
                            ("c", ["c", "a", "e"], [2, 0, 3])):
        np.save(tmp_path / f"{name}.npy", X[rows] if name != "c" else np.vstack([X[2], X[0], X[3] * 10]))
        (tmp_path / f"{name}.ids.txt").write_text("\n".join(ids) + "\n")
    same = [tmp_path / "a.npy", tmp_path / "b.npy"]
    paths, masks, ids = _aligned_over_union(same, tmp_path / "out")
    assert paths == same and masks is None and list(ids) == ["a", "b", "c", "d"]
    assert not (tmp_path / "out").exists()
    paths, masks, ids = _aligned_over_union([tmp_path / "a.npy", tmp_path / "c.npy"], tmp_path / "out")
    assert list(ids) == ["a", "b", "c", "d", "e"]
    assert [np.load(m).tolist() for m in masks] == [[1, 1, 1, 1, 0], [1, 0, 1, 0, 1]]
    A, C = (np.load(p) for p in paths)
    assert np.array_equal(A[:4], X) and not A[4].any()
    assert np.array_equal(C[[0, 2, 4]], np.vstack([X[0], X[2], X[3] * 10])) and not C[[1, 3]].any()
