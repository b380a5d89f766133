"""Flower loopback overhead, before and after: seconds per round beyond the in-process round, time to round 1.

For 3 and 10 SuperNodes (one synthetic view each: n=100, d=20, r=6, make_synthetic), the
same views, config and seed run

* in process (``run_inprocess``, BLAS pinned to one thread): the round time of the maths;
* on a loopback Flower deployment (1 SuperLink + one SuperNode per view, separate processes,
  the launcher's settings), once with the code of ``--before-src`` (a checkout's ``src``, e.g.
  the commit before the changes) and once with this checkout's -- interleaved, in fresh
  processes, in one run of this script, so both see the same machine load.

Recorded per run: seconds per round (mean of the history's per-round seconds) and its excess
over the in-process round; time to round 1 = seconds from the ``run_flower`` call to the start
of round 1, measured the same way for both codes (``V.npy``'s modification time minus the
rounds' seconds; the new code also records the exact time stamp in ``status.json``, reported as
``time_to_round1_exact``); the deployment start (SuperLink + SuperNodes up); and whether V is
bit-identical to the in-process V.

    git -C . archive <before-commit> src | tar -x -C /tmp/before
    PYTHONPATH=src .venv/bin/python benchmarks/bench_flower.py --before-src /tmp/before/src \\
        [--rounds 4] [--nodes 3,10] [--repeats 1] [--out benchmarks/results/flower.json]

Without ``--before-src`` only the current code runs.  Takes ≈10-15 min on 2 cores.
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


def worker(m: int, rounds: int, seed: int = 0) -> dict:
    """One Flower run with whatever ``fedsonmf`` is on the path (old or new API: only
    ``run_flower(paths, cfg, run_dir=, max_rounds=, seed=)`` is used)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from fedsonmf._validation import check_views
    from fedsonmf.datasets import make_synthetic
    from fedsonmf.federation.flower import run_flower, write_views
    from fedsonmf.federation.inprocess import run_inprocess
    from fedsonmf.protocol.config import FedConfig

    data = make_synthetic(n_clients=m, **SPEC, heterogeneity=0.6, random_state=seed)
    cfg = FedConfig(n_components=SPEC["rank"])
    with threadpool_limits(1):
        ref = run_inprocess(check_views(data.views, cfg.n_components), cfg, max_rounds=rounds, seed=seed)
    in_secs = [row["seconds"] for row in ref.history.rows]
    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        paths = write_views(data.views, Path(tmp) / "views")
        import inspect

        # the same protocol as the in-process reference (plain uploads): the new run_flower defaults
        # to secure aggregation, the old code has no such parameter
        kw = {"secure_aggregation": False} if "secure_aggregation" in inspect.signature(run_flower).parameters else {}
        t0 = time.time()
        res = run_flower(paths, cfg, run_dir=Path(tmp) / "run", max_rounds=rounds, seed=seed, **kw)
        wall = time.time() - t0
        secs = [row["seconds"] for row in res.history.rows]
        v_written = os.path.getmtime(Path(tmp) / "run" / "server" / "V.npy")
    fl = res.extra["flower"]
    out = {
        "nodes": m, "rounds": rounds,
        "inprocess_seconds_per_round": float(np.mean(in_secs)),
        "seconds_per_round": float(np.mean(secs)), "round_seconds": secs,
        "extra_seconds_per_round": float(np.mean(secs) - np.mean(in_secs)),
        "time_to_round1": float(v_written - sum(secs) - t0),
        "deployment_start_seconds": float(fl["startup_seconds"]), "wall_seconds": wall,
        "handshake_seconds": fl.get("handshake_seconds"),
        "bit_identical": bool(np.array_equal(res.V, ref.V)),
    }
    if "time_to_round1" in fl:
        out["time_to_round1_exact"] = float(fl["time_to_round1"])
    return out


def _run_worker(src: Path, m: int, rounds: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        subprocess.run([sys.executable, __file__, "--worker", str(m), "--rounds", str(rounds), "--worker-out",
                        fh.name], env=env, check=True, cwd=tempfile.gettempdir())
        return json.loads(Path(fh.name).read_text())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--nodes", default="3,10")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--before-src", type=Path, default=None, help="src folder of the code to compare against")
    ap.add_argument("--after-src", type=Path, default=ROOT / "src", help="src folder of the new code (default: this "
                    "checkout's)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "flower.json")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        args.worker_out.write_text(json.dumps(worker(args.worker, args.rounds)))
        return
    codes = [("after", args.after_src.resolve())]
    if args.before_src is not None:
        # else the installed code would run under the name "before"
        if not (args.before_src / "fedsonmf" / "__init__.py").is_file():
            ap.error(f"--before-src {args.before_src}: no fedsonmf package there (give a checkout's src folder)")
        codes.insert(0, ("before", args.before_src.resolve()))
    results = []
    for m in [int(x) for x in args.nodes.split(",")]:
        for rep in range(args.repeats):
            for name, src in codes:
                print(f"[{m} SuperNodes, {name}, repeat {rep + 1}] running ...", flush=True)
                row = {"code": name, "repeat": rep, "load_average": os.getloadavg(), **_run_worker(src, m, args.rounds)}
                print(f"  {row['seconds_per_round']:.2f} s/round ({row['extra_seconds_per_round']:+.2f} beyond "
                      f"in-process {row['inprocess_seconds_per_round']:.3f}); time to round 1 "
                      f"{row['time_to_round1']:.1f} s; bit-identical {row['bit_identical']}", flush=True)
                results.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    import flwr

    args.out.write_text(json.dumps({
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "flwr": flwr.__version__,
                    "cpus": os.cpu_count()},
        "spec": SPEC, "before_src": str(args.before_src) if args.before_src else None,
        "after_src": str(args.after_src), "results": results,
    }, indent=1))
    print(f"wrote {args.out}")
    print("| SuperNodes | code | s/round | beyond in-process | time to round 1 (s) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['nodes']} | {r['code']} | {r['seconds_per_round']:.2f} | {r['extra_seconds_per_round']:.2f} | "
              f"{r['time_to_round1']:.1f} |")


if __name__ == "__main__":
    main()
