"""CLI commands of the flower area (registered by :mod:`fedsonmf.cli`).

``fedsonmf flower run VIEW...``      SuperLink + one SuperNode per view on loopback: factorise, collect, stop
``fedsonmf flower cluster VIEW...``  the same deployment running FedMultiViewClustering's pipeline: labels.csv
``fedsonmf flower app DEST``         write the shim Flower app (for ``flwr run`` on real machines)
``fedsonmf flower views DEST``       write synthetic view files (one per client) to try it out
``fedsonmf flower simulate DIR``     the same app in Flower's simulation engine, one simulated client per view

Both runs check the view files and the run folder (absent or empty, unless ``--resume`` or
``--overwrite``) before anything starts (exit 2 on bad input), show the progress the ServerApp
writes to ``status.json`` (phase, round k of K, s/round, ETA: a bar on a terminal, timestamped
lines otherwise), print the time from the launch to the start of round 1, and end with the run
folder's size, the nodes' copies of the views removed unless ``--keep-views``.

Separate machines (docs/flower.md, "Real multiple machines"; each a thin wrapper that prints what it runs):

``fedsonmf flower keys tls DIR --host ADDR``   CA + SuperLink certificate (server.key 0600; no CA key kept)
``fedsonmf flower keys node DIR --name N``     a SuperNode key pair (ECDSA P-384, private 0600)
``fedsonmf flower keys coordinator DIR``       the coordinator's Ed25519 pair (coordinator.key 0600, .pub)
``fedsonmf flower superlink --host ADDR ...``  flower-superlink with TLS + SuperNode authentication + gate
``fedsonmf flower register N.pub --partition P ...``  register a node key, pin view P to its node id
``fedsonmf flower supernode --view FILE ...``  flower-supernode for one view with its own key + gate
``fedsonmf flower submit --superlink ...``     flwr run of the shipped app, signed, with the pins; the status

superlink runs the daemon with ``--isolation process`` and this host's gate executor
(:mod:`fedsonmf.federation.flower.gate`) in the foreground, and stops both together; supernode runs
the project's node loop (:mod:`fedsonmf.federation.flower.nodeloop`, the gate's checks in process,
no port), or with ``FEDSONMF_NODE_LOOP=flower`` flower-supernode and the gate executor.  A daemon's
port that is taken is named with its option before anything starts.

Flower (``flwr``) is an optional extra: ``pip install "fedsonmf[flower]"``.  ``flower run``
uses secure aggregation unless ``--no-secure-aggregation`` is given.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer

from fedsonmf.cli import align
from fedsonmf.cli.options import (
    ALGORITHM_OPTIONS,
    CONTEXT,
    check_output_path,
    error_line,
    with_params,
)
from fedsonmf.federation import deployment_defaults as dd
from fedsonmf.protocol.params import FLOWER_SECURE_AGGREGATION, default


def _flower():
    try:
        from fedsonmf.federation import flower
    except ImportError as exc:
        error_line(exc)
        raise typer.Exit(2) from None
    return flower


def _mask_paths(masks, n_views: int):
    if not masks:
        return None
    if len(masks) != n_views:
        raise typer.BadParameter(f"give one --mask per view ({n_views}), got {len(masks)}", param_hint="--mask")
    return [None if m == "-" else Path(m) for m in masks]


class FlowerProgress:
    """A rich display of a Flower run, fed with the ServerApp's ``status.json`` (``update``).

    Before round 1 it names the phase (starting, handshake, setup); then round k of K,
    the mean seconds per round and the ETA (rounds left x s/round; a run that meets
    ``tol`` stops earlier), for each of a clustering run's fits in turn (``n_restarts``), or for
    its fits at once (each fit's rounds; the bar and the ETA follow the slowest).  The
    rounds' bar ends at the rounds that ran; in a clustering run
    a second bar then counts the refinement's exchanges, with the stage and the mean seconds
    per exchange (no ETA: the count is not known in advance).  ``enabled=False``: silent.
    """

    PHASES = {"handshake": "waiting for the SuperNodes (handshake)", "setup": "setting up the clients",
              "clustering": "k-means on V", "embed": "embedding the new samples"}
    #: the clustering phase's exchanges (``stage`` in status.json)
    STAGES = {"refine": "k-means refinement", "graph": "graph refinement", "spectral": "spectral step"}

    def __init__(self, total: int, *, enabled: bool = True):
        self.total, self.enabled = total, enabled
        self._progress = self._task = self._clustering_task = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task("starting", total=self.total or None,
                                                 status="SuperLink + SuperNodes, submitting the run")
        return self

    def update(self, st: dict) -> None:
        """Show the ServerApp's status ``st`` (phase, or round k of K with s/round and ETA)."""
        if self._progress is None:
            return
        phase, done = st.get("phase"), int(st.get("rounds_done", 0) or 0)
        if st.get("status") == "completed":
            self._completed(st, done)
        elif phase == "clustering":
            self._clustering(st, done)
        elif phase == "round" or (done and phase not in self.PHASES):
            self._progress.update(self._task, description="rounds", completed=done,
                                  status=_rounds_text(st, self.total, done))
        elif phase in self.PHASES:
            self._progress.update(self._task, description=phase, completed=done, status=self.PHASES[phase])

    def log(self, text: str) -> None:
        """A line of other output (``flwr run``'s), printed above the bars."""
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            typer.echo(text, err=True)

    def _clustering(self, st: dict, done: int) -> None:
        """The clustering phase, on a bar of its own: the rounds' bar ends at the rounds that ran (an
        early stop may have ended them before the budget) with its own elapsed time, and the
        clustering bar counts the exchanges (``n/?``: how many the refinement needs is not known)
        with a clock that runs on (a finished bar's would stop)."""
        assert self._progress is not None
        if self._clustering_task is None:
            self._end_rounds(done or self.total)
            self._clustering_task = self._progress.add_task("clustering", total=None, status="")
        self._progress.update(self._clustering_task, completed=int(st.get("exchanges") or 0),
                              status=self._clustering_status(st))

    def _end_rounds(self, ran: int) -> None:
        """The rounds' bar, full at the rounds that ran (fewer than the budget after an early stop)."""
        assert self._progress is not None
        status = f"done: {ran} of at most {self.total} rounds" if ran < self.total else "done"
        self._progress.update(self._task, description="rounds", total=ran or None, completed=ran, status=status)

    def _clustering_status(self, st: dict) -> str:
        """The clustering phase: the stage and exchange count, with s/exchange once known."""
        status, spe = _clustering_text(st)
        return (status + f" ({spe:.1f} s/exchange)") if spe else status

    def _completed(self, st: dict, done: int) -> None:
        """The end: the rounds that ran (fewer than the budget after an early stop)."""
        if self._progress is None:
            return
        ran = int(st.get("n_rounds") or done)
        if not ran:  # a predict run: one embedding, no rounds
            self._progress.update(self._task, description="embed", total=1, completed=1, status="done")
            return
        self._end_rounds(ran)
        if self._clustering_task is not None:  # the exchanges counted: the clustering bar ends full
            n = int(st.get("exchanges") or 0) or 1
            self._progress.update(self._clustering_task, total=n, completed=n, status="done")

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
        return False


class PlainProgress:
    """The progress of a Flower run as plain timestamped lines, for a stderr that is not a terminal
    (``nohup``, CI, ``2> log``), fed like :class:`FlowerProgress` with the ServerApp's ``status.json``.

    A line whenever the phase, the clustering stage, the fit (one after the other) or the final status
    changes, and otherwise at most one every ``every`` seconds while rounds or exchanges go on: round k
    of K with s/round and the ETA, or the stage, the exchange count and s/exchange.  A 200-round run
    at 0.4 s/round thus writes a few dozen lines, not 200.  ``write(text)``: where a line goes
    (default: stderr).
    """

    def __init__(self, total: int, *, every: float = 5.0, write=None, clock=time.monotonic):
        self.total, self.every, self.clock = total, every, clock
        self._write = write or (lambda text: typer.echo(text, err=True))
        self._key: Optional[tuple] = None
        self._text: Optional[str] = None
        self._at = float("-inf")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def log(self, text: str) -> None:
        """One timestamped line."""
        self._write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}")

    def update(self, st: dict) -> None:
        """A line for the status ``st`` when it says something new (see the class docstring)."""
        key = (st.get("status"), st.get("phase"), st.get("stage"), st.get("restart"))
        text = self.describe(st)
        now = self.clock()
        if key != self._key or (text != self._text and now - self._at >= self.every):
            self._key, self._text, self._at = key, text, now
            self.log(text)

    def describe(self, st: dict) -> str:
        """The status ``st`` in one line (no time stamp)."""
        done = int(st.get("rounds_done", 0) or 0)
        status, phase = st.get("status"), st.get("phase")
        if status == "completed":
            ran = int(st.get("n_rounds") or done)
            if not ran:
                return "done: the new samples embedded"
            text = f"done: {ran} rounds" + (f" (of at most {self.total})" if ran < self.total else "")
            return text + (f", {st['exchanges']} clustering exchanges" if st.get("exchanges") else "")
        if status in ("failed", "stopped"):
            return f"{status}: {st.get('error') or st.get('report') or 'see the run folder'}"
        if phase == "clustering":
            text, spe = _clustering_text(st)
            return f"clustering: {text}" + (f", {spe:.2f} s/exchange" if spe else "")
        if phase == "round" or (done and phase not in FlowerProgress.PHASES):
            return _rounds_text(st, self.total, done)
        return FlowerProgress.PHASES.get(str(phase), "starting: SuperLink + SuperNodes, submitting the run")


