"""The package's layering is a checked contract (import-linter) and has no import cycles."""

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept():
    """The contracts in pyproject.toml ([tool.importlinter]): layers, a pure core, nothing imports the CLI."""
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail("import-linter is not installed (it is in the test extra)")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_no_import_cycles_between_modules():
    graph = grimp.build_graph("fedsonmf", cache_dir=None)
    cycles = []
    for mod in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(mod):
            if imported != mod and graph.chain_exists(importer=imported, imported=mod):
                cycles.append((mod, imported))
    # a package __init__ re-exporting its children is the usual, harmless "cycle": ignore parents
    cycles = [(a, b) for a, b in cycles if not (b.startswith(a + ".") or a.startswith(b + "."))]
    assert not cycles, f"import cycles: {cycles[:10]}"


def test_layers_are_folders():
    pkg = ROOT / "src" / "fedsonmf"
    for folder in ("core", "protocol", "algorithms", "federation", "estimators", "experiments", "cli", "datasets"):
        assert (pkg / folder / "__init__.py").is_file(), folder
    flat = sorted(p.name for p in pkg.glob("*.py"))
    assert flat == ["__init__.py", "_io.py", "_provenance.py", "_validation.py", "exceptions.py", "metrics.py",
                    "model_selection.py", "preprocessing.py"], flat


def test_no_module_is_imported_by_a_name_held_in_a_string():
    """Every import is one the layer contracts can see: no ``importlib.import_module``/``__import__`` in the
    package, except the gate's loader of the operator's ``--app module:attr`` (Flower's own app reference,
    given on the gate's command line, never by a run config or a FAB), the package root's lazy public
    names (PEP 562: a fixed table of downward imports, so that a Flower process imports only what it uses)
    and the Flower compatibility module's contract check (it looks up the Flower symbols its contract
    table names, to fail loudly on a Flower upgrade; none of the project's modules)."""
    package = ROOT / "src" / "fedsonmf"
    allowed = {package / "federation" / "flower" / "gate.py", package / "__init__.py",
               package / "federation" / "flower" / "compat.py"}
    found = []
    for path in sorted(package.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if ("import_module(" in line or "__import__(" in line) and path not in allowed:
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
