"""Hostile and malformed inputs to the command line: one ``error:`` line naming the file, the
usual exit code, no traceback and no fit before the refusal (``fedsonmf.cli.app.main`` in this
process, as tests/test_cli_main.py)."""

import json

import numpy as np
import pytest

from _cli import run_main
from fedsonmf.cli.app import main
from fedsonmf.federation import checkpoint as ckpt

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


# ----------------------------------------------------------------------------- fedsonmf synthetic --checkpoint-dir

SYNTH = ["synthetic", "--clients", 3, "--samples", 20, "--features", 6, "--rank", 3, "-q"]


@pytest.mark.parametrize("below", [False, True])
def test_checkpoint_dir_that_is_a_file_is_refused_before_the_fit(tmp_path, capsys, below):
    afile = tmp_path / "afile"
    afile.write_text("x")
    target = afile / "sub" if below else afile
    code, lines, out = run_main([*SYNTH, "--rounds", 2, "--checkpoint-dir", target], capsys)
    assert code == 2 and len(lines) == 1 and out == ""  # no fit ran (its summary goes to stdout)
    assert "--checkpoint-dir" in lines[0] and f"{afile} is a file, not a folder" in lines[0]


def test_estimator_refuses_a_checkpoint_dir_that_is_a_file(tmp_path):
    from fedsonmf.estimators import FedSONMF
    from fedsonmf.exceptions import ParameterError

    (tmp_path / "afile").write_text("x")
    views = [np.random.default_rng(0).random((20, 6)) for _ in range(2)]
    with pytest.raises(ParameterError, match="is a file, not a folder"):
        FedSONMF(n_components=2, max_rounds=1, checkpoint_dir=tmp_path / "afile").fit(views)


def test_synthetic_resume_from_a_tampered_checkpoint_is_one_error_line(tmp_path, capsys):
    d = tmp_path / "ck"
    code, _, _ = run_main([*SYNTH, "--rounds", 2, "--checkpoint-dir", d], capsys)
    assert code == 0
    arrays, meta = ckpt.load_npz(d / ckpt.SERVER_FILE)
    arrays["Vbar"] = arrays["Vbar"][:, :-3]
    ckpt.atomic_save_npz(d / ckpt.SERVER_FILE, arrays, meta)
    code, lines, _ = run_main([*SYNTH, "--rounds", 3, "--checkpoint-dir", d], capsys)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: server checkpoint {d / ckpt.SERVER_FILE}: saved Vbar has shape (3, 17)")


# ----------------------------------------------------------------------------- --threads

@pytest.mark.parametrize("value", [0, -3])
@pytest.mark.parametrize("command", [["cluster", "a.npy", "b.npy", "-k", 2], ["reproduce", "table1"]])
def test_threads_below_one_is_a_parameter_error(tmp_path, capsys, command, value):
    code, lines, out = run_main([*command, "--threads", value, "-q"], capsys)
    assert code == 2 and len(lines) == 1 and out == ""
    assert "--threads" in lines[0] and "x>=1" in lines[0]


# ----------------------------------------------------------------------------- control characters

@pytest.mark.parametrize("name, shown", [("nl\nname.npy", r"nl\nname.npy"),
                                         ("esc\x1b[31mred.npy", r"esc\x1b[31mred.npy"),
                                         ("del\x7fc1\x9b.npy", r"del\x7fc1\x9b.npy")])
def test_control_characters_in_names_are_escaped_in_the_error_line(tmp_path, capsys, name, shown):
    np.save(tmp_path / "ok.npy", np.ones((10, 4)))
    try:
        np.save(tmp_path / name, np.ones((7, 3)))
    except OSError:  # a file system that refuses the name
        pytest.skip("cannot create a file with this name here")
    code, lines, _ = run_main(["cluster", tmp_path / "ok.npy", tmp_path / name, "-k", 2, "-q"], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert shown in lines[0]
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in lines[0])


def test_a_missing_view_named_with_an_escape_sequence_is_shown_escaped(tmp_path, capsys):
    np.save(tmp_path / "ok.npy", np.ones((10, 4)))
    missing = tmp_path / "gone\x1b]0;title\x07.npy"
    code, lines, _ = run_main(["cluster", tmp_path / "ok.npy", missing, "-k", 2], capsys)
    assert code == 2 and len(lines) == 1
    assert r"gone\x1b]0;title\x07.npy" in lines[0] and "\x1b" not in lines[0]


def test_warning_lines_are_escaped_too(capsys):
    from fedsonmf.cli.app import _show_warning

    _show_warning(set(), "view 'a\nb\x1b[2J'", UserWarning, "f.py", 1)
    err = capsys.readouterr().err
    assert err == "warning: view 'a\\nb\\x1b[2J'\n"



def test_a_flower_command_escapes_its_error_line_too(tmp_path, capsys):
    pytest.importorskip("flwr")
    np.save(tmp_path / "ok.npy", np.ones((10, 4)))
    missing = tmp_path / "gone\n\x1b[2Jview.npy"
    code, lines, _ = run_main(["flower", "cluster", tmp_path / "ok.npy", missing, "--clusters", 2,
                               "--out", tmp_path / "run"], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert r"gone\n\x1b[2Jview.npy" in lines[0] and "\x1b" not in lines[0]