def _clustering_text(st: dict) -> tuple[str, Optional[float]]:
    """The clustering phase of the status ``st``: the stage and its exchange count (before the first
    exchange, the server's k-means of V) and the seconds per exchange once known (else None)."""
    stage = st.get("stage")
    if not stage:
        return FlowerProgress.PHASES["clustering"], None
    return (f"{FlowerProgress.STAGES.get(stage, stage)}, exchange {st.get('exchanges')}",
            st.get("seconds_per_exchange") or None)


def _rounds_text(st: dict, total: int, done: int) -> str:
    """Round k of K (each fit's rounds when a clustering run's fits run at once), s/round, ETA."""
    spr = st.get("seconds_per_round")
    status = f"round {st.get('round')} of {total}"
    if st.get("fit_rounds"):  # a clustering run's fits at once: each one's rounds done, the bar the slowest's
        n, rounds = int(st.get("n_restarts") or 0), st["fit_rounds"]
        each = "/".join(str(rounds.get(str(i), 0)) for i in range(n))
        status = f"{n} fits at once, rounds {each} of {total}"
    if spr:
        status += f", {spr:.1f} s/round, ETA {max(total - done, 0) * spr:.0f} s"
    if st.get("n_restarts") and not st.get("fit_rounds"):  # the fits one after the other
        status = f"fit {int(st.get('restart') or 0) + 1} of {st['n_restarts']}: {status}"
    return status


def progress_display(total: int, quiet: bool = False):
    """The progress display of a run: a rich bar when stderr is a terminal, plain timestamped lines
    (:class:`PlainProgress`) when it is not, nothing with ``quiet``."""
    if quiet:
        return FlowerProgress(total, enabled=False)
    return FlowerProgress(total) if sys.stderr.isatty() else PlainProgress(total)


def _participation(min_clients, sample_clients, rejoin):
    if min_clients is None and sample_clients is None:
        if rejoin != "server":
            raise typer.BadParameter("needs --min-clients or --sample-clients (partial participation)",
                                     param_hint="--rejoin")
        return None
    from fedsonmf.protocol.participation import Participation

    def num(x):
        return None if x is None else (int(x) if x >= 1 and x == int(x) else float(x))

    return Participation(min_clients=num(min_clients), sample=num(sample_clients), rejoin=rejoin)


def _check_out_folder(out: Path) -> None:
    """The run folder must be a folder (or not exist yet): a usage error before anything is written."""
    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{out} is a file, not a folder", param_hint="--out")


#: what a run folder holds (docs/flower.md, the launcher's layout): what --overwrite removes
RUN_FOLDER_ENTRIES = ("flwr-home", "app", "nodes", "server", "logs", "gate", "job.json", "security", "aligned",
                      "predict", ".lock")


def _claim_out_folder(out: Path, *, resume: bool, overwrite: bool, can_resume: bool = True) -> None:
    """The run folder ``--out`` before anything is written: absent or empty, or ``--resume`` (the run in
    it goes on), or ``--overwrite`` (the previous run's files are removed here, refused while a launch
    holds the folder, and only when the folder holds nothing but a run's entries).  Otherwise one
    ``error:`` line and exit 2: a re-run must not silently mix with, or replace, an earlier run."""
    import shutil

    _check_out_folder(out)
    if resume and overwrite:
        raise typer.BadParameter("--resume continues the run in --out, --overwrite replaces it: give one",
                                 param_hint="--overwrite")
    if resume or not out.is_dir() or not any(out.iterdir()):
        return
    from fedsonmf.exceptions import FlowerRunError
    from fedsonmf.federation.flower.deployment import _lock_run_dir

    if (out / ".lock").exists():  # a launch running on it is named first, whatever the folder holds
        try:
            _lock_run_dir(out).release()
        except FlowerRunError as exc:
            error_line(exc)
            raise typer.Exit(2) from None
    if not overwrite:
        error_line(f"run folder {out} is not empty (an earlier run?): give "
                   + ("--resume to continue its run, " if can_resume else "")
                   + "--overwrite to replace it, or another --out")
        raise typer.Exit(2)
    foreign = sorted(e.name for e in out.iterdir() if e.name not in RUN_FOLDER_ENTRIES)
    if foreign:
        error_line(f"--overwrite removes only a run's files, and {out} holds others too "
                   f"({', '.join(foreign[:5])}): give another --out")
        raise typer.Exit(2)
    try:
        lock = _lock_run_dir(out)  # not while a launch uses it
    except FlowerRunError as exc:
        error_line(exc)
        raise typer.Exit(2) from None
    try:
        for e in out.iterdir():
            if e.name != ".lock":
                shutil.rmtree(e) if e.is_dir() and not e.is_symlink() else e.unlink()
    finally:
        lock.release()


def _tidy_and_size(out: Path, keep_views: bool) -> None:
    """After a completed run: without ``--keep-views`` the aligned view copies of ``--missing mask`` go
    too (the launcher has removed the nodes' own copies); then one line with the run folder's size."""
    import shutil

    from fedsonmf.federation.flower.launcher import folder_size

    if not keep_views and (out / "aligned").is_dir():
        shutil.rmtree(out / "aligned")
    size = folder_size(out)
    typer.echo(f"run folder {out.resolve()}: {size / 1e6:.1f} MB" +
               ("" if keep_views else " (no copies of the views kept; --keep-views keeps them)"))


def _keep_views_option():
    return typer.Option(False, "--keep-views", help="Keep the nodes' copies of their views in the run folder "
                        "after the run completes (a clustering run's prepared view per fit, binary copies of "
                        "text views, --missing mask's aligned copies); removed by default.")


def _overwrite_option():
    return typer.Option(False, "--overwrite", help="Replace the run in a non-empty --out (its files are removed "
                        "first); without it (or --resume) a non-empty --out is refused.")


def _check_inputs_or_exit(fl, views, cfg, out: Path, rounds, tol, *, resume: bool = False, **kw):
    """Check everything a launch needs before any process starts: the view (and mask) files,
    the budget and the run folder; ``(shapes, rounds, tol)``.  Bad input ends the command with
    one ``error:`` line and exit 2."""
    from fedsonmf.exceptions import InputError, ParameterError
    from fedsonmf.federation.budget import resolve_budget

    try:
        shapes = fl.check_inputs(views, **kw)
        rounds, tol = resolve_budget(cfg, rounds, tol)
    except (InputError, ParameterError) as exc:
        error_line(exc)
        raise typer.Exit(2) from None
    _check_out_folder(out)
    if resume and not (out / "job.json").is_file():
        raise typer.BadParameter(f"nothing to resume in {out} (no job.json)", param_hint="--out")
    return shapes, rounds, tol


def _launch(fl, views, out: Path, rounds: int, insecure: bool, quiet: bool, **run_kw):
    """Start the deployment (after every check) with progress, and run ``run_flower``; a failed
    run ends the command with one ``error:`` line and exit 1."""
    if insecure:
        typer.echo("WARNING: --insecure: no TLS and no SuperNode authentication; any process that can reach "
                   "127.0.0.1 can join the federation as a node, read the traffic and submit its own app",
                   err=True)
    typer.echo(f"starting 1 SuperLink + {len(views)} SuperNodes on 127.0.0.1 (run folder {out})")
    try:
        with progress_display(rounds, quiet) as prog:
            return fl.run_flower(views, run_dir=out, max_rounds=rounds, progress=prog.update, **run_kw)
    except (fl.FlowerRunError, FileNotFoundError, PermissionError, TimeoutError, ValueError) as exc:
        error_line(exc)
        raise typer.Exit(1) from None


# options shared by the deployment commands (one declaration each; defaults: fedsonmf.federation.deployment_defaults)
def _seed_option(help: str):
    return typer.Option(dd.SEED, "--seed", min=0, help=help)


def _round_timeout_option():
    return typer.Option(dd.ROUND_TIMEOUT, "--round-timeout",
                        help="Seconds to wait for all replies of a round.")


def _node_timeout_option():
    return typer.Option(dd.NODE_TIMEOUT, "--node-timeout",
                        help="Seconds to wait for all SuperNodes.")


def _record_wire_option():
    return typer.Option(False, "--record-wire", help="Log every message (privacy audit).")


def _secure_aggregation_option():
    return typer.Option(FLOWER_SECURE_AGGREGATION, "--secure-aggregation/--no-secure-aggregation",
                        help="Pairwise-masked uploads: the server learns only their sums "
                             "(on by default in deployments; docs/privacy.md).")


def _mask_option():
    return typer.Option(None, "--mask", help="Incomplete views: one .npy availability mask (bool, length n) per "
                                             "view, in view order; '-' for a complete view.")


