"""What a Flower node pays per message to read its own view: parsing the file against loading
its binary copy, side by side in one run.

Every message of a Flower run is served by a fresh process under stock Flower, so a node reads
its view at every round and every refinement exchange.  A view parsed from text or a MATLAB file
(CSV/TSV, ``.mtx``, ``.mat``) is parsed once and kept as a binary copy in the node's state folder
(:func:`fedsonmf.federation.flower.client_app._read`); this times one read each way (the best of a
few, one core; every value read once, so a memory-mapped copy is paged in) for dense and sparse
views of a few sizes and prints the ratio.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_node_view_read.py [--out benchmarks/results/node_view_read.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedsonmf._io import write_json_atomic  # noqa: E402
from fedsonmf._provenance import meta  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_storage import seconds  # noqa: E402  (one warm-up call, then the best of a few)

#: (format, n samples, d features, density); ".mat" is MATLAB's default v7 file (compressed),
#: ".mat-raw" one written without compression
CASES = [(".csv", 500, 1000, 1.0), (".csv", 2000, 1000, 1.0), (".mtx", 2000, 5000, 0.01),
         (".mat", 2000, 1000, 1.0), (".mat", 2000, 5000, 0.01), (".mat-raw", 2000, 1000, 1.0)]


def touch(X) -> float:
    """Every stored value read once (a memory-mapped copy is paged in, as the fit's products do)."""
    return float((X.data if sp.issparse(X) else np.asarray(X)).sum())


def write(path: Path, ext: str, n: int, d: int, density: float, rng) -> None:
    import scipy.io

    X = rng.random((n, d)) if density >= 1 else sp.random(n, d, density=density, random_state=rng, format="csr")
    if ext == ".csv":
        np.savetxt(path, X, delimiter=",", fmt="%.6g")
    elif ext == ".mtx":
        scipy.io.mmwrite(path, sp.coo_matrix(X))
    else:
        scipy.io.savemat(path, {"X": X}, do_compression=ext == ".mat")


def main(argv=None) -> int:
    from fedsonmf.federation.flower.client_app import _read

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    print("| format | n × d | density | parse (s) | from the copy (s) | ratio |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for ext, n, d, density in CASES:
            path = Path(tmp) / f"view-{n}-{d}-{ext[1:]}{ext[:4]}"
            write(path, ext, n, d, density, rng)
            copy = Path(tmp) / "state" / path.stem
            parse = seconds(lambda path=path: touch(_read(path)))
            _read(path, copy)  # the first read writes the copy
            loaded = seconds(lambda path=path, copy=copy: touch(_read(path, copy)))
            rows.append({"format": ext, "n": n, "d": d, "density": density, "parse_s": parse, "copy_s": loaded,
                         "ratio": parse / loaded})
            print(f"| {ext} | {n} × {d} | {density:g} | {parse:.3f} | {loaded:.4f} | {parse / loaded:.0f} |",
                  flush=True)
    if args.out:
        write_json_atomic(args.out, {"meta": meta(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
