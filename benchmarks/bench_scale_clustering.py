"""Scale of the default clustering: planted two-view problems from n = 10^4 up.

Each view is sparse, d_p = 2 000 features at 1 % density (20 nonzeros per sample, values in
[0.5, 1.5)); a sample of cluster k (c = 10, uniform) draws each nonzero from its cluster's own
block of d_p / c features with probability 1/2, else from all d_p features. Each case runs in a
fresh subprocess (its peak RSS counted from after the planted data are made) on one BLAS thread:

* ``clustering``: a default ``FedMultiViewClustering(n_clusters=10)`` fit -- CPU seconds per
  stage (the factorisation's fits, k-means of each fit's V, the graph build, the clients' halves
  of the k-means refinement and graph exchanges, the rest of the stages at the server), rounds,
  exchanges, peak RSS against the data's bytes (and apart, the peaks of the fits and of the stages
  after them), bytes per client of the kept fit's rounds, ARI
  against the planted clusters;
* ``factorization``: one default ``federated_sonmf`` fit (r = 10): CPU seconds, rounds, peak RSS,
  bytes per client;
* ``simulation`` (``--simulation N``): one default factorisation (r = 10) of ten planted views of N
  samples in Flower's simulation engine, a virtual node per view with the app's secure defaults,
  beside the same fit in process: wall seconds, rounds, bytes per client, V equal bit for bit;
* ``graph``: one view's k-NN graph (:func:`fedsonmf.pipeline.graph.client_graph`), exact and
  approximate: CPU seconds and the approximate graph's recall of the exact one's edges (the exact
  neighbours of 1 000 random samples, so it runs at every size).

At ``--compare`` (default 10^4) the clustering also runs with the exact graph forced above
``EXACT_GRAPH_MAX`` and with the approximate one forced below it, and the two fits' labels are compared
(ARI): the effect of the approximate graph on the pipeline.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_scale_clustering.py \
        [--sizes 10000 100000] [--compare 10000] [--simulation 100000] \
        [--out benchmarks/results/scale_clustering.json]

The results file is written atomically, 0600 (its folder 0700 if created).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parent


def make_planted(n: int, d: int = 2000, density: float = 0.01, c: int = 10, m: int = 2, signal: float = 0.5,
                 seed: int = 0):
    """``(views, labels)``: m sparse CSR views (n, d) of c planted clusters (module docstring)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, n)
    per_row = max(1, int(round(d * density)))
    block = d // c
    views = []
    for _ in range(m):
        own = rng.random((n, per_row)) < signal
        cols = np.where(own, labels[:, None] * block + rng.integers(0, block, (n, per_row)),
                        rng.integers(0, d, (n, per_row)))
        rows = np.repeat(np.arange(n), per_row)
        X = sp.csr_matrix((rng.random(n * per_row) + 0.5, (rows, cols.ravel())), shape=(n, d))
        X.sum_duplicates()
        views.append(X)
    return views, labels


def _nbytes(X) -> int:
    return int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) if hasattr(X, "indptr") else int(X.nbytes)