def _missing_option():
    return typer.Option("error", "--missing", help="View files whose ids differ: 'error', or 'mask': align them "
                                                   "here over the union of their ids, each node with its "
                                                   "availability mask (files without ids: an all-zero row is a "
                                                   "missing sample), as `fedsonmf cluster --missing mask` does.")


def _apply_missing(views: list[Path], mask_paths, missing: str, out: Path):
    """``--missing``: ``(views, mask_paths, ids)`` to launch with -- the files as given ('error'), or their
    copies aligned over the union of their ids with a mask each ('mask', :func:`_aligned_over_union`);
    ``ids`` as :func:`fedsonmf.datasets.files.sorted_ids` gives them when the alignment found ids."""
    from fedsonmf.exceptions import InputError

    if missing not in ("error", "mask"):
        raise typer.BadParameter(f"must be 'error' or 'mask', got {missing!r}", param_hint="--missing")
    if missing == "error":
        return views, mask_paths, None
    if mask_paths is not None:
        raise typer.BadParameter("--missing mask makes each node's mask from the files; leave out --mask",
                                 param_hint="--mask")
    _check_out_folder(out)  # the aligned copies are written into it
    try:
        views, mask_paths, raw = _aligned_over_union(views, out)
    except InputError as exc:
        error_line(exc)
        raise typer.Exit(2) from None
    return views, mask_paths, None if raw is None else (raw, raw.dtype.kind == "i")


def _insecure_option():
    return typer.Option(False, "--insecure", help="No TLS and no SuperNode authentication "
                        "(secure by default: per-deployment CA, node keys, views pinned to keys).")


def _min_clients_option():
    return typer.Option(None, "--min-clients", help="Partial participation: a round goes on when this many "
                        "clients replied (count >= 1 or fraction).")


def _sample_clients_option():
    return typer.Option(None, "--sample-clients", help="Partial participation: clients asked per round "
                        "(count >= 1 or fraction).")


def _rejoin_option():
    return typer.Option(dd.REJOIN, "--rejoin", help="Correction of a client that missed "
                        "rounds: server, refresh, drop or stale.")


def _quiet_option():
    return typer.Option(False, "--quiet", "-q", help="No progress display.")


def _sample_ids(views: list[Path]):
    """The samples' ids as every node orders its rows (:func:`fedsonmf.datasets.files.sorted_ids` of
    the first view file; the launcher has checked that every file holds the same ids), or None."""
    from fedsonmf.datasets.files import read_view, sorted_ids

    return sorted_ids(read_view(views[0], mmap_mode="r", validate=False)[1])


def _aligned_over_union(views: list[Path], out: Path):
    """``--missing mask``: the view files read here and aligned over the sorted union of their ids
    (:func:`fedsonmf.datasets.load_views` with ``missing="mask"``, as ``fedsonmf cluster`` does): each
    node's aligned copy (its rows in the union's order, zero rows for the samples it lacks) and its
    availability mask in ``OUT/aligned/p<i>/`` (0700 folders, 0600 files), so that the nodes read only
    their own samples; ``(view paths, mask paths, ids)``.  Files that already hold the same samples
    are used as given (no mask).  This machine reads every file: a loopback deployment's convenience,
    where it has them all (separate machines agree on the order themselves: docs/flower.md)."""
    from fedsonmf.datasets.files import load_views
    from fedsonmf.federation.flower.viewfiles import write_masks, write_views

    ds = load_views(views, missing="mask")
    if ds.masks is None:
        return views, None, ds.ids
    base = out / "aligned"
    paths = [write_views([X], base / f"p{p}")[0] for p, X in enumerate(ds.views)]
    masks = [write_masks([mk], base / f"p{p}" / "mask")[0] for p, mk in enumerate(ds.masks)]
    return paths, masks, ds.ids


#: the --rank of a clustering command
RANK_HELP = "Rank rule: auto (2 x clusters, narrow views padded), paper (= clusters) or a number (capped " \
            "at the narrowest view)."


def _rank_rule(rank: str):
    """A clustering command's ``--rank``: ``auto``, ``paper`` or a positive integer."""
    rule = int(rank) if rank.isdigit() else rank
    if rule not in ("auto", "paper") and not (isinstance(rule, int) and rule >= 1):
        raise typer.BadParameter(f"must be auto, paper or a positive number, got {rank!r}",
                                 param_hint="--rank")
    return rule


def _read_labels(path: Path, ids, n: int):
    """True classes for scoring, in the nodes' sample order: ``.npy`` or one label per line (views
    without ids), or ``sample_id,label`` lines (aligned by the view files' ids, else by 0..n-1)."""
    from fedsonmf.datasets.files import align_labels
    from fedsonmf.exceptions import InputError

    if not path.is_file():
        raise InputError(f"labels file {path} does not exist")
    return align_labels(path, ids, n)


def _kept_fit(cl: dict) -> str:
    """", fit k of n kept (the medoid)" for a clustering run of several fits, else ""."""
    rs = cl.get("restarts")
    return f", fit {rs['best_restart'] + 1} of {rs['n_init']} kept (the medoid)" if rs else ""


def _report_submitted_clustering(out: Path, clusters: int, labels: Path | None) -> None:
    """After a clustering run submitted on the SuperLink host: the cluster sizes, where the labels are,
    and with ``labels`` the scores (also added to ``result.json``); bad labels end with exit 2."""
    import json

    cl = json.loads((out / "result.json").read_text()).get("clustering", {})
    typer.echo(f"{clusters} clusters of sizes {cl.get('cluster_sizes')} (rank r = {cl.get('n_components')}"
               f"{_kept_fit(cl)}); labels: {out / 'labels.csv'}")
    _score_submitted(out, labels)


def _report_submitted_predict(out: Path, labels: Path | None) -> None:
    """After a predict run submitted on the SuperLink host: how many new samples went to each cluster,
    where their labels are, and with ``labels`` the scores."""
    import numpy as np

    from fedsonmf.federation.flower.clustering import read_labels_csv

    found = read_labels_csv(out / "labels.csv")
    typer.echo(f"assigned {found.size} new samples, per cluster {np.bincount(found).tolist()}; labels: "
               f"{out / 'labels.csv'}")
    _score_submitted(out, labels)


def _score_submitted(out: Path, labels: Path | None) -> None:
    """With ``labels``: the scores of ``out/labels.csv`` against them (as ``fedsonmf score`` reads the
    two files), printed and added to result.json."""
    from fedsonmf.cli.cluster import _scored_files
    from fedsonmf.exceptions import InputError
    from fedsonmf.federation.flower.launcher import _update_result_json
    from fedsonmf.metrics import clustering_scores, format_scores

    if labels is None:
        return
    try:
        y, found = _scored_files(out / "labels.csv", labels)
    except InputError as exc:
        error_line(exc)
        raise typer.Exit(2) from None
    sc = clustering_scores(y, found, ari=True)
    _update_result_json(out, {"scores": sc})
    typer.echo(format_scores(sc))


def _report(res) -> None:
    """One line: why the run stopped, s/round, the time from the launch to round 1, the final objective."""
    info = res.extra["flower"]
    secs = [r["seconds"] for r in res.history.rows]
    t1 = info.get("time_to_round1")
    line = f"{res.stopping_reason}; {sum(secs) / max(len(secs), 1):.2f} s/round"
    line += f", start-up {t1:.1f} s (launch to round 1)" if t1 is not None else ""
    last = res.history.rows[-1] if res.history.rows else {}
    if "R_rel" in last:
        line += f"; final objective {last['objective']:.6g}, R/R1 {last['R_rel']:.3e}"
    typer.echo(line)


#: the view files of a loopback launch (``flower run``, ``flower cluster``)
VIEWS_HELP = ("One view file per client, samples x features: CSV/TSV, .npy, sparse .npz, .mtx or .mat; row i of "
              "every file is sample i, or, when the files carry ids (an id column or <stem>.ids.txt), the i-th "
              "smallest id.")


