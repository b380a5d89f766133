"""CLI commands of the flower area (registered by :mod:`fedsonmf.cli`).

``fedsonmf flower run VIEW...``      SuperLink + one SuperNode per view on loopback: factorise, collect, stop
``fedsonmf flower cluster VIEW...``  the same deployment running FedMultiViewClustering's pipeline: labels.csv
``fedsonmf flower app DEST``         write the shim Flower app (for ``flwr run`` on real machines)
``fedsonmf flower views DEST``       write synthetic view files (one per client) to try it out

Both runs check the view files before anything starts (exit 2 on bad input), show the
progress the ServerApp writes to ``status.json`` (phase, round k of K, s/round, ETA) and
print the time from the launch to the start of round 1.

Flower (``flwr``) is an optional extra: ``pip install "fedsonmf[flower]"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fedsonmf.cli.options import (
    ALGORITHM_OPTIONS,
    CONTEXT,
    check_output_path,
    with_params,
)


def _flower():
    try:
        from fedsonmf.federation import flower
    except ImportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
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
    ``tol`` stops earlier).  ``enabled=False``: silent.
    """

    PHASES = {"handshake": "waiting for the SuperNodes (handshake)", "setup": "setting up the clients",
              "clustering": "k-means on V", "embed": "embedding the new samples"}

    def __init__(self, total: int, *, enabled: bool = True):
        self.total, self.enabled = total, enabled
        self._progress = self._task = None

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
        if self._progress is None:
            return
        phase, done = st.get("phase"), int(st.get("rounds_done", 0) or 0)
        if phase == "round" or (done and phase not in self.PHASES):
            spr = st.get("seconds_per_round")
            status = f"round {st.get('round')} of {self.total}"
            if spr:
                status += f", {spr:.1f} s/round, ETA {max(self.total - done, 0) * spr:.0f} s"
            self._progress.update(self._task, description="rounds", completed=done, status=status)
        elif phase in self.PHASES:
            self._progress.update(self._task, description=phase, completed=done, status=self.PHASES[phase])
        if st.get("status") == "completed":
            self._progress.update(self._task, completed=self.total or done, status="done")

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
        return False


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


def _check_inputs_or_exit(fl, views, **kw):
    """Bad input ends the command with exit 2 before any process starts."""
    from fedsonmf.exceptions import InputError, ParameterError

    try:
        return fl.check_inputs(views, **kw)
    except (InputError, ParameterError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)


def _read_labels(path: Path, n: int):
    """True classes for scoring: ``.npy``, or a text file with one label per line or ``sample_id,label``
    lines (a header line is skipped); one label per sample."""
    import numpy as np

    from fedsonmf.exceptions import InputError

    if not path.is_file():
        raise InputError(f"labels file {path} does not exist")
    if path.suffix == ".npy":
        y = np.load(path, allow_pickle=False).ravel()
    else:
        rows = [r.replace("\t", ",").split(",") for r in path.read_text().splitlines() if r.strip()]
        if rows and len(rows) == n + 1:
            rows = rows[1:]  # a header
        if rows and len(rows[0]) >= 2:
            try:
                rows = sorted(rows, key=lambda r: int(r[0]))
            except ValueError:
                raise InputError(f"labels file {path}: the first column must be the sample id 0..n-1") from None
            y = np.array([r[-1].strip() for r in rows])
        else:
            y = np.array([r[0].strip() for r in rows])
    if y.size != n:
        raise InputError(f"labels file {path} holds {y.size} labels for {n} samples")
    return y


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


