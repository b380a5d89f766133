"""CLI options built from the parameter table (:data:`fedsonmf.protocol.params.PARAMS`).

Every command takes its defaults and help texts from the table, so a default
cannot differ between commands, the estimators and the function.  A command
that deliberately runs another setting (``fedsonmf synthetic`` runs the paper's
synthetic study setting) says so in its own help.
"""

from __future__ import annotations

import functools
import inspect
import typing
from pathlib import Path
from typing import Optional

import typer

from fedsonmf.protocol.params import PARAMS

__all__ = ["param", "mu_option", "parse_mu", "check_output_path", "CONTEXT", "with_params", "ALGORITHM_OPTIONS",
           "DP_OPTIONS", "threads_option", "one_line", "error_line"]

#: control characters (C0, DEL, C1): shown escaped in ``error:`` and ``warning:`` lines
_CONTROL = {c: repr(chr(c))[1:-1] for c in (*range(0x20), *range(0x7f, 0xa0))}


def one_line(text: object) -> str:
    """``text`` with its control characters escaped as Python does (``\\n``, ``\\x1b``): a file
    named with a newline keeps the message on one line, and an escape sequence in a name (or
    in anything else a message quotes) never reaches the terminal."""
    return str(text).translate(_CONTROL)


def error_line(text: object) -> None:
    """Print a failed command's one ``error: ...`` line on stderr (:func:`one_line`)."""
    typer.echo(f"error: {one_line(text)}", err=True)


#: the algorithm options every federated command offers (flags derived from the names)
ALGORITHM_OPTIONS = ("mu", "mu_scale", "tau", "alpha", "eta_g", "rho1", "correction", "batch_size", "algorithm")
#: flags that are not ``--name-with-dashes``
_FLAGS = {"correction": ("--correction/--no-correction",), "diagnostics": ("--diagnostics/--no-diagnostics",),
          "normalize_embedding": ("--normalize-embedding/--raw-embedding",), "max_rounds": ("--rounds",),
          "n_components": ("--rank", "-r")}
#: option types that the default does not tell
_TYPES = {"mu": str, "n_init": str, "batch_size": str, "checkpoint_dir": Optional[Path], "blas_threads": Optional[int],
          "dp_epsilon": Optional[float], "dp_noise_multiplier": Optional[float]}
#: the differential-privacy options (fedsonmf.protocol.privacy)
DP_OPTIONS = ("dp_epsilon", "dp_noise_multiplier", "dp_clip", "dp_clip_setup", "dp_delta", "dp_rounds")

#: the help panel of each group of the table (the option object FedMultiViewClustering holds it in)
PANELS = {"method": "The method (MethodOptions)", "refinement": "The refinement (RefineOptions)",
          "privacy": "Privacy (PrivacyOptions)", "inprocess": "The federation", "flower": "The federation"}

#: ``-h`` is help, as users expect (every command and group)
CONTEXT = {"help_option_names": ["-h", "--help"]}


def param(name: str, *flags: str, default=..., help: str | None = None, **kw):
    """``typer.Option`` for table parameter ``name``, with the table's default and help.

    Parameters
    ----------
    name : str
        A key of :data:`fedsonmf.protocol.params.PARAMS`.
    *flags : str
        The option's flags; none = ``--name-with-dashes``.
    default : object, optional
        A declared departure from the table's default (the command's help says why).
    help : str or None, default=None
        Help text; None = the table's.
    **kw
        Passed to ``typer.Option`` (``min=``, ...).

    Returns
    -------
    typer.models.OptionInfo
    """
    p = PARAMS[name]
    flags = flags or ("--" + name.replace("_", "-"),)
    value = p.default if default is ... else default
    kw.setdefault("rich_help_panel", PANELS.get(p.group))
    return typer.Option(value, *flags, help=help or p.help, **kw)


def mu_option():
    """``--mu``: a number or 'auto' (the table's default)."""
    return typer.Option(str(PARAMS["mu"].default), "--mu", help=PARAMS["mu"].help, rich_help_panel=PANELS["method"])


def parse_mu(text: str):
    """The value of ``--mu``: ``"auto"`` or a number.

    Parameters
    ----------
    text : str
        What the user typed.

    Returns
    -------
    str or float

    Raises
    ------
    typer.BadParameter
        Neither (one ``error:`` line, exit 2).
    """
    if text == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"must be a number >= 0 or 'auto', got {text!r}", param_hint="--mu") from None


def threads_option(help: str = "BLAS threads."):
    """``--threads``: the BLAS threads of a command's fits, an integer >= 1 (default 1)."""
    return typer.Option(1, "--threads", min=1, help=help)


def check_output_path(path: Path | None, flag: str, folder: bool = False) -> None:
    """Fail before any computation when an output file (or folder) cannot be written.

    Parameters
    ----------
    path : Path or None
        The output file (None: nothing to check).
    flag : str
        The option that named it, for the message.
    folder : bool, default=False
        ``path`` is an output folder (created with its missing parents when written, e.g.
        ``--checkpoint-dir``): refused when it, or the nearest of its parents that exists, is
        not a folder.

    Raises
    ------
    typer.BadParameter
        Its folder does not exist, or ``path`` is a folder; with ``folder``, ``path`` or the
        nearest existing parent is a file.
    """
    if path is None:
        return
    if folder:
        existing = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            what = f"{path} is a file, not a folder" if existing == path else f"{existing} is a file, not a folder"
            raise typer.BadParameter(what, param_hint=flag)
        return
    parent = path.resolve().parent
    if not parent.is_dir():
        raise typer.BadParameter(f"folder {parent} does not exist", param_hint=flag)
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a folder, not a file", param_hint=flag)


def _parse_auto_int(text: str):
    """A table value that is ``"auto"`` or an int, typed as text: the int when it is digits (the
    estimator checks everything else and names the parameter)."""
    return int(text) if isinstance(text, str) and text.strip().isdigit() else text


#: parameters typed as text on the command line, and how their text becomes the value
_PARSERS = {"mu": parse_mu, "n_init": _parse_auto_int, "batch_size": _parse_auto_int}


def with_params(*names: str):
    """Decorator: add the table parameters ``names`` as options of a typer command.

    The command receives them as one dict ``params`` (``mu`` already parsed), so
    every command that runs a federation declares them once, here.
    """

    def deco(func):
        hints = typing.get_type_hints(func)
        sig = inspect.signature(func)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
               if p.name != "params"]
        extra = []
        for n in names:
            opt = mu_option() if n == "mu" else param(n, *_FLAGS.get(n, ()))
            kind = _TYPES.get(n, type(PARAMS[n].default))
            extra.append(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind))

        @functools.wraps(func)
        def command(**kwargs):
            params = {n: kwargs.pop(n) for n in names}
            for n, parse in _PARSERS.items():
                if n in params:
                    params[n] = parse(params[n])
            return func(params=params, **kwargs)

        del command.__wrapped__  # typer must see the new signature, not func's
        command.__signature__ = sig.replace(parameters=own + extra)
        command.__annotations__ = {p.name: p.annotation for p in own + extra}
        return command

    return deco