def register(app, reproduce_app) -> None:
    """Add this area's commands to the main app and to fedsonmf reproduce."""
    flower_app = typer.Typer(help="Federation on Flower: loopback launcher and the app for real machines.",
                             no_args_is_help=True, context_settings=CONTEXT)
    app.add_typer(flower_app, name="flower")

    @flower_app.command("run")
    @with_params("n_components", *ALGORITHM_OPTIONS, "max_rounds", "tol", "diagnostics")
    def run(
        views: list[Path] = typer.Argument(..., help=VIEWS_HELP),
        out: Path = typer.Option(..., "--out", "-o", help="Run folder (FLWR_HOME, logs, node state, results)."),
        seed: int = _seed_option("Run seed."),
        resume: bool = typer.Option(False, "--resume", help="Continue the run saved in --out."),
        round_timeout: float = _round_timeout_option(),
        node_timeout: float = _node_timeout_option(),
        record_wire: bool = _record_wire_option(),
        record_wire_arrays: bool = typer.Option(False, "--record-wire-arrays",
                                                help="With --record-wire: also save every array the server "
                                                     "receives (server/wire-arrays/)."),
        secure_aggregation: bool = _secure_aggregation_option(),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Also write config + history here."),
        tls: Optional[list[Path]] = typer.Option(None, "--tls", help="Your own TLS files instead of the "
                                                  "per-deployment CA: give three times, CA certificate, server "
                                                  "certificate, server key (0600)."),
        insecure: bool = _insecure_option(),
        masks: Optional[list[str]] = _mask_option(),
        missing: str = _missing_option(),
        min_clients: Optional[float] = _min_clients_option(),
        sample_clients: Optional[float] = _sample_clients_option(),
        rejoin: str = _rejoin_option(),
        quiet: bool = _quiet_option(),
        keep_views: bool = _keep_views_option(),
        overwrite: bool = _overwrite_option(),
        params: Any = None,
    ):
        """Factorise on a loopback Flower deployment (one SuperNode per view file)."""
        fl = _flower()
        from fedsonmf.protocol.config import FedConfig

        check_output_path(json_path, "--json")
        algorithm, rounds, tol = params.pop("algorithm"), params.pop("max_rounds"), params.pop("tol")
        if tls and len(tls) != 3:
            raise typer.BadParameter("give it three times: CA certificate, server certificate, server key",
                                     param_hint="--tls")
        if insecure and tls:
            raise typer.BadParameter("--insecure and --tls exclude each other", param_hint="--tls")
        cfg = FedConfig(**params)
        mask_paths = _mask_paths(masks, len(views))
        _claim_out_folder(out, resume=resume, overwrite=overwrite)
        given = list(views)  # the inputs of record (--json), also when the nodes get aligned copies
        views, mask_paths, _ = _apply_missing(views, mask_paths, missing, out)
        part = _participation(min_clients, sample_clients, rejoin)
        rounds, tol = _check_inputs_or_exit(fl, views, cfg, out, rounds, tol, n_components=cfg.n_components,
                                            mask_paths=mask_paths, resume=resume)[1:]
        res = _launch(fl, views, out, rounds, insecure, quiet, cfg=cfg, algorithm=algorithm, tol=tol, seed=seed,
                      resume=resume, round_timeout=round_timeout, node_timeout=node_timeout,
                      record_wire=record_wire, record_wire_arrays=record_wire_arrays,
                      secure_aggregation=secure_aggregation,
                      tls=False if insecure else (tuple(tls) if tls else True), auth=not insecure,
                      mask_paths=mask_paths, participation=part, keep_views=keep_views)
        _report(res)
        server = Path(out).resolve() / "server"
        typer.echo(f"V: {server / 'V.npy'}  history: {server / 'result.json'}")
        _tidy_and_size(out, keep_views)
        if json_path is not None:
            res.save_json(json_path, inputs=[Path(v) for v in given])
            typer.echo(f"wrote {json_path}")

    @flower_app.command("cluster")
    @with_params(*ALGORITHM_OPTIONS, "max_rounds", "tol", "diagnostics", "preprocess", "normalize_embedding",
                 "n_init")
    def cluster(
        views: list[Path] = typer.Argument(..., help=VIEWS_HELP),
        clusters: int = typer.Option(..., "--clusters", "-k", min=1, help="Number of clusters c."),
        out: Path = typer.Option(..., "--out", "-o", help="Run folder; the labels are in OUT/server/labels.csv."),
        labels: Optional[Path] = typer.Option(None, "--labels", help="True classes to score against (ACC/NMI/"
                                              "purity): .npy or one label per line (views without ids), or "
                                              "sample_id,label lines (by the files' ids)."),
        labels_out: Optional[Path] = typer.Option(None, "--labels-out", help="Also write the clusters here as CSV "
                                                  "sample_id,cluster with the view files' own ids (server/labels.csv "
                                                  "numbers the samples 0..n-1 in the nodes' order)."),
        rank: str = typer.Option(dd.RANK_RULE, "--rank", "-r", help=RANK_HELP),
        seed: int = _seed_option("Run seed (the fit's and k-means')."),
        round_timeout: float = _round_timeout_option(),
        node_timeout: float = _node_timeout_option(),
        record_wire: bool = _record_wire_option(),
        secure_aggregation: bool = _secure_aggregation_option(),
        insecure: bool = _insecure_option(),
        masks: Optional[list[str]] = _mask_option(),
        missing: str = _missing_option(),
        min_clients: Optional[float] = _min_clients_option(),
        sample_clients: Optional[float] = _sample_clients_option(),
        rejoin: str = _rejoin_option(),
        quiet: bool = _quiet_option(),
        keep_views: bool = _keep_views_option(),
        overwrite: bool = _overwrite_option(),
        params: Any = None,
    ):
        """Cluster the samples on a loopback Flower deployment: FedMultiViewClustering's pipeline, one
        SuperNode per view file; each node preprocesses its own view, the server runs k-means.  With
        --mask or --missing mask (incomplete views) each node uses only the samples it holds."""
        fl = _flower()
        from fedsonmf.exceptions import InputError
        from fedsonmf.protocol.config import FedConfig

        rule = _rank_rule(rank)
        algorithm, rounds, tol = params.pop("algorithm"), params.pop("max_rounds"), params.pop("tol")
        options = {"rank": rule, "preprocess": params.pop("preprocess"),
                   "normalize_embedding": params.pop("normalize_embedding"), "n_init": params.pop("n_init")}
        part = _participation(min_clients, sample_clients, rejoin)
        cfg = FedConfig(**params)  # n_components: the rank rule decides (at the handshake)
        mask_paths = _mask_paths(masks, len(views))
        _claim_out_folder(out, resume=False, overwrite=overwrite, can_resume=False)
        views, mask_paths, ids = _apply_missing(views, mask_paths, missing, out)
        shapes, rounds, tol = _check_inputs_or_exit(fl, views, cfg, out, rounds, tol, n_clusters=clusters,
                                                    mask_paths=mask_paths)
        check_output_path(labels_out, "--labels-out")
        if missing != "mask" and (labels is not None or labels_out is not None):
            ids = _sample_ids(views)
        y = None
        if labels is not None:
            try:
                y = _read_labels(labels, ids, shapes[0][0])
            except InputError as exc:
                error_line(exc)
                raise typer.Exit(2) from None
        res = _launch(fl, views, out, rounds, insecure, quiet, cfg=cfg, algorithm=algorithm, tol=tol, seed=seed,
                      round_timeout=round_timeout, node_timeout=node_timeout, record_wire=record_wire,
                      participation=part, n_clusters=clusters, clustering=options, labels=y,
                      secure_aggregation=secure_aggregation, tls=not insecure, auth=not insecure,
                      mask_paths=mask_paths, keep_views=keep_views)
        _report(res)
        cl = res.extra["clustering"]
        typer.echo(f"{clusters} clusters of sizes {cl['cluster_sizes']} (rank r = {cl['n_components']}"
                   f"{_kept_fit(cl)})")
        if "scores" in res.extra:
            from fedsonmf.metrics import format_scores

            typer.echo(format_scores(res.extra["scores"]))
        server = Path(out).resolve() / "server"
        typer.echo(f"labels: {server / 'labels.csv'}  V: {server / 'V.npy'}  result: {server / 'result.json'}")
        if labels_out is not None:
            from fedsonmf.datasets.files import write_assignments

            write_assignments(labels_out, None if ids is None else ids[0], res.extra["labels"])
            typer.echo(f"wrote {labels_out} ({shapes[0][0]} rows: sample_id,cluster)")
        _tidy_and_size(out, keep_views)

    @flower_app.command("app")
    def app_dir(dest: Path = typer.Argument(..., help="Directory to write the shim app into.")):
        """Write the Flower app directory for `flwr run DEST <connection> --run-config ...`."""
        fl = _flower()
        fl.write_app_dir(dest)
        typer.echo(f"wrote {dest} (run-config keys: see {dest / 'pyproject.toml'})")

    @flower_app.command("simulate")
    @with_params("n_components", *ALGORITHM_OPTIONS, "max_rounds", "tol", "diagnostics")
    def simulate(
        views: list[Path] = typer.Argument(..., help="A folder of view0.*, view1.*, ... (one per simulated "
                                           "client; node state is written into it), or the view files."),
        out: Path = typer.Option(..., "--out", "-o", help="Run folder (FLWR_HOME, logs, results)."),
        seed: int = _seed_option("Run seed."),
        cpus_per_client: int = typer.Option(1, "--cpus-per-client", min=1,
                                            help="Ray CPUs per simulated client (clients run cores/this at a time)."),
        round_timeout: float = _round_timeout_option(),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Also write config + history here."),
        params: Any = None,
    ):
        """Run a federation in Flower's simulation engine (needs the simulation extra: Ray)."""
        fl = _flower()
        from fedsonmf.federation.budget import resolve_budget
        from fedsonmf.protocol.config import FedConfig

        check_output_path(json_path, "--json")
        algorithm, rounds, tol = params.pop("algorithm"), params.pop("max_rounds"), params.pop("tol")
        cfg = FedConfig(**params)
        rounds, tol = resolve_budget(cfg, rounds, tol)  # a bad budget: one error: line, exit 2, nothing started
        source = views[0] if len(views) == 1 and views[0].is_dir() else views
        if not isinstance(source, Path):  # view files (a folder is checked by run_simulation, before it starts)
            _check_inputs_or_exit(fl, source, cfg, out, rounds, tol, n_components=cfg.n_components)
        typer.echo(f"starting a simulation SuperLink on 127.0.0.1 (run folder {out})")
        try:
            res = fl.run_simulation(source, cfg, run_dir=out, algorithm=algorithm, max_rounds=rounds, tol=tol,
                                    seed=seed, cpus_per_client=cpus_per_client, round_timeout=round_timeout)
        except ImportError as exc:
            error_line(exc)
            raise typer.Exit(2) from None
        except (fl.FlowerRunError, FileNotFoundError, TimeoutError) as exc:
            error_line(exc)
            raise typer.Exit(1) from None
        info = res.extra["flower"]
        secs = [r["seconds"] for r in res.history.rows]
        typer.echo(f"{info['num_supernodes']} simulated clients, {res.stopping_reason}; "
                   f"{sum(secs) / len(secs):.2f} s/round, start-up {info['startup_seconds']:.1f} s")
        server = Path(out).resolve() / "server"
        typer.echo(f"V: {server / 'V.npy'}  history: {server / 'result.json'}")
        if json_path is not None:
            files = sorted(p for p in views[0].iterdir() if p.is_file()) if isinstance(source, Path) else views
            res.save_json(json_path, inputs=files)
            typer.echo(f"wrote {json_path}")

    @flower_app.command("views")
    def views_cmd(
        dest: Path = typer.Argument(..., help="Directory for view0.npy, view1.npy, ..."),
        clients: int = typer.Option(3, help="Number of views."),
        samples: int = typer.Option(100, help="Samples n."),
        features: int = typer.Option(20, help="Features per view."),
        rank: int = typer.Option(6, help="Planted rank."),
        heterogeneity: float = typer.Option(0.6, "--heterogeneity", "-H", help="h in [0, 1]."),
        seed: int = typer.Option(0, help="Data seed."),
    ):
        """Write synthetic views (make_synthetic), one .npy file per client."""
        from fedsonmf.datasets import make_synthetic

        _flower()  # without flwr: one error line, not a traceback
        from fedsonmf.federation.flower.viewfiles import write_views

        data = make_synthetic(n_clients=clients, n_samples=samples, n_features=features, rank=rank,
                              heterogeneity=heterogeneity, random_state=seed)
        for p in write_views(data.views, dest):
            typer.echo(str(p))

    _register_machine_commands(flower_app)


