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
