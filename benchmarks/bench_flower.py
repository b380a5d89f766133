"""Flower loopback latency, before and after: seconds per exchange beyond the in-process round.

For each node count (one synthetic view per node: n=100, d=20, r=6, make_synthetic) the same
views, config and seed run

* in process (``run_inprocess``, BLAS pinned to one thread): the round time of the maths;
* on a loopback Flower deployment with the secure defaults (TLS, node keys and pins, the gate,
  signed single-use tokens, secure aggregation), once per node loop of ``--node-loops``:
  ``flower`` (Flower's ``flower-supernode`` + the gate executor: its loop sleeps 3 s after every
  empty pull) and ``fedsonmf`` (the project's node loop, :mod:`fedsonmf.federation.flower.nodeloop`),
  and optionally with the code of ``--before-src`` (a checkout's ``src``) with each of these loops
  (code that predates the project's loop runs Flower's under both names) -- interleaved, in
  fresh processes, in one run of this script, so all see the same machine load.

A round of the fit is one exchange (the server's message to every node and their replies) plus
the server's step, so the seconds per round of this tiny problem are a trivial exchange's
latency; every one of the ``--rounds`` rounds runs (``tol`` = 0).  Recorded per run: seconds per
round (median, min, max of the history's per-round seconds) and the mean's excess over the
in-process round; time to round 1 (``V.npy``'s modification time minus the rounds' seconds;
``time_to_round1_exact`` from ``status.json`` where the code records it); the deployment start;
the wall time; whether V is bit-identical to the in-process V.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_flower.py --nodes 2 --rounds 30 \\
        [--node-loops flower,fedsonmf] [--before-src /tmp/before/src] [--repeats 1] \\
        [--out benchmarks/results/flower_exchange.json]

The record is written atomically, 0600.  Two node loops, 2 nodes, 30 rounds: ≈ 3 min on 2 cores.
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

SPEC = dict(n_samples=100, n_features=20, rank=6)
ROOT = Path(__file__).resolve().parents[1]


def worker(m: int, rounds: int, seed: int = 0, secure_aggregation: bool = True) -> dict:
    """One Flower run with whatever ``fedsonmf`` is on the path (old or new API: only
    ``run_flower(paths, cfg, run_dir=, max_rounds=, tol=, seed=)`` is used); the node loop is the
    environment's ``FEDSONMF_NODE_LOOP`` (code that predates it runs Flower's)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from fedsonmf._validation import check_views
    from fedsonmf.datasets import make_synthetic
    from fedsonmf.federation.flower import run_flower, write_views
    from fedsonmf.federation.inprocess import run_inprocess
    from fedsonmf.protocol.config import FedConfig

    data = make_synthetic(n_clients=m, **SPEC, heterogeneity=0.6, random_state=seed)
    import inspect

    # the in-process reference runs the same protocol (secure aggregation or plain) as the deployment
    secure_kw = ({"secure_aggregation": bool(secure_aggregation)}
                 if "secure_aggregation" in inspect.signature(FedConfig).parameters else {})
    cfg = FedConfig(n_components=SPEC["rank"], **secure_kw)
    # every round runs (tol = 0): the exchanges measured are the rounds asked for, not a stopping rule's
    with threadpool_limits(1):
        ref = run_inprocess(check_views(data.views, cfg.n_components), cfg, max_rounds=rounds, tol=0.0, seed=seed)
    in_secs = [row["seconds"] for row in ref.history.rows]
    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        paths = write_views(data.views, Path(tmp) / "views")
        # secure aggregation (the default) or the plain protocol; code without the parameter runs plain
        kw = ({"secure_aggregation": bool(secure_aggregation)}
              if "secure_aggregation" in inspect.signature(run_flower).parameters else {})
        t0 = time.time()
        res = run_flower(paths, cfg, run_dir=Path(tmp) / "run", max_rounds=rounds, tol=0.0, seed=seed, **kw)
        wall = time.time() - t0
        secs = [row["seconds"] for row in res.history.rows]
        v_written = os.path.getmtime(Path(tmp) / "run" / "server" / "V.npy")
    fl = res.extra["flower"]
    out = {
        "nodes": m, "rounds": rounds,
        "inprocess_seconds_per_round": float(np.mean(in_secs)),
        "seconds_per_round": float(np.mean(secs)), "round_seconds": secs,
        "median_seconds_per_round": float(np.median(secs)), "min_seconds_per_round": float(np.min(secs)),
        "max_seconds_per_round": float(np.max(secs)),
        "secure_aggregation": bool(kw.get("secure_aggregation", False)),
        "extra_seconds_per_round": float(np.mean(secs) - np.mean(in_secs)),
        "time_to_round1": float(v_written - sum(secs) - t0),
        "deployment_start_seconds": float(fl["startup_seconds"]), "wall_seconds": wall,
        "handshake_seconds": fl.get("handshake_seconds"),
        "bit_identical": bool(np.array_equal(res.V, ref.V)),
    }
    if "time_to_round1" in fl:
        out["time_to_round1_exact"] = float(fl["time_to_round1"])
    rows = [w for w in fl.get("wire_bytes", []) if w.get("kind") == "round"]
    if rows and all("seconds" in w for w in rows):  # push to last reply, recorded by code that has it
        out["exchange_seconds"] = [float(w["seconds"]) for w in rows]
    out["upload_bytes_per_client"] = sum(int(w["up"]) for w in fl.get("wire_bytes", [])) / m
    if "exchanges" in fl:
        out["exchanges"] = fl["exchanges"]
    return out