# ------------------------------------------------------------------------------------------ separate machines
# Thin wrappers around flower-superlink / flower-supernode / flwr with the exact flags of a secure
# deployment (docs/flower.md, "Real multiple machines"); each prints the command it runs.

DEFAULT_HOME = Path("flwr-home")


def _sec():
    _flower()
    from fedsonmf.federation.flower import security

    return security


class _Stop(Exception):
    """A signal asked the daemon command to stop."""


def _wait_port(address: str, daemon, timeout: float = 600.0) -> None:
    """Wait until ``address`` accepts connections (an event; a daemon that exits fails at once)."""
    import socket

    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        if daemon.poll() is not None:
            raise _DaemonExited(daemon.returncode)
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the runtime API {address} did not open within {timeout:g} s") from None
            time.sleep(0.1)


class _DaemonExited(Exception):
    def __init__(self, code):
        self.code = code


def _run_gated(program: str, args: list[str], home: Path, *, role: str, runtime_api: str, public_key: str,
               root_certificates=None, out_root: Optional[Path] = None, front: Optional[tuple] = None) -> None:
    """Run ``program args`` (a Flower daemon) with this host's gate executor (``gate.py``) in the
    foreground, until the daemon exits or this command gets SIGTERM/SIGINT/SIGHUP.

    Both run in process groups of their own (the executor's ServerApp children too), started and
    stopped together by one :class:`~fedsonmf.federation.flower.supervisor.Supervisor`, as a
    ``LoopbackDeployment``'s are; the executor also exits when the daemon dies, and the
    supervisor's watcher stops both when this command is killed with -9.  The pin (the installed
    app's FAB hash, the coordinator's public key) and a fresh SuperExec secret are written to
    ``home/gate`` (0700, files 0600); the ledger there is kept across restarts, so a run id's
    authorisation stays single-use.  ``front`` = (argv, HOST:PORT): a process started once the
    daemon listens (the SuperLink's Fleet-only proxy, :mod:`.fleetproxy`), stopped with it."""
    import shlex

    from fedsonmf._io import new_private_dir
    from fedsonmf.federation.flower import gate
    from fedsonmf.federation.flower.deployment import _bin, flower_env
    from fedsonmf.federation.flower.supervisor import Supervisor

    home = new_private_dir(home.resolve())
    fab_hash = gate.installed_fab_sha256()
    gate_dir = home / "gate"
    _, secret = gate.prepare_host(gate_dir, [fab_hash], public_key)
    env = flower_env(home)
    exe = _bin(program)
    argv = [exe, *args, *_sec().gate_daemon_args(secret)]
    typer.echo(f"FLWR_HOME={home} {shlex.join(argv)}", err=True)
    typer.echo(f"gate: only the fedsonmf app with FAB sha256 {fab_hash}, authorised by the coordinator key "
               f"{public_key}", err=True)
    exec_env = dict(env)
    if out_root is not None:  # the ServerApp writes only below it
        exec_env["FEDSONMF_OUT_ROOT"] = str(out_root)

    def on_signal(signum, _frame):
        raise _Stop(signum)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    sup = Supervisor()
    code = 0
    try:
        daemon = sup.start(argv, env=env)
        _wait_port(runtime_api, daemon)
        front_proc = _start_front(front, env, sup)
        ex_argv = gate.executor_argv(role, runtime_api, gate_dir, parent_pid=daemon.pid,
                                     root_certificates=root_certificates)
        typer.echo(f"gate executor: {shlex.join(ex_argv)}", err=True)
        executor = sup.start(ex_argv, env=exec_env)
        while daemon.poll() is None:
            if front_proc is not None and front_proc.poll() is not None:
                error_line(f"the Fleet API proxy exited with code {front_proc.returncode}; stopping "
                           f"{program}")
                program, code = "the Fleet API proxy", 1
                break
            if executor.poll() is not None:  # a daemon without its gate would run nothing: say so, stop
                error_line(f"the gate executor exited with code {executor.returncode}; stopping "
                           f"{program}")
                program, code = "the gate executor", 1
                break
            time.sleep(0.2)
        else:
            code = daemon.returncode
    except _DaemonExited as exc:
        code = exc.code
    except _Stop:
        code = 0
    except TimeoutError as exc:
        error_line(exc)
        code = 1
    finally:
        for sig in old:  # no second signal in the middle of stopping
            signal.signal(sig, signal.SIG_IGN)
        sup.close()
        for sig, h in old.items():
            signal.signal(sig, h)
    if code:
        typer.echo(f"{program} exited with code {code}", err=True)
    raise typer.Exit(0 if not code else (code if code > 0 else 1))


def _submit_with_progress(argv: list[str], env: dict, status_path: Path, rounds: int, *, poll: float = 0.5):
    """Run ``flwr run --stream`` (``argv``), its output passed on line by line, and show the progress of
    the ServerApp's ``status_path`` while it runs (readable when submitting on the SuperLink host): a
    bar on a terminal, timestamped lines otherwise (:func:`progress_display`).  A status file left by
    an earlier run in the same out-dir is not shown until the new run rewrites it.  Returns the
    finished process."""
    import queue
    import subprocess
    import threading

    from fedsonmf.federation.flower.deployment import _read_status

    def stamp():
        try:
            return status_path.stat().st_mtime_ns
        except OSError:
            return None

    old, last = stamp(), None
    lines: queue.Queue = queue.Queue()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    stream = proc.stdout
    assert stream is not None

    def read() -> None:
        for line in stream:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with progress_display(rounds) as prog:
        while True:
            ended = proc.poll() is not None
            while not lines.empty():
                prog.log(lines.get().rstrip("\n"))
            now = stamp()
            if now is not None and now != old:
                st = _read_status(status_path)
                if st and st.get("updated_at") != last:
                    last = st.get("updated_at")
                    prog.update(st)
            if ended and not reader.is_alive() and lines.empty():
                break
            reader.join(timeout=poll) if ended else _wait_quietly(proc, poll)
    return proc


def _wait_quietly(proc, seconds: float) -> None:
    import subprocess

    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


def _node_loop_choice() -> str:
    """``fedsonmf`` (the project's node loop) or ``flower`` (flower-supernode + the gate executor): the
    environment's ``FEDSONMF_NODE_LOOP``, as :class:`~fedsonmf.federation.flower.deployment.LoopbackDeployment`
    reads it."""
    from fedsonmf.exceptions import InputError
    from fedsonmf.federation.flower.deployment import NODE_LOOPS

    loop = os.environ.get("FEDSONMF_NODE_LOOP") or "fedsonmf"
    if loop not in NODE_LOOPS:
        raise InputError(f"FEDSONMF_NODE_LOOP must be one of {', '.join(NODE_LOOPS)}, got {loop!r}")
    return loop


