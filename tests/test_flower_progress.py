"""The progress of a Flower run without a deployment: the ServerApp's ``status.json``
(:class:`StatusFile`) and the CLI's display of it (:class:`FlowerProgress`)."""

import io
import json

import pytest
from rich.console import Console

from fedsonmf.cli.flower import FlowerProgress


@pytest.fixture
def shown(monkeypatch):
    """``make(total) -> (FlowerProgress(total), its task, output)``: the display, rendered to a string buffer."""
    buf, made = io.StringIO(), []
    monkeypatch.setattr("rich.console.Console", lambda **kw: Console(file=buf, width=160))

    def make(total):
        prog = FlowerProgress(total).__enter__()
        made.append(prog)
        return prog, prog._progress.tasks[0], buf

    yield make
    for prog in made:  # stop the live displays' refresh threads
        prog.__exit__(None, None, None)


def test_status_file_counts_the_clustering_exchanges(tmp_path, monkeypatch):
    server_app = pytest.importorskip("fedsonmf.federation.flower.server_app")  # imports flwr
    now = [100.0]
    monkeypatch.setattr(server_app.time, "time", lambda: now[0])
    path = tmp_path / "status.json"
    status = server_app.StatusFile(path, max_rounds=200)

    def read():
        return json.loads(path.read_text())

    status.exchange_started("round", 1)
    status.round_done(1, 2.0)
    status.exchange_started("init", 0)  # not a clustering kind, outside the clustering phase: ignored
    assert read()["phase"] == "round" and "exchanges" not in read()
    status.write(phase="clustering")
    assert "stage" not in read()
    now[0] = 110.0
    status.exchange_started("refine", 1)
    st = read()
    assert (st["phase"], st["stage"], st["exchanges"], st["exchange_started_at"]) == ("clustering", "refine", 1, 110.0)
    assert "seconds_per_exchange" not in st
    for s, t in ((2, 115.0), (3, 121.0)):
        now[0] = t
        status.exchange_started("refine", s)
    now[0] = 122.0
    status.exchange_started("graph", 1)  # each stage's counter starts at 1: the file counts them all
    st = read()
    assert (st["phase"], st["stage"], st["exchanges"], st["exchange_started_at"]) == ("clustering", "graph", 4, 122.0)
    assert st["seconds_per_exchange"] == pytest.approx(4.0)  # (122 - 110) / 3 gaps
    now[0] = 125.0
    status.exchange_started("unmask", 0)  # any other kind in the clustering phase counts too
    st = read()
    assert (st["stage"], st["exchanges"], st["seconds_per_exchange"]) == ("unmask", 5, pytest.approx(3.75))
    assert st["rounds_done"] == 1 and st["round"] == 1 and st["max_rounds"] == 200


def test_progress_shows_the_clustering_exchanges(shown):
    prog, task, _ = shown(200)
    prog.update({"status": "running", "phase": "round", "round": 31, "rounds_done": 30, "seconds_per_round": 1.0})
    assert task.description == "rounds" and task.fields["status"].startswith("round 31 of 200")
    prog.update({"status": "running", "phase": "clustering", "rounds_done": 31})
    # the rounds ran (early stop): their bar ends at 31/31, not stuck at 31/200, its clock stopped there
    assert (task.description, task.total, task.completed) == ("rounds", 31, 31) and task.finished
    assert task.fields["status"] == "done: 31 of at most 200 rounds"
    clu = prog._progress.tasks[1]  # the clustering phase's own bar: exchanges of an unknown count
    assert (clu.description, clu.fields["status"], clu.total) == ("clustering", "k-means on V", None)
    assert not clu.finished and clu.elapsed is not None  # its clock runs on
    prog.update({"status": "running", "phase": "clustering", "rounds_done": 31, "stage": "refine", "exchanges": 1})
    assert clu.fields["status"] == "k-means refinement, exchange 1" and clu.completed == 1
    prog.update({"status": "running", "phase": "clustering", "rounds_done": 31, "stage": "refine",
                 "exchanges": 12, "seconds_per_exchange": 5.08})
    assert clu.fields["status"] == "k-means refinement, exchange 12 (5.1 s/exchange)" and clu.completed == 12
    prog.update({"status": "running", "phase": "clustering", "rounds_done": 31, "stage": "graph", "exchanges": 13})
    assert clu.fields["status"] == "graph refinement, exchange 13"
    prog.update({"status": "running", "phase": "clustering", "rounds_done": 31, "stage": "spectral",
                 "exchanges": 17, "seconds_per_exchange": 4.96})
    assert clu.fields["status"] == "spectral step, exchange 17 (5.0 s/exchange)"
    assert "ETA" not in clu.fields["status"] and not clu.finished and len(prog._progress.tasks) == 2
    prog.update({"status": "completed", "phase": "done", "rounds_done": 31, "n_rounds": 31, "exchanges": 17})
    assert (clu.total, clu.completed, clu.fields["status"]) == (17, 17, "done") and clu.finished
    assert (task.total, task.completed) == (31, 31)


