"""Incomplete views: each organisation holds only some of the samples (docs/algorithm.md §15.1).

Two views of the same 90 samples, but each file holds a different subset (ids in an ``id``
column); ``load_views(..., missing="mask")`` aligns them over the union of the ids and returns
each view's availability mask.  The fit never reads a row outside its view's mask, and each
client uploads only the columns it holds (the server learns which positions each client holds,
nothing more).  Every sample still gets a cluster: the shared V covers all of them.

    python examples/incomplete_views.py [OUT_DIR]
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

from fedsonmf.datasets import load_views
from fedsonmf.estimators import FedMultiViewClustering
from fedsonmf.metrics import clustering_scores


def main(out: Path, seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), 30)
    ids = np.array([f"p{i:03d}" for i in range(y.size)])
    held = {"clinic.csv": rng.random(y.size) < 0.8, "survey.csv": rng.random(y.size) < 0.7}
    held["survey.csv"] |= ~held["clinic.csv"]  # every sample is held by at least one view
    for (name, mask), d in zip(held.items(), (12, 9)):
        X = np.kron(np.eye(3), np.ones((1, d // 3)))[y] + 0.3 * rng.random((y.size, d))
        rows = [f"{ids[i]}," + ",".join(f"{v:.6f}" for v in X[i]) for i in np.flatnonzero(mask)]
        (out / name).write_text("id," + ",".join(f"f{j}" for j in range(d)) + "\n" + "\n".join(rows) + "\n")
        print(f"{name}: {mask.sum()} of {y.size} samples")
    (out / "labels.csv").write_text("id,label\n" + "\n".join(f"{i},{c}" for i, c in zip(ids, y)) + "\n")

    ds = load_views([out / name for name in held], labels=out / "labels.csv", missing="mask")
    print("held per view:", [int(np.sum(m)) for m in ds.masks])
    model = FedMultiViewClustering(n_clusters=3, random_state=0).fit(ds.views, masks=ds.masks)
    print("scores over all samples:",
          {k: round(v, 3) for k, v in clustering_scores(ds.labels, model.labels_).items()})


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="fedsonmf-example-"))
    out.mkdir(parents=True, exist_ok=True)
    main(out)
