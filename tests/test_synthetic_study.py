"""The synthetic-study runner: cells, outputs, resuming, CLI (tiny sizes)."""

import csv
import json

import pytest
from typer.testing import CliRunner

from fedsonmf.experiments import StudyConfig, run_study, study_cells
from fedsonmf.experiments.report import rounds_to
from fedsonmf.experiments.synthetic_study import unique_cells

TINY = dict(seeds=(0,), heterogeneity=(0.0, 0.9), taus=(2, 3), tau_main=3, rounds=3, rounds_one_step=4,
            n_clients=3, n_samples=20, n_features=8, rank=3, n_zero_rows=1)


def _numbers(out):
    """rounds.csv without the wall-time column."""
    with open(out / "rounds.csv") as fh:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(fh)]


def test_cells_cover_every_figure_and_are_shared():
    cfg = StudyConfig(seeds=(0, 1))
    figs = study_cells(cfg)
    assert len(figs["fig2"]) == 2 * 4 * 4 and len(figs["fig3"]) == 2 * 4 * 4 and len(figs["fig4"]) == 2 * 4 * 4
    cells = unique_cells(figs)
    # the proposed tau = 10 run belongs to Figs. 2, 3 and 4 but runs once
    assert len(cells) == 2 * 4 * (4 + 3 + 3)
    budgets = {c.algorithm: c.rounds for c in cells}
    assert budgets["local_tau1"] == budgets["server_update"] == cfg.rounds_one_step
    assert budgets["fedsonmf"] == budgets["no_correction"] == budgets["fedmavg"] == cfg.rounds


def test_rounds_to():
    rows = [{"round": 1, "m": 1.0}, {"round": 2, "m": 0.5}, {"round": 3, "m": 0.001}]
    assert rounds_to(rows, 1e-2, "m") == 3 and rounds_to(rows, 1e-4, "m") is None


def test_resume_gives_identical_numbers_and_recomputes_nothing(tmp_path):
    cfg = StudyConfig(**TINY)
    n_cells = len(unique_cells(study_cells(cfg)))
    fresh = tmp_path / "fresh"
    info = run_study(fresh, cfg)
    assert info == {**info, "computed": n_cells, "reused": 0, "complete": True}

    half = tmp_path / "half"
    first = run_study(half, cfg, jobs=2, max_cells=n_cells // 2)  # "interrupted": half the cells, in workers
    assert first["complete"] is False and not (half / "summary.md").exists()
    (half / "cells" / "junk.json.tmp").write_text("{")  # debris of a killed write is ignored
    second = run_study(half, cfg)
    assert second["computed"] == n_cells - n_cells // 2 and second["reused"] == n_cells // 2
    assert _numbers(half) == _numbers(fresh)
    third = run_study(half, cfg)
    assert third["computed"] == 0 and third["complete"]

    # a corrupt cell file or a changed specification is recomputed, nothing else
    victim = sorted((half / "cells").glob("fedmavg_*.json"))[0]
    victim.write_text("{not json")
    assert run_study(half, cfg, report=False)["computed"] == 1
    assert run_study(half, StudyConfig(**{**TINY, "rounds_one_step": 5}), report=False)["computed"] == 2 * 2


def test_outputs(tmp_path):
    cfg = StudyConfig(**TINY)
    run_study(tmp_path, cfg)
    for name in ("fig2_tau.png", "fig3_baselines.png", "fig4_ablation.png", "fig5_rounds_to_target.png"):
        assert (tmp_path / name).stat().st_size > 1000
    meta = json.loads((tmp_path / "config.json").read_text())
    assert StudyConfig.from_dict(meta["study"]) == cfg and meta["run"]["complete"]
    summary = (tmp_path / "summary.md").read_text()
    for metric in ("R_rel", "R_avg_rel", "R_rel0", "R_avg_rel0"):
        assert f"### {metric} = " in summary
    with open(tmp_path / "rounds.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["algorithm"] for r in rows} == {"fedsonmf", "fedmavg", "fedmgs", "fedvra", "server_update",
                                              "local_tau1", "no_correction"}
    with open(tmp_path / "rounds_to_target.csv") as fh:
        assert len(list(csv.DictReader(fh))) == len(unique_cells(study_cells(cfg)))


def test_bad_study_parameters_raise_before_running():
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        StudyConfig(**{**TINY, "baselines": ("nope",)})
    with pytest.raises(ValueError, match="rounds must be"):
        StudyConfig(**{**TINY, "rounds": 0})
    with pytest.raises(ValueError, match="figure_metric"):
        StudyConfig(**{**TINY, "figure_metric": "R_V"})


def test_cli_quick_runs_and_resumes(tmp_path):
    from fedsonmf.cli.app import app

    args = ["reproduce", "synthetic", "--quick", "--seeds", "1", "--rounds", "1", "--rounds-one-step", "1",
            "--quiet", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "36 cells computed, 0 reused" in res.output and (tmp_path / "summary.md").exists()
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and "0 cells computed, 36 reused" in res.output


def test_estimator_and_cli_select_baselines(tmp_path):
    from fedsonmf.cli.app import app

    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["synthetic", "--algorithm", "fedmavg", "--rounds", "2", "--clients", "3",
                                   "--samples", "20", "--features", "8", "--rank", "3", "-q", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["config"]["algorithm"] == "fedmavg"
