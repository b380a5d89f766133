"""Running the console script in this process: ``fedsonmf.cli.app.main(argv)`` for the tests of
its one-``error:``-line contract (tests/test_cli_main.py, tests/test_cli_hostile.py)."""

from __future__ import annotations

import pytest

from fedsonmf.cli.app import main


def run_main(argv, capsys):
    """``main`` on ``argv`` (each item made a str): its exit code, the non-blank stderr lines and stdout."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    return exc.value.code, lines, out
