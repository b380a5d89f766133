"""README.md works as written: its Python blocks run, its commands parse (and the cheap ones run).

* every ```python block runs, in order, in one temporary folder (files one block writes are
  there for the next block and the commands), with a ``../shared/data`` beside it when the data
  folder exists (else the blocks that read it are skipped, with the reason);
* every ``fedsonmf ...`` command line (indented blocks) is parsed by the real CLI (an unknown
  command or option fails), and the cheap ones in :data:`RUN` run; the others are listed in
  :data:`PARSE_ONLY` with the reason;
* every ``tests/...`` path and every ``bash scripts/...``/``docs/...`` script the README names exists;
* the API reference builds (docs/api/build.sh).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DATA = Path(os.environ.get("FEDSONMF_DATA") or ROOT.parent / "shared" / "data")

#: commands that run in the test (seconds each)
RUN = {
    "fedsonmf synthetic -H 0.9 --tau 10 --rounds 30 --no-correction --json out.json --plot out.png",
    "fedsonmf synthetic --algorithm fedmavg -H 0.9",
    "fedsonmf cluster view_a.csv view_b.npz --clusters 4 --labels-out clusters.csv",
}
#: commands only parsed, with the reason they do not run here
PARSE_ONLY = {
    "reproduce synthetic": "the paper's whole study (hours; --quick still minutes)",
    "reproduce table1": "every data set x 10 seeds (tens of minutes)",
    "BBCSport.mat --seeds 10": "10 seeds + the context methods on real data (minutes)",
    "BBCSport.mat --seeds 3": "differential privacy over 3 seeds on real data (a minute)",
    "FILE.mat": "a placeholder file name",
    "A.csv B.npz": "placeholder files (ids, labels, different samples)",
    "score clusters.csv --labels y.csv": "y.csv stands for your own labels (tests/test_sklearn_cli.py scores files)",
    "fedsonmf flower": "a real Flower deployment (SuperLink + SuperNodes; the deploy tests run it)",
}


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


def command_lines() -> list[str]:
    """``fedsonmf ...`` lines of the indented blocks, comments stripped."""
    out = []
    for line in README.splitlines():
        if line.startswith("    fedsonmf "):
            out.append(line.split("  #")[0].strip())
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    base = tmp_path_factory.mktemp("readme")
    work = base / "work"
    work.mkdir()
    if DATA.is_dir():
        (base / "shared").mkdir()
        (base / "shared" / "data").symlink_to(DATA, target_is_directory=True)
    return work


def test_readme_has_blocks_and_commands():
    assert len(python_blocks()) >= 4 and len(command_lines()) >= 10


def test_python_blocks_run_in_order(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    skipped = []
    namespace: dict = {}
    for i, block in enumerate(python_blocks()):
        if "../shared/data" in block and not DATA.is_dir():
            skipped.append(i)
            continue
        exec(compile(block, f"README.md python block {i}", "exec"), namespace)  # noqa: S102
    assert (workdir / "view_a.csv").is_file()  # for the commands below
    if skipped:
        pytest.skip(f"blocks {skipped} read ../shared/data, which is absent")


def _parse(argv):
    """Parse ``argv`` with the real CLI (click), without running the command."""
    import click
    import typer.main

    from fedsonmf.cli.app import app

    group = typer.main.get_command(app)
    ctx = group.make_context("fedsonmf", list(argv), resilient_parsing=False)
    cmd, args = group, list(argv)
    while isinstance(cmd, click.Group):
        name, sub, args = cmd.resolve_command(ctx, args)
        cmd = sub
        ctx = cmd.make_context(name, args, parent=ctx)
    return cmd


@pytest.mark.parametrize("line", command_lines())
def test_every_command_line_parses(line):
    assert "[" not in line, f"an optional part in brackets does not run as written: {line}"
    argv = shlex.split(line)[1:]
    argv = [a.replace("view*.npy", "view0.npy") for a in argv]
    _parse(argv)  # raises click's UsageError on an unknown command or option, a bad value


def test_every_command_is_run_or_listed_with_a_reason():
    for line in command_lines():
        assert line in RUN or any(key in line for key in PARSE_ONLY), f"not covered: {line}"


def test_cheap_commands_run(workdir, monkeypatch):
    from fedsonmf.cli.app import main

    monkeypatch.chdir(workdir)
    if not (workdir / "view_a.csv").is_file():  # the python blocks write the view files
        pytest.skip("needs the files the README's python blocks write (run with them)")
    for line in sorted(RUN):
        assert line in command_lines(), f"RUN lists a command the README no longer has: {line}"
        with pytest.raises(SystemExit) as exc:
            main(shlex.split(line)[1:] + ["-q"])
        assert exc.value.code in (0, None), line
    assert (workdir / "out.json").is_file() and (workdir / "out.png").is_file()
    assert (workdir / "clusters.csv").read_text().startswith("sample_id,cluster")


def test_named_paths_exist():
    for ref in set(re.findall(r"`(tests/[\w./*-]+)`", README)):
        assert list(ROOT.glob(ref)), f"README names {ref}, which matches no file"
    for ref in set(re.findall(r"bash ((?:scripts|docs)/[\w./-]+\.sh)", README)):
        assert (ROOT / ref).is_file(), ref
    for ref in set(re.findall(r"`((?:docs|benchmarks|examples)/[\w./-]+)`", README)):
        assert (ROOT / ref.rstrip("/")).exists(), f"README names {ref}, which does not exist"


def test_markers_named_in_readme_are_declared():
    import tomllib

    declared = {m.split(":")[0] for m in tomllib.loads((ROOT / "pyproject.toml").read_text())
                ["tool"]["pytest"]["ini_options"]["markers"]}
    for marker in re.findall(r'-m "not (\w+)"', README):
        assert marker in declared, marker


def test_api_reference_builds(tmp_path):
    pytest.importorskip("pdoc", reason="the docs extra (pdoc) is not installed")
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(["bash", str(ROOT / "docs" / "api" / "build.sh"), str(tmp_path / "api")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pages = {p.relative_to(tmp_path / "api").as_posix() for p in (tmp_path / "api").rglob("*.html")}
    for page in ("fedsonmf.html", "fedsonmf/estimators/single.html", "fedsonmf/model_selection.html"):
        assert page in pages, sorted(pages)
    assert "SparseONMF" in (tmp_path / "api" / "fedsonmf" / "estimators" / "single.html").read_text()


@pytest.mark.parametrize("script", ["cluster_two_csv_views.py", "incomplete_views.py", "synthetic_study.py"])
def test_examples_run(script, tmp_path):
    """The examples/ scripts run as written (the Flower one starts a deployment: the deploy tests cover it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wrote" in proc.stdout or "scores" in proc.stdout


def test_every_example_is_listed_and_importable():
    listed = (ROOT / "examples" / "README.md").read_text()
    for path in sorted((ROOT / "examples").glob("*.py")):
        assert path.name in listed, path.name
        compile(path.read_text(), str(path), "exec")


def test_plot_command_draws_both_demo_runs_with_labels(tmp_path, monkeypatch):
    """The demo's figure: both runs in one PNG, each labelled from its config (the ablation says so)."""
    from fedsonmf.cli.app import _run_label, main

    monkeypatch.chdir(tmp_path)
    for extra, name in (([], "c.json"), (["--no-correction"], "n.json")):
        with pytest.raises(SystemExit):
            main(["synthetic", "--rounds", "3", "-q", "--clients", "3", "--json", name, *extra])
    import json

    labels = [_run_label(json.loads((tmp_path / n).read_text()), tmp_path / n) for n in ("c.json", "n.json")]
    assert "with drift correction" in labels[0] and "no correction (ablation)" in labels[1]
    with pytest.raises(SystemExit) as exc:
        main(["plot", "c.json", "n.json", "--out", "both.png"])
    assert exc.value.code in (0, None) and (tmp_path / "both.png").stat().st_size > 1000
    assert "fedsonmf plot results/demo-correction.json results/demo-no-correction.json" in \
        (ROOT / "scripts" / "demo.sh").read_text()
