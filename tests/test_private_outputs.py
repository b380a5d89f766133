"""Every file fedsonmf writes is 0600 and every folder it creates 0700, whatever the umask.

A world-readable output is a leak of the same rank as a wrong result (a plot of a private run,
an organisation's view file written for a deployment, a study's per-round CSV); these tests
run the writers under the common umask 022 and walk what they leave.
"""

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

from fedsonmf._io import new_private_dir, save_figure_atomic
from fedsonmf.cli.app import app


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _open_to_others(root: Path) -> list[str]:
    """Paths under ``root`` (itself excluded) with any group or other permission bit."""
    loose = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            continue
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            loose.append(f"{path.relative_to(root)} {oct(stat.S_IMODE(path.stat().st_mode))}")
    return loose


def test_cli_json_and_png_are_private(tmp_path, umask_022):
    out, png = tmp_path / "run.json", tmp_path / "run.png"
    result = CliRunner().invoke(app, ["synthetic", "--rounds", "3", "--clients", "3", "--samples", "30",
                                      "--json", str(out), "--plot", str(png), "-q"])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _open_to_others(tmp_path) == []


def test_view_and_mask_files_are_private_and_exact(tmp_path, umask_022):
    from fedsonmf.federation.flower import write_masks, write_views

    rng = np.random.default_rng(0)
    dense = rng.standard_normal((7, 4))  # signed entries are valid views
    sparse = sp.random(7, 9, density=0.3, random_state=0, format="csr")
    paths = write_views([dense, sparse], tmp_path / "deploy" / "views")
    masks = write_masks([None, np.arange(7) % 2 == 0], tmp_path / "deploy" / "views")
    assert _open_to_others(tmp_path) == []
    np.testing.assert_array_equal(np.load(paths[0]), dense)
    assert (sp.load_npz(paths[1]) != sparse).nnz == 0
    assert masks[0] is None and np.load(masks[1]).tolist() == [True, False] * 3 + [True]
    assert not [p for p in (tmp_path / "deploy" / "views").iterdir() if p.name.endswith(".tmp")]


def test_synthetic_study_outputs_are_private(tmp_path, umask_022):
    from fedsonmf.experiments import StudyConfig, run_study

    cfg = StudyConfig(seeds=(0,), heterogeneity=(0.5,), taus=(2,), tau_main=2, rounds=2, rounds_one_step=2,
                      n_clients=2, n_samples=12, n_features=6, rank=2, n_zero_rows=1)
    run_study(tmp_path / "study", cfg)
    names = {p.name for p in (tmp_path / "study").iterdir()}
    assert {"rounds.csv", "rounds_to_target.csv", "summary.md", "config.json", "fig2_tau.png", "cells"} <= names
    assert _open_to_others(tmp_path) == []


def test_new_private_dir_leaves_existing_folders_as_they_are(tmp_path, umask_022):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    made = new_private_dir(shared / "a" / "b")
    assert made.is_dir()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755  # the user's folder: not ours to change
    assert stat.S_IMODE((shared / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert new_private_dir(made) == made  # an existing folder: nothing to do


@pytest.mark.parametrize("suffix, magic",
                         [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF"), ("", b"\x89PNG")])
def test_save_figure_atomic_takes_the_format_from_the_suffix(tmp_path, umask_022, suffix, magic):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    try:
        path = save_figure_atomic(fig, tmp_path / f"fig{suffix}")
    finally:
        plt.close(fig)
    assert path.read_bytes().startswith(magic)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
