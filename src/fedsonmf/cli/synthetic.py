"""``fedsonmf synthetic``: the method on the paper's planted synthetic problem (docs/algorithm.md §8)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fedsonmf.cli.options import check_output_path, param, parse_mu
from fedsonmf.protocol.params import SYNTHETIC_STUDY

#: where ``fedsonmf synthetic`` departs from the parameter table, and why: the paper's synthetic
#: study setting (mu, rho1 at the generator's known scale), and one BLAS thread (fastest at this size)
SYNTHETIC_DEFAULTS = {**SYNTHETIC_STUDY, "blas_threads": 1}


def register(app, reproduce_app) -> None:
    """Add this area's commands to the main app."""

    @app.command()
    def synthetic(
        heterogeneity: float = typer.Option(0.6, "--heterogeneity", "-H", help="h in [0, 1] (docs/algorithm.md §8)."),
        tau: int = param("tau"),
        rounds: int = param("max_rounds", "--rounds"),
        tol: float = param("tol"),
        seed: int = typer.Option(0, "--seed", min=0, help="Seed of the data and of the run."),
        correction: bool = param("correction", "--correction/--no-correction"),
        clients: int = typer.Option(10, "--clients", min=1, help="Number of clients (views)."),
        samples: int = typer.Option(100, "--samples", min=1, help="Number of samples n."),
        features: int = typer.Option(20, "--features", min=1, help="Features per view d_p."),
        rank: int = param("n_components", "--rank", "-r"),
        noise: float = typer.Option(0.01, "--noise", min=0.0, help="Noise level."),
        mu: str = param("mu", default=str(SYNTHETIC_DEFAULTS["mu"]),
                        help="l2,1 weight: a number or 'auto' (default: the synthetic study's value at the "
                             "generator's scale)."),
        alpha: float = param("alpha", default=SYNTHETIC_DEFAULTS["alpha"],
                             help="Local step (the synthetic study's value)."),
        eta_g: float = param("eta_g"),
        rho1: float = param("rho1", default=SYNTHETIC_DEFAULTS["rho1"],
                            help="U-step proximal weight (the synthetic study's value)."),
        algorithm: str = param("algorithm"),
        blas_threads: int = param("blas_threads", default=SYNTHETIC_DEFAULTS["blas_threads"], min=1,
                                  help="BLAS threads (1 is fastest at this size)."),
        checkpoint_dir: Optional[Path] = param("checkpoint_dir"),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write config + per-round history here."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of R/R1 per round here."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    ):
        """Run the method on the planted synthetic problem and report convergence.

        mu and rho1 default to the paper's synthetic study setting (docs/algorithm.md §11), not
        the library's scale-free defaults, so that the numbers match docs/synthetic-study.md;
        every other option takes the parameter table's default.
        """
        from fedsonmf.cli.progress import RoundProgress
        from fedsonmf.datasets import make_synthetic
        from fedsonmf.estimators.sonmf import federated_sonmf

        mu = parse_mu(mu)
        check_output_path(json_path, "--json")
        check_output_path(plot, "--plot")
        check_output_path(checkpoint_dir, "--checkpoint-dir", folder=True)
        if not 0.0 <= heterogeneity <= 1.0:
            raise typer.BadParameter(f"must be in [0, 1], got {heterogeneity}", param_hint="--heterogeneity")
        data = make_synthetic(
            n_clients=clients, n_samples=samples, n_features=features, rank=rank, heterogeneity=heterogeneity,
            noise=noise, random_state=seed,
        )
        with RoundProgress(rounds, enabled=not quiet, title=f"synthetic h={heterogeneity:g} tau={tau}") as progress:
            res = federated_sonmf(
                data.views, rank, mu=mu, tau=tau, alpha=alpha, eta_g=eta_g, rho1=rho1, max_rounds=rounds, tol=tol,
                correction=correction, algorithm=algorithm, random_state=seed, callback=progress.update,
                blas_threads=blas_threads, checkpoint_dir=checkpoint_dir,
            )
        res.config["data"] = {
            "generator": "make_synthetic", "n_clients": clients, "n_samples": samples, "n_features": features,
            "rank": rank, "heterogeneity": heterogeneity, "noise": noise, "seed": seed,
        }
        hist = res.history
        target = hist.rounds_to(1e-2)
        last = hist.rows[-1]
        typer.echo(
            f"{res.stopping_reason}\n"
            f"final objective {last['objective']:.6g}, R/R1 {last['R_rel']:.3e}, "
            f"rounds to R/R1 <= 1e-2: {target if target is not None else 'not reached'}, "
            f"effective rank {last['effective_rank']}"
        )
        if json_path is not None:
            res.save_json(json_path)
            typer.echo(f"wrote {json_path}")
        if plot is not None:
            from fedsonmf.experiments.plotting import plot_residuals

            label = f"{algorithm} (h={heterogeneity:g}, tau={tau})"
            if not correction:
                label += ", no drift correction (ablation)"
            plot_residuals({label: hist}, plot)
            typer.echo(f"wrote {plot}")
