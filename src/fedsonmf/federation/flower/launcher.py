"""Launch a federation on a loopback Flower deployment: :func:`run_flower` and :func:`predict_flower`.

The launcher checks every input (:mod:`.viewfiles`, :func:`~fedsonmf.federation.budget.resolve_budget`,
the clustering options) before any process starts, then runs the federation on a
:class:`~.deployment.LoopbackDeployment` and reads its result back.

Everything lives in one run folder::

    <run_dir>/flwr-home/      FLWR_HOME (config.toml with the "fedsonmf" connection, installed FABs)
    <run_dir>/app/            the shim Flower app (written fresh; nothing else goes here)
    <run_dir>/nodes/p<i>/     node-local state of SuperNode i (state files), its log; the copies of
                              its view there are removed once the run completes (:func:`drop_view_copies`)
    <run_dir>/server/         the ServerApp's out-dir: status.json, result.json, V.npy, checkpoint/
    <run_dir>/logs/           superlink.log, gate-superlink.log, flwr-run-<k>.log
    <run_dir>/gate/           the gate's files (all 0600)
    <run_dir>/job.json        job id and run config (reused by ``resume``)
    <run_dir>/security/       (0700) tls/ (per-deployment CA + server certificate), pins.json (0600)
    <run_dir>/.lock           held (fcntl.flock) while a launch uses the folder

The deployment's processes, security and gate are described in :mod:`.deployment`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsonmf._io import private_dir, write_json_atomic
from fedsonmf._validation import check_auto_or_count
from fedsonmf.exceptions import DataWarning, FlowerRunError, InputError, ParameterError, warn
from fedsonmf.federation import deployment_defaults as dd
from fedsonmf.federation import secagg
from fedsonmf.federation.budget import resolve_budget
from fedsonmf.federation.flower.deployment import (  # noqa: F401 - re-exported: the launcher's public names
    CONNECTION,
    InsecureDeploymentWarning,
    LoopbackDeployment,
    RunOutcome,
    _lock_run_dir,
    failure_message,
    flower_env,
    superlink_exit_report,
)
from fedsonmf.federation.flower.viewfiles import check_inputs, write_masks, write_views  # noqa: F401 - re-exported
from fedsonmf.pipeline.rank_rule import RANK_RULES
from fedsonmf.protocol.history import FitResult, History, json_default
from fedsonmf.protocol.params import FLOWER_SECURE_AGGREGATION, default

__all__ = ["LoopbackDeployment", "RunOutcome", "FlowerRunError", "InsecureDeploymentWarning", "flower_env",
           "run_flower", "load_result", "write_views", "write_masks", "check_inputs", "predict_flower",
           "PredictOutcome", "CLUSTERING_DEFAULTS", "clustering_run_config", "drop_view_copies", "folder_size"]


def load_result(out_dir) -> FitResult:
    """The FitResult of a completed Flower run, read from its out-dir.

    Parameters
    ----------
    out_dir : path
        The ServerApp's out-dir (``<run_dir>/server``), holding ``V.npy`` and ``result.json``.

    Returns
    -------
    FitResult
        V, history, stopping reason, seed and config; ``bases`` is None (they stay on the
        nodes); every other field of ``result.json`` is in ``extra``.
    """
    out_dir = Path(out_dir)
    d = json.loads((out_dir / "result.json").read_text())
    hist = History(d["history"], R0=d.get("R0"))
    extra = {k: v for k, v in d.items() if k not in
             ("config", "seed", "n_rounds", "converged", "stopping_reason", "seconds", "R0", "history")}
    return FitResult(V=np.load(out_dir / "V.npy"), bases=None, history=hist, n_rounds=d["n_rounds"],
                     stopping_reason=d["stopping_reason"], converged=d["converged"], seed=d["seed"],
                     config=d["config"], seconds=d["seconds"], extra=extra,
                     mu=float(d["config"]["mu_value"]) if "mu_value" in d.get("config", {}) else None)


#: options of a clustering run (``run_flower(..., clustering=...)``) and their defaults (the estimator's)
CLUSTERING_DEFAULTS = {"rank": dd.RANK_RULE, "preprocess": default("preprocess"),
                       "normalize_views": default("normalize_views"),
                       "normalize_embedding": default("normalize_embedding"),
                       "kmeans_n_init": default("kmeans_n_init"), "kmeans_max_iter": default("kmeans_max_iter"),
                       "early_stop": default("early_stop"), "refine": default("refine"),
                       "refine_starts": default("refine_starts"),
                       "refine_seeded_starts": default("refine_seeded_starts"),
                       "refine_spectral_steps": default("refine_spectral_steps"), "n_init": default("n_init")}


def clustering_run_config(n_clusters: int, clustering: dict | None) -> dict:
    """The run-config keys of a clustering run (``n-clusters``, ``rank-rule``, ...) from the options
    ``clustering`` (keys of :data:`CLUSTERING_DEFAULTS`, the others at their defaults); a
    :class:`ParameterError` names unknown options and a bad rank rule."""
    opts = {**CLUSTERING_DEFAULTS, **(clustering or {})}
    unknown = sorted(set(opts) - set(CLUSTERING_DEFAULTS))
    if unknown:
        raise ParameterError(f"unknown clustering options {unknown}; known: {sorted(CLUSTERING_DEFAULTS)}")
    rank = opts["rank"]
    if not (rank in RANK_RULES or (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1)):
        raise ParameterError(f"clustering rank must be one of {RANK_RULES} or a positive integer, got {rank!r}")
    n_init = check_auto_or_count("clustering n_init", opts["n_init"])  # a count, also as text
    return {"n-clusters": int(n_clusters), "rank-rule": str(rank), "preprocess": str(opts["preprocess"]),
            "normalize-views": bool(opts["normalize_views"]), "normalize-embedding": bool(opts["normalize_embedding"]),
            "kmeans-n-init": int(opts["kmeans_n_init"]), "kmeans-max-iter": int(opts["kmeans_max_iter"]),
            "early-stop": str(opts["early_stop"]), "refine": str(opts["refine"]),
            "refine-starts": int(opts["refine_starts"]),
            "refine-seeded-starts": int(opts["refine_seeded_starts"]),
            "refine-spectral-steps": int(opts["refine_spectral_steps"]), "n-init": str(n_init)}


def _update_result_json(out_dir: Path, extra: dict) -> None:
    path = out_dir / "result.json"
    d = json.loads(path.read_text())
    d.update(extra)
    write_json_atomic(path, d, default=json_default)


def run_flower(view_paths, cfg, *, run_dir=None, algorithm: str = "fedsonmf", max_rounds: int | None = None,
               tol: float | None = None, seed: int = dd.SEED, resume: bool = False,
               round_timeout: float = dd.ROUND_TIMEOUT,
               node_timeout: float = dd.NODE_TIMEOUT, record_wire: bool = False,
               pin_threads: bool = True, timeout: float = 3600.0, tls: tuple | bool | None = True, auth: bool = True,
               startup_timeout: float | None = None, mask_paths=None, participation=None,
               secure_aggregation: bool | None = None, record_wire_arrays: bool = False,
               n_clusters: int | None = None, clustering: dict | None = None, labels=None,
               progress=None, keep_views: bool = False, deployment: LoopbackDeployment | None = None) -> FitResult:
    """Run a federation on a loopback Flower deployment and return its result.

    Starts a SuperLink and one SuperNode per view file (separate processes on
    127.0.0.1, see :class:`LoopbackDeployment`), runs the federation, and stops
    every process it started.  Every input is checked before any process starts
    (:func:`~fedsonmf.federation.flower.viewfiles.check_inputs`: files present,
    2-D, equal n, r <= d_p; the budget; the clustering options); the ServerApp
    checks the views again at the handshake.

    Parameters
    ----------
    view_paths : list of path
        One view file per client (``.npy`` of shape (n_samples, d_p) or sparse ``.npz``);
        row i of every file is sample i.
    cfg : FedConfig
        The algorithm's parameters (``cfg.diagnostics`` is honoured;
        ``cfg.secure_aggregation`` is not consulted, see ``secure_aggregation``).
    run_dir : path or None
        The run folder (created 0700 and locked while the launch uses it).  None only with
        ``deployment`` (its run folder is used).
    algorithm : str, default="fedsonmf"
        A name of :data:`fedsonmf.algorithms.ALGORITHMS`.
    max_rounds : int >= 1 or None, default=None
        Communication rounds at most; None = the parameter table's default
        (:func:`~fedsonmf.federation.budget.resolve_budget`).
    tol : float >= 0 or None, default=None
        Stop when R/R1 <= tol; None = the table's default (0 without diagnostics).
    seed : int, default=0
        The run seed (also k-means' in a clustering run).
    resume : bool, default=False
        Continue the run saved in ``run_dir`` (same job id); it ends with the same V
        as an uninterrupted run.
    round_timeout : float, default=300.0
        Seconds the server waits for the replies of one round.
    node_timeout : float, default=120.0
        Seconds the server waits for every view's SuperNode at the handshake.
    record_wire : bool, default=False
        The server logs every message to ``server/wire.jsonl`` (privacy audit).
    pin_threads : bool, default=True
        BLAS threads = 1 in every process (bit-identical to the in-process engine).
    timeout : float, default=3600.0
        Seconds the whole ``flwr run`` may take while it makes no progress (the limit
        restarts whenever a round completes).
    tls : True, False or (ca.crt, server.pem, server.key), default=True
        True: a per-deployment CA; a tuple: your own files; False: plain HTTP (warns,
        needs ``auth=False``).
    auth : bool, default=True
        SuperNode authentication, each view pinned to its node's key.
    startup_timeout : float or None, default=None
        Seconds for the nodes' start-up (the setup exchange); None uses ``node_timeout``.
    mask_paths : list of path or None, default=None
        One availability mask per view (None = complete; :func:`write_masks`;
        docs/algorithm.md §15.1); with ``n_clusters`` each node's preprocessing, refinement
        distances and k-NN graph use the samples it holds, as in process.
    participation : Participation or None, default=None
        Partial rounds (docs/algorithm.md §15.2).
    secure_aggregation : bool or None, default=None
        None = on (:data:`~fedsonmf.protocol.params.FLOWER_SECURE_AGGREGATION`); False is
        the explicit opt-out.  The server then receives only sums of the uploads
        (docs/privacy.md).
    record_wire_arrays : bool, default=False
        With ``record_wire``: also save every array the server receives.
    n_clusters : int or None, default=None
        c: run :class:`~fedsonmf.estimators.clustering.FedMultiViewClustering`'s
        pipeline; ``cfg.n_components`` is replaced by the rank rule (settled at the
        handshake from c and the nodes' d_p), each node preprocesses its own view and
        the ServerApp runs k-means on the final V and writes ``labels.csv``
        (``sample_id,cluster``) and ``centers.npy``.
    clustering : dict or None, default=None
        Options of a clustering run, keys of :data:`CLUSTERING_DEFAULTS`
        (``rank``: "auto", "paper" or an int; ``preprocess``,
        ``normalize_views``, ``normalize_embedding``, ``kmeans_n_init``,
        ``kmeans_max_iter``, ``early_stop``, ``refine``); missing keys take the estimator's defaults.
    labels : array-like of shape (n_samples,) or None, default=None
        True classes (needs ``n_clusters``): this function, the submitting side,
        scores the labels the server wrote; they never enter the federation.
    progress : callable or None, default=None
        ``progress(status)`` with the ServerApp's ``status.json`` as the run goes
        (phase, round k of K, seconds per round; :class:`.server_app.StatusFile`).
    keep_views : bool, default=False
        Keep the nodes' copies of their views in the run folder after a completed run (a
        clustering run's prepared view per fit, the binary copy of a view parsed from text;
        :func:`drop_view_copies`).  They are needed until the run completes (a resume reads
        them) and never after; a run that fails keeps them whatever this says.
    deployment : LoopbackDeployment or None, default=None
        A started deployment to run on, left running on return (its daemons serve many fits; see
        docs/flower.md, "One deployment, many fits").  ``view_paths`` and ``mask_paths`` must be
        the ones it serves; ``run_dir`` None or its run folder; the fit's out-dir is
        ``<run_dir>/fits/<job-id>/`` (with its ``job.json``); no ``resume``.  A deployment whose
        nodes require secure aggregation refuses a fit without it (checked here, before the run).
        None: a deployment is started for this fit and stopped on return.

    Returns
    -------
    FitResult
        V, history, stopping reason, config.  ``extra["flower"]`` holds start-up and
        wire numbers, among them ``time_to_round1`` (seconds from this call to the
        start of round 1).  A clustering run adds ``extra["labels"]`` (n,),
        ``extra["cluster_centers"]`` (c, r), ``extra["clustering"]`` (options, r,
        sizes) and, with ``labels``, ``extra["scores"]`` (ACC/NMI/purity, also in
        result.json).

    Raises
    ------
    InputError, ParameterError
        Bad input, before any process starts.
    FlowerRunError
        The run failed (the message names the client and round).

    Notes
    -----
    With the same seed and rounds, V (and the labels) equal the in-process
    engine's bit for bit (BLAS pinned, as here).
    """
    t_launch = time.time()
    if deployment is not None:
        run_dir = _check_shared_deployment(deployment, view_paths, mask_paths, run_dir, resume,
                                           FLOWER_SECURE_AGGREGATION if secure_aggregation is None
                                           else bool(secure_aggregation))
    elif run_dir is None:
        raise ParameterError("run_flower needs a run_dir (or a started deployment)")
    max_rounds, tol = resolve_budget(cfg, max_rounds, tol)
    check_inputs(view_paths, None if n_clusters is not None else cfg.n_components, n_clusters=n_clusters,
                 mask_paths=mask_paths)
    if labels is not None and n_clusters is None:
        raise ParameterError("labels (to score against) need n_clusters")
    cluster_rc = clustering_run_config(n_clusters, clustering) if n_clusters is not None else {}
    if FLOWER_SECURE_AGGREGATION if secure_aggregation is None else secure_aggregation:
        secagg.warn_two_parties(len(view_paths), cfg.dp_enabled)  # here: the ServerApp's goes to its log only
    run_dir = Path(run_dir).resolve()
    lock = _lock_run_dir(run_dir)  # before job.json: a second launch must not touch the first's files
    try:
        job_file = run_dir / "job.json"
        out_dir = None  # the deployment's default, <run_dir>/server
        if deployment is not None:  # fits on one deployment: each its own out-dir and job record
            job_id = f"job-{uuid.uuid4().hex[:12]}"
            out_dir = run_dir / "fits" / job_id
            job_file = out_dir / "job.json"
        elif resume:
            if not job_file.is_file():
                raise FlowerRunError(f"nothing to resume in {run_dir} (no job.json)")
            job_id = json.loads(job_file.read_text())["job-id"]
        else:
            job_id = f"job-{uuid.uuid4().hex[:12]}"
        run_config = {
            "algorithm": algorithm, "num-rounds": int(max_rounds), "tol": float(tol), "seed": int(seed),
            "config-json": json.dumps(cfg.to_dict()), "diagnostics": bool(cfg.diagnostics), "job-id": job_id,
            "resume": bool(resume), "round-timeout": float(round_timeout), "node-timeout": float(node_timeout),
            "startup-timeout": float(startup_timeout or 0.0),
            "record-wire": bool(record_wire), "record-wire-arrays": bool(record_wire_arrays),
            "secure-aggregation": FLOWER_SECURE_AGGREGATION if secure_aggregation is None else bool(secure_aggregation),
            **cluster_rc,
        }
        if participation is not None:
            run_config.update({"min-clients": float(participation.min_clients or 0),
                               "sample-clients": float(participation.sample or 0), "rejoin": participation.rejoin})
        private_dir(job_file.parent)
        write_json_atomic(job_file, {"job-id": job_id, "run-config": run_config,
                                     "views": [str(Path(p).resolve()) for p in view_paths]})
        t0 = time.perf_counter()
        if deployment is not None:
            dep = deployment
            outcome = dep.run(run_config, out_dir=out_dir, timeout=timeout, progress=progress)
        else:
            with LoopbackDeployment(run_dir, view_paths, pin_threads=pin_threads, tls=tls, auth=auth,
                                    mask_paths=mask_paths,
                                    require_secure_aggregation=bool(run_config["secure-aggregation"])) as dep:
                outcome = dep.run(run_config, timeout=timeout, progress=progress)
        wall = time.perf_counter() - t0
        if not outcome.ok:
            raise FlowerRunError(failure_message(outcome.status), outcome.status)
        if not keep_views:  # completed: no resume will read them
            drop_view_copies(run_dir, len(view_paths))
        res = load_result(outcome.out_dir)
        fl = res.extra.setdefault("flower", {})
        fl.update({"startup_seconds": dep.startup_seconds, "flwr_run_seconds": outcome.wall_seconds,
                   "wall_seconds": wall, "run_dir": str(run_dir), "launched_at": t_launch, "tls": dep.tls is not None,
                   "auth": dep.auth, "security_seconds": dep.security_seconds,
                   "shared_deployment": deployment is not None, "out_dir": str(outcome.out_dir)})
        if fl.get("round1_started_at") is not None:
            fl["time_to_round1"] = float(fl["round1_started_at"]) - t_launch
        if n_clusters is not None:
            from fedsonmf.federation.flower.clustering import read_labels_csv

            found = read_labels_csv(outcome.out_dir / "labels.csv")
            res.extra["labels"] = found
            res.extra["cluster_centers"] = np.load(outcome.out_dir / "centers.npy")
            message = res.extra.get("clustering", {}).get("rank_message")
            if message:
                warn(message, DataWarning)
            if labels is not None:
                from fedsonmf.metrics import clustering_scores

                y = np.asarray(labels).ravel()
                if y.size != found.size:
                    raise InputError(f"{y.size} labels for {found.size} samples")
                res.extra["scores"] = clustering_scores(y, found, ari=True)
                _update_result_json(outcome.out_dir, {"scores": res.extra["scores"]})
        return res
    finally:
        lock.release()


def _check_shared_deployment(dep: LoopbackDeployment, view_paths, mask_paths, run_dir, resume: bool,
                             secure: bool) -> Path:
    """The run folder of a fit on the started deployment ``dep``, after checking that the fit fits
    it (a :class:`ParameterError` or :class:`InputError` names the mismatch before anything runs)."""
    if dep.superlink is None or dep.superlink.poll() is not None:
        raise FlowerRunError(f"the deployment in {dep.run_dir} is not running: start it first "
                             "(with LoopbackDeployment(...) as dep: ...)")
    if resume:
        raise ParameterError("resume continues the run saved in a run folder of its own, not a fit on a shared "
                             "deployment")
    if run_dir is not None and Path(run_dir).resolve() != dep.run_dir:
        raise ParameterError(f"run_dir {run_dir} is not the deployment's run folder {dep.run_dir}")
    given = [Path(p).resolve() for p in view_paths]
    if given != dep.view_paths:
        raise InputError(f"the fit's view files {[str(p) for p in given]} are not the ones the deployment serves "
                         f"{[str(p) for p in dep.view_paths]}")
    masks = [None if m is None else Path(m).resolve() for m in (mask_paths or [None] * len(given))]
    if masks != dep.mask_paths:
        raise InputError("the fit's mask files are not the ones the deployment's nodes were started with")
    if dep.require_secure_aggregation and not secure:
        raise ParameterError("the deployment's nodes require secure aggregation (started with "
                             "require_secure_aggregation=True) and refuse this fit without it: keep "
                             "secure_aggregation on, or start the deployment with require_secure_aggregation=False")
    return dep.run_dir


def drop_view_copies(run_dir, n_views: int) -> int:
    """Remove the nodes' copies of their views from the run folder ``run_dir``; the bytes freed.

    A node keeps, in its state folder (``nodes/p<i>/state/``), a clustering run's prepared view
    for every fit (``<job>[-restart-<k>]/view-<i>.npy|.npz``: dense, (n, max(d_p', r)) float64)
    and the binary copy of a view parsed from text or MATLAB (``view-copy-<i>.*``).  A resume
    reads them (the prepared view is the clustering's input, and its fingerprint is checked);
    after a completed run nothing does.  Everything else is kept: the fitted transforms and
    bases (predict needs them), the checkpoints, the logs and the results.
    """
    from fedsonmf.federation.flower.clustering import drop_prepared_view

    freed = 0
    for p in range(int(n_views)):
        base = Path(run_dir) / "nodes" / f"p{p}" / "state"
        if not base.is_dir():
            continue
        found = [f for d in base.iterdir() if d.is_dir() for f in d.glob(f"view-{p}.np[yz]")]
        found += [f for f in base.glob(f"view-copy-{p}.*") if f.is_file()]
        freed += sum(f.stat().st_size for f in found)
        for d in {f.parent for f in found if f.parent != base}:
            drop_prepared_view(d, p)
        for f in found:
            f.unlink(missing_ok=True)
    return freed


def folder_size(path) -> int:
    """Bytes of the files below ``path`` (symbolic links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


@dataclass
class PredictOutcome:
    """What :func:`predict_flower` returns: the new samples' ``labels`` (n_new,), their
    embedding ``V`` (r, n_new) and the out-dir (``labels.csv``, ``V.npy``, ``result.json``)."""

    labels: np.ndarray
    V: np.ndarray
    out_dir: Path
    wall_seconds: float


def predict_flower(view_paths, new_view_paths, *, run_dir, out_dir=None,
                   round_timeout: float = dd.ROUND_TIMEOUT,
                   node_timeout: float = dd.NODE_TIMEOUT, record_wire: bool = False,
                   pin_threads: bool = True, timeout: float = 1800.0, tls: tuple | None = None,
                   progress=None) -> PredictOutcome:
    """Assign new samples to the clusters of the clustering run saved in ``run_dir`` (one exchange).

    Starts the loopback deployment again on the same node folders (each node keeps its
    fitted transform and basis there), with ``new_view_paths[p]`` as node p's
    ``predict-path`` (the node config names the file a node reads, never the run config).
    Each node sends ``U_p^T X_p^new`` (r x n_new) of its preprocessed new samples; the
    server embeds them with the bases fixed and picks the nearest fitted centre -- the
    in-process ``FedMultiViewClustering.predict``, bit for bit.

    Parameters
    ----------
    view_paths : list of path
        The fitted run's view files (one per node, in view order).
    new_view_paths : list of path
        One file of new samples per view (``.npy`` or sparse ``.npz``, the fitted widths).
    run_dir : path
        The folder of a clustering run (:func:`run_flower` with ``n_clusters``).
    out_dir : path or None, default=None
        Where the ServerApp writes ``labels.csv``, ``V.npy`` and ``result.json``;
        None = ``<run_dir>/predict``.
    round_timeout, node_timeout : float, default=300.0, 120.0
        Seconds the server waits for the replies, and for the nodes at the handshake.
    record_wire : bool, default=False
        Log every message (privacy audit).
    pin_threads : bool, default=True
        BLAS threads = 1 in every process.
    timeout : float, default=1800.0
        Seconds the ``flwr run`` may go without progress.
    tls : tuple or None, default=None
        As in :class:`LoopbackDeployment` (None: a per-deployment CA).
    progress : callable or None, default=None
        ``progress(status)`` with the ServerApp's ``status.json``.

    Returns
    -------
    PredictOutcome
        The new samples' labels (n_new,), their embedding V (r, n_new), the out-dir.

    Raises
    ------
    InputError
        Before anything starts: no clustering run in ``run_dir``, or new-sample files that do
        not match the views.
    FlowerRunError
        The predict run failed.
    """
    run_dir = Path(run_dir).resolve()
    model = run_dir / "server"
    if not (model / "centers.npy").is_file():
        raise InputError(f"{run_dir} holds no clustering run (no server/centers.npy): fit with n_clusters first")
    if len(new_view_paths) != len(view_paths):
        raise InputError(f"{len(new_view_paths)} files of new samples for {len(view_paths)} views")
    fitted = [d for _, d in check_inputs(view_paths)]
    widths = [d for _, d in check_inputs(new_view_paths)]
    if widths != fitted:
        raise InputError(f"the new samples' files have {widths} features per view, the fitted views {fitted}")
    out_dir = Path(out_dir or run_dir / "predict").resolve()
    rc = {"mode": "predict", "model-dir": str(model), "round-timeout": float(round_timeout),
          "node-timeout": float(node_timeout), "record-wire": bool(record_wire)}
    try:
        fit_secure = bool(json.loads((model / "result.json").read_text())["config"].get("secure_aggregation", False))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{run_dir} holds no readable fit record (server/result.json): {exc}") from exc
    with LoopbackDeployment(run_dir, view_paths, pin_threads=pin_threads, tls=tls, predict_paths=new_view_paths,
                            require_secure_aggregation=fit_secure) as dep:  # nodes as the fit had them
        outcome = dep.run(rc, out_dir=out_dir, timeout=timeout, progress=progress)
    if not outcome.ok:
        raise FlowerRunError(f"Flower predict run failed: {outcome.status.get('error')}", outcome.status)
    from fedsonmf.federation.flower.clustering import read_labels_csv

    return PredictOutcome(read_labels_csv(out_dir / "labels.csv"), np.load(out_dir / "V.npy"), out_dir,
                          outcome.wall_seconds)
