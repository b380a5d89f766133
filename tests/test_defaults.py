"""One source for every default: each public entry point's defaults equal the parameter table's.

The table is :data:`fedsonmf.protocol.params.PARAMS` (the algorithm's and the run's
parameters) and :mod:`fedsonmf.federation.deployment_defaults` (a deployment's own:
timeouts, seed, rejoin and rank rules).  Covered: ``run_inprocess``, ``run_flower``,
``predict_flower``, ``run_simulation`` / ``simulation_run_config``, the Flower app's
run config (``RUN_CONFIG_DEFAULTS``, hence ``flower-app/pyproject.toml``, which
``tests/test_flower_app_folder.py`` keeps equal to it), the ServerApp's reading of a
run config, and every option of every CLI command.  The one declared departure is
``fedsonmf synthetic``'s :data:`~fedsonmf.cli.synthetic.SYNTHETIC_DEFAULTS` (the paper's
synthetic study setting).
"""

import inspect

import click
import pytest
import typer.main

from fedsonmf.cli.app import app
from fedsonmf.cli.synthetic import SYNTHETIC_DEFAULTS
from fedsonmf.federation import deployment_defaults as dd
from fedsonmf.federation.budget import resolve_budget
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.params import FLOWER_SECURE_AGGREGATION, PARAMS, SYNTHETIC_STUDY, default

TABLE_BUDGET = (default("max_rounds"), default("tol"))


def _defaults(func) -> dict:
    return {n: p.default for n, p in inspect.signature(func).parameters.items() if p.default is not p.empty}


def test_the_budget_of_every_engine_is_the_tables():
    assert resolve_budget(FedConfig(n_components=2)) == TABLE_BUDGET
    # the same rule as the estimators: no residual without diagnostics, a private run lasts dp_rounds
    assert resolve_budget(FedConfig(n_components=2, diagnostics=False)) == (default("max_rounds"), 0.0)
    dp = FedConfig(n_components=2, diagnostics=False, dp_noise_multiplier=1.0)
    assert resolve_budget(dp) == (default("dp_rounds"), 0.0)
    d = _defaults(run_inprocess)
    assert d["max_rounds"] is None and d["tol"] is None  # resolved by resolve_budget
    assert d["algorithm"] == default("algorithm")


def test_resolve_budget_refuses_what_cannot_run():
    from fedsonmf.exceptions import ParameterError

    with pytest.raises(ParameterError, match="diagnostics"):
        resolve_budget(FedConfig(n_components=2, diagnostics=False), tol=1e-3)
    with pytest.raises(ParameterError, match="dp_rounds"):
        resolve_budget(FedConfig(n_components=2, diagnostics=False, dp_noise_multiplier=1.0), max_rounds=50)


def test_flower_entry_points_take_the_table_and_the_deployment_defaults():
    pytest.importorskip("flwr")
    from fedsonmf.federation.flower import launcher, simulation

    for func in (launcher.run_flower, simulation.run_simulation, simulation.simulation_run_config):
        d = _defaults(func)
        assert d["max_rounds"] is None and d["tol"] is None, func.__name__
        assert d["algorithm"] == default("algorithm") and d["seed"] == dd.SEED, func.__name__
        assert d["round_timeout"] == dd.ROUND_TIMEOUT, func.__name__
    for func in (launcher.run_flower, launcher.predict_flower):
        d = _defaults(func)
        assert (d["round_timeout"], d["node_timeout"]) == (dd.ROUND_TIMEOUT, dd.NODE_TIMEOUT), func.__name__
    assert launcher.CLUSTERING_DEFAULTS == {
        "rank": dd.RANK_RULE, "preprocess": default("preprocess"), "normalize_views": default("normalize_views"),
        "normalize_embedding": default("normalize_embedding"), "kmeans_n_init": default("kmeans_n_init"),
        "kmeans_max_iter": default("kmeans_max_iter"), "early_stop": default("early_stop"),
        "refine": default("refine"), "refine_starts": default("refine_starts"),
        "refine_seeded_starts": default("refine_seeded_starts"),
        "refine_spectral_steps": default("refine_spectral_steps"), "n_init": default("n_init")}