def _peak_rss() -> int:
    """The process's peak resident set since the last :func:`_reset_peak` (Linux: VmHWM)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _reset_peak() -> int:
    """Forget the peak so far (the planted data's generation is not the fit's): the current RSS."""
    import gc

    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    return _peak_rss()


def _timed(store: dict, key: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            store[key] = store.get(key, 0.0) + time.process_time() - t0
    return wrapper


def _phase_peaks(peaks: dict, cluster_fits):
    """``cluster_fits`` recording the peak RSS up to its call (``peaks["fits"]``: the preprocessing and
    the five fits) and during it (``peaks["stages"]``: the k-means refinement and the graph stage,
    the graph builds included)."""
    @functools.wraps(cluster_fits)
    def wrapper(*args, **kwargs):
        peaks["fits"] = _peak_rss()
        _reset_peak()
        try:
            return cluster_fits(*args, **kwargs)
        finally:
            peaks["stages"] = _peak_rss()
    return wrapper


def case_clustering(n: int, search: str = "auto", seed: int = 0) -> dict:
    """A default clustering fit (module docstring); ``search`` is passed to every client's graph."""
    from sklearn.metrics import adjusted_rand_score

    import fedsonmf.estimators.clustering as est
    from fedsonmf import FedMultiViewClustering
    from fedsonmf.pipeline.graph import client_graph

    views, truth = make_planted(n, seed=seed)
    data = sum(_nbytes(X) for X in views)
    rss_data = _reset_peak()
    cpu: dict = {}
    est.client_graph = _timed(cpu, "graph_build", functools.partial(client_graph, search=search))
    est.kmeans_on_embedding = _timed(cpu, "kmeans_of_each_fit", est.kmeans_on_embedding)
    est.client_refine = _timed(cpu, "kmeans_refinement_clients", est.client_refine)
    est.client_links = _timed(cpu, "graph_exchanges_clients", est.client_links)
    est.client_products = _timed(cpu, "graph_exchanges_clients", est.client_products)
    peaks: dict = {}
    est.cluster_fits = _timed(cpu, "stages_after_the_fits", _phase_peaks(peaks, est.cluster_fits))
    t0 = time.process_time()
    model = FedMultiViewClustering(n_clusters=10, random_state=seed).fit(views)
    total = time.process_time() - t0
    stages = cpu.pop("stages_after_the_fits")
    cpu["factorisation_fits"] = total - stages - cpu["kmeans_of_each_fit"]
    cpu["stages_server_and_rest"] = stages - sum(v for k, v in cpu.items() if k.endswith("clients") or
                                                 k == "graph_build")
    rows = model.history_.rows
    per_round = [(r.get("bytes_up", 0) + r.get("bytes_down", 0)) / len(views) for r in rows]
    report = model.fit_report_
    return {"n": n, "search": search, "cpu_seconds": total, "cpu_seconds_by_stage": cpu,
            "rounds_per_fit": report["rounds"], "refine_exchanges": report["refine_exchanges"],
            "graph_exchanges": report["graph_exchanges"], "data_bytes": data, "rss_after_data": rss_data,
            "peak_rss": max(peaks.values()), "peak_rss_over_data": max(peaks.values()) / data,
            "peak_rss_fits": peaks["fits"], "peak_rss_stages": peaks["stages"],
            "kept_fit_bytes_per_client": float(sum(per_round)),
            "ari": float(adjusted_rand_score(truth, model.labels_)), "labels": model.labels_.tolist()}


def case_factorization(n: int, seed: int = 0) -> dict:
    """One default federated_sonmf fit (r = 10) on the planted views."""
    from fedsonmf import federated_sonmf

    views, _ = make_planted(n, seed=seed)
    data = sum(_nbytes(X) for X in views)
    _reset_peak()
    t0 = time.process_time()
    res = federated_sonmf(views, 10, random_state=seed)
    total = time.process_time() - t0
    rows = res.history.rows
    return {"n": n, "cpu_seconds": total, "rounds": int(res.n_rounds), "cpu_seconds_per_round": total / res.n_rounds,
            "data_bytes": data, "peak_rss": _peak_rss(), "peak_rss_over_data": _peak_rss() / data,
            "bytes_per_client": float(sum(r.get("bytes_up", 0) + r.get("bytes_down", 0) for r in rows) / len(views))}


