"""Command-line interface: ``fedsonmf synthetic``, ``fedsonmf cluster``, ``fedsonmf reproduce ...``,
``fedsonmf flower ...``.

Sub-commands of other areas live in their own modules and are registered by
``register(app, reproduce_app)`` functions (``cli_cluster``, ``cli_experiments``,
``cli_flower``) so that this file stays small.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fedsonmf.cli import cluster as cli_cluster
from fedsonmf.cli import experiments as cli_experiments
from fedsonmf.cli import flower as cli_flower
from fedsonmf.cli.progress import RoundProgress

app = typer.Typer(
    name="fedsonmf",
    help="Federated sparse orthogonal NMF and federated multi-view clustering.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
reproduce_app = typer.Typer(help="Reproduce the paper's experiments.", no_args_is_help=True)
app.add_typer(reproduce_app, name="reproduce")


@app.command()
def synthetic(
    heterogeneity: float = typer.Option(0.6, "--heterogeneity", "-h", help="h in [0, 1] (ALGORITHM.md §8)."),
    tau: int = typer.Option(10, help="Local steps per round."),
    rounds: int = typer.Option(30, help="Maximum communication rounds."),
    tol: float = typer.Option(0.0, help="Stop when R/R1 <= tol (0: run all rounds)."),
    seed: int = typer.Option(0, help="Seed of the data and of the run."),
    correction: bool = typer.Option(True, "--correction/--no-correction", help="Drift correction."),
    clients: int = typer.Option(10, help="Number of clients (views)."),
    samples: int = typer.Option(100, help="Number of samples n."),
    features: int = typer.Option(20, help="Features per view d_p."),
    rank: int = typer.Option(6, help="Rank r."),
    noise: float = typer.Option(0.01, help="Noise level."),
    mu: float = typer.Option(1.0, help="l2,1 weight."),
    alpha: float = typer.Option(0.01, help="Local step size."),
    eta_g: float = typer.Option(1.5, help="Global step multiplier."),
    rho1: float = typer.Option(1.0, help="U-step proximal weight."),
    algorithm: str = typer.Option("fedsonmf", help="Algorithm name (see `fedsonmf.algorithms.ALGORITHMS`)."),
    blas_threads: int = typer.Option(1, help="BLAS threads (1 is fastest at this size)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write config + per-round history here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of R/R1 per round here."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
):
    """Run the method on the planted synthetic problem and report convergence."""
    from fedsonmf.datasets import make_synthetic
    from fedsonmf.estimators.sonmf import federated_sonmf

    data = make_synthetic(
        n_clients=clients, n_samples=samples, n_features=features, rank=rank, heterogeneity=heterogeneity,
        noise=noise, random_state=seed,
    )
    with RoundProgress(rounds, enabled=not quiet, title=f"synthetic h={heterogeneity:g} tau={tau}") as progress:
        res = federated_sonmf(
            data.views, rank, mu=mu, tau=tau, alpha=alpha, eta_g=eta_g, rho1=rho1, max_rounds=rounds, tol=tol,
            correction=correction, algorithm=algorithm, random_state=seed, callback=progress.update,
            blas_threads=blas_threads,
        )
    res.config["data"] = {
        "generator": "make_synthetic", "n_clients": clients, "n_samples": samples, "n_features": features,
        "rank": rank, "heterogeneity": heterogeneity, "noise": noise, "seed": seed,
    }
    hist = res.history
    target = hist.rounds_to(1e-2)
    typer.echo(
        f"{res.stopping_reason}\n"
        f"final objective {hist.rows[-1]['objective']:.6g}, R/R1 {hist.rows[-1]['R_rel']:.3e}, "
        f"rounds to R/R1 <= 1e-2: {target if target is not None else 'not reached'}, "
        f"effective rank {hist.rows[-1]['effective_rank']}"
    )
    if json_path is not None:
        res.save_json(json_path)
        typer.echo(f"wrote {json_path}")
    if plot is not None:
        from fedsonmf.experiments.plotting import plot_residuals

        plot_residuals({f"{algorithm} (h={heterogeneity:g}, tau={tau})": hist}, plot)
        typer.echo(f"wrote {plot}")


cli_cluster.register(app, reproduce_app)
cli_experiments.register(app, reproduce_app)
cli_flower.register(app, reproduce_app)


def main() -> None:  # console-script entry point
    from fedsonmf.exceptions import InputError, ParameterError

    try:
        app()
    except (ParameterError, InputError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2)
