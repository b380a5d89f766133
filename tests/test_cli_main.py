"""``fedsonmf.cli.app.main(argv)``, the console script, for every command group.

The documented contract: every predictable failure prints exactly one ``error: ...`` line on
stderr and exits non-zero -- 2 for bad input or parameters, reported before anything starts
(no fit, no process), 1 for a run or a write that failed.  Each case below runs ``main`` in this
process (no deployment is started) and checks the exit code, the single line and its content.
"""

import numpy as np
import pytest

from _cli import run_main
from fedsonmf.cli.app import main


def _cases(tmp_path):
    np.save(tmp_path / "v0.npy", np.ones((10, 4)))
    np.save(tmp_path / "v1.npy", np.ones((10, 5)))
    np.save(tmp_path / "short.npy", np.ones((7, 5)))
    np.save(tmp_path / "m7.npy", np.ones(7, dtype=bool))
    (tmp_path / "afile").write_text("x")
    for name, ids in (("ida", [3, 1, 2]), ("idb", [1, 2, 4]), ("idc", [2, 3, 1])):  # CSVs with an id column
        (tmp_path / f"{name}.csv").write_text("id,x,y\n" + "".join(f"{i},{i}.5,1\n" for i in ids))
    (tmp_path / "noid.csv").write_text("1,2\n3,4\n5,6\n")
    (tmp_path / "y9.csv").write_text("sample_id,label\n1,a\n2,b\n9,a\n")
    v0, v1, nope = tmp_path / "v0.npy", tmp_path / "v1.npy", tmp_path / "nope.npy"
    sub = tmp_path / "afile" / "x"  # a path below a file: cannot be created
    return {
        # group: fedsonmf synthetic
        "synthetic bad parameter": (["synthetic", "--tau", 0, "-q"], 2, "tau must be an integer >= 1"),
        "synthetic bad mu": (["synthetic", "--mu", "foo", "-q"], 2, "--mu"),
        "synthetic bad heterogeneity": (["synthetic", "-H", 2, "-q"], 2, "[0, 1]"),
        # group: fedsonmf cluster
        "cluster missing file": (["cluster", tmp_path / "nope.mat"], 2, "does not exist"),
        "cluster unknown option": (["cluster", "--bogus"], 2, "--bogus"),
        # group: fedsonmf score
        "score missing clusters": (["score", nope, "--labels", tmp_path / "y9.csv"], 2, "is not a file"),
        "score json below a file": (["score", tmp_path / "y9.csv", "--labels", tmp_path / "y9.csv", "--json",
                                       sub], 2, "--json"),
        # group: fedsonmf reproduce
        "reproduce table1 no data": (["reproduce", "table1", "--data", tmp_path / "none"], 2, "data"),
        "reproduce synthetic bad rounds": (["reproduce", "synthetic", "--rounds", 0], 2, "rounds"),
        "reproduce unknown command": (["reproduce", "nope"], 2, "nope"),
        # group: fedsonmf plot
        "plot missing results": (["plot", nope, "--out", tmp_path / "p.png"], 2, "not a fedsonmf results JSON"),
        "plot not a results file": (["plot", tmp_path / "afile", "--out", tmp_path / "p.png"], 2,
                                    "not a fedsonmf results JSON"),
        # group: fedsonmf flower (loopback launcher and app)
        "flower run missing view": (["flower", "run", nope, v1, "--out", tmp_path / "r"], 2,
                                    "view file " + str(nope) + " does not exist"),
        "flower run rank above a width": (["flower", "run", v0, v1, "--out", tmp_path / "r", "--rank", 5], 2,
                                          "n_components=5"),
        "flower run different n": (["flower", "run", v0, tmp_path / "short.npy", "--out", tmp_path / "r",
                                    "--rank", 2], 2, "different numbers of samples"),
        "flower run tol without diagnostics": (["flower", "run", v0, v1, "--out", tmp_path / "r", "--rank", 2,
                                                "--no-diagnostics"], 2, "tol > 0 needs diagnostics"),
        "flower run out is a file": (["flower", "run", v0, v1, "--out", tmp_path / "afile", "--rank", 2], 2,
                                     "is a file"),
        "flower run resume nothing": (["flower", "run", v0, v1, "--out", tmp_path / "r", "--rank", 2,
                                       "--resume"], 2, "nothing to resume"),
        "flower cluster too many clusters": (["flower", "cluster", v0, v1, "-k", 11, "--out", tmp_path / "r"], 2,
                                             "n_clusters=11"),
        "flower cluster mask of another length": (["flower", "cluster", v0, v1, "-k", 2, "--mask", tmp_path / "m7.npy",
                                                   "--mask", "-", "--out", tmp_path / "r"], 2,
                                                  "client 0: the availability mask has length 7, the view has 10"),
        "flower run mask of another length": (["flower", "run", v0, v1, "--rank", 2, "--mask", "-", "--mask",
                                               tmp_path / "m7.npy", "--out", tmp_path / "r"], 2,
                                              "client 1: the availability mask has length 7"),
        "flower cluster views of other samples": (["flower", "cluster", tmp_path / "ida.csv", tmp_path / "idb.csv",
                                                   "-k", 2, "--out", tmp_path / "r"], 2,
                                                  "the views hold different sample ids: ida.csv lacks 1 (4)"),
        "flower cluster labels of other ids": (["flower", "cluster", tmp_path / "ida.csv", tmp_path / "idc.csv",
                                                "-k", 2, "--labels", tmp_path / "y9.csv", "--out", tmp_path / "r"], 2,
                                               "no label for 1 samples (3); 1 labels for ids no view holds (9)"),
        "flower cluster missing mask with masks": (["flower", "cluster", v0, v1, "-k", 2, "--missing", "mask",
                                                    "--mask", "-", "--mask", "-", "--out", tmp_path / "r"], 2,
                                                   "leave out --mask"),
        "flower cluster bad missing": (["flower", "cluster", v0, v1, "-k", 2, "--missing", "zeros", "--out",
                                        tmp_path / "r"], 2, "--missing"),
        "flower run missing mask with masks": (["flower", "run", v0, v1, "--rank", 2, "--missing", "mask", "--mask",
                                                "-", "--mask", "-", "--out", tmp_path / "r"], 2, "leave out --mask"),
        "flower run views of other samples": (["flower", "run", tmp_path / "ida.csv", tmp_path / "idb.csv",
                                               "--rank", 1, "--out", tmp_path / "r"], 2,
                                              "--missing mask"),
        "flower run ids in some views only": (["flower", "run", tmp_path / "ida.csv", tmp_path / "noid.csv",
                                               "--rank", 1, "--out", tmp_path / "r"], 2,
                                              "sample ids for some views only: ida.csv carry ids"),
        "flower cluster bad rank rule": (["flower", "cluster", v0, v1, "-k", 2, "--rank", "big", "--out",
                                          tmp_path / "r"], 2, "--rank"),
        "flower simulate tol without diagnostics": (["flower", "simulate", v0, v1, "--out", tmp_path / "r",
                                                     "--no-diagnostics"], 2, "tol > 0 needs diagnostics"),
        "flower simulate missing view": (["flower", "simulate", nope, "--out", tmp_path / "r"], 2,
                                         "does not exist"),
        "flower views bad heterogeneity": (["flower", "views", tmp_path / "v", "-H", 2], 2, "heterogeneity"),
        "flower app unwritable": (["flower", "app", sub], 1, "Not a directory"),
        # group: fedsonmf flower (separate machines)
        "flower superlink without tls": (["flower", "superlink", "--host", "127.0.0.1"], 2, "--tls DIR"),
        "flower register missing option": (["flower", "register", tmp_path / "n.pub", "--partition", 0], 2,
                                           "--superlink"),
        "flower supernode missing view": (["flower", "supernode", "--superlink", "127.0.0.1:9092", "--view", nope,
                                           "--partition", 0, "--partitions", 2, "--insecure", "--home",
                                           tmp_path / "h"], 2, "does not exist"),
        "flower submit without coordinator key": (["flower", "submit", "--superlink", "127.0.0.1:9092", "--out",
                                                   tmp_path / "r", "--clients", 2, "--insecure"], 2,
                                                  "--coordinator-key"),
        "flower submit clusters bad rank rule": (["flower", "submit", "--superlink", "127.0.0.1:9092", "--out",
                                                  tmp_path / "r", "--clients", 2, "--insecure", "--clusters", 2,
                                                  "--rank", "big", "--coordinator-key", tmp_path / "c.key"], 2,
                                                 "--rank"),
        # group: fedsonmf flower align
        "flower align tags without a key": (["flower", "align", "tags", v0, "--key", tmp_path / "link.key", "--out",
                                           tmp_path / "t.json"], 2, "does not exist"),
        "flower align positions unreadable": (["flower", "align", "positions", nope, "--out-dir", tmp_path / "p"], 2,
                                              "does not exist"),
        "flower align view of another file": (["flower", "align", "view", v0, "--key", tmp_path / "link.key",
                                               "--positions", nope, "--out", tmp_path / "a"], 2, "does not exist"),
        "flower align key unwritable": (["flower", "align", "key", sub / "k"], 1, "Not a directory"),
        # group: fedsonmf flower keys
        "flower keys tls unwritable": (["flower", "keys", "tls", sub, "--host", "127.0.0.1"], 1, "Not a directory"),
        "flower keys node unwritable": (["flower", "keys", "node", sub, "--name", "n0"], 1, "Not a directory"),
        "flower keys coordinator unwritable": (["flower", "keys", "coordinator", sub], 1, "Not a directory"),
        "flower keys unknown": (["flower", "keys", "nope"], 2, "nope"),
    }


