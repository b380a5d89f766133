"""Which approximate k-NN library for the graph stage: recall of the exact graph and CPU seconds.

One planted sparse view (:func:`bench_scale_clustering.make_planted`: d_p = 2 000 at 1 %, c = 10),
rows scaled to unit norm, k = 20 neighbours by cosine. The exact neighbours of 1 000 random samples
are the reference. Searched: pynndescent on the sparse view as it is; hnswlib, usearch and faiss-cpu
(HNSW) on the view densified (float32; ``--dense``, n x d_p floats, so only at small n); and the
four on a truncated SVD of the view (``--svd-dim``), their candidates re-ranked by exact cosine.
Needs the libraries: ``pip install pynndescent hnswlib usearch faiss-cpu`` (only usearch is a
dependency of fedsonmf, in the extra ``fedsonmf[scale]``; the graph stage's own search, candidates
from a principal subspace ranked by exact cosine, is timed by ``bench_scale_clustering.py``).

    nice -n 10 env OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/bench_scale_knn.py \
        --n 10000 --dense --svd-dim 64

pynndescent compiles its loops (numba) at its first search in a process: it runs twice, and the
second figure is the search alone. Prints one line per library and space.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale_clustering import make_planted  # noqa: E402

K = 20


def search(lib: str, Z, width: int):
    """The ``width`` nearest rows of every row of ``Z`` (unit rows; by inner product)."""
    if lib == "pynndescent":
        import pynndescent

        metric = "cosine" if sp.issparse(Z) else "dot"
        return pynndescent.NNDescent(Z, metric=metric, n_neighbors=width, random_state=0, n_jobs=1,
                                     compressed=True).neighbor_graph[0]
    n, dim = Z.shape
    if lib == "hnswlib":
        import hnswlib

        index = hnswlib.Index(space="ip", dim=dim)
        index.init_index(max_elements=n, ef_construction=100, M=16)
        index.set_num_threads(1)
        index.add_items(Z)
        index.set_ef(2 * width)
        return index.knn_query(Z, k=width)[0]
    if lib == "usearch":
        from usearch.index import Index

        index = Index(ndim=dim, metric="ip", dtype="f32")
        index.add(np.arange(n), Z, threads=1)
        return index.search(Z, width, threads=1).keys.astype(np.int64)
    if lib == "faiss":
        import faiss

        faiss.omp_set_num_threads(1)
        index = faiss.IndexHNSWFlat(dim, 16, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = 2 * width
        index.add(Z)
        return index.search(Z, width)[1]
    raise ValueError(lib)


def main(argv=None) -> int:
    from sklearn.utils.extmath import randomized_svd

    from fedsonmf.pipeline.refine import refine_view

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--dense", action="store_true", help="also hnswlib, usearch, faiss on the densified view")
    ap.add_argument("--svd-dim", type=int, default=0, help="also every library on a truncated SVD (0: none)")
    ap.add_argument("--libraries", nargs="+", default=["pynndescent", "hnswlib", "usearch", "faiss"])
    args = ap.parse_args(argv)
    n = args.n
    views, labels = make_planted(n)
    X = sp.csr_matrix(refine_view(views[0]))
    Q = np.random.default_rng(1).choice(n, min(1000, n), replace=False)
    S = (X[Q] @ X.T).toarray()
    S[np.arange(Q.size), Q] = -np.inf
    E = np.argpartition(-S, K, axis=1)[:, :K]
    print(f"n={n}: exact neighbours in the planted cluster {np.mean(labels[E] == labels[Q][:, None]):.3f}")

    def report(name, nbrs, seconds):
        nbrs = np.asarray(nbrs)
        found = [np.isin(E[i], nbrs[q][nbrs[q] != q][:K]).mean() for i, q in enumerate(Q)]
        same = [np.mean(labels[nbrs[q][nbrs[q] != q][:K]] == labels[q]) for q in Q]
        print(f"{name}: {seconds:.1f} s CPU, recall {np.mean(found):.3f}, in the cluster {np.mean(same):.3f}",
              flush=True)

    spaces = [("sparse view", X)]
    if args.dense:
        spaces.append(("dense view", X.toarray().astype(np.float32)))
    if args.svd_dim:
        U, s, _ = randomized_svd(X, args.svd_dim, n_iter=2, random_state=0)
        Z = (U * s).astype(np.float32)
        spaces.append((f"SVD-{args.svd_dim}", Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-12)))
    for space, Z in spaces:
        for lib in args.libraries:
            if (space == "sparse view") != (lib == "pynndescent") and not space.startswith("SVD"):
                continue  # a sparse view: pynndescent alone; the densified one: the three others
            runs = 2 if lib == "pynndescent" else 1
            for run in range(runs):
                t0 = time.process_time()
                nbrs = search(lib, Z, K + 1)
                suffix = " (with compilation)" if runs == 2 and run == 0 else ""
                report(f"{lib} on the {space}{suffix}", nbrs, time.process_time() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
