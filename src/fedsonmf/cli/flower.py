"""CLI commands of the flower area (registered by :mod:`fedsonmf.cli`).

``fedsonmf flower run VIEW...``   SuperLink + one SuperNode per view on loopback, run, collect, stop
``fedsonmf flower app DEST``      write the shim Flower app (for ``flwr run`` on real machines)
``fedsonmf flower views DEST``    write synthetic view files (one per client) to try it out
``fedsonmf flower simulate DIR``  the same app in Flower's simulation engine, one simulated client per view

Flower (``flwr``) is an optional extra: ``pip install "fedsonmf[flower]"``.  ``flower run``
uses secure aggregation unless ``--no-secure-aggregation`` is given.
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
from fedsonmf.protocol.params import FLOWER_SECURE_AGGREGATION


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
        record_wire_arrays: bool = typer.Option(False, "--record-wire-arrays",
                                                help="With --record-wire: also save every array the server "
                                                     "receives (server/wire-arrays/)."),
        secure_aggregation: bool = typer.Option(FLOWER_SECURE_AGGREGATION,
                                                "--secure-aggregation/--no-secure-aggregation",
                                                help="Pairwise-masked uploads: the server learns only their sums "
                                                     "(on by default in deployments; docs/privacy.md)."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Also write config + history here."),
        tls: Optional[List[Path]] = typer.Option(None, "--tls", help="TLS on loopback: give three times, "
                                                  "CA certificate, server certificate, server key."),
        masks: Optional[List[str]] = typer.Option(None, "--mask", help="Incomplete views: one .npy availability "
                                                  "mask (bool, length n) per view, in view order; '-' for a "
                                                  "complete view."),
        params: dict = None,
    ):
        """Run a federation on a loopback Flower deployment (one SuperNode per view file)."""
        fl = _flower()
        from fedsonmf.protocol.config import FedConfig

        check_output_path(json_path, "--json")
        algorithm, rounds, tol = params.pop("algorithm"), params.pop("max_rounds"), params.pop("tol")
        cfg = FedConfig(**params)
        if tls and len(tls) != 3:
            typer.echo("error: --tls must be given three times: CA certificate, server certificate, server key",
                       err=True)
            raise typer.Exit(2)
        typer.echo(f"starting 1 SuperLink + {len(views)} SuperNodes on 127.0.0.1 (run folder {out})")
        try:
            res = fl.run_flower(views, cfg, run_dir=out, algorithm=algorithm, max_rounds=rounds, tol=tol, seed=seed,
                                resume=resume, round_timeout=round_timeout, node_timeout=node_timeout,
                                record_wire=record_wire, record_wire_arrays=record_wire_arrays,
                                secure_aggregation=secure_aggregation, tls=tuple(tls) if tls else None,
                                mask_paths=_mask_paths(masks, len(views)))
        except (fl.FlowerRunError, FileNotFoundError, PermissionError, TimeoutError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1)
        info = res.extra["flower"]
        last = res.history.rows[-1]
        secs = [r["seconds"] for r in res.history.rows]
        line = f"{res.stopping_reason}; {sum(secs) / len(secs):.2f} s/round, start-up {info['startup_seconds']:.1f} s"
        if "R_rel" in last:
            line += f"; final objective {last['objective']:.6g}, R/R1 {last['R_rel']:.3e}"
        typer.echo(line)
        typer.echo(f"V: {Path(out).resolve() / 'server' / 'V.npy'}  history: {Path(out).resolve() / 'server' / 'result.json'}")
        if json_path is not None:
            res.save_json(json_path)
            typer.echo(f"wrote {json_path}")

    @flower_app.command("app")
    def app_dir(dest: Path = typer.Argument(..., help="Directory to write the shim app into.")):
        """Write the Flower app directory for `flwr run DEST <connection> --run-config ...`."""
        fl = _flower()
        fl.write_app_dir(dest)
        typer.echo(f"wrote {dest} (run-config keys: see {dest / 'pyproject.toml'})")

    @flower_app.command("simulate")
    @with_params("n_components", *ALGORITHM_OPTIONS, "max_rounds", "tol", "diagnostics")
    def simulate(
        views: List[Path] = typer.Argument(..., help="A folder of view0.*, view1.*, ... (one per simulated "
                                           "client; node state is written into it), or the view files."),
        out: Path = typer.Option(..., "--out", "-o", help="Run folder (FLWR_HOME, logs, results)."),
        seed: int = typer.Option(0, "--seed", min=0, help="Run seed."),
        cpus_per_client: int = typer.Option(1, "--cpus-per-client", min=1,
                                            help="Ray CPUs per simulated client (clients run cores/this at a time)."),
        round_timeout: float = typer.Option(300.0, help="Seconds to wait for all replies of a round."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Also write config + history here."),
        params: dict = None,
    ):
        """Run a federation in Flower's simulation engine (needs the simulation extra: Ray)."""
        fl = _flower()
        from fedsonmf.protocol.config import FedConfig

        check_output_path(json_path, "--json")
        algorithm, rounds, tol = params.pop("algorithm"), params.pop("max_rounds"), params.pop("tol")
        cfg = FedConfig(**params)
        source = views[0] if len(views) == 1 and views[0].is_dir() else views
        typer.echo(f"starting a simulation SuperLink on 127.0.0.1 (run folder {out})")
        try:
            res = fl.run_simulation(source, cfg, run_dir=out, algorithm=algorithm, max_rounds=rounds, tol=tol,
                                    seed=seed, cpus_per_client=cpus_per_client, round_timeout=round_timeout)
        except ImportError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2)
        except (fl.FlowerRunError, FileNotFoundError, TimeoutError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1)
        info = res.extra["flower"]
        secs = [r["seconds"] for r in res.history.rows]
        typer.echo(f"{info['num_supernodes']} simulated clients, {res.stopping_reason}; "
                   f"{sum(secs) / len(secs):.2f} s/round, start-up {info['startup_seconds']:.1f} s")
        server = Path(out).resolve() / "server"
        typer.echo(f"V: {server / 'V.npy'}  history: {server / 'result.json'}")
        if json_path is not None:
            res.save_json(json_path)
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
        from fedsonmf.federation.flower.launcher import write_views

        data = make_synthetic(n_clients=clients, n_samples=samples, n_features=features, rank=rank,
                              heterogeneity=heterogeneity, random_state=seed)
        for p in write_views(data.views, dest):
            typer.echo(str(p))
