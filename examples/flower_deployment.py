"""The clustering pipeline on a real Flower deployment, on this machine (needs ``pip install ".[flower]"``).

``engine="flower"`` starts a SuperLink and one SuperNode per view as separate processes on
127.0.0.1 (TLS with a per-deployment CA, one key per node, each view pinned to its node, secure
aggregation of every upload), runs the same federation as in-process, and stops everything it
started.  With the same seed the labels equal the in-process estimator's, bit for bit.  Expect a
minute or two: Flower's start-up and polling dominate at this size.

The same from the command line:

    fedsonmf flower views views/ --clients 3 --samples 100 --features 20 --rank 6
    fedsonmf flower cluster views/view*.npy --clusters 3 --out run --rounds 10

Separate machines: the recipe in docs/flower.md ("Real multiple machines").

    python examples/flower_deployment.py [RUN_DIR]
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

from fedsonmf.datasets import make_synthetic
from fedsonmf.estimators import FedMultiViewClustering, Flower


def main(run_dir: Path):
    data = make_synthetic(n_clients=3, n_samples=60, n_features=12, rank=3, random_state=0)
    # one fit (n_init=1) keeps the example short: a Flower exchange costs seconds, not milliseconds
    params = dict(n_clusters=3, max_rounds=10, tol=0, random_state=0, n_init=1)
    flower = FedMultiViewClustering(federation=Flower(run_dir=run_dir), **params).fit(data.views)
    local = FedMultiViewClustering(**params).fit(data.views)
    print(f"Flower run folder: {flower.flower_run_dir_}")
    print("same labels as in-process:", bool(np.array_equal(flower.labels_, local.labels_)))
    print("cluster sizes:", np.bincount(flower.labels_).tolist())


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="fedsonmf-flower-")))
