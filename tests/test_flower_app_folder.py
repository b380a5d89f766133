"""The committed Flower app folder ``flower-app/`` is exactly what ``write_app_dir`` writes
(one source of truth, no drift), and Flower's own tools accept it.

Fast: no processes.  If the first test fails after a template change, regenerate
the folder with ``fedsonmf flower app flower-app`` and commit it.
"""

import io
import re
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.cli.build import build_fab_from_disk  # noqa: E402
from flwr.cli.config_utils import load_and_validate  # noqa: E402

from fedsonmf.federation.flower.template import PACKAGE, RUN_CONFIG_DEFAULTS, write_app_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "flower-app"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_committed_app_folder_equals_write_app_dir(tmp_path):
    written = _files(write_app_dir(tmp_path / "flower-app"))
    committed = _files(APP)
    assert sorted(committed) == sorted(written), "regenerate with `fedsonmf flower app flower-app`"
    for name, content in written.items():
        assert committed[name] == content, f"flower-app/{name} differs from write_app_dir's output; regenerate it"


def test_app_folder_license_is_the_project_license():
    assert (APP / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()


def test_flower_accepts_the_app_folder_and_ships_only_the_shim():
    config, warnings = load_and_validate(APP / "pyproject.toml", check_module=False)
    assert config["tool"]["flwr"]["app"]["config"] == RUN_CONFIG_DEFAULTS
    assert "fedsonmf" in config["project"]["dependencies"]  # installed beforehand: not on any index
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(APP))) as fab:
        names = sorted(n for n in fab.namelist() if not n.startswith(".info/"))
    assert names == ["LICENSE", f"{PACKAGE}/__init__.py", f"{PACKAGE}/client_app.py", f"{PACKAGE}/server_app.py",
                     "pyproject.toml"]


def test_every_run_config_key_is_documented():
    """docs/flower.md's run-config table names every key of the app."""
    text = (ROOT / "docs" / "flower.md").read_text()
    documented = set(re.findall(r"`([a-z][a-z0-9-]*)`", text))
    missing = sorted(set(RUN_CONFIG_DEFAULTS) - documented)
    assert not missing, f"run-config keys missing from docs/flower.md: {missing}"