def _run_worker(src: Path, m: int, rounds: int, node_loop: str, secure_aggregation: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src), FEDSONMF_NODE_LOOP=node_loop)
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        subprocess.run([sys.executable, __file__, "--worker", str(m), "--rounds", str(rounds), "--worker-out",
                        fh.name, *([] if secure_aggregation else ["--plain"])], env=env, check=True,
                       cwd=tempfile.gettempdir())
        return json.loads(Path(fh.name).read_text())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--nodes", default="2")
    ap.add_argument("--node-loops", default="flower,fedsonmf",
                    help="comma-separated node loops to run side by side: flower, fedsonmf")
    ap.add_argument("--plain", action="store_true", help="the plain protocol instead of secure aggregation")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--before-src", type=Path, default=None, help="src folder of the code to compare against")
    ap.add_argument("--after-src", type=Path, default=ROOT / "src", help="src folder of the new code (default: this "
                    "checkout's)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "flower_exchange.json")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        from fedsonmf._io import write_json_atomic  # 0600, atomic

        write_json_atomic(args.worker_out, worker(args.worker, args.rounds, secure_aggregation=not args.plain),
                          indent=None)
        return
    loops = [x.strip() for x in args.node_loops.split(",") if x.strip()]
    if not loops or set(loops) - {"flower", "fedsonmf"}:
        ap.error(f"--node-loops: give flower and/or fedsonmf, got {args.node_loops!r}")
    codes = [(f"after/{loop}", args.after_src.resolve(), loop) for loop in loops]
    if args.before_src is not None:
        # else the installed code would run under the name "before"
        if not (args.before_src / "fedsonmf" / "__init__.py").is_file():
            ap.error(f"--before-src {args.before_src}: no fedsonmf package there (give a checkout's src folder)")
        # the earlier code with each node loop too, so old and new compare with the same loop
        codes = [(f"before/{loop}", args.before_src.resolve(), loop) for loop in loops] + codes
    results = []
    for m in [int(x) for x in args.nodes.split(",")]:
        for rep in range(args.repeats):
            for name, src, loop in codes:
                print(f"[{m} SuperNodes, {name}, repeat {rep + 1}] running ...", flush=True)
                row = {"code": name, "node_loop": loop, "repeat": rep, "load_average": os.getloadavg(),
                       **_run_worker(src, m, args.rounds, loop, not args.plain)}
                print(f"  {row['median_seconds_per_round']:.3f} s/round median ({row['extra_seconds_per_round']:+.3f} "
                      f"mean beyond in-process {row['inprocess_seconds_per_round']:.4f}); time to round 1 "
                      f"{row['time_to_round1']:.1f} s; wall {row['wall_seconds']:.1f} s; bit-identical "
                      f"{row['bit_identical']}", flush=True)
                results.append(row)
    import flwr

    from fedsonmf._io import write_json_atomic  # 0600, atomic

    write_json_atomic(args.out, {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "flwr": flwr.__version__,
                    "cpus": os.cpu_count()},
        "spec": SPEC, "command": " ".join(["benchmarks/bench_flower.py", *(argv or sys.argv[1:])]),
        "before_src": str(args.before_src) if args.before_src else None,
        "after_src": str(args.after_src), "secure_aggregation": not args.plain, "results": results,
    })
    print(f"wrote {args.out}")
    print("| nodes | code / node loop | s/exchange median (min-max) | beyond in-process (mean) | time to round 1 (s) "
          "| wall (s) | V bit-identical |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['nodes']} | {r['code']} | {r['median_seconds_per_round']:.3f} ({r['min_seconds_per_round']:.3f}-"
              f"{r['max_seconds_per_round']:.3f}) | {r['extra_seconds_per_round']:.3f} | {r['time_to_round1']:.1f} | "
              f"{r['wall_seconds']:.1f} | {r['bit_identical']} |")


if __name__ == "__main__":
    main()