def _check_port_free(host: str, port: int, option: str) -> None:
    """An :class:`~fedsonmf.exceptions.InputError` naming ``option`` when something already listens on
    ``host:port`` (a second daemon of the same kind on one host), before the daemon starts: Flower's
    own answer is a traceback ending in ``address already in use``.  The probe binds as uvicorn does
    (``SO_REUSEADDR``), so a port whose last connections linger in TIME_WAIT counts as free."""
    import errno
    import socket

    from fedsonmf.exceptions import InputError

    addr = str(host).strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, int(port)))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise InputError(f"{addr} is not an address of this host ({exc.strerror}): give one of its "
                                 "own addresses (127.0.0.1 to rehearse on one host)") from None
            raise InputError(f"port {port} on {addr} is not free ({exc.strerror}): another daemon (a second node "
                             f"on this host?) uses it; choose another with {option}") from None


def _run_node_loop(superlink_addr: str, ca_cert, private_key, node_config: str, home: Path,
                   public_key: str) -> NoReturn:
    """Run the project's node loop (:mod:`fedsonmf.federation.flower.nodeloop`) for one view in the
    foreground, until it exits or this command gets SIGTERM/SIGINT/SIGHUP (it then deactivates at the
    SuperLink).  Its gate files live in ``home/gate`` (0700): the pin (the installed app's FAB hash, the
    coordinator's public key) and the ledger, kept across restarts (a run's authorisation stays
    single-use).  It opens no port: nodes on one host need no option to tell them apart."""
    import shlex

    from fedsonmf._io import new_private_dir, private_dir
    from fedsonmf.federation.flower import gate
    from fedsonmf.federation.flower.deployment import flower_env
    from fedsonmf.federation.flower.nodeloop import node_argv
    from fedsonmf.federation.flower.supervisor import Supervisor

    home = new_private_dir(home.resolve())
    fab_hash = gate.installed_fab_sha256()
    gate_dir = private_dir(home / "gate")
    gate.write_pin(gate_dir / "pin.json", [fab_hash], public_key)
    argv = node_argv(superlink_addr, ca_cert=ca_cert, private_key=private_key, node_config=node_config,
                     gate_dir=gate_dir)
    typer.echo(f"FLWR_HOME={home} {shlex.join(argv)}", err=True)
    typer.echo(f"gate: only the fedsonmf app with FAB sha256 {fab_hash}, authorised by the coordinator key "
               f"{public_key}", err=True)

    def on_signal(signum, _frame):
        raise _Stop(signum)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    sup = Supervisor()
    code = 0
    try:
        proc = sup.start(argv, env=flower_env(home))
        code = proc.wait()
    except _Stop:
        code = 0
    finally:
        for sig in old:  # no second signal in the middle of stopping
            signal.signal(sig, signal.SIG_IGN)
        sup.close()
        for sig, h in old.items():
            signal.signal(sig, h)
    if code:
        typer.echo(f"the node loop exited with code {code}", err=True)
    raise typer.Exit(0 if not code else (code if code > 0 else 1))


def _start_front(front: Optional[tuple], env: dict, sup):
    """Start ``front`` = (argv, HOST:PORT) (see :func:`_run_gated`) with the supervisor ``sup`` and wait
    until it listens; None without one."""
    if front is None:
        return None
    import shlex

    argv, address = front
    typer.echo(f"Fleet API proxy: {shlex.join(argv)}", err=True)
    proc = sup.start(argv, env=env)
    host, _, port = address.rpartition(":")
    _wait_port(f"{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{port}", proc)
    return proc


def _submitted_failure(home: Path, app_dir: Path) -> Optional[str]:
    """Why the run just submitted from ``home`` ended without a ServerApp status, from Flower's own
    record of it (the newest run of this app bundle, ``flwr ls``): the gate's refusal (a stale,
    forged or copied token, an app the SuperLink host has not pinned) or another early end; None
    while it runs or when the record cannot be read."""
    from fedsonmf.federation.flower import gate
    from fedsonmf.federation.flower.deployment import failed_run_status, flower_env, flower_runs

    fab_hash = gate.fab_sha256(gate.build_fab(app_dir))
    ours = [r for r in flower_runs(flower_env(home)) if fab_hash.startswith(str(r.get("fab-hash") or "-"))]
    if not ours:
        return None
    newest = max(ours, key=lambda r: str(r.get("pending-at") or ""))
    return failed_run_status(newest).get("error")


def _coordinator_public(path: Optional[Path]) -> str:
    from fedsonmf.federation.flower import gate

    if path is None:
        raise typer.BadParameter("give --coordinator-key PUB (the coordinator's public key, from `fedsonmf "
                                 "flower keys coordinator`): only runs it signed execute here",
                                 param_hint="--coordinator-key")
    try:
        return gate.read_public_key(path)
    except ValueError as exc:
        _fail(exc)


def _fail(exc) -> NoReturn:
    """One ``error:`` line; exit 2 for bad input (an InputError, such as a missing view or an open key
    file), 1 for anything that failed."""
    from fedsonmf.exceptions import InputError

    error_line(exc)
    raise typer.Exit(2 if isinstance(exc, InputError) else 1)