def case_graph(n: int, search: str = "approximate", seed: int = 0, queries: int = 1000) -> dict:
    """One view's graph: CPU seconds and the recall of the exact k nearest neighbours of ``queries``
    random samples among its edges (1 for the exact search, whose neighbours have no ties here)."""
    import scipy.sparse as sp

    from fedsonmf.pipeline.graph import client_graph, graph_neighbors
    from fedsonmf.pipeline.refine import refine_view

    views, truth = make_planted(n, seed=seed)
    X = views[0]
    out: dict = {"n": n, "search": search, "k": graph_neighbors(n, 10)}
    _reset_peak()
    t0 = time.process_time()
    A = sp.csr_array(client_graph(X, n_clusters=10, search=search))
    out["cpu_seconds"] = time.process_time() - t0
    out["peak_rss"] = _peak_rss()
    # the share of the graph's edge weight inside a planted cluster (what the graph stage works from)
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    out["same_cluster_weight"] = float(A.data[truth[rows] == truth[A.indices]].sum() / A.data.sum())
    Y = sp.csr_array(refine_view(X))
    Q = np.random.default_rng(1).choice(n, min(queries, n), replace=False)
    YT = sp.csr_array(Y.T)
    E = []
    step = max(1, (1 << 25) // n)  # 256 MB of similarities at a time
    for lo in range(0, Q.size, step):
        q = Q[lo:lo + step]
        S = (Y[q] @ YT).toarray()
        S[np.arange(q.size), q] = -np.inf
        E.append(np.argpartition(-S, out["k"], axis=1)[:, :out["k"]])  # continuous values: no ties
    E = np.concatenate(E)
    out["recall"] = float(np.mean([np.isin(E[i], A.indices[A.indptr[q]:A.indptr[q + 1]]).mean()
                                   for i, q in enumerate(Q)]))
    out["exact_same_cluster"] = float(np.mean(truth[E] == truth[Q][:, None]))  # of the exact neighbours
    return out


def case_simulation(n: int, m: int = 10, seed: int = 0, rounds: int | None = None) -> dict:
    """One default factorisation (r = 10) of ``m`` planted views in Flower's simulation engine (a
    virtual node per view, secure aggregation on, the app's defaults) beside the same fit in process:
    wall seconds of each, rounds, bytes per client, peak RSS of this (the driver's) process, and
    whether the two V are equal bit for bit."""
    import tempfile

    from threadpoolctl import threadpool_limits

    from fedsonmf._validation import check_views
    from fedsonmf.federation.flower import run_simulation
    from fedsonmf.federation.inprocess import run_inprocess
    from fedsonmf.protocol.config import FedConfig

    views, _ = make_planted(n, m=m, seed=seed)
    data = sum(_nbytes(X) for X in views)
    cfg = FedConfig(n_components=10)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = run_simulation(views, cfg, run_dir=Path(tmp) / "sim", max_rounds=rounds, seed=seed,
                             node_timeout=1800.0, round_timeout=1800.0, timeout=7200.0)
        wall = time.perf_counter() - t0
    with threadpool_limits(1):  # the simulation pins BLAS to one thread in every process
        t0 = time.perf_counter()
        ref = run_inprocess(check_views(views, 10), cfg.replace(secure_aggregation=True), "fedsonmf",
                            max_rounds=rounds, seed=seed)
        wall_inprocess = time.perf_counter() - t0
    rows = res.history.rows
    return {"n": n, "clients": m, "data_bytes": data, "wall_seconds": wall, "inprocess_wall_seconds": wall_inprocess,
            "rounds": int(res.n_rounds), "stopping_reason": res.stopping_reason,
            "bytes_per_client": float(sum(r.get("bytes_up", 0) + r.get("bytes_down", 0) for r in rows) / m),
            "diagnostic_bytes_per_client": float(sum(r.get("bytes_diagnostics", 0) for r in rows) / m),
            "driver_peak_rss": _peak_rss(), "equal_to_inprocess": bool(np.array_equal(res.V, ref.V))}


def run_sub(fn: str, **kw) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(SRC)!r}); import bench_scale_clustering as b; "
            f"print(json.dumps(b.{fn}(**{kw!r})))")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "NUMBA_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from sklearn.metrics import adjusted_rand_score

    from fedsonmf._io import new_private_dir, write_json_atomic

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--compare", type=int, default=10_000, help="n of the exact/approximate comparison (0: none)")
    ap.add_argument("--exact-up-to", type=int, default=100_000, help="the exact graph timed up to this n")
    ap.add_argument("--jobs", type=int, default=1, help="cases run side by side (each its own process)")
    ap.add_argument("--simulation", type=int, default=0,
                    help="n of a 10-client factorisation in Flower's simulation engine (0: none; needs Ray)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/scale_clustering.json"))
    args = ap.parse_args(argv)
    cases = []
    if args.simulation:
        cases.append(("simulation", "case_simulation", {"n": args.simulation}))
    if args.compare:
        cases += [("compare", "case_clustering", {"n": args.compare, "search": s}) for s in ("exact", "approximate")]
    for n in args.sizes:
        cases += [("graph", "case_graph", {"n": n, "search": s}) for s in ("approximate", "exact")
                  if s == "approximate" or n <= args.exact_up_to]
        cases += [("factorization", "case_factorization", {"n": n}), ("clustering", "case_clustering", {"n": n})]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [(key, pool.submit(run_sub, fn, **kw)) for key, fn, kw in cases]
        results = []
        for key, f in futures:
            results.append((key, f.result()))
            print(f"[{key}]", {k: v for k, v in results[-1][1].items() if k != "labels"}, flush=True)
    report: dict = {"machine": "2 cores shared with other jobs, each case one process on one BLAS thread, "
                               f"{max(1, args.jobs)} case(s) at a time; CPU seconds of the case's process",
                    "command": " ".join(["benchmarks/bench_scale_clustering.py", *sys.argv[1:]])}
    for key in ("graph", "factorization", "clustering", "simulation"):
        report[key] = [r for k, r in results if k == key]
    for r in report["clustering"]:
        r.pop("labels")
    runs = {r["search"]: r for k, r in results if k == "compare"}
    if runs:
        report["compare"] = {"n": args.compare, "ari_exact_vs_approximate_labels": float(adjusted_rand_score(
            runs["exact"].pop("labels"), runs["approximate"].pop("labels"))), "runs": runs}
    new_private_dir(args.out.parent)
    write_json_atomic(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
