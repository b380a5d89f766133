"""An honest-but-curious server's reconstruction attack on each client's view, in each mode.

The server follows the protocol and records everything it receives; from it, it attacks each
client's view X_p (d_p x n):

(a) **Gram**: relative Frobenius error of its best estimate of the sample Gram matrix X_p^T X_p
    (the estimate Y^T Y of an r x n matrix Y it can form, after the best scaling);
(b) **nearest neighbours**: share of samples whose nearest neighbour (Euclidean, columns of Y)
    is their nearest neighbour in X_p;
(c) **rebuild**: with k known samples (their raw x_j and their columns of Y), a ridge
    regression from Y's columns to raw x (weight chosen by leave-one-out on the known samples),
    applied to the other samples: relative Frobenius error there (``rebuild_error_known_mean``:
    the error of guessing the known samples' mean, i.e. learning nothing).

For each attack the server tries every estimate Y it can form from what it received and we
report the best one *chosen with the ground truth* (an upper bound of what it achieves).
Estimates: each matrix it received, as received, and V^s - grad0/2 (= U_p^T X_p exactly, from the
diagnostics), one per round.  The **baseline** is the same attack on the public output alone (V
of every round and the broadcasts, which the server computes anyway): the server is meant to
learn V; what it learns *beyond* that is the difference.

Modes (one federated run gives the plain and SecAgg views of the same protocol):

* ``plain`` -- each client's uploads: V_proj (setup), Vhat_p and diagnostics every round;
* ``plain, no diagnostics`` -- the same run with ``diagnostics=False``;
* ``secagg`` -- only the sums over the clients of every upload (V_proj, Vhat, grad0 and the
  diagnostic scalars included), modelled exactly by summing what each client uploaded
  (:func:`server_view`; a recorded SecAgg transcript can be read in its place);
* ``dp`` / ``secagg+dp`` -- a DP run (``dp_epsilon``; no diagnostics), per client / summed.

    .venv/bin/python benchmarks/bench_privacy_attack.py           # synthetic (3 seeds) + BBCSport
    .venv/bin/python benchmarks/bench_privacy_attack.py --quick   # synthetic, 1 seed

Writes ``benchmarks/results/privacy_attack.json`` (``--quick``: ``privacy_attack-quick.json``).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from fedsonmf._validation import check_views
from fedsonmf.core.prox import prox_l21_nonneg
from fedsonmf.datasets import default_data_dir, load_mat, make_synthetic
from fedsonmf.estimators.clustering import FedMultiViewClustering, _check_view_structure
from fedsonmf.federation.inprocess import InProcessTransport
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.pipeline.rank_rule import resolve_rank
from fedsonmf.preprocessing import normalize_views
from fedsonmf.protocol.config import FedConfig

K_KNOWN = 10
DP_EPSILONS = (10.0, 1e3, 1e5)


# ----------------------------------------------------------------------------- the runs


def run_logged(views_dn, cfg: FedConfig, rounds: int, seed: int):
    """One in-process run whose every message is recorded: (log, result)."""
    clients = [ClientRuntime(X, "fedsonmf", cfg, dp_seed=[seed, 3, p]) for p, X in enumerate(views_dn)]
    transport = InProcessTransport(clients)
    transport.log = []
    res = run_federation(transport, "fedsonmf", cfg, max_rounds=rounds, tol=0.0, seed=seed)
    res.bases = [cl.state.arrays["U"] for cl in clients]  # for the model's own error only (never sent)
    return transport.log, res


def public_estimates(log, cfg: FedConfig, mu: float) -> dict:
    """What the server knows anyway: V^s of every round (from its own broadcasts) -- the baseline."""
    out = {}
    for kind, p, msg in log:
        if kind == "down" and p == 0 and msg.kind == "round":
            out[f"V^{msg.round}"] = prox_l21_nonneg(msg.arrays["Vbar"], cfg.eta_tilde * mu)
            out[f"Vbar^{msg.round}"] = msg.arrays["Vbar"]
    return out


def server_view(log, m: int, mode: str) -> list[dict]:
    """What the server receives, per client: ``[{name: r x n matrix}]`` (one dict per client).

    ``mode="plain"``: each client's own uploads.  ``mode="secagg"``: only the sum over the
    clients of each upload (the same dict for every client) -- the exact SecAgg outcome
    with full participation.  Diagnostic scalars are summed too (unused by these attacks).
    """
    per = [dict() for _ in range(m)]
    for kind, p, msg in log:
        if kind != "up":
            continue
        for key, A in msg.arrays.items():
            per[p][f"{key}^{msg.round}"] = np.asarray(A, dtype=np.float64)
        for key, A in msg.diagnostics.items():
            if isinstance(A, np.ndarray):
                per[p][f"{key}^{msg.round}"] = np.asarray(A, dtype=np.float64)
    if mode == "plain":
        return per
    if mode == "secagg":
        total = {k: sum(d[k] for d in per) for k in per[0]}
        return [total] * m
    raise ValueError(mode)


def estimates(received: dict, public: dict, m_sum: int) -> dict:
    """Every r x n estimate of U_p^T X_p the server can form: what it received, and V^s - grad0/2.

    ``m_sum``: 1 for one client's uploads, m for SecAgg sums (the mean is then the estimate)."""
    out = {}
    for name, A in received.items():
        key, s = name.split("^")
        A = A / m_sum
        out[name] = A
        if key == "grad0" and f"V^{s}" in public:
            out[f"V^{s} - grad0^{s}/2"] = public[f"V^{s}"] - A / 2
    return out