def _register_machine_commands(flower_app) -> None:
    keys_app = typer.Typer(help="Create TLS certificates and SuperNode key pairs.", no_args_is_help=True,
                           context_settings=CONTEXT)
    flower_app.add_typer(keys_app, name="keys")
    align.register(flower_app, _fail)

    @keys_app.command("tls")
    def keys_tls(
        dest: Path = typer.Argument(..., help="Folder for ca.crt, server.pem, server.key (0600)."),
        host: list[str] = typer.Option(..., "--host", help="Address or DNS name the nodes dial (repeatable)."),
        days: int = typer.Option(365, "--days", min=1, help="Validity."),
    ):
        """A fresh CA and a SuperLink certificate for --host (and 127.0.0.1); the CA key is not kept.

        Give ca.crt to every node and submitter; server.key stays on the SuperLink host."""
        sec = _sec()
        # the SuperLink's own SuperExec dials 127.0.0.1 when it listens on 0.0.0.0
        hosts = list(dict.fromkeys([*host, "127.0.0.1"]))
        files = sec.make_tls(dest, hosts, days=days)
        for f in files.as_tuple():
            typer.echo(f)

    @keys_app.command("node")
    def keys_node(
        dest: Path = typer.Argument(..., help="Folder for the key pair."),
        name: str = typer.Option("node", "--name", help="File name of the private key (public: NAME.pub)."),
    ):
        """A SuperNode key pair (ECDSA P-384, private key 0600) and the node's secure-aggregation signing
        key (Ed25519, NAME-secagg.pem, 0600): send only NAME.pub and NAME-secagg.pub to the coordinator."""
        sec = _sec()
        key = sec.make_node_key(dest, name)
        _, signing_pub, signing = sec.node_signing_key(key.private)
        typer.echo(f"{key.private}\n{key.public}\nfingerprint {key.fingerprint}\n{signing_pub}\n"
                   f"secure-aggregation signing key {signing}")

    @keys_app.command("coordinator")
    def keys_coordinator(
        dest: Path = typer.Argument(..., help="Folder for coordinator.key (0600) and coordinator.pub."),
    ):
        """The coordinator's Ed25519 key pair: it signs every run it submits; every host's gate runs
        only runs signed by it.  coordinator.key stays with the coordinator (`flower submit`); give
        coordinator.pub to the SuperLink host and every node (`--coordinator-key`)."""
        _flower()
        from fedsonmf._io import private_dir
        from fedsonmf.federation.flower import gate

        d = private_dir(dest)
        if (d / "coordinator.key").exists():
            _fail(f"{d / 'coordinator.key'} exists; a new key would orphan every host that trusts the old "
                  "one (remove it first to re-key)")
        auth = gate.Authority.create(d / "coordinator.key")
        pub = auth.write_public(d / "coordinator.pub")
        typer.echo(f"{d / 'coordinator.key'}\n{pub}\npublic key {auth.public_key}")

    @flower_app.command("superlink")
    def superlink(
        host: str = typer.Option(..., "--host", help="Address the nodes dial (the Fleet API only)."),
        port: int = typer.Option(9092, "--port", help="The nodes' HTTPS port (the Fleet API only)."),
        control_port: int = typer.Option(9093, "--control-port", help="The SuperLink's own port, on 127.0.0.1 "
                                         "only: the Control API (register, submit, flwr ls/stop); reach it from "
                                         "another host through an SSH tunnel."),
        tls_dir: Optional[Path] = typer.Option(None, "--tls", help="Folder with ca.crt, server.pem, server.key."),
        home: Path = typer.Option(DEFAULT_HOME, "--home", help="FLWR_HOME of the SuperLink."),
        insecure: bool = typer.Option(False, "--insecure", help="Plain HTTP, no node authentication (warns)."),
        coordinator_key: Optional[Path] = typer.Option(None, "--coordinator-key", help="The coordinator's "
                                                       "PUBLIC key (coordinator.pub): only runs it signed execute."),
        out_root: Path = typer.Option(Path("."), "--out-root", help="The ServerApp writes only below this folder "
                                      "(run out-dirs must lie in it)."),
    ):
        """Run flower-superlink with TLS, SuperNode authentication and the gate (foreground).

        The SuperLink listens on 127.0.0.1:--control-port only (Flower OSS's Control API has no user
        authentication); a proxy on --host:--port passes the Fleet API to it and refuses the rest.
        The SuperLink starts no app itself (``--isolation process``): this host's gate executor
        runs the installed fedsonmf ServerApp, only for the pinned app bundle and coordinator-signed runs."""
        sec = _sec()
        try:
            if insecure:
                typer.echo("WARNING: --insecure: plain HTTP and no SuperNode authentication; anyone who reaches "
                           f"{host}:{port} can join as a node, read the traffic and submit runs", err=True)
                tls = None
            else:
                if tls_dir is None:
                    raise typer.BadParameter("give --tls DIR (from `fedsonmf flower keys tls`) or --insecure",
                                             param_hint="--tls")
                key = sec.check_private_file(tls_dir / "server.key", "TLS server key")
                tls = (tls_dir.resolve() / "ca.crt", tls_dir.resolve() / "server.pem", key)
            if control_port == port and host in ("127.0.0.1", "0.0.0.0", "localhost", ""):
                raise sec.InputError(f"--control-port {control_port} is --port: give the Control API its own port")
            args = sec.superlink_args("127.0.0.1", control_port, tls, auth=not insecure)
        except sec.InputError as exc:
            _fail(exc)
        public = _coordinator_public(coordinator_key)
        try:
            _check_port_free(host, port, "--port")
            _check_port_free("127.0.0.1", control_port, "--control-port")
        except sec.InputError as exc:
            _fail(exc)
        from fedsonmf.federation.flower import fleetproxy

        front = (fleetproxy.argv(f"{host}:{port}", f"{'https' if tls else 'http'}://127.0.0.1:{control_port}", tls),
                 f"{host}:{port}")
        _run_gated("flower-superlink", args, home, role="serverapp",
                   runtime_api=sec.superlink_runtime_api("127.0.0.1", control_port),
                   public_key=public, root_certificates=tls[0] if tls else None, out_root=out_root.resolve(),
                   front=front)

    @flower_app.command("register")
    def register_cmd(
        public_key: Path = typer.Argument(..., help="The node operator's NAME.pub."),
        partition: int = typer.Option(..., "--partition", min=0, help="The view this node holds."),
        superlink_addr: str = typer.Option(..., "--superlink", help="HOST:PORT of the SuperLink."),
        ca: Path = typer.Option(..., "--ca", help="The deployment's ca.crt."),
        pins: Path = typer.Option(..., "--pins", help="Pins file on the SuperLink host (created 0600)."),
        home: Path = typer.Option(DEFAULT_HOME, "--home", help="FLWR_HOME of the coordinator."),
        replace: bool = typer.Option(False, "--replace", help="Re-pin a view that is already pinned (the old "
                                     "node is unregistered: its key can no longer connect)."),
        signing_key: Optional[Path] = typer.Option(None, "--signing-key", help="The node's NAME-secagg.pub: "
                                                   "recorded beside --pins, pinned by `submit` in every run it "
                                                   "signs (the nodes check each other's secure-aggregation keys "
                                                   "with it)."),
    ):
        """Register a node's public key with the SuperLink and pin --partition to the node id it gets."""
        sec = _sec()
        from fedsonmf.federation.flower.deployment import CONNECTION, _bin, flower_env

        try:
            line = public_key.read_text()
            signing = sec.read_signing_public(signing_key) if signing_key is not None else None
            sec.write_connection(home, CONNECTION, superlink_addr, ca)
            old = sec.read_pins(pins).get(partition) if pins.exists() else None
            if old is not None and not replace:  # before registering anything
                raise sec.InputError(f"view {partition} is already pinned to node {old.node_id} (key "
                                     f"{old.fingerprint}) in {pins}; pass --replace to re-pin it")
            env = flower_env(home.resolve())
            nid = sec.register_node_key(_bin("flwr"), public_key, CONNECTION, env=env)
            sec.add_pin(pins, partition, sec.Pin(nid, sec.key_fingerprint(line)), replace=replace)
            if old is not None and old.node_id != nid:  # the replaced key can no longer connect
                sec.unregister_node(_bin("flwr"), old.node_id, CONNECTION, env=env)
            if signing is not None:
                sec.add_peer_key(pins, partition, signing)
        except (OSError, sec.InputError, sec.FederationError) as exc:
            _fail(exc)
        typer.echo(f"view {partition} pinned to node {nid} (key {sec.key_fingerprint(line)}) in {pins}")

    @flower_app.command("supernode")
    def supernode(
        superlink_addr: str = typer.Option(..., "--superlink", help="HOST:PORT of the SuperLink."),
        view: Path = typer.Option(..., "--view", help="This node's own view file (any view format: CSV/TSV, .npy, "
                                  ".npz, .mtx, .mat; with ids, its rows are sorted by id)."),
        partition: int = typer.Option(..., "--partition", min=0, help="The view index (pinned at registration)."),
        partitions: int = typer.Option(..., "--partitions", min=1, help="Number of views in the federation."),
        key: Optional[Path] = typer.Option(None, "--key", help="This node's private key (0600; NAME.pub beside)."),
        ca: Optional[Path] = typer.Option(None, "--ca", help="The deployment's ca.crt."),
        state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Node-local private state."),
        mask: Optional[Path] = typer.Option(None, "--mask", help="Availability mask (incomplete views)."),
        runtime_port: int = typer.Option(9094, "--runtime-port", help="With FEDSONMF_NODE_LOOP=flower: the local "
                                         "Runtime API port of flower-supernode (one per node on a host); the "
                                         "default node loop opens no port."),
        home: Path = typer.Option(DEFAULT_HOME, "--home", help="FLWR_HOME of this node."),
        insecure: bool = typer.Option(False, "--insecure", help="Plain HTTP, no key (warns)."),
        coordinator_key: Optional[Path] = typer.Option(None, "--coordinator-key", help="The coordinator's "
                                                       "PUBLIC key (coordinator.pub): only runs it signed execute."),
        allow_plain: bool = typer.Option(False, "--allow-plain", help="Take part in runs without secure "
                                         "aggregation too (this node's uploads then reach the server unmasked)."),
        min_cluster_size: int = typer.Option(1, "--refine-min-cluster-size", min=1, help="Answer refinement "
                                             "labels only when every nonempty cluster holds at least this many "
                                             "samples (2 or more refuses the seeded starts)."),
        predict: Optional[Path] = typer.Option(None, "--predict", help="This node's file of new samples (same "
                                               "features as --view) for `submit --predict-from`; restart the node "
                                               "with it, with the same --state-dir as the fit."),
    ):
        """Run the SuperNode of one view, with TLS, its own key and the gate (foreground).

        By default the project's node loop (``python -m fedsonmf.federation.flower.nodeloop``: Flower's
        Fleet connection, the gate's checks on every message, the installed fedsonmf ClientApp in
        process; it opens no port).  With ``FEDSONMF_NODE_LOOP=flower`` in the environment: Flower's
        flower-supernode with ``--isolation process`` and the gate executor on its Runtime API
        (``--runtime-port``, one per node on a host).  Either runs only the pinned app bundle and
        coordinator-signed runs, and refuses runs without secure aggregation unless given ``--allow-plain``."""
        sec = _sec()
        try:
            for what, path in (("view", view), ("new-sample", predict)):
                if path is not None and not path.is_file():
                    raise sec.InputError(f"{what} file {path} does not exist")
            if insecure:
                typer.echo("WARNING: --insecure: plain HTTP, no node key", err=True)
                ca_cert = private = None
            else:
                if key is None or ca is None:
                    raise typer.BadParameter("give --key and --ca, or --insecure", param_hint="--key/--ca")
                private = sec.load_node_key(key).private  # refuses a group/world-readable key
                ca_cert = ca.resolve()
                signing_key, signing_pub, signing = sec.node_signing_key(private)  # made once, kept
                typer.echo(f"secure-aggregation signing key {signing_key}; the coordinator pins its public half "
                           f"{signing} ({signing_pub}: `flower register --signing-key`)", err=True)
            ncfg = sec.node_config(partition, partitions, view, state_dir, mask, require_secure=not allow_plain,
                                   min_cluster_size=min_cluster_size, predict=predict,
                                   signing_key=None if insecure else signing_key)
            args = sec.supernode_args(superlink_addr, ca_cert, private, ncfg, port=runtime_port)
            loop = _node_loop_choice()
        except (sec.InputError, OSError) as exc:  # OSError: the signing key cannot be written
            _fail(exc)
        public = _coordinator_public(coordinator_key)
        try:
            if loop == "flower":  # its Runtime API port must be free (two nodes on one host: one each)
                _check_port_free("127.0.0.1", runtime_port, "--runtime-port")
        except sec.InputError as exc:
            _fail(exc)
        if loop == "fedsonmf":
            _run_node_loop(superlink_addr, ca_cert, private, ncfg, home, public)
        _run_gated("flower-supernode", args, home, role="clientapp", runtime_api=f"127.0.0.1:{runtime_port}",
                   public_key=public)

    @flower_app.command("submit")
    @with_params(*ALGORITHM_OPTIONS, "max_rounds", "tol", "diagnostics", "preprocess", "normalize_embedding",
                 "n_init")
    def submit(
        superlink_addr: str = typer.Option(..., "--superlink", help="HOST:PORT of the SuperLink."),
        clusters: Optional[int] = typer.Option(None, "--clusters", "-k", min=1, help="Cluster the samples into c "
                                               "clusters (FedMultiViewClustering's pipeline; labels in "
                                               "OUT/labels.csv); without it the run only factorises."),
        rank: Optional[str] = typer.Option(None, "--rank", "-r", help=f"Rank r (default {default('n_components')})"
                                           f"; with --clusters: {RANK_HELP[0].lower()}{RANK_HELP[1:]} Default "
                                           f"{dd.RANK_RULE}."),
        labels: Optional[Path] = typer.Option(None, "--labels", help="With --clusters, when submitting on the "
                                              "SuperLink host: true classes to score against (ACC/NMI/purity), "
                                              ".npy or one label per line in the nodes' sample order."),
        predict_from: Optional[Path] = typer.Option(None, "--predict-from", help="Assign new samples instead of "
                                                    "fitting: the out-dir of a clustering run (on the SuperLink "
                                                    "host) whose bases and centres to use; each node embeds the "
                                                    "file its `supernode --predict` names."),
        ca: Optional[Path] = typer.Option(None, "--ca", help="The deployment's ca.crt."),
        pins: Optional[Path] = typer.Option(None, "--pins", help="Pins file on the SuperLink host."),
        out: Path = typer.Option(..., "--out", help="out-dir on the SuperLink host (a relative path is resolved "
                                 "here: submit on the SuperLink host, or give an absolute path)."),
        clients: Optional[int] = typer.Option(None, "--clients", min=1, help="Number of views (SuperNodes) of a "
                                              "fit (a predict run takes its fit's)."),
        seed: int = _seed_option("Run seed."),
        job_id: str = typer.Option("", "--job-id", help="Names the nodes' state files (keep it to resume)."),
        resume: bool = typer.Option(False, "--resume", help="Continue from out-dir/checkpoint."),
        round_timeout: float = _round_timeout_option(),
        node_timeout: float = _node_timeout_option(),
        home: Path = typer.Option(DEFAULT_HOME, "--home", help="FLWR_HOME of the submitter."),
        insecure: bool = typer.Option(False, "--insecure", help="Plain HTTP and no pins (warns)."),
        coordinator_key: Optional[Path] = typer.Option(None, "--coordinator-key", help="The coordinator's "
                                                       "PRIVATE key (coordinator.key, 0600): signs this run."),
        params: Any = None,
    ):
        """Submit the fedsonmf app to a SuperLink (flwr run --stream) and report the ServerApp's status.

        With --clusters the run clusters the samples as `flower cluster` does on loopback (each node
        preprocesses its own view, the rank rule is settled at the handshake, the server refines the
        partition with the nodes); --preprocess and --normalize-embedding apply only then.  With
        --predict-from RUN it assigns new samples to RUN's clusters (one exchange, the bases fixed)."""
        import json

        from fedsonmf.federation.flower.deployment import CONNECTION, _bin, _read_status, flower_env
        from fedsonmf.federation.flower.template import _toml_value, write_app_dir
        from fedsonmf.protocol.config import FedConfig

        sec = _sec()
        from fedsonmf._io import write_atomic
        from fedsonmf.federation.flower import gate

        if not insecure and (ca is None or pins is None):
            raise typer.BadParameter("give --ca and --pins, or --insecure", param_hint="--ca/--pins")
        from fedsonmf.federation.budget import resolve_budget
        from fedsonmf.federation.flower.launcher import clustering_run_config

        algorithm, rounds, tol = params.pop("algorithm"), params.pop("max_rounds"), params.pop("tol")
        options = {"preprocess": params.pop("preprocess"), "normalize_embedding": params.pop("normalize_embedding"),
                   "n_init": params.pop("n_init")}
        cluster_rc: dict[str, Any] = {}
        if predict_from is not None:
            if clusters is not None or rank is not None or resume:
                raise typer.BadParameter("a predict run fits nothing: leave out --clusters, --rank and --resume",
                                         param_hint="--predict-from")
            model = predict_from.resolve()
            if model.exists() and not (model / "centers.npy").is_file():
                raise typer.BadParameter(f"{model} holds no clustering run (no centers.npy): give the out-dir of "
                                         "a `submit --clusters` run", param_hint="--predict-from")
            if labels is not None and not labels.is_file():
                raise typer.BadParameter(f"labels file {labels} does not exist", param_hint="--labels")
        else:  # a fit: the factorisation, or the clustering with --clusters
            if clients is None:
                raise typer.BadParameter("give the number of views (SuperNodes) of the fit", param_hint="--clients")
            if clusters is None:
                if labels is not None:
                    raise typer.BadParameter("--labels scores a clustering: give --clusters too",
                                             param_hint="--labels")
                if rank is not None and not (rank.isdigit() and int(rank) >= 1):
                    raise typer.BadParameter(f"must be a positive number (a rank rule needs --clusters), got "
                                             f"{rank!r}", param_hint="--rank")
                if rank is not None:
                    params["n_components"] = int(rank)
            else:
                if labels is not None and not labels.is_file():
                    raise typer.BadParameter(f"labels file {labels} does not exist", param_hint="--labels")
                cluster_rc = clustering_run_config(clusters, {**options, "rank": _rank_rule(rank or dd.RANK_RULE)})
            cfg = FedConfig(**params)  # with --clusters, n_components is the rank rule's (at the handshake)
            rounds, tol = resolve_budget(cfg, rounds, tol)  # a bad budget: one error: line, exit 2 (cli.app.main)

        if coordinator_key is None:
            raise typer.BadParameter("give --coordinator-key coordinator.key (`fedsonmf flower keys coordinator`): "
                                     "the hosts run only runs it signed", param_hint="--coordinator-key")
        try:
            authority = gate.Authority.load(coordinator_key)  # refuses a group/world-readable key
        except OSError as exc:
            _fail(exc)
        except (ValueError, TypeError, AttributeError) as exc:  # not a PEM Ed25519 private key
            _fail(f"coordinator key {coordinator_key} is not the coordinator's private key (coordinator.key "
                  f"from `fedsonmf flower keys coordinator`): {exc}")
        if insecure:
            typer.echo("WARNING: --insecure: plain HTTP and no node pins", err=True)
        home = home.resolve()
        sec.write_connection(home, CONNECTION, superlink_addr, None if insecure else ca)
        app_dir = write_app_dir(home / "fedsonmf-app")
        common = {"out-dir": str(out.resolve()), "round-timeout": round_timeout, "node-timeout": node_timeout,
                  "node-pins": "" if insecure or pins is None else str(pins.resolve())}
        if predict_from is not None:  # the nodes and the fit's job id come from the fit's record in model-dir
            conf = {"mode": "predict", "model-dir": str(predict_from.resolve()), **common}
        else:
            conf = {"num-clients": clients, "num-rounds": rounds, "tol": tol, "seed": seed, "algorithm": algorithm,
                    "config-json": json.dumps(cfg.to_dict()), "diagnostics": bool(cfg.diagnostics), "job-id": job_id,
                    "resume": resume, **common, **cluster_rc}
        from fedsonmf.protocol.params import FLOWER_SECURE_AGGREGATION

        plain = not conf.get("secure-aggregation", FLOWER_SECURE_AGGREGATION)  # no masks: no keys to authenticate
        if not insecure and pins is not None and not plain:  # the views' signing keys, under the coordinator's
            # signature: the nodes check each other's secure-aggregation keys with them, whatever the server relays
            try:
                conf[sec.PEERS_KEY] = sec.peer_keys_for_run(pins.resolve(), clients if predict_from is None else None)
            except sec.InputError as exc:
                _fail(exc)
        # sign the run for the FAB `flwr run` submits (Flower's builder is deterministic)
        conf = gate.sign_run_config(authority, gate.fab_sha256(gate.build_fab(app_dir)), conf)
        overrides = home / "run-config.toml"  # 0600: holds this run's authorisation
        write_atomic(overrides, "".join(f"{k} = {_toml_value(v)}\n" for k, v in conf.items()))
        typer.echo(f"flwr run {app_dir} {CONNECTION} --stream --run-config {overrides}", err=True)
        out = out.resolve()
        proc = _submit_with_progress([_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream", "--run-config",
                                      str(overrides)], flower_env(home), out / "status.json",
                                     0 if predict_from is not None else rounds)
        status = _read_status(out / "status.json")  # readable when submitting on the SuperLink host
        if not status and (failure := _submitted_failure(home, app_dir)):
            _fail(failure)  # refused by the gate (its reason), or ended before the ServerApp's first status
        if not status:
            typer.echo(f"flwr run exited {proc.returncode}; the ServerApp's status is {out}/status.json on the "
                       "SuperLink host")
            raise typer.Exit(0 if proc.returncode == 0 else 1)
        if status.get("status") != "completed":
            _fail(f"the run failed: {status.get('error')} (last completed round {status.get('last_completed_round')})")
        if predict_from is not None:
            _report_submitted_predict(out, labels)
            return
        typer.echo(f"completed {status.get('n_rounds')} rounds; V: {Path(out) / 'V.npy'}")
        if clusters is not None:
            _report_submitted_clustering(out, clusters, labels)