def register(app, reproduce_app) -> None:
    """Add this area's commands to the main app and to fedsonmf reproduce."""
    flower_app = typer.Typer(help="Federation on Flower: loopback launcher and the app for real machines.",
                             no_args_is_help=True, context_settings=CONTEXT)
    app.add_typer(flower_app, name="flower")

    @flower_app.command("run")
    @with_params("n_components", *ALGORITHM_OPTIONS, "max_rounds", "tol", "diagnostics")
    def run(
        views: List[Path] = typer.Argument(..., help="One view file per client: .npy (n_samples, d_p) or sparse .npz."),
        out: Path = typer.Option(..., "--out", "-o", help="Run folder (FLWR_HOME, logs, node state, results)."),
        seed: int = typer.Option(0, "--seed", min=0, help="Run seed."),
        resume: bool = typer.Option(False, "--resume", help="Continue the run saved in --out."),
        round_timeout: float = typer.Option(300.0, help="Seconds to wait for all replies of a round."),
        node_timeout: float = typer.Option(120.0, help="Seconds to wait for all SuperNodes."),
        record_wire: bool = typer.Option(False, "--record-wire", help="Log every message (privacy audit)."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Also write config + history here."),
        tls: Optional[List[Path]] = typer.Option(None, "--tls", help="TLS on loopback: give three times, "
                                                  "CA certificate, server certificate, server key."),
        masks: Optional[List[str]] = typer.Option(None, "--mask", help="Incomplete views: one .npy availability "
                                                  "mask (bool, length n) per view, in view order; '-' for a "
                                                  "complete view."),
        min_clients: Optional[float] = typer.Option(None, "--min-clients", help="Partial participation: a round "
                                                    "goes on when this many clients replied (count >= 1 or "
                                                    "fraction)."),
        sample_clients: Optional[float] = typer.Option(None, "--sample-clients", help="Partial participation: "
                                                       "clients asked per round (count >= 1 or fraction)."),
        rejoin: str = typer.Option("server", "--rejoin", help="Correction of a client that missed rounds: "
                                   "server, refresh, drop or stale."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
        params: dict = None,
    ):
        """Factorise on a loopback Flower deployment (one SuperNode per view file)."""
        fl = _flower()
        from fedsonmf.protocol.config import FedConfig

        check_output_path(json_path, "--json")
        algorithm, rounds, tol = params.pop("algorithm"), params.pop("max_rounds"), params.pop("tol")
        cfg = FedConfig(**params)
        mask_paths = _mask_paths(masks, len(views))
        part = _participation(min_clients, sample_clients, rejoin)
        if tls and len(tls) != 3:
            typer.echo("error: --tls must be given three times: CA certificate, server certificate, server key",
                       err=True)
            raise typer.Exit(2)
        _check_inputs_or_exit(fl, views, n_components=cfg.n_components, mask_paths=mask_paths)
        typer.echo(f"starting 1 SuperLink + {len(views)} SuperNodes on 127.0.0.1 (run folder {out})")
        try:
            with FlowerProgress(rounds, enabled=not quiet) as prog:
                res = fl.run_flower(views, cfg, run_dir=out, algorithm=algorithm, max_rounds=rounds, tol=tol,
                                    seed=seed, resume=resume, round_timeout=round_timeout, node_timeout=node_timeout,
                                    record_wire=record_wire, tls=tuple(tls) if tls else None, mask_paths=mask_paths,
                                    participation=part, progress=prog.update)
        except (fl.FlowerRunError, TimeoutError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1)
        _report(res)
        typer.echo(f"V: {Path(out).resolve() / 'server' / 'V.npy'}  history: {Path(out).resolve() / 'server' / 'result.json'}")
        if json_path is not None:
            res.save_json(json_path)
            typer.echo(f"wrote {json_path}")

    @flower_app.command("cluster")
    @with_params(*ALGORITHM_OPTIONS, "max_rounds", "tol", "diagnostics", "preprocess", "normalize_embedding")
    def cluster(
        views: List[Path] = typer.Argument(..., help="One view file per client: .npy (n_samples, d_p) or sparse .npz "
                                           "(row i of every file is sample i)."),
        clusters: int = typer.Option(..., "--clusters", "-k", min=1, help="Number of clusters c."),
        out: Path = typer.Option(..., "--out", "-o", help="Run folder; the labels are in OUT/server/labels.csv."),
        labels: Optional[Path] = typer.Option(None, "--labels", help="True classes to score against (ACC/NMI/"
                                              "purity): .npy, or one label per line / sample_id,label lines."),
        rank: str = typer.Option("auto", "--rank", "-r", help="Rank rule: auto (2 x clusters, narrow views padded), "
                                 "auto-cap, paper (= clusters) or a number (capped at the narrowest view)."),
        seed: int = typer.Option(0, "--seed", min=0, help="Run seed (the fit's and k-means')."),
        round_timeout: float = typer.Option(300.0, help="Seconds to wait for all replies of a round."),
        node_timeout: float = typer.Option(120.0, help="Seconds to wait for all SuperNodes."),
        record_wire: bool = typer.Option(False, "--record-wire", help="Log every message (privacy audit)."),
        min_clients: Optional[float] = typer.Option(None, "--min-clients", help="Partial participation: a round "
                                                    "goes on when this many clients replied (count >= 1 or "
                                                    "fraction)."),
        sample_clients: Optional[float] = typer.Option(None, "--sample-clients", help="Partial participation: "
                                                       "clients asked per round (count >= 1 or fraction)."),
        rejoin: str = typer.Option("server", "--rejoin", help="Correction of a client that missed rounds: "
                                   "server, refresh, drop or stale."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
        params: dict = None,
    ):
        """Cluster the samples on a loopback Flower deployment: FedMultiViewClustering's pipeline, one
        SuperNode per view file; each node preprocesses its own view, the server runs k-means."""
        fl = _flower()
        from fedsonmf.exceptions import InputError
        from fedsonmf.protocol.config import FedConfig

        rule = int(rank) if rank.isdigit() else rank
        if rule not in ("auto", "auto-cap", "paper") and not (isinstance(rule, int) and rule >= 1):
            raise typer.BadParameter(f"must be auto, auto-cap, paper or a positive number, got {rank!r}",
                                     param_hint="--rank")
        algorithm, rounds, tol = params.pop("algorithm"), params.pop("max_rounds"), params.pop("tol")
        options = {"rank": rule, "preprocess": params.pop("preprocess"),
                   "normalize_embedding": params.pop("normalize_embedding")}
        part = _participation(min_clients, sample_clients, rejoin)
        cfg = FedConfig(**params)  # n_components: the rank rule decides (at the handshake)
        shapes = _check_inputs_or_exit(fl, views, n_clusters=clusters)
        y = None
        if labels is not None:
            try:
                y = _read_labels(labels, shapes[0][0])
            except InputError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2)
        typer.echo(f"starting 1 SuperLink + {len(views)} SuperNodes on 127.0.0.1 (run folder {out})")
        try:
            with FlowerProgress(rounds, enabled=not quiet) as prog:
                res = fl.run_flower(views, cfg, run_dir=out, algorithm=algorithm, max_rounds=rounds, tol=tol,
                                    seed=seed, round_timeout=round_timeout, node_timeout=node_timeout,
                                    record_wire=record_wire, participation=part, n_clusters=clusters,
                                    clustering=options, labels=y, progress=prog.update)
        except (fl.FlowerRunError, TimeoutError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1)
        _report(res)
        cl = res.extra["clustering"]
        typer.echo(f"{clusters} clusters of sizes {cl['cluster_sizes']} (rank r = {cl['n_components']})")
        if "scores" in res.extra:
            sc = res.extra["scores"]
            typer.echo(f"ACC {100 * sc['acc']:.1f} %  NMI {100 * sc['nmi']:.1f} %  purity {100 * sc['purity']:.1f} %")
        server = Path(out).resolve() / "server"
        typer.echo(f"labels: {server / 'labels.csv'}  V: {server / 'V.npy'}  result: {server / 'result.json'}")

    @flower_app.command("app")
    def app_dir(dest: Path = typer.Argument(..., help="Directory to write the shim app into.")):
        """Write the Flower app directory for `flwr run DEST <connection> --run-config ...`."""
        fl = _flower()
        fl.write_app_dir(dest)
        typer.echo(f"wrote {dest} (run-config keys: see {dest / 'pyproject.toml'})")

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
        from fedsonmf.federation.flower.launcher import write_views

        data = make_synthetic(n_clients=clients, n_samples=samples, n_features=features, rank=rank,
                              heterogeneity=heterogeneity, random_state=seed)
        for p in write_views(data.views, dest):
            typer.echo(str(p))