# ----------------------------------------------------------------------------- the attacks


def _dense(X) -> np.ndarray:
    return X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)


def gram_error(Y: np.ndarray, G: np.ndarray) -> float:
    """min_c ||c Y^T Y - G||_F / ||G||_F."""
    H = Y.T @ Y
    hh = float(np.vdot(H, H))
    c = float(np.vdot(H, G)) / hh if hh > 0 else 0.0
    return float(np.linalg.norm(c * H - G) / np.linalg.norm(G))


def nearest(Z: np.ndarray) -> np.ndarray:
    """Index of each column's nearest other column (Euclidean)."""
    sq = np.einsum("ij,ij->j", Z, Z)
    D = sq[:, None] + sq[None, :] - 2 * (Z.T @ Z)
    np.fill_diagonal(D, np.inf)
    return np.argmin(D, axis=1)


def _ridge(A: np.ndarray, B: np.ndarray, lam: float) -> np.ndarray:
    """argmin_W ||A W - B||^2 + lam ||W||^2 (A: k x f, B: k x d)."""
    f = A.shape[1]
    return np.linalg.solve(A.T @ A + lam * np.eye(f), A.T @ B)


def rebuild_error(Y: np.ndarray, X: np.ndarray, known: np.ndarray) -> float:
    """Ridge regression x ~ W [y; 1] on the known samples, relative error on the others.

    The ridge weight is the attacker's own choice: leave-one-out error over the known samples
    on a grid (it uses nothing but the known samples); with r + 1 >= k plain least squares
    would interpolate and extrapolate wildly.
    """
    n = X.shape[1]
    A = np.vstack([Y, np.ones((1, n))]).T
    others = np.setdiff1d(np.arange(n), known)
    Ak, Bk = A[known], X[:, known].T
    scale = float(np.trace(Ak.T @ Ak)) / Ak.shape[1] or 1.0
    best = (np.inf, 1.0)
    for lam in scale * np.logspace(-8, 2, 11):
        err = 0.0
        for i in range(len(known)):
            keep = np.arange(len(known)) != i
            W = _ridge(Ak[keep], Bk[keep], lam)
            err += float(np.sum((Ak[i] @ W - Bk[i]) ** 2))
        best = min(best, (err, lam))
    W = _ridge(Ak, Bk, best[1])
    Xhat = (A[others] @ W).T
    return float(np.linalg.norm(Xhat - X[:, others]) / np.linalg.norm(X[:, others]))


def mean_predictor_error(X: np.ndarray, known: np.ndarray) -> float:
    """The rebuild error of guessing every other sample as the mean of the known ones (no estimate at all)."""
    others = np.setdiff1d(np.arange(X.shape[1]), known)
    guess = X[:, known].mean(axis=1, keepdims=True)
    return float(np.linalg.norm(X[:, others] - guess) / np.linalg.norm(X[:, others]))


