"""A shared set as organisations, one per view: ``fedsonmf flower cluster`` from launch to labels, beside the
in-process fit (``--set``: BBCSport, 2 nodes, the default; MSRC-v1, 5 nodes).

For each code (this checkout's ``src``, and optionally ``--before-src``, a checkout's ``src``), in
fresh processes, one after the other in one run (the same machine load):

* the in-process estimator (``FedMultiViewClustering(c, random_state=0, secure_aggregation=True)``,
  the deployment's defaults; BLAS pinned to one thread): its wall time and labels;
* ``fedsonmf flower cluster view0 view1 ... -k c`` on a loopback deployment with the secure defaults
  (TLS, node keys and pins, the gate, signed single-use tokens, secure aggregation): the wall time
  from the command's launch to its exit, to round 1 and to the labels file, the fit's
  s/round, the exchanges per stage (``flower.exchanges``, code that records them) and the array bytes
  up and down per node (``flower.wire_bytes``); whether its labels equal the in-process ones.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/bench_flower_cluster.py \\
        [--set MSRC-v1] [--data /work/shared/data] [--before-src /tmp/before/src] \\
        [--out benchmarks/results/flower_cluster.json]

The record is written atomically, 0600.  One code: ≈ 1.5–2 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the sets: file under the data folder, number of clusters
SETS = {"BBCSport": ("BBCSport/zskong/BBCSport.mat", 5), "MSRC-v1": ("MSRC-v1/youweiliang/MSRC_v1.mat", 7)}


def prepare(data: Path, out: Path, name: str) -> None:
    """The views as files, the true classes, the in-process fit's labels and seconds (this process's code)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from fedsonmf import FedMultiViewClustering
    from fedsonmf._io import write_json_atomic
    from fedsonmf.datasets.mat import load_mat
    from fedsonmf.estimators.options import from_flat
    from fedsonmf.federation.flower import write_views

    rel, c = SETS[name]
    ds = load_mat(data / rel)
    paths = write_views(ds.views, out / "views")
    np.save(out / "y.npy", np.asarray(ds.labels))
    t0 = time.perf_counter()
    with threadpool_limits(1):
        model = FedMultiViewClustering(c, random_state=0, **from_flat({"secure_aggregation": True})).fit(ds.views)
    seconds = time.perf_counter() - t0
    np.save(out / "inprocess_labels.npy", np.asarray(model.labels_))
    write_json_atomic(out / "prep.json", {"paths": [str(p) for p in paths], "inprocess_seconds": seconds,
                                         "n": int(ds.views[0].shape[0])}, indent=None)


def measure(src: Path, data: Path, name: str) -> dict:
    import numpy as np

    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="bench-flower-cluster-") as tmp:
        out = Path(tmp)
        subprocess.run([sys.executable, __file__, "--prepare", str(out), "--data", str(data), "--set", name], env=env,
                       check=True, cwd=tempfile.gettempdir())
        prep = json.loads((out / "prep.json").read_text())
        cmd = [str(Path(sys.executable).parent / "fedsonmf"), "flower", "cluster", *prep["paths"],
               "-k", str(SETS[name][1]), "-o", str(out / "run"), "--labels", str(out / "y.npy")]
        t0 = time.time()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
        wall = time.time() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"flower cluster failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        server = out / "run" / "server"
        res = json.loads((server / "result.json").read_text())
        status = json.loads((server / "status.json").read_text())
        from fedsonmf.federation.flower.clustering import read_labels_csv

        labels = read_labels_csv(server / "labels.csv")
        ref = np.load(out / "inprocess_labels.npy")
        rows = res["flower"]["wire_bytes"]
        m = len(prep["paths"])
        return {
            "inprocess_seconds": prep["inprocess_seconds"],
            "flower_wall_seconds": wall,
            "launch_to_labels_seconds": os.path.getmtime(server / "labels.csv") - t0,
            "launch_to_round1_seconds": float(status["round1_started_at"]) - t0,
            "seconds_per_round": status.get("seconds_per_round"),
            "n_rounds": res["clustering"].get("restarts", {}).get("n_rounds"),
            "exchanges": res["flower"].get("exchanges"),
            "wire_rows": len(rows),
            "up_bytes_per_node": sum(int(w["up"]) for w in rows) / m,
            "down_bytes_per_node": sum(int(w["down"]) for w in rows) / m,
            "labels_equal_inprocess": bool(np.array_equal(labels, ref)),
        }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(SETS), default="BBCSport")
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--before-src", type=Path, default=None, help="src folder of the code to compare against")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "flower_cluster.json")
    ap.add_argument("--prepare", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.prepare is not None:
        prepare(args.data, args.prepare, args.set)
        return
    codes = [("after", (ROOT / "src").resolve())]
    if args.before_src is not None:
        if not (args.before_src / "fedsonmf" / "__init__.py").is_file():
            ap.error(f"--before-src {args.before_src}: no fedsonmf package there (give a checkout's src folder)")
        codes.insert(0, ("before", args.before_src.resolve()))
    results = []
    for name, src in codes:
        print(f"[{name}] running ...", flush=True)
        row = {"code": name, "load_average": os.getloadavg(), **measure(src, args.data, args.set)}
        print(json.dumps(row), flush=True)
        results.append(row)
    from fedsonmf._io import write_json_atomic  # 0600, atomic

    write_json_atomic(args.out, {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
        "data": f"{args.set} ({SETS[args.set][0]}), one node per view, c = {SETS[args.set][1]}",
        "command": " ".join(["benchmarks/bench_flower_cluster.py", *(argv or sys.argv[1:])]),
        "results": results,
    })
    print(f"wrote {args.out}")
    print("| code | in process (s) | flower cluster: launch to labels (s) | launch to round 1 (s) | s/round "
          "| exchanges | up / down per node (MB) | labels equal |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        ex = (r["exchanges"] or {}).get("total", "-")
        print(f"| {r['code']} | {r['inprocess_seconds']:.1f} | {r['launch_to_labels_seconds']:.1f} | "
              f"{r['launch_to_round1_seconds']:.1f} | {r['seconds_per_round'] or float('nan'):.2f} | {ex} | "
              f"{r['up_bytes_per_node'] / 1e6:.2f} / {r['down_bytes_per_node'] / 1e6:.2f} | "
              f"{r['labels_equal_inprocess']} |")


if __name__ == "__main__":
    main()