def test_progress_after_an_early_stop_shows_the_rounds_run(shown):
    prog, task, buf = shown(200)
    prog.update({"status": "running", "phase": "round", "round": 31, "rounds_done": 30})
    prog.update({"status": "completed", "phase": "done", "round": 31, "rounds_done": 31, "n_rounds": 31})
    assert (task.total, task.completed) == (31, 31)
    assert task.fields["status"] == "done: 31 of at most 200 rounds"
    prog.__exit__(None, None, None)  # the final render
    assert "31/31" in buf.getvalue() and "200/200" not in buf.getvalue()


def test_progress_after_the_full_budget_says_done(shown):
    prog, task, _ = shown(50)
    prog.update({"status": "completed", "phase": "done", "rounds_done": 50, "n_rounds": 50})
    assert (task.total, task.completed, task.fields["status"]) == (50, 50, "done")


def test_progress_of_a_predict_run(shown):
    prog, task, _ = shown(0)
    prog.update({"status": "running", "phase": "embed", "rounds_done": 0})
    assert task.fields["status"] == "embedding the new samples"
    prog.update({"status": "completed", "phase": "done", "rounds_done": 0, "mode": "predict"})
    assert (task.description, task.total, task.completed, task.fields["status"]) == ("embed", 1, 1, "done")


def test_fits_at_once_report_each_fits_rounds_and_the_bar_follows_the_slowest(tmp_path, shown):
    """A clustering run's fits at once: ``status.json`` counts every fit's rounds (a resumed fit from
    its checkpoint's), ``rounds_done`` is the slowest running fit's, and the display shows them all."""
    server_app = pytest.importorskip("fedsonmf.federation.flower.server_app")  # imports flwr
    path = tmp_path / "status.json"
    status = server_app.StatusFile(path, max_rounds=30, n_restarts=3)
    for i, k in ((0, 0), (1, 4), (2, 0)):  # each thread announces its fit; fit 1 resumes after round 4
        status.fits_started({i: k})
    status.fit_round_done(0, 1, 2.0)
    status.fit_round_done(2, 1, 4.0)
    st = json.loads(path.read_text())
    assert st["fit_rounds"] == {"0": 1, "1": 4, "2": 1} and st["fits_running"] == [0, 1, 2]
    assert st["rounds_done"] == 1 and st["seconds_per_round"] == pytest.approx(3.0)
    for s in range(2, 6):
        status.fit_round_done(0, s, 2.0)
    status.fit_finished(0)  # fit 0 stopped early: the others decide the bar
    status.fit_round_done(2, 2, 2.0)
    st = json.loads(path.read_text())
    assert st["fits_running"] == [1, 2] and st["rounds_done"] == 2
    prog, task, _ = shown(30)
    prog.update({**st, "phase": "round", "round": 5})
    assert task.completed == 2 and task.fields["status"].startswith("3 fits at once, rounds 5/4/2 of 30, ")
    assert "ETA" in task.fields["status"]
    for i in (1, 2):
        status.fit_finished(i)
    assert json.loads(path.read_text())["rounds_done"] == 5  # none running: the longest fit's rounds