def attack(X, cands: dict, known: np.ndarray) -> dict:
    """The three attacks on view X (d_p, n) with the best of the candidate estimates each."""
    X = _dense(X)
    G = X.T @ X
    nn_true = nearest(X)
    best = {"gram_error": (np.inf, None), "nn_agreement": (-1.0, None), "rebuild_error": (np.inf, None)}
    for name, Y in cands.items():
        if not np.all(np.isfinite(Y)):
            continue
        g, a, b = gram_error(Y, G), float(np.mean(nearest(Y) == nn_true)), rebuild_error(Y, X, known)
        if g < best["gram_error"][0]:
            best["gram_error"] = (g, name)
        if a > best["nn_agreement"][0]:
            best["nn_agreement"] = (a, name)
        if b < best["rebuild_error"][0]:
            best["rebuild_error"] = (b, name)
    out = {k: v[0] for k, v in best.items()}
    out["best_estimate"] = {k: v[1] for k, v in best.items()}
    out["rebuild_error_known_mean"] = mean_predictor_error(X, known)
    out["nn_agreement_chance"] = 1.0 / (X.shape[1] - 1)
    return out


def model_error(views_dn, res) -> float:
    """The fit's own relative error ||X_p - U_p V|| / ||X_p|| (mean over clients), for scale."""
    return float(np.mean([np.linalg.norm(_dense(X) - U @ res.V) / np.linalg.norm(_dense(X))
                          for X, U in zip(views_dn, res.bases)]))


def evaluate(views_dn, cfg: FedConfig, rounds: int, seed: int, dp_epsilons) -> dict:
    """Every mode on one federation: mean over clients of each attack, and the baseline."""
    m, n = len(views_dn), views_dn[0].shape[1]
    known = np.random.default_rng(seed).choice(n, size=K_KNOWN, replace=False)
    out = {}

    def modes_of(log, res, cfg_run, label, modes):
        mu = float(res.config["mu_value"])
        public = public_estimates(log, cfg_run, mu)
        public[f"V^{res.n_rounds + 1} (final)"] = res.V
        base = _mean([attack(X, public, known) for X in views_dn])
        out.setdefault("baseline (public V only)", base)
        if label:  # a DP run: its own public V (noisier than the plain run's) is its baseline
            out[f"baseline{label}"] = base
        for mode, key in modes:
            view = server_view(log, m, mode)
            rows = [attack(X, {**public, **estimates(view[p], public, 1 if mode == "plain" else m)}, known)
                    for p, X in enumerate(views_dn)]
            entry = _mean(rows)
            if res.extra.get("privacy"):
                entry["privacy"] = {k: res.extra["privacy"][k] for k in
                                    ("epsilon", "epsilon_secagg", "epsilon_all_views", "delta", "noise_multiplier",
                                     "clip", "rounds")}
            out[f"{key}{label}"] = entry

    for diag in (True, False):
        c = cfg.replace(diagnostics=diag)
        log, res = run_logged(views_dn, c, rounds, seed)
        if diag:
            out["_model_error_plain"] = model_error(views_dn, res)
            modes_of(log, res, c, "", [("plain", "plain"), ("secagg", "secagg")])
        else:
            modes_of(log, res, c, "", [("plain", "plain, no diagnostics"), ("secagg", "secagg, no diagnostics")])
    for eps in dp_epsilons:
        c = cfg.replace(diagnostics=False, dp_epsilon=eps, dp_rounds=rounds)
        log, res = run_logged(views_dn, c, rounds, seed)
        modes_of(log, res, c, f" (epsilon={eps:g})", [("plain", "dp"), ("secagg", "secagg+dp")])
    return out


def _mean(rows: list[dict]) -> dict:
    keys = ("gram_error", "nn_agreement", "rebuild_error")
    out = {k: float(np.mean([r[k] for r in rows])) for k in keys + ("rebuild_error_known_mean",)}
    out["per_client"] = [{k: r[k] for k in keys} for r in rows]
    out["best_estimate"] = rows[0]["best_estimate"]
    return out


# ----------------------------------------------------------------------------- data sets


def synthetic_views(seed: int):
    """The synthetic setting of the privacy study: 10 clients, n = 100, d_p = 20, r = 6, h = 0.6 (views / ||.||_F)."""
    d = make_synthetic(n_clients=10, n_samples=100, n_features=20, rank=6, heterogeneity=0.6, random_state=seed)
    return check_views(normalize_views(d.views), 6), FedConfig(6)


