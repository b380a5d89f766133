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