def _names():
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return sorted(_cases(pathlib.Path(d)))


@pytest.mark.parametrize("name", _names())
def test_main_fails_with_one_error_line_and_the_documented_exit_code(name, tmp_path, capsys):
    if name.startswith("flower"):
        pytest.importorskip("flwr")
    argv, code, needle = _cases(tmp_path)[name]
    got, lines, out = run_main(argv, capsys)
    assert got == code, (got, lines, out)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert needle in lines[0], lines
    assert "starting" not in out  # bad input is reported before anything starts
    assert "Traceback" not in lines[0] and "╭" not in lines[0]


def test_every_command_group_is_exercised():
    import click
    import typer.main

    from fedsonmf.cli.app import app

    root = typer.main.get_command(app)
    groups = {"synthetic", "cluster", "score", "reproduce", "flower", "plot"}
    assert set(root.commands) == groups
    covered = {name.split()[0] for name in _names()}
    assert covered == groups
    flower = root.commands["flower"]
    assert isinstance(flower, click.Group)
    flower_covered = {name.split()[1] for name in _names() if name.startswith("flower")}
    assert flower_covered == set(flower.commands)  # every flower command has a case


def test_help_and_no_arguments(capsys):
    code, _, out = run_main(["-h"], capsys)
    assert code == 0 and "synthetic" in out and "flower" in out
    code, _, _ = run_main([], capsys)
    assert code == 2  # help printed, as click does without arguments


