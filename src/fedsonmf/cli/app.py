"""The ``fedsonmf`` command: ``synthetic``, ``cluster``, ``plot``, ``reproduce ...``, ``flower ...``.

Each command group lives in its own module and adds itself with
``register(app, reproduce_app)``.  Conventions: ``-h`` is help; every
predictable failure prints one ``error: ...`` line on stderr and exits non-zero
(2 for bad input or parameters, 1 for a run that failed); arguments are
checked before any fitting starts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from fedsonmf.cli import cluster, experiments, flower, synthetic
from fedsonmf.cli.options import CONTEXT, error_line, one_line
from fedsonmf.exceptions import DataWarning

app = typer.Typer(
    name="fedsonmf",
    help="Federated sparse orthogonal NMF and federated multi-view clustering.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
)
reproduce_app = typer.Typer(help="Reproduce the paper's experiments.", no_args_is_help=True, context_settings=CONTEXT)
app.add_typer(reproduce_app, name="reproduce")

for _module in (synthetic, cluster, experiments, flower):
    _module.register(app, reproduce_app)


def _run_label(doc: dict, path: Path) -> str:
    """A legend entry for one results JSON: the algorithm, whether drift correction was on, h and tau
    (``doc`` checked by :func:`_read_results`)."""
    cfg = doc.get("config") or {}
    algo = str(cfg.get("algorithm", path.stem))
    what = algo if algo != "fedsonmf" else "fedsonmf, " + ("with drift correction" if cfg.get("correction", True)
                                                          else "no correction (ablation)")
    data = cfg.get("data") or {}
    extra = [f"h={data['heterogeneity']:g}"] if "heterogeneity" in data else []
    if "tau" in cfg:
        extra.append(f"tau={cfg['tau']}")
    return what + (f" ({', '.join(extra)})" if extra else "")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: the row fields ``fedsonmf plot`` reads (History.column: the x and y of each line)
_PLOTTED = ("round", "R_rel")


def _read_results(path: Path):
    """``(history, legend entry)`` of one results JSON, or an InputError naming the file and what
    is wrong (``<file>: not a fedsonmf results JSON (<what>)``) for anything the plot cannot use."""
    import json

    from fedsonmf.exceptions import InputError
    from fedsonmf.protocol.history import History

    def bad(what: str) -> InputError:
        return InputError(f"{path}: not a fedsonmf results JSON ({what})")

    try:
        doc = json.loads(Path(path).read_text())
    except RecursionError:
        raise bad("nested too deeply") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise bad(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict):
        raise bad(f"a JSON {type(doc).__name__}, not an object")
    if "history" not in doc:
        raise bad("no 'history'")
    rows = doc["history"]
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise bad("'history' is not a list of rows (objects)")
    if not rows:
        raise bad("'history' has no rows")
    for i, row in enumerate(rows):
        for key in _PLOTTED:
            if key in row and not _is_number(row[key]):
                raise bad(f"history row {i}: {key} = {row[key]!r:.40} is not a number")
    if doc.get("R0") is not None and not _is_number(doc["R0"]):
        raise bad("'R0' is not a number")
    cfg = doc.get("config")
    if cfg is not None and not isinstance(cfg, dict):
        raise bad("'config' is not an object")
    data = (cfg or {}).get("data")
    if data is not None and not isinstance(data, dict):
        raise bad("'config.data' is not an object")
    if data and "heterogeneity" in data and not _is_number(data["heterogeneity"]):
        raise bad("'config.data.heterogeneity' is not a number")
    return History(rows, R0=doc.get("R0")), _run_label(doc, Path(path))


@app.command("plot")
def plot(
    results: list[Path] = typer.Argument(..., help="Results JSON files (--json of synthetic / flower run)."),
    out: Path = typer.Option(..., "--out", "-o", help="The PNG to write."),
    target: float = typer.Option(1e-2, "--target", help="Draw (and label) this R/R1 level; 0: none."),
    title: Optional[str] = typer.Option(None, "--title", help="Figure title."),
):
    """R/R1 per round of several runs in one figure, each labelled from its config (e.g. the demo's two runs)."""
    from fedsonmf.cli.options import check_output_path
    from fedsonmf.experiments.plotting import plot_residuals

    check_output_path(out, "--out")
    runs = {}
    for path in results:
        hist, label = _read_results(path)
        while label in runs:
            label += "'"
        runs[label] = hist
    plot_residuals(runs, out, title=title, target=target if target > 0 else None)
    typer.echo(f"wrote {out}")



def _error(text: object) -> None:
    """Print the one ``error: ...`` line of a failed command on stderr."""
    error_line(text)


def _show_warning(shown: set[str], message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one ``warning: ...`` line on stderr, like the ``error:`` lines, and each text once
    per command (``shown``: the texts shown so far; the fits of several seeds warn alike): the file
    and line that raised it (the library's, or typer's for a command) mean nothing to a
    command-line user."""
    name = "" if category in (UserWarning, DataWarning) else f"{category.__name__}: "
    text = f"warning: {name}{one_line(message)}"
    if text not in shown:
        shown.add(text)
        typer.echo(text, err=True)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one ``error:`` line and a non-zero exit for every known failure,
    one ``warning:`` line per warning."""
    import functools
    import warnings

    import click

    from fedsonmf._provenance import set_command
    from fedsonmf.exceptions import FedSONMFError, InputError, ParameterError

    set_command(sys.argv[1:] if argv is None else argv)  # the command line in every JSON's meta block
    previous = warnings.showwarning
    warnings.showwarning = functools.partial(_show_warning, set())
    try:
        # standalone_mode=False: click's usage errors reach us instead of being drawn as a
        # multi-line box, so they too become one ``error:`` line (exit 2)
        code = app(args=argv, standalone_mode=False, prog_name="fedsonmf")
        sys.exit(code if isinstance(code, int) else 0)  # as click's standalone mode: always SystemExit
    except click.exceptions.UsageError as exc:
        if not exc.format_message():  # no arguments: the help was printed (click's exit code 2)
            sys.exit(2)
        name = exc.ctx.command_path if exc.ctx is not None else "fedsonmf"
        _error(f"{exc.format_message()} (see '{name} -h')")
        sys.exit(2)
    except click.exceptions.Abort:
        _error("aborted")
        sys.exit(1)
    except click.exceptions.ClickException as exc:
        _error(exc.format_message())
        sys.exit(exc.exit_code or 1)
    except (ParameterError, InputError) as exc:
        _error(exc)
        sys.exit(2)
    except FedSONMFError as exc:
        _error(exc)
        sys.exit(1)
    except OSError as exc:  # unreadable input, unwritable output, full disk
        _error(exc)
        sys.exit(1)
    finally:
        warnings.showwarning = previous
