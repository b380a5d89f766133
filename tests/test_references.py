"""The simple centralized references: each clusters a planted problem, keeps its own
scaling whatever the caller did, survives empty samples and sparse views, and reaches the table."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import planted
from fedsonmf.datasets.mat import MultiViewDataset
from fedsonmf.experiments.references import (
    REFERENCES,
    best_reference,
    knn_affinity,
    row_normalize_view,
    run_reference,
)
from fedsonmf.experiments.table1 import CONTEXT_METHODS, rows_for, run_dataset, standing
from fedsonmf.metrics import clustering_scores


@pytest.mark.parametrize("name", list(REFERENCES))
def test_every_reference_clusters_a_planted_problem(name):
    Xs, y = planted()
    labels = run_reference(name, Xs, 3, random_state=0)
    assert labels.shape == (y.size,)
    assert clustering_scores(y, labels)["acc"] == pytest.approx(1.0)


@pytest.mark.parametrize("name", list(REFERENCES))
def test_references_scale_themselves_and_take_sparse_views(name):
    Xs, y = planted()
    a = run_reference(name, Xs, 3, random_state=0)
    b = run_reference(name, [7.0 * X for X in Xs], 3, random_state=0)  # the view's scale does not matter
    assert clustering_scores(a, b)["acc"] == pytest.approx(1.0)
    c = run_reference(name, [sp.csr_matrix(X) for X in Xs], 3, random_state=0)
    assert clustering_scores(y, c)["acc"] == pytest.approx(1.0)
    wide = [sp.csr_array(X) for X in Xs]  # 64-bit indices, which scikit-learn's k-means refuses itself
    for W in wide:
        W.indices, W.indptr = W.indices.astype(np.int64), W.indptr.astype(np.int64)
    np.testing.assert_array_equal(run_reference(name, wide, 3, random_state=0), c)


def test_row_normalisation_and_knn_graph_ignore_empty_samples():
    Xs, y = planted()
    X = Xs[0].copy()
    X[0] = 0.0
    R = row_normalize_view(X)
    assert np.all(R[0] == 0) and np.allclose(np.linalg.norm(R[1:], axis=1), 1.0)
    A = knn_affinity(X, 5)
    assert A[[0]].nnz == 0 and A.shape == (y.size, y.size)
    assert (A != A.T).nnz == 0  # symmetric
    for name in REFERENCES:
        assert run_reference(name, [X, *Xs[1:]], 3, random_state=0).shape == (y.size,)


def test_unknown_reference_and_best():
    with pytest.raises(ValueError, match="unknown reference"):
        run_reference("nope", planted()[0], 3)
    assert best_reference({"fedsonmf": 99.0, "kmeans-rownorm": 80.0, "mv-spectral": 81.0}) == ("mv-spectral", 81.0)
    assert best_reference({"fedsonmf": 99.0}) is None


def test_table_runs_every_reference_and_marks_the_best():
    Xs, y = planted()
    ds = MultiViewDataset(views=Xs, labels=y + 1, view_names=["a", "b", "c"], name="planted")
    res = run_dataset(ds, key="planted", label="planted", methods=["fedsonmf", *CONTEXT_METHODS, "kmeans-concat"],
                      seeds=[0], params={"max_rounds": 20, "tol": 0.0})
    assert set(res.reports) == {"fedsonmf", *CONTEXT_METHODS}  # the old name is an alias
    names = [r["method"] for r in rows_for(res)]
    assert sum("(best reference)" in n for n in names) == 1
    assert "against the best centralized reference" in standing(res)
    assert res.to_dict()["best_reference"][0] in REFERENCES


def test_cluster_context_reports_every_reference_in_the_same_run(tmp_path):
    import json

    from typer.testing import CliRunner

    from fedsonmf.cli.app import app

    Xs, y = planted()
    paths = []
    for p, X in enumerate(Xs):
        np.save(tmp_path / f"v{p}.npy", X)
        paths.append(str(tmp_path / f"v{p}.npy"))
    np.savetxt(tmp_path / "y.csv", y + 1, fmt="%d")
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, ["cluster", *paths, "--labels", str(tmp_path / "y.csv"), "--seeds", "1",
                                      "--context", "--rounds", "10", "-q", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "points)" in result.output  # the standing line (rich may wrap it)
    doc = json.loads(out.read_text())["result"]
    assert set(doc["reports"]) == {"fedsonmf", *CONTEXT_METHODS}
    assert doc["best_reference"][0] in REFERENCES