def bbcsport_views(root: Path):
    """BBCSport as its two clients hold it under FedMultiViewClustering's defaults (their own preprocessing)."""
    ds = load_mat(root / "BBCSport" / "zskong" / "BBCSport.mat")
    c = ds.n_classes
    est = FedMultiViewClustering(c)
    views = _check_view_structure(ds.views)
    est._validate(views[0].shape[0])
    r, _ = resolve_rank(c, [X.shape[1] for X in views], est.n_components)
    est.n_components_, est.preprocessing_, est.view_scales_ = r, [], None
    Xs, _ = est._client_views(views, fitted=False)
    return check_views(Xs, r), FedConfig(r)


def main() -> None:
    from fedsonmf._io import write_json_atomic

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="synthetic only, 1 seed, one DP budget")
    ap.add_argument("--seeds", type=int, default=None, help="synthetic seeds (default 3, quick 1)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    seeds = range(args.seeds or (1 if args.quick else 3))
    eps = DP_EPSILONS[1:2] if args.quick else DP_EPSILONS
    out_path = args.out or Path("benchmarks/results") / ("privacy_attack-quick.json" if args.quick
                                                          else "privacy_attack.json")
    result = {"settings": {"rounds": args.rounds, "known_samples": K_KNOWN, "dp_epsilons": list(eps),
                           "selection": "best candidate estimate per attack, chosen with the ground truth "
                                        "(an upper bound of the attacker's success)"},
              "datasets": {}}
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        runs = [evaluate(*synthetic_views(s), args.rounds, s, eps) for s in seeds]
        result["datasets"]["synthetic"] = {"setting": "10 clients, n = 100, d_p = 20, r = 6, h = 0.6",
                                           "seeds": list(seeds), "modes": _over_seeds(runs),
                                           "seconds": time.perf_counter() - t0}
        _print("synthetic", result["datasets"]["synthetic"]["modes"])
        write_json_atomic(out_path, result)
        root = default_data_dir()
        if not args.quick and root is not None and (root / "BBCSport").is_dir():
            t0 = time.perf_counter()
            views, cfg = bbcsport_views(root)
            run = evaluate(views, cfg, args.rounds, 0, eps)
            result["datasets"]["BBCSport"] = {"setting": f"2 clients, n = {views[0].shape[1]}, "
                                                         f"d_p = {[X.shape[0] for X in views]}, r = {cfg.n_components}",
                                              "seeds": [0], "modes": _over_seeds([run]),
                                              "seconds": time.perf_counter() - t0}
            _print("BBCSport", result["datasets"]["BBCSport"]["modes"])
            write_json_atomic(out_path, result)
    print(f"wrote {out_path}")


def _over_seeds(runs: list[dict]) -> dict:
    out = {}
    for mode in runs[0]:
        if mode.startswith("_"):
            out[mode] = float(np.mean([r[mode] for r in runs]))
            continue
        e = {k: float(np.mean([r[mode][k] for r in runs]))
             for k in ("gram_error", "nn_agreement", "rebuild_error", "rebuild_error_known_mean")}
        e["per_seed"] = [{k: r[mode][k] for k in ("gram_error", "nn_agreement", "rebuild_error")} for r in runs]
        e["best_estimate"] = runs[0][mode]["best_estimate"]
        if "privacy" in runs[0][mode]:
            e["privacy"] = runs[0][mode]["privacy"]
        out[mode] = e
    return out


def _print(name: str, modes: dict) -> None:
    print(f"{name}: model error ||X_p - U_p V|| / ||X_p|| = {modes.get('_model_error_plain', float('nan')):.3f}; "
          "rebuild error of the known samples' mean "
          f"{modes['baseline (public V only)']['rebuild_error_known_mean']:.3f}")
    print(f"  {'mode':34s} {'Gram err':>9s} {'NN agree':>9s} {'rebuild':>9s}")
    for mode, e in modes.items():
        if mode.startswith("_"):
            continue
        print(f"  {mode:34s} {e['gram_error']:9.3f} {e['nn_agreement']:9.2f} {e['rebuild_error']:9.3f}")


if __name__ == "__main__":
    main()
