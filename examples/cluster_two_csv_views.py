"""Cluster the samples of two CSV views held by two organisations (one client per view).

Each organisation has its own file: rows are samples, an ``id`` column names them (in any order
-- ids only order each client's rows locally, they never leave it), the other columns are that
organisation's features.  The script writes two such files, loads them, clusters the samples
federatedly, scores the clusters against the labels (which the fit never sees), picks a
parameter without labels by cross-validation over the samples of both views, and writes the
clusters as CSV.

    python examples/cluster_two_csv_views.py [OUT_DIR]
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

from fedsonmf.datasets import load_views
from fedsonmf.estimators import FedMultiViewClustering, MethodOptions
from fedsonmf.metrics import clustering_scores
from fedsonmf.model_selection import GridSearchCV


def write_views(out: Path, n_per_cluster=30, seed=0):
    """Two views of 3 clusters (each cluster lights up its own block of features), rows shuffled per file."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), n_per_cluster)
    ids = np.array([f"s{i:03d}" for i in range(y.size)])
    for name, d in (("hospital.csv", 12), ("lab.csv", 9)):
        centers = np.kron(np.eye(3), np.ones((1, d // 3)))
        X = centers[y] + 0.3 * rng.random((y.size, d))
        order = rng.permutation(y.size)  # each organisation stores its rows in its own order
        header = "id," + ",".join(f"{name.split('.')[0]}_{j}" for j in range(d))
        rows = [f"{ids[i]}," + ",".join(f"{v:.6f}" for v in X[i]) for i in order]
        (out / name).write_text(header + "\n" + "\n".join(rows) + "\n")
    (out / "labels.csv").write_text("id,label\n" + "\n".join(f"{i},{c}" for i, c in zip(ids, y)) + "\n")


def main(out: Path):
    write_views(out)
    ds = load_views([out / "hospital.csv", out / "lab.csv"], labels=out / "labels.csv")
    print(f"{ds.n_samples} samples, views of {ds.n_features} features")

    model = FedMultiViewClustering(n_clusters=3, random_state=0)
    labels = model.fit_predict(ds.views)
    print("scores against the labels:", {k: round(v, 3) for k, v in clustering_scores(ds.labels, labels).items()})
    print(f"rank r={model.n_components_}, {model.n_iter_} rounds, mu={model.mu_:.3g}")

    # choose tau without labels: the label-free score on held-out samples of *both* views
    grid = {"method": [MethodOptions(tau=5), MethodOptions(tau=10)]}
    search = GridSearchCV(FedMultiViewClustering(3, random_state=0), grid, cv=3)
    search.fit(ds.views)
    print("best tau (label-free):", search.best_params_["method"].tau)

    path = out / "clusters.csv"
    path.write_text("sample_id,cluster\n" + "\n".join(f"{i},{c}" for i, c in zip(ds.ids, labels)) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="fedsonmf-example-"))
    out.mkdir(parents=True, exist_ok=True)
    main(out)
