"""CLI options built from the parameter table (:data:`fedsonmf.protocol.params.PARAMS`).

Every command takes its defaults and help texts from the table, so a default
cannot differ between commands, the estimators and the function.  A command
that deliberately runs another setting (``fedsonmf synthetic`` runs the paper's
synthetic study setting) says so in its own help.
"""

from __future__ import annotations

from pathlib import Path

import typer

from fedsonmf.protocol.params import PARAMS

__all__ = ["param", "mu_option", "parse_mu", "check_output_path", "CONTEXT"]

#: ``-h`` is help, as users expect (every command and group)
CONTEXT = {"help_option_names": ["-h", "--help"]}


def param(name: str, *flags: str, default=..., help: str | None = None, **kw):
    """``typer.Option`` for table parameter ``name`` (flag ``--name-with-dashes`` unless given)."""
    p = PARAMS[name]
    flags = flags or ("--" + name.replace("_", "-"),)
    value = p.default if default is ... else default
    return typer.Option(value, *flags, help=help or p.help, **kw)


def mu_option():
    """``--mu``: a number or 'auto' (the table's default)."""
    return typer.Option(str(PARAMS["mu"].default), "--mu", help=PARAMS["mu"].help)


def parse_mu(text: str):
    """'auto' or a float; a clear error otherwise."""
    if text == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"must be a number >= 0 or 'auto', got {text!r}", param_hint="--mu") from None


def check_output_path(path: Path | None, flag: str) -> None:
    """Fail before any computation when an output file cannot be written."""
    if path is None:
        return
    parent = path.resolve().parent
    if not parent.is_dir():
        raise typer.BadParameter(f"folder {parent} does not exist", param_hint=flag)
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a folder, not a file", param_hint=flag)