#: run-config key of the Flower app -> the parameter it carries
RUN_CONFIG_PARAMS = {
    "num-rounds": "max_rounds", "tol": "tol", "algorithm": "algorithm", "rank": "n_components", "mu": "mu",
    "mu-scale": "mu_scale", "alpha": "alpha", "tau": "tau", "eta-g": "eta_g", "rho1": "rho1",
    "correction": "correction", "init-u": "init_u", "init-v": "init_v", "diagnostics": "diagnostics",
    "preprocess": "preprocess", "normalize-views": "normalize_views", "normalize-embedding": "normalize_embedding",
    "kmeans-n-init": "kmeans_n_init", "kmeans-max-iter": "kmeans_max_iter", "early-stop": "early_stop",
    "refine": "refine", "refine-starts": "refine_starts", "refine-seeded-starts": "refine_seeded_starts",
    "refine-spectral-steps": "refine_spectral_steps",
    "n-init": "n_init",
}


def test_the_flower_app_config_is_the_table():
    from fedsonmf.federation.flower.template import RUN_CONFIG_DEFAULTS as rc

    for key, name in RUN_CONFIG_PARAMS.items():
        assert rc[key] == default(name), key
    assert rc["secure-aggregation"] is FLOWER_SECURE_AGGREGATION
    assert (rc["seed"], rc["round-timeout"], rc["node-timeout"], rc["rejoin"], rc["rank-rule"]) == (
        dd.SEED, dd.ROUND_TIMEOUT, dd.NODE_TIMEOUT, dd.REJOIN, dd.RANK_RULE)


def test_the_server_app_reads_the_template_defaults():
    pytest.importorskip("flwr")
    from fedsonmf.federation.flower.server_app import _budget, config_from_run_config

    cfg = config_from_run_config({})
    assert cfg.to_dict() == FedConfig().replace(secure_aggregation=FLOWER_SECURE_AGGREGATION).to_dict()
    assert _budget(cfg, {}) == TABLE_BUDGET
    assert _budget(cfg.replace(diagnostics=False), {}) == (default("max_rounds"), 0.0)


# ------------------------------------------------------------------------------------------- the CLI
#: CLI option name -> the table parameter it sets (options named like the parameter map to it directly)
CLI_ALIASES = {"rounds": "max_rounds"}
#: deployment options -> their declared default
DEPLOYMENT_OPTIONS = {"round_timeout": dd.ROUND_TIMEOUT, "node_timeout": dd.NODE_TIMEOUT,
                      "rejoin": dd.REJOIN, "secure_aggregation": FLOWER_SECURE_AGGREGATION}
#: commands whose options deliberately depart from the table, with the declared departure
DEPARTURES = {("synthetic",): SYNTHETIC_DEFAULTS,
              # None = every study cell's own budget (fedsonmf.experiments.study_design), the paper's figures
              ("reproduce", "synthetic"): {"rounds": None}}


def _commands(cmd, path=()):
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, cmd


def _expected(path, name):
    departures = DEPARTURES.get(path, {})
    if name in departures:
        return departures[name]
    if name in DEPLOYMENT_OPTIONS and path[:1] == ("flower",):
        return DEPLOYMENT_OPTIONS[name]
    return default(CLI_ALIASES.get(name, name))


def _checked_options(path, cmd):
    for p in cmd.params:
        name = CLI_ALIASES.get(p.name, p.name)
        if isinstance(p, click.Option) and (name in PARAMS or (p.name in DEPLOYMENT_OPTIONS and path[0] == "flower")):
            yield p


def test_every_cli_option_takes_the_table_default():
    root = typer.main.get_command(app)
    checked, bad = 0, []
    for path, cmd in _commands(root):
        for p in _checked_options(path, cmd):
            want = _expected(path, p.name)
            got = p.default
            if p.name == "mu" and isinstance(got, str) and got != "auto":
                got = float(got)  # --mu is a number or 'auto' (parsed by cli.options.parse_mu)
            checked += 1
            if got != want:
                bad.append(f"fedsonmf {' '.join(path)} --{p.name}: {got!r}, table {want!r}")
    assert not bad, bad
    assert checked > 50  # every command group was seen


def test_the_synthetic_command_departs_only_as_declared():
    assert SYNTHETIC_DEFAULTS == {**SYNTHETIC_STUDY, "blas_threads": 1}
    root = typer.main.get_command(app)
    synthetic = root.commands["synthetic"]
    opts = {p.name: p.default for p in synthetic.params}
    assert (opts["rounds"], opts["tol"]) == TABLE_BUDGET
