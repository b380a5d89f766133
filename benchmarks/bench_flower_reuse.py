"""Wall time of K fits on loopback: a deployment started per fit (``run_flower(run_dir=...)``) against
one deployment serving them all (``run_flower(deployment=dep)``), with the same V checked bit for bit.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_flower_reuse.py --fits 3

docs/flower.md ("One deployment, many fits") gives the result; on a shared machine the times carry
the other jobs' load (say so with any figure).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fits", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    from fedsonmf.federation.flower import LoopbackDeployment, run_flower, write_views
    from fedsonmf.protocol.config import FedConfig

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = write_views([rng.random((40, 8)) for _ in range(args.nodes)], root / "views")
        cfg = FedConfig(n_components=3)
        t0 = time.perf_counter()
        fresh = [run_flower(paths, cfg, run_dir=root / f"fresh{k}", max_rounds=args.rounds, seed=k)
                 for k in range(args.fits)]
        t_fresh = time.perf_counter() - t0
        t0 = time.perf_counter()
        with LoopbackDeployment(root / "shared", paths) as dep:
            shared = [run_flower(paths, cfg, deployment=dep, max_rounds=args.rounds, seed=k)
                      for k in range(args.fits)]
        t_shared = time.perf_counter() - t0
    same = all(np.array_equal(a.V, b.V) for a, b in zip(fresh, shared))
    print(f"{args.fits} fits, {args.nodes} nodes, {args.rounds} rounds: a deployment per fit {t_fresh:.1f} s, "
          f"one shared deployment {t_shared:.1f} s (its start-up {dep.startup_seconds:.1f} s); "
          f"same V bit for bit: {same}")


if __name__ == "__main__":
    main()
