"""The codebase's checked habits: ruff (lint + import order) and mypy (types) are clean.

Configured in pyproject.toml ([tool.ruff], [tool.mypy]); both come with the test extra.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name):
    exe = Path(sys.executable).with_name(name)
    path = str(exe) if exe.exists() else shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return path


def test_ruff_is_clean():
    out = subprocess.run([_tool("ruff"), "check", "src", "tests", "benchmarks"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_mypy_is_clean():
    out = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
