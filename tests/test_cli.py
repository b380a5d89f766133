import json

from typer.testing import CliRunner

from fedsonmf.cli.app import app


def test_synthetic_cli_writes_json_and_png(tmp_path):
    out, png = tmp_path / "run.json", tmp_path / "run.png"
    result = CliRunner().invoke(app, ["synthetic", "--rounds", "4", "--clients", "3", "--samples", "30",
                                      "--heterogeneity", "0.3", "--json", str(out), "--plot", str(png), "-q"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["config"]["tau"] == 10 and doc["config"]["data"]["heterogeneity"] == 0.3
    assert doc["seed"] == 0 and len(doc["history"]) == 4
    for key in ("round", "R", "R_rel", "objective", "effective_rank", "seconds"):
        assert key in doc["history"][0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_bad_parameters():
    result = CliRunner().invoke(app, ["synthetic", "--tau", "0", "-q"])
    assert result.exit_code != 0
    assert "tau must be an integer >= 1" in str(result.exception) + result.output


def test_usage_errors_are_one_error_line(capsys):
    """Unknown options, bad values and unknown commands: one ``error:`` line on stderr, exit 2
    (not click's multi-line box)."""
    import pytest

    from fedsonmf.cli.app import main

    for argv in (["synthetic", "--tau", "x"], ["cluster", "--bogus"], ["nope"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err
        assert "╭" not in err[0]


def test_cluster_view_files_with_different_ids_needs_missing_mask(tmp_path, capsys):
    """Views holding different sample ids: refused in the complete case (one error line, exit 2), clustered
    over the union of ids with ``--missing mask``; the assignments cover every id once."""
    import csv

    import numpy as np
    import pytest

    from fedsonmf.cli.app import main

    rng = np.random.default_rng(0)
    n, c = 45, 3
    y = np.repeat(np.arange(c), n // c)
    ids = np.arange(1000, 1000 + n)
    paths = []
    for p, d in enumerate((6, 9)):
        X = np.kron(np.eye(c), np.ones((1, d // c)))[y] + 0.05 * rng.random((n, d))
        keep = np.flatnonzero(np.arange(n) % 5 != p)  # each view lacks a fifth of the samples
        path = tmp_path / f"v{p}.npy"
        np.save(path, X[keep])
        (tmp_path / f"v{p}.ids.txt").write_text("\n".join(map(str, ids[keep])) + "\n")
        paths.append(str(path))
    out = tmp_path / "out.csv"
    with pytest.raises(SystemExit) as info:
        main(["cluster", *paths, "-k", "3", "-q", "--labels-out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and "different sample ids" in err[0] and "--missing mask" in err[0]
    assert not out.exists()
    with pytest.raises(SystemExit) as info:
        main(["cluster", *paths, "-k", "3", "-q", "--missing", "mask", "--labels-out", str(out)])
    assert info.value.code == 0, capsys.readouterr().err
    rows = list(csv.reader(out.open()))[1:]
    assert [int(r[0]) for r in rows] == ids.tolist()
