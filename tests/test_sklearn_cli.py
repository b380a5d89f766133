"""The CLI refuses at once what cannot work, in one ``error:`` line (exit 2), typer's own errors included."""

import numpy as np
import pytest

from fedsonmf.cli.app import main


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.parametrize("argv", [
    ["bogus"],
    ["cluster"],
    ["cluster", "--rank", "abc", "x.csv"],
    ["synthetic", "--tau"],
    ["synthetic", "--no-such-option"],
    ["reproduce", "table1", "--seeds", "x"],
])
def test_typer_usage_errors_are_one_error_line_exit_2(argv, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "╭" not in err and "Traceback" not in err


@pytest.fixture
def two_csv_views(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.savetxt("a.csv", rng.random((30, 5)), delimiter=",")
    np.savetxt("b.csv", rng.random((30, 7)), delimiter=",")
    return tmp_path


def test_too_large_rank_is_refused_at_once(two_csv_views, capsys, monkeypatch):
    import fedsonmf.estimators.clustering as clu

    monkeypatch.setattr(clu.FedMultiViewClustering, "fit", lambda *a, **k: pytest.fail("a fit started"))
    code, _, err = _run(["cluster", "a.csv", "b.csv", "-k", "3", "--rank", "100000"], capsys)
    assert code == 2 and "error: --rank 100000 exceeds the features of view 0 (5" in err


def test_labels_out_writes_the_clusters(two_csv_views, capsys):
    code, out, _ = _run(["cluster", "a.csv", "b.csv", "-k", "3", "--rounds", "3", "-q", "--labels-out", "l.csv"],
                        capsys)
    assert code in (0, None)
    lines = (two_csv_views / "l.csv").read_text().splitlines()
    assert lines[0] == "sample_id,cluster" and len(lines) == 31
    assert {int(line.split(",")[1]) for line in lines[1:]} <= {0, 1, 2}


def test_only_matches_data_set_names_not_path_substrings(tmp_path):
    from fedsonmf.exceptions import InputError
    from fedsonmf.experiments.table1 import select_datasets

    files = [tmp_path / p for p in ("BBCSport/zskong/BBCSport.mat", "BBCSport/xiyu/BBCSport.mat",
                                    "3Sources/zskong/Data_3Sources.mat", "MSRC-v1/a/MSRC_v1.mat")]
    rel = lambda ps: [str(p.relative_to(tmp_path)) for p in ps]  # noqa: E731
    assert rel(select_datasets(files, tmp_path, ["bbcsport"])) == rel(files[:2])
    assert rel(select_datasets(files, tmp_path, ["BBCSport/zskong"])) == rel(files[:1])
    assert rel(select_datasets(files, tmp_path, ["3Sources/zskong/Data_3Sources.mat", "MSRC-v1"])) == rel(files[2:])
    assert select_datasets(files, tmp_path, None) == files
    with pytest.raises(InputError, match=r"--only 'zskong' names no data set.*data sets: 3Sources, BBCSport, MSRC-v1"):
        select_datasets(files, tmp_path, ["zskong"])
    with pytest.raises(InputError, match="'BBC'"):
        select_datasets(files, tmp_path, ["BBC"])  # no substring matches


def test_rounds_bar_follows_r_rel_towards_tol():
    from fedsonmf.cli.progress import round_fraction, round_status

    row = {"round": 20, "R_rel": 1e-2, "objective": 1.0, "effective_rank": 3}
    assert round_fraction(row, 200, 1e-4) == pytest.approx(0.5)  # half way from 1 to 1e-4 on a log scale
    assert round_fraction(row, 200, 0.0) == pytest.approx(0.1)  # no tolerance: rounds of the budget
    assert round_fraction({**row, "R_rel": 1e-5}, 200, 1e-4) == 1.0
    assert round_fraction({"round": 5, "effective_rank": 3}, 10, 1e-4) == 0.5  # no diagnostics
    text = round_status(row, 200, 1e-4)
    assert "round 20/200" in text and "R/R1=1.00e-02 -> 1e-04" in text
    step = {"round": 20, "R_step_rel": 1e-2, "effective_rank": 3}  # a clustering fit's row: the step's residual
    assert round_fraction(step, 200, 1e-4) == pytest.approx(0.5)
    assert "R_step/R_step1=1.00e-02 -> 1e-04" in round_status(step, 200, 1e-4)


def test_progress_bars_run_with_eta(two_csv_views, capsys):
    import io

    from rich.console import Console

    from fedsonmf.cli.progress import RoundProgress

    buf = io.StringIO()
    with RoundProgress(10, tol=1e-4, console=Console(file=buf, force_terminal=False, width=150)) as bar:
        for k in range(1, 4):
            bar.update({"round": k, "R_rel": 10.0 ** -k, "objective": 1.0, "effective_rank": 2})
    assert "ETA" in buf.getvalue() and "round 3/10" in buf.getvalue()
    code, _, _ = _run(["cluster", "a.csv", "b.csv", "-k", "3", "--rounds", "3"], capsys)
    assert code in (0, None)


def test_n_jobs_gives_the_same_clusters_and_the_bar_averages_the_restarts(two_csv_views, capsys):
    """--n-jobs 2 runs the restarts in threads: the same assignments as --n-jobs 1; the progress bar
    (one for all restarts of a fit) shows their mean way to the end and names the row's restart."""
    from fedsonmf.cli.cluster import _Progress
    from fedsonmf.cli.progress import UNITS

    for jobs in ("1", "2"):
        code, _, _ = _run(["cluster", "a.csv", "b.csv", "-k", "3", "--rounds", "4", "--n-init", "3", "-q",
                           "--n-jobs", jobs, "--labels-out", f"l{jobs}.csv"], capsys)
        assert code in (0, None)
    assert (two_csv_views / "l1.csv").read_text() == (two_csv_views / "l2.csv").read_text()
    with _Progress(True, 1, 10) as prog:
        prog.on_round({"round": 5, "effective_rank": 3, "restart": 0, "n_restarts": 2})
        prog.on_round({"round": 10, "effective_rank": 3, "restart": 1, "n_restarts": 2})
        task = prog.progress.tasks[prog.rounds]
        assert task.completed == pytest.approx(UNITS * (0.5 + 1.0) / 2)
        assert task.fields["status"].startswith("restart 2/2  round 10/10")
        prog.on_seed("fedsonmf", 0, {"acc": 0.5})  # the next seed's fit starts from nothing
        prog.on_round({"round": 5, "effective_rank": 3, "restart": 1, "n_restarts": 2})
        assert prog.progress.tasks[prog.rounds].completed == pytest.approx(UNITS * 0.25)


def test_score_matches_clustering_scores_in_any_row_order(tmp_path, capsys, monkeypatch):
    """fedsonmf score: a Flower labels.csv (ids = positions) against one label per line, and a file of
    real ids against id,label pairs listed in another order, give the library's scores; bad pairs exit 2."""
    import json

    from sklearn.metrics import adjusted_rand_score

    from fedsonmf.metrics import clustering_scores

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    y, pred = rng.integers(0, 3, 40), rng.integers(0, 4, 40)
    want = {**clustering_scores(y, pred), "ari": adjusted_rand_score(y, pred)}
    (tmp_path / "labels.csv").write_text("sample_id,cluster\n" + "".join(f"{i},{k}\n" for i, k in enumerate(pred)))
    (tmp_path / "y.txt").write_text("".join(f"class{k}\n" for k in y))
    code, out, _ = _run(["score", "labels.csv", "--labels", "y.txt", "--json", "s.json"], capsys)
    assert code in (0, None) and "40 samples, 4 clusters, 3 classes" in out
    got = json.loads((tmp_path / "s.json").read_text())["scores"]
    assert got == pytest.approx(want)
    ids = [f"p{i:03d}" for i in range(40)]
    a, b = rng.permutation(40), rng.permutation(40)
    (tmp_path / "own.csv").write_text("id,cluster\n" + "".join(f"{ids[i]},{pred[i]}\n" for i in a))
    (tmp_path / "yid.csv").write_text("id,label\n" + "".join(f"{ids[i]},{y[i]}\n" for i in b))
    code, out, _ = _run(["score", "own.csv", "--labels", "yid.csv", "--json", "t.json"], capsys)
    assert code in (0, None)
    assert json.loads((tmp_path / "t.json").read_text())["scores"] == pytest.approx(want)
    (tmp_path / "short.csv").write_text("id,label\n" + "".join(f"{ids[i]},{y[i]}\n" for i in b[:-1]))
    (tmp_path / "dup.csv").write_text("id,cluster\n" + "".join(f"{ids[i]},{pred[i]}\n" for i in [*a, a[0]]))
    for clusters, labels, message in (("own.csv", "y.txt", "must be id,label pairs"),
                                      ("own.csv", "short.csv", "no label for 1 samples"),
                                      ("dup.csv", "yid.csv", "dup.csv: duplicate ids")):
        code, _, err = _run(["score", clusters, "--labels", labels], capsys)
        assert code == 2 and err.startswith("error: ") and message in err
