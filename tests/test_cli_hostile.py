"""Hostile and malformed inputs to the command line: one ``error:`` line naming the file, the
usual exit code, no traceback and no fit before the refusal (``fedsonmf.cli.app.main`` in this
process, as tests/test_cli_main.py)."""

import json

import pytest

from fedsonmf.cli.app import main


def run_main(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    return exc.value.code, lines, out


# ----------------------------------------------------------------------------- fedsonmf plot

PLOT_CASES = {
    "deeply nested": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "not an object": ("[1, 2]", "a JSON list, not an object"),
    "config a list": ('{"history": [{"round": 1, "R_rel": 1.0}], "config": []}', "'config' is not an object"),
    "heterogeneity text": ('{"history": [{"round": 1, "R_rel": 1.0}], "config": {"data": {"heterogeneity": "x"}}}',
                           "'config.data.heterogeneity' is not a number"),
    "empty history": ('{"history": [], "config": []}', "'history' has no rows"),
    "rows not objects": ('{"history": [{"round": "a"}, 5, null]}', "'history' is not a list of rows"),
    "history an object": ('{"history": {"a": 1}}', "'history' is not a list of rows"),
    "round text": ('{"history": [{"round": "a", "R_rel": 1.0}]}', "history row 0: round = 'a' is not a number"),
    "R_rel null": ('{"history": [{"round": 1, "R_rel": null}]}', "history row 0: R_rel = None is not a number"),
    "no history": ('{"config": {}}', "no 'history'"),
    "not JSON": ("{", "JSONDecodeError"),
    "not UTF-8": (b"\xff\xfe{", "UnicodeDecodeError"),
}


@pytest.mark.parametrize("name", sorted(PLOT_CASES))
def test_plot_refuses_a_malformed_results_json_in_one_line(tmp_path, capsys, name):
    text, what = PLOT_CASES[name]
    path = tmp_path / "r.json"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    code, lines, _ = run_main(["plot", path, "--out", tmp_path / "p.png"], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: not a fedsonmf results JSON (") and what in lines[0]
    assert not (tmp_path / "p.png").exists()


def test_plot_still_draws_a_good_results_json(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"history": [{"round": 1, "R_rel": 1.0}, {"round": 2, "R_rel": 0.1}],
                                "config": {"algorithm": "fedsonmf", "tau": 5, "data": {"heterogeneity": 0.6}}}))
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(path), "--out", str(tmp_path / "p.png")])
    assert exc.value.code == 0 and (tmp_path / "p.png").stat().st_size > 0
