"""What TLS + SuperNode authentication (+ pins) cost on a loopback deployment.

The same views, config and seed run ``run_flower`` secure (the default: per-deployment
CA, node keys registered and pinned) and ``--insecure`` (``tls=False, auth=False``),
alternating, ``--repeats`` times each, and report per mode the deployment start-up
(SuperLink healthy + keys + registration + SuperNodes spawned; of it, the seconds spent
on certificates, keys and ``flwr supernode register``), the time from ``flwr run`` to
the end of the handshake, and seconds per round.  The V of both modes must be equal.

    .venv/bin/python benchmarks/bench_flower_security.py [--rounds 5] [--repeats 2] \
        [--out benchmarks/results/flower_security.json]

3 SuperNodes, m=3, n=100, d=20, r=6.  Takes ≈4-6 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import warnings
from pathlib import Path

import numpy as np

from fedsonmf._io import new_private_dir, write_json_atomic
from fedsonmf.datasets import make_synthetic
from fedsonmf.federation.flower import run_flower, write_views
from fedsonmf.federation.flower.launcher import InsecureDeploymentWarning
from fedsonmf.protocol.config import FedConfig


def one(paths, cfg, rounds, secure: bool, root: Path, k: int) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureDeploymentWarning)
        res = run_flower(paths, cfg, run_dir=root / f"{'secure' if secure else 'insecure'}-{k}", max_rounds=rounds,
                         seed=0, tls=secure, auth=secure)
    fl = res.extra["flower"]
    secs = [r["seconds"] for r in res.history.rows]
    return {"startup_seconds": fl["startup_seconds"], "security_seconds": fl["security_seconds"],
            "handshake_seconds": fl["handshake_seconds"], "seconds_per_round": statistics.mean(secs[1:] or secs),
            "wall_seconds": fl["wall_seconds"], "V": res.V}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    data = make_synthetic(n_clients=3, n_samples=100, n_features=20, rank=6, heterogeneity=0.6, random_state=0)
    cfg = FedConfig(n_components=6)
    runs = {"secure": [], "insecure": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = write_views(data.views, root / "views")
        for k in range(args.repeats):
            for mode in ("insecure", "secure"):
                runs[mode].append(one(paths, cfg, args.rounds, mode == "secure", root, k))
                print(mode, {key: round(v, 3) for key, v in runs[mode][-1].items() if key != "V"}, flush=True)
    same_v = all(np.array_equal(r["V"], runs["insecure"][0]["V"]) for rs in runs.values() for r in rs)
    summary = {mode: {key: statistics.mean(r[key] for r in rs) for key in rs[0] if key != "V"}
               for mode, rs in runs.items()}
    summary["cost"] = {key: summary["secure"][key] - summary["insecure"][key] for key in summary["secure"]}
    summary.update({"rounds": args.rounds, "repeats": args.repeats, "n_supernodes": 3, "same_V": same_v})
    print(json.dumps(summary, indent=1))
    if args.out:
        new_private_dir(args.out.parent)
        write_json_atomic(args.out, summary, indent=1)
    return summary


if __name__ == "__main__":
    main()