def test_a_successful_command_exits_zero(tmp_path, capsys):
    code, lines, out = run_main(["synthetic", "--rounds", 2, "--clients", 2, "--samples", 20, "-q"], capsys)
    assert code == 0 and "max_rounds=2 reached" in out
    assert not [line for line in lines if line.startswith("error:")]


def test_warnings_are_one_line_each_and_what_the_data_needs_said_is_shown(tmp_path, capsys):
    """A warning is one ``warning: ...`` line (no file, line or source of the library or of typer);
    a capped run names its category.  A data warning (here a view with 42 % all-zero rows) reaches a
    ``cluster`` user, though the command hides the other warnings of its fits; with labels and 3
    seeds it is shown once."""
    import warnings

    rng = np.random.default_rng(0)
    Z = rng.random((60, 8))
    Z[:25] = 0
    np.save(tmp_path / "a.npy", rng.random((60, 7)))
    np.save(tmp_path / "z.npy", Z)
    np.savetxt(tmp_path / "y.csv", np.repeat(np.arange(3), 20), fmt="%d")
    shown = warnings.showwarning
    code, lines, _ = run_main(["synthetic", "--rounds", 2, "--clients", 2, "--samples", 20, "-q"], capsys)
    assert code == 0 and lines == [line for line in lines if line.startswith("warning: ConvergenceWarning: stopped")]
    assert len(lines) == 1 and ".py" not in lines[0]
    for extra in (["--clusters", 3], ["--labels", tmp_path / "y.csv", "--seeds", 3]):
        code, lines, _ = run_main(["cluster", tmp_path / "a.npy", tmp_path / "z.npy", "-q", *extra], capsys)
        assert code == 0, lines
        assert len(lines) == 1 and lines[0].startswith("warning: view 1: 42 % of its samples are all-zero rows"), lines
    assert warnings.showwarning is shown  # restored: main() leaves the caller's warnings as they were


def test_flower_views_without_flwr_is_one_error_line(tmp_path):
    """`fedsonmf flower views` before the Flower extra is installed: rc 2 and one `error:` line naming
    the extra, not a traceback (the README's Flower commands start with it)."""
    import os
    import subprocess
    import sys

    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "flwr.py").write_text("raise ImportError('No module named flwr')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "block"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", "from fedsonmf.cli.app import main; main()", "flower", "views",
                           str(tmp_path / "views")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "fedsonmf[flower]" in lines[0], proc.stderr
    assert not (tmp_path / "views").exists()


def test_reproduce_table1_names_the_protocol_it_ran(tmp_path, capsys):
    """The table's caption says what "ours" is: the label-free defaults, or the paper's literal protocol
    under --paper (it said "label-free defaults" for both)."""
    from scipy.io import savemat

    from fedsonmf.datasets.synthetic import make_synthetic

    d = make_synthetic(n_clients=2, n_samples=60, n_features=10, rank=3, random_state=0)
    (tmp_path / "Toy").mkdir()
    cell = np.empty((1, 2), dtype=object)
    cell[0, 0], cell[0, 1] = d.views
    savemat(tmp_path / "Toy" / "toy.mat", {"X": cell, "Y": np.repeat([1, 2, 3], 20)[:, None]})
    for flags, ours in (([], "ours = label-free defaults"), (["--paper"], "ours = the paper's literal protocol")):
        with pytest.raises(SystemExit) as exc:
            main(["reproduce", "table1", "--data", str(tmp_path), "--seeds", "1", "-m", "fedsonmf", "-q",
                  "--rounds", "5", *flags])
        assert exc.value.code in (0, None)
        assert ours in " ".join(capsys.readouterr().out.split())
