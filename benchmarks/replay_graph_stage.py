"""Replay the graph stage of default clustering fits on other graphs (docs/clustering.md, stop 48-49).

The graph stage (the graph refinement and its spectral step) starts from the k-means refinement's
partition. That partition is what a fit with ``refine="kmeans"`` returns (the same restarts, the
same k-means stage), so this script fits once per data set and seed with ``refine="kmeans"``, then
runs :func:`~fedsonmf.estimators.spectral.graph_stage` from it, in process and without secure
aggregation, with each client's k-NN graph built by the variant under test, ended by the
estimator's ``refine_graph_choice`` (the default: the stage's medoid). The variant ``rule`` is the
library's own graph, so its column is the default fit's ACC (``--check`` fits the default too and
says whether the labels agree). Label-free variants only; labels only score.

    OMP_NUM_THREADS=1 python benchmarks/replay_graph_stage.py --seeds 2 --variants rule,reference-k,both-k \\
        ../shared/data/MSRC-v1/youweiliang/MSRC_v1.mat FOLDER/*.mat --json replay.json

Variants: ``rule`` (:func:`~fedsonmf.estimators.graph.graph_neighbors` with c, the default),
``cut`` (the rule's graph, the stage ended by the cut rule alone: ``refine_graph_choice="cut"``,
the default before stop 50), ``reference-k`` (the multi-view spectral reference's
k = max(10, round(log2 n))), ``both-k`` (each client sums its graphs at the two k: nearer
neighbours weigh double), ``shared-neighbours`` (each k-NN edge weighted by the Jaccard overlap of
the two samples' neighbour sets), and
``spectral-raw`` (not a graph: the rule's graph, but the spectral candidate's partition before its
own graph refinement, i.e. k-means on the 20-step spectral block, always kept).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedsonmf import FedMultiViewClustering
from fedsonmf._io import write_json_atomic
from fedsonmf._provenance import meta
from fedsonmf.core.masks import held_columns
from fedsonmf.datasets import load_mat
from fedsonmf.estimators.clustering_steps import (
    graph_products,
    graph_reply,
    graph_stage,
    graph_view,
    spectral_steps,
)
from fedsonmf.estimators.graph import graph_neighbors
from fedsonmf.estimators.spectral import spectral_partition
from fedsonmf.metrics import clustering_accuracy

VARIANTS = ("rule", "cut", "reference-k", "both-k", "shared-neighbours", "spectral-raw")


def _reference_k(X) -> int:
    return graph_neighbors(X.shape[0])


def shared_neighbour_graph(X, held, n_clusters: int):
    """The rule's k-NN graph with every edge (i, j) weighted by |N(i) & N(j)| / |N(i) | N(j)|, N(i)
    being i and its neighbours in that symmetric graph (a superset of its k nearest: the graph before
    symmetrisation is not exposed); tied neighbours count with their share of an edge."""
    A = graph_view(X, held=held, n_clusters=n_clusters)
    N = sp.csr_array(A + sp.eye_array(A.shape[0], format="csr") * (np.asarray(A.sum(axis=1)).ravel() > 0))
    inter = sp.csr_array(N @ N.T).multiply(A > 0)
    size = np.asarray(N.sum(axis=1)).ravel()
    inter = sp.coo_array(inter)
    w = inter.data / (size[inter.row] + size[inter.col] - inter.data)
    return sp.csr_array((w, (inter.row, inter.col)), shape=A.shape)


def build_graph(variant: str, X, held, n_clusters: int):
    if variant in ("rule", "cut", "spectral-raw"):
        return graph_view(X, held=held, n_clusters=n_clusters)
    if variant == "reference-k":
        return graph_view(X, held=held, n_neighbors=_reference_k(X))
    if variant == "both-k":  # weights up to 2: halved so that a reply's entries stay at most 1
        return (graph_view(X, held=held, n_neighbors=_reference_k(X))
                + graph_view(X, held=held, n_clusters=n_clusters)) / 2.0
    if variant == "shared-neighbours":
        return shared_neighbour_graph(X, held, n_clusters)
    raise ValueError(f"unknown variant {variant!r}; one of {VARIANTS}")


def replay(variant: str, views, masks, start, n_clusters: int, *, seed: int, est: FedMultiViewClustering):
    """The graph stage from ``start`` on the variant's graphs: labels (n,). The k-means refinement's
    exchange (the spectral candidate's dense score) is the estimator's own in-process driver."""
    c = int(n_clusters)
    held = [None if masks is None else held_columns(masks[p], len(start), client=p) for p in range(len(views))]
    graphs = [build_graph(variant, X, h, c) for X, h in zip(views, held)]

    def exchange(labels):
        return sum(graph_reply(A, labels, c) for A in graphs)

    def products(M):
        return sum(graph_products(A, M) for A in graphs)

    steps = spectral_steps(len(start), c, est.refine_spectral_steps)
    if variant == "spectral-raw":
        return spectral_partition(start, exchange(start), products, c, steps, seed=seed,
                                  max_iter=est.kmeans_max_iter, n_init=est.kmeans_n_init)
    labels, _ = graph_stage(start, exchange, products, c, steps=steps, seed=seed,
                            refine=est._refine_exchange(views, masks, secure=False),
                            max_iter=est.kmeans_max_iter, n_init=est.kmeans_n_init,
                            choice="cut" if variant == "cut" else est.refine_graph_choice)
    return labels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", type=Path, nargs="+", help=".mat files (load_mat)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--variants", default="rule,reference-k", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--check", action="store_true", help="also fit the default and compare its labels with 'rule'")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; one of {', '.join(VARIANTS)}")
    if args.check and "rule" not in variants:
        ap.error("--check compares the default fit with the 'rule' variant: add it to --variants")
    out: dict = {"variants": variants, "seeds": list(range(args.seeds)), "results": {}}
    t0 = time.perf_counter()
    for path in args.files:
        ds = load_mat(path)
        c = int(ds.n_classes)
        masks = None if ds.mask is None else [np.asarray(ds.mask[:, p], dtype=bool) for p in range(ds.n_views)]
        row: dict = {"start": [], **{v: [] for v in variants}}
        same = []
        for s in range(args.seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est = FedMultiViewClustering(n_clusters=c, random_state=s, refine="kmeans").fit(ds.views, masks=masks)
                graph_seed = int(est.seeds_[est.best_restart_ or 0])
                row["start"].append(100 * clustering_accuracy(ds.labels, est.labels_))
                replayed = {v: replay(v, ds.views, masks, est.labels_, c, seed=graph_seed, est=est) for v in variants}
                for v, labels in replayed.items():
                    row[v].append(100 * clustering_accuracy(ds.labels, labels))
                if args.check:
                    default = FedMultiViewClustering(n_clusters=c, random_state=s).fit(ds.views, masks=masks)
                    same.append(bool(np.array_equal(default.labels_, replayed["rule"])))
        out["results"][path.stem] = {k: np.round(x, 2).tolist() for k, x in row.items()}
        if args.check:
            out["results"][path.stem]["same_as_default"] = same
        line = "  ".join(f"{k} {np.mean(x):.2f}" for k, x in row.items())
        print(f"{path.stem}: {line}" + (f"  same={same}" if args.check else ""), flush=True)
        if args.json:
            write_json_atomic(args.json, out)
    out["seconds"] = time.perf_counter() - t0
    out["meta"] = meta(inputs=[(p.stem, p) for p in args.files], seeds=out["seeds"])
    if args.json:
        write_json_atomic(args.json, out)
    return 0

if __name__ == "__main__":
    sys.exit(main())
