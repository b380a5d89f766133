"""CLI commands of the cluster area (registered by :mod:`fedsonmf.cli`).

* ``fedsonmf cluster PATH.mat`` -- the real-data protocol on one multi-view file;
  ``fedsonmf cluster A.csv B.npz ... --clusters c [--labels y.csv]`` -- one file per view
  (:func:`fedsonmf.datasets.load_views`), rows aligned by sample id;
* ``fedsonmf reproduce table1`` -- every dataset of the data folder, beside the paper's Table 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import typer

from fedsonmf._io import write_json_atomic
from fedsonmf._provenance import meta
from fedsonmf.cli.options import ALGORITHM_OPTIONS, DP_OPTIONS, check_output_path, threads_option, with_params
from fedsonmf.cli.progress import UNITS
from fedsonmf.exceptions import InputError, ParameterError

#: the paper's literal protocol (FedMultiViewClustering.paper)
PAPER = {"n_components": "paper", "preprocess": "none", "normalize_embedding": False}
PAPER_HELP = "The paper's literal protocol: r = clusters, no preprocessing, k-means on raw V^T."


def _check_common(seeds: int, nmi_average: str, json_path) -> None:
    """Arguments checked before any fitting starts."""
    from fedsonmf.metrics import _AVERAGE_METHODS as NMI_AVERAGES

    if seeds < 1:
        raise typer.BadParameter(f"must be >= 1, got {seeds}", param_hint="--seeds")
    if nmi_average not in NMI_AVERAGES:
        raise typer.BadParameter(f"must be one of {', '.join(NMI_AVERAGES)}, got {nmi_average!r}",
                                 param_hint="--nmi-average")
    check_output_path(json_path, "--json")


def _seeds_line(n_seeds: int, asked: int | None, labelled: bool) -> str:
    """The line that says how many seeds ``fedsonmf cluster`` fits, and why (stderr, at the start)."""
    which = "seed 0" if n_seeds == 1 else f"seeds 0..{n_seeds - 1}"
    if not labelled:
        return f"fedsonmf cluster: 1 fit ({which}): no labels, so no scores to average over seeds"
    why = "as --seeds asks" if asked is not None else "the default with labels; --seeds N to change"
    return (f"fedsonmf cluster: {n_seeds} fit{'s' if n_seeds > 1 else ''} ({which}, {why}); the scores are "
            "the mean ± std over the seeds")


class _Progress:
    """Two rich bars with ETA: seeds of the current method, and the current fit's way to its end
    (rounds, or R/R1 towards ``tol``: :func:`fedsonmf.cli.progress.round_fraction`)."""

    def __init__(self, enabled: bool, n_seeds: int, max_rounds: int, tol: float | None = None):
        self.enabled, self.n_seeds, self.max_rounds, self.tol = enabled, n_seeds, max_rounds, tol
        self.progress = None
        self._restarts: dict[int, float] = {}  # the current fit's restarts: how far each is

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress

            from fedsonmf.cli.progress import progress_columns

            self.progress = Progress(*progress_columns(), console=Console(stderr=True), transient=True)
            self.progress.__enter__()
            self.seeds = self.progress.add_task("seeds", total=self.n_seeds, status=f"0/{self.n_seeds}")
            self.rounds = self.progress.add_task("rounds", total=UNITS, status="")
        return self

    def start(self, description: str):
        if self.progress:
            self.progress.reset(self.seeds, total=self.n_seeds, description=description, status=f"0/{self.n_seeds}")
            self.progress.reset(self.rounds, total=UNITS)
        self._restarts = {}

    def on_seed(self, method, seed, row):
        if self.progress:
            if self.progress.tasks[self.seeds].description != method:
                self.start(method)
            self.progress.update(self.seeds, advance=1, status=f"{int(self.progress.tasks[self.seeds].completed) + 1}"
                                 f"/{self.n_seeds}  seed {seed}: ACC {100 * row['acc']:.1f}")
            self.progress.reset(self.rounds, total=UNITS)
        self._restarts = {}

    def on_round(self, row):
        """One round of one fit; a clustering's restarts (``restart`` of ``n_restarts``, possibly
        interleaved with ``--n-jobs``) share the bar: it shows their mean way to the end."""
        if self.progress:
            from fedsonmf.cli.progress import round_fraction, round_status

            frac, status = round_fraction(row, self.max_rounds, self.tol), round_status(row, self.max_rounds, self.tol)
            n = int(row.get("n_restarts", 1))
            if n > 1:
                self._restarts[int(row["restart"])] = frac
                frac = sum(self._restarts.values()) / n
                status = f"restart {int(row['restart']) + 1}/{n}  {status}"
            self.progress.update(self.rounds, completed=UNITS * frac, status=status)

    def __exit__(self, *exc):
        if self.progress:
            self.progress.__exit__(*exc)
        return False


def _table(results, title: str):
    from rich.table import Table

    from fedsonmf.experiments.table1 import rows_for

    t = Table(title=title)
    for col in ("dataset", "method"):
        t.add_column(col, justify="left")
    for col in ("ACC %", "NMI %", "purity %", "s / seed"):
        t.add_column(col, justify="right")
    for res in results:
        for i, row in enumerate(rows_for(res)):
            style = "dim" if row["method"].startswith("paper") else None
            t.add_row(row["dataset"] if i == 0 else "", row["method"], row["acc"], row["nmi"], row["purity"],
                      row["seconds"], style=style)
        t.add_section()
    return t


def _describe_defaults(res, params) -> str:
    if not res.reports:
        return ""
    rep = res.reports.get("fedsonmf") or next(iter(res.reports.values()))
    info = rep.info[0] if rep.info else {}
    if "mu" not in info:
        return ""
    r = sorted({i.get("n_components") for i in rep.info})
    rounds = [i["n_rounds"] for i in rep.info]
    ranks = sorted({i["effective_rank"] for i in rep.info})
    how = f"label-free rule mu_scale={params.get('mu_scale', 0.1):g}" if params.get("mu", "auto") == "auto" else "given"
    return (f"{res.label}: r={r}, mu={np.mean([i['mu'] for i in rep.info]):.4g} ({how}), "
            f"rounds {min(rounds)}-{max(rounds)}, effective rank {ranks}, "
            f"embedding {'row-normalised' if params.get('normalize_embedding', True) else 'raw'}")





def _load(paths: list[Path], *, views_key, labels_key, missing, labels_path, id_column, header, delimiter):
    """One multi-view .mat file (load_mat, as before) or one file per view (load_views)."""
    from fedsonmf.datasets.files import check_format, load_views
    from fedsonmf.datasets.mat import load_mat

    for p in paths:  # an unsupported extension is refused before any file is read
        check_format(p)
    if missing not in ("auto", "mask", "zeros"):
        raise ParameterError(f"--missing must be 'auto', 'mask' or 'zeros', got {missing!r}")
    if len(paths) == 1 and paths[0].suffix.lower() == ".mat":
        for flag, value in (("--labels", labels_path), ("--id-column", id_column), ("--delimiter", delimiter),
                            ("--header/--no-header", header)):
            if value is not None:
                raise ParameterError(f"{flag} is for view files (one per view); a multi-view .mat file carries its "
                                     "labels (--labels-key picks them)")
        vk = None if views_key is None else (views_key.split(",") if "," in views_key else views_key)
        return load_mat(paths[0], views_key=vk, labels_key=labels_key, missing=missing)
    if labels_key is not None:
        raise ParameterError("--labels-key is for a multi-view .mat file given alone; give the labels of view "
                             "files with --labels FILE")
    key = None
    if views_key is not None:
        key = views_key.split(",") if "," in views_key else views_key
        if isinstance(key, list) and len(key) != len(paths):
            raise ParameterError(f"--views-key: {len(key)} names for {len(paths)} view files")
    # our choice: with view files 'auto' means the complete case (every file must hold the same sample ids)
    return load_views(paths, labels=labels_path, id_column=id_column, key=key, delimiter=delimiter,
                      header="infer" if header is None else header,
                      missing={"auto": "error"}.get(missing, missing))


def _fit_assignments(ds, c: int, algorithm: str, params: dict, seed: int, on_round=None):
    """The clusters of one seed's fit, exactly as the protocol's fit of that seed (evaluate_clustering)."""
    import warnings

    from fedsonmf.exceptions import DataWarning, PrivacyWarning
    from fedsonmf.experiments.evaluation import clustering_model

    model = clustering_model(c, {**params, "algorithm": algorithm}, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as run_dataset: capped runs report their rounds
        warnings.simplefilter("once", DataWarning)  # but what the data needs said, once
        warnings.simplefilter("once", PrivacyWarning)  # and what the privacy settings do not give
        labels = model.fit_predict(ds.views, callback=on_round, masks=ds.masks if algorithm == "fedsonmf" else None)
    return labels, model


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def _describe_privacy(report) -> str:
    """One line with the (epsilon, delta) of the DP fits (the same for every seed), or ''."""
    reps = [i["privacy"] for i in report.info if i.get("privacy")]
    if not reps:
        return ""
    p = reps[0]
    return (f"differential privacy ({p['unit'].split(' (')[0]}): epsilon = {p['epsilon']:.4g} per view against "
            f"anyone who sees its uploads, {p['epsilon_secagg']:.4g} against a server that sees only sums "
            f"(secure aggregation), {p['epsilon_all_views']:.4g} for all views at once; delta = {p['delta']:g}, "
            f"noise multiplier {p['noise_multiplier']:.4g}, clip {p['clip']:g}, {p['rounds']} rounds, per fit")


def _paper_key(path: Path, stem: str) -> str:
    """The Table 1 name of a file: a known dataset name among its parent folders, else its stem."""
    from fedsonmf.experiments.table1 import PAPER_TABLE1

    for part in path.resolve().parts[::-1]:
        if part in PAPER_TABLE1:
            return part
    return stem


def _check_rank(rank: int, ds) -> None:
    """Refuse at once a --rank no fit could use (it would be capped to a huge rank, or pad every view)."""
    widths = [int(X.shape[1]) for X in ds.views]
    p = int(np.argmin(widths))
    if rank > widths[p]:
        raise ParameterError(f"--rank {rank} exceeds the features of view {p} ({widths[p]}; the views have "
                             f"{widths}): a nonnegative orthonormal basis needs rank <= features -- choose "
                             f"--rank <= {widths[p]}, or leave --rank out for the 'auto' rule (2 x clusters)")
    if rank > ds.n_samples:
        raise ParameterError(f"--rank {rank} exceeds the number of samples ({ds.n_samples}): choose --rank <= "
                             f"{ds.n_samples}")


def _scored_files(clusters_path: Path, labels_path: Path):
    """``(y_true, y_pred)`` of a clusters file and a labels file, in one sample order.

    A clusters file whose ids are the positions 0..n-1 (a Flower run's ``labels.csv``, the rows in
    the nodes' order) takes labels one per line or as ``id,label`` pairs of those positions; a file
    of other ids (``--labels-out``, ``flower align labels``) takes ``id,label`` pairs, matched by id.
    """
    from fedsonmf.datasets.files import align_labels, read_labels, sorted_ids

    for p, flag in ((clusters_path, "CLUSTERS"), (labels_path, "--labels")):
        if not p.is_file():
            raise InputError(f"{flag}: {p} is not a file")
    values, ids = read_labels(clusters_path)
    n = values.size
    if n == 0:
        raise InputError(f"{clusters_path} holds no clusters")
    key = sorted_ids(ids)
    if key is not None and key[1] and np.array_equal(key[0], np.arange(n)):
        key = None  # positions: the nodes' order (a Flower run's labels.csv)
    if key is not None and read_labels(labels_path)[1] is None:
        raise InputError(f"{clusters_path} names its samples by id, so --labels must be id,label pairs (one "
                         f"label per line has no ids to match)")
    # both files through the same alignment: by id (duplicates, missing and extra ids refused) or by
    # position; the clusters first, so that an id it repeats is named as such
    pred = align_labels(clusters_path, key, n)
    return align_labels(labels_path, key, n), pred


def register(app, reproduce_app) -> None:
    """Add this area's commands to the main app and to fedsonmf reproduce."""

    @app.command()
    def score(
        clusters_path: Path = typer.Argument(..., metavar="CLUSTERS", help="A clustering: sample_id,cluster "
                                             "lines (--labels-out, a Flower run's labels.csv, `flower align "
                                             "labels`), or one cluster per line, or .npy."),
        labels_path: Path = typer.Option(..., "--labels", help="The true classes: one per line (in the "
                                         "clusters' order), or id,label pairs (matched by id), or .npy."),
        nmi_average: str = typer.Option("arithmetic", help="NMI normalisation: arithmetic, sqrt, max, ..."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write the scores here."),
    ):
        """Score a clustering file against true classes (ACC, NMI, purity, adjusted Rand index): e.g. a
        Flower run's labels.csv copied off the SuperLink host."""
        from fedsonmf.metrics import clustering_scores, format_scores

        _check_common(1, nmi_average, json_path)
        y, pred = _scored_files(clusters_path, labels_path)
        sc = clustering_scores(y, pred, average_method=nmi_average, ari=True)
        typer.echo(f"{y.size} samples, {int(pred.max()) + 1} clusters, {int(y.max()) + 1} classes: "
                   f"{format_scores(sc, digits=2)}")
        if json_path is not None:
            doc = {"scores": sc, "n_samples": int(y.size), "n_clusters": int(pred.max()) + 1,
                   "n_classes": int(y.max()) + 1, "nmi_average": nmi_average,
                   "meta": meta(inputs=[clusters_path, labels_path])}
            write_json_atomic(json_path, doc)
            typer.echo(f"wrote {json_path}")

    @app.command()
    @with_params(*ALGORITHM_OPTIONS, "max_rounds", "tol", "init_u", "init_v", "normalize_embedding", "preprocess",
                 "n_init", "n_jobs", *DP_OPTIONS)
    def cluster(
        paths: list[Path] = typer.Argument(..., help="A multi-view .mat file, or one file per view: .csv, .tsv, "
                                           ".npy, .npz (scipy.sparse), .mtx, .mat (samples x features)."),
        clusters: Optional[int] = typer.Option(None, "--clusters", "-k", min=1, help="Clusters (default: #classes)."),
        rank: Optional[int] = typer.Option(None, "--rank", "-r", min=1,
                                           help="Rank r (default: the 'auto' rule, 2 x clusters)."),
        paper: bool = typer.Option(False, "--paper", help=PAPER_HELP),
        seeds: Optional[int] = typer.Option(None, "--seeds", help="Seeds 0..seeds-1, one whole fit each. "
                                            "Default: 10 when the data has labels (the .mat file's, or --labels): "
                                            "the scores are the mean ± std over the seeds, and the run takes 10 "
                                            "times one fit; 1 without labels (nothing to average). The count and "
                                            "its reason are printed to stderr at the start (not with -q)."),
        labels_path: Optional[Path] = typer.Option(None, "--labels", help="View files: the labels to score "
                                                   "against (.csv/.tsv/.txt/.npy: one per row, or id,label pairs)."),
        labels_out: Optional[Path] = typer.Option(None, "--labels-out", "--assignments", help="Write the "
                                                  "clusters of seed 0 here as CSV sample_id,cluster."),
        id_column: Optional[str] = typer.Option(None, "--id-column", help="CSV/TSV views: the sample-id column "
                                                "(header name or 0-based index; default: a column named id or "
                                                "sample_id). Other views: <stem>.ids.txt beside the file."),
        header: Optional[bool] = typer.Option(None, "--header/--no-header", help="CSV/TSV views: the first row "
                                              "is (not) a header (default: inferred)."),
        delimiter: Optional[str] = typer.Option(None, "--delimiter", help="CSV/TSV views: the field separator "
                                                "(default: ',' for .csv, tab for .tsv)."),
        views_key: Optional[str] = typer.Option(None, "--views-key", help="Variable holding the views (comma-"
                                                "separated names for one variable per view) if not guessed; "
                                                "with view files: the variable of each .mat view."),
        labels_key: Optional[str] = typer.Option(None, "--labels-key", help="Variable holding the labels."),
        missing: str = typer.Option("auto", "--missing", help="Incomplete views: 'auto' (the file's availability "
                                    "variable, if any; view files: every file must hold the same sample ids), "
                                    "'mask' (view files: different ids become the availability masks; .mat: also "
                                    "an all-zero row is a missing sample) or 'zeros' (zero-filling, no mask)."),
        context: bool = typer.Option(False, "--context", help="Also run, in the same run, the simple centralized "
                                     "references on the pooled views: k-means on the row-normalised and on the "
                                     "Frobenius-scaled concatenation, scikit-learn NMF + k-means, multi-view "
                                     "spectral clustering (the best is marked)."),
        nmi_average: str = typer.Option("arithmetic", help="NMI normalisation: arithmetic, sqrt, max, ..."),
        threads: int = threads_option("BLAS threads (1 is fastest for these small products)."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write every score and parameter here."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display and no seeds line."),
        params: Any = None,  # filled by @with_params from the table-backed options
    ):
        """Cluster the samples of a multi-view .mat file, or of one file per view (one client per view); with
        labels, score them (ACC/NMI/purity): one fit without labels, 10 seeds with labels (--seeds)."""
        from rich.console import Console
        from threadpoolctl import threadpool_limits

        from fedsonmf.datasets.files import write_assignments

        n_seeds = seeds if seeds is not None else 10
        _check_common(n_seeds, nmi_average, json_path)
        check_output_path(labels_out, "--labels-out")
        ds = _load(paths, views_key=views_key, labels_key=labels_key, missing=missing, labels_path=labels_path,
                   id_column=id_column, header=header, delimiter=delimiter)
        # after the files are read: scikit-learn's import (about 1 s) is not paid for a refused file
        from fedsonmf.experiments.table1 import CONTEXT_METHODS, run_dataset, standing
        if ds.labels is None:
            if clusters is None:
                raise ParameterError("--clusters is needed when there are no labels (--labels)")
            if context:
                raise ParameterError("--context: the context methods are scored against labels: give --labels")
            if seeds is not None and seeds != 1:
                raise ParameterError("--seeds: without --labels there are no scores to average over seeds; one "
                                     "fit (seed 0) is run")
            n_seeds = 1
        if not quiet:
            typer.echo(_seeds_line(n_seeds, seeds, ds.labels is not None), err=True)
        if rank is not None:
            _check_rank(rank, ds)
        algorithm, rounds = params.pop("algorithm"), params["max_rounds"]
        params["n_components"] = "auto" if rank is None else rank
        if paper:
            params.update(PAPER)
        label = paths[0].name if len(paths) == 1 else ", ".join(p.name for p in paths)
        console = Console()
        assignments = None
        with threadpool_limits(threads), _Progress(not quiet, n_seeds, rounds, params.get("tol")) as prog:
            if ds.labels is not None:
                methods = [algorithm, *(CONTEXT_METHODS if context else ())]
                res = run_dataset(ds, key=_paper_key(paths[0], ds.name), label=label, methods=methods,
                                  seeds=range(n_seeds), params=params, average_method=nmi_average,
                                  n_clusters=clusters, on_seed=prog.on_seed, on_round=prog.on_round)
                if algorithm not in res.reports:  # the method could not run (e.g. r above a view's width)
                    raise InputError(res.note or f"{algorithm} did not run")
                if labels_out is not None:  # seed 0's fit again: the report keeps scores, not partitions
                    assignments, _ = _fit_assignments(ds, int(clusters or ds.n_classes or 0), algorithm, params, 0)
            else:
                prog.start(algorithm)
                assignments, model = _fit_assignments(ds, int(clusters or 0), algorithm, params, 0,
                                                      on_round=prog.on_round)
        if ds.labels is not None:
            console.print(_table([res], f"{ds.name}: n={ds.n_samples}, views={ds.n_features}, c={ds.n_classes}, "
                                        f"{n_seeds} seeds (mean ± std, %)"))
            console.print(_describe_defaults(res, params))
            if context:
                console.print(standing(res, algorithm))
            privacy = _describe_privacy(res.reports[algorithm])
            if privacy:
                console.print(privacy)
            doc = {"params": params, "result": res.to_dict()}
        else:
            assert assignments is not None and clusters is not None  # no labels: --clusters was required
            sizes = np.bincount(assignments, minlength=clusters).tolist()
            console.print(f"{ds.name}: n={ds.n_samples}, views={ds.n_features}, {clusters} clusters of sizes "
                          f"{sizes} (seed 0; r={model.n_components_}, mu={model.mu_:.4g}, {model.n_rounds_} rounds, "
                          f"effective rank {model.effective_rank_}); no labels, no scores")
            doc = {"params": params, "result": {"label": label, "n_samples": ds.n_samples, "n_views": ds.n_views,
                                                "n_features": ds.n_features, "n_clusters": clusters, "seed": 0,
                                                "cluster_sizes": sizes, "n_components": model.n_components_,
                                                "mu": model.mu_, "n_rounds": model.n_rounds_,
                                                "effective_rank": model.effective_rank_}}
        if labels_out is not None:
            write_assignments(labels_out, ds.ids, assignments)
            typer.echo(f"wrote {labels_out} ({ds.n_samples} rows: sample_id,cluster)")
        if json_path is not None:
            doc["meta"] = meta(inputs=[p for p in [*paths, labels_path] if p is not None], seeds=list(range(n_seeds)))
            write_json_atomic(json_path, doc, default=_json_default)
            typer.echo(f"wrote {json_path}")

    @reproduce_app.command("table1")
    @with_params("max_rounds", "tol", "rho1", "mu_scale", "normalize_embedding", "preprocess", "n_init", "n_jobs")
    def table1(
        data_dir: Optional[Path] = typer.Option(None, "--data",
                                                help="Data folder (default: FEDSONMF_DATA or ../shared/data)."),
        seeds: int = typer.Option(10, "--seeds", help="Seeds 0..seeds-1."),
        paper: bool = typer.Option(False, "--paper", help=PAPER_HELP),
        method: Optional[list[str]] = typer.Option(None, "--method", "-m", help="Methods (repeatable; default all): "
                                                   "fedsonmf, the references kmeans-rownorm, kmeans-frobenius, "
                                                   "nmf-kmeans, mv-spectral, the other federated algorithms."),
        include: Optional[list[str]] = typer.Option(
            None, "--only", help="Only these data sets (repeatable): a data-set name (BBCSport), or NAME/SOURCE for "
                                 "one source."),
        threads: int = threads_option(),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write all scores here."),
        quiet: bool = typer.Option(False, "--quiet", "-q"),
        params: Any = None,  # filled by @with_params from the table-backed options
    ):
        """Every dataset of the data folder, our rows beside the paper's Table 1 rows."""
        from rich.console import Console
        from threadpoolctl import threadpool_limits

        from fedsonmf.datasets.mat import default_data_dir
        from fedsonmf.experiments.table1 import available_methods, run_table1, standing

        _check_common(seeds, "arithmetic", json_path)
        root = data_dir or default_data_dir()
        if root is None or not Path(root).is_dir():
            raise InputError("no data folder: pass --data or set FEDSONMF_DATA")
        rounds = params["max_rounds"]
        if paper:
            params.update(PAPER)
        methods = list(method or available_methods())
        console = Console()
        results = []
        with threadpool_limits(threads), _Progress(not quiet, seeds, rounds, params.get("tol")) as prog:
            def on_dataset(label, ds):
                if prog.progress:
                    prog.progress.console.print(f"[bold]{label}[/] n={ds.n_samples} views={ds.n_features} "
                                                f"c={ds.n_classes}")

            def on_result(res):
                results.append(res)
                if prog.progress:
                    prog.progress.console.print(_table([res], res.label))
                if json_path is not None:
                    write_json_atomic(json_path, {"params": params, "methods": methods,
                                                  "results": [r.to_dict() for r in results],
                                                  "meta": meta(inputs=[root / r.label for r in results],
                                                               seeds=list(range(seeds)))})

            run_table1(root, methods=methods, seeds=range(seeds), params=params, include=include,
                       on_dataset=on_dataset, on_seed=prog.on_seed, on_round=prog.on_round, on_result=on_result)
        ours = "the paper's literal protocol (--paper)" if paper else "label-free defaults"
        console.print(_table(results, f"Table 1: {seeds} seeds, mean ± std (%); ours = {ours}"))
        for res in results:
            console.print(_describe_defaults(res, params))
            line = standing(res)
            if line:
                console.print(line)
            if res.note:
                console.print(f"{res.label}: {res.note}")
        console.print("Paper rows: Caltech101 49.48/50.40/87.51 and NUS-WIDE 56.35/43.34/57.52 "
                      "(datasets not in the folder).")
        if json_path is not None:
            typer.echo(f"wrote {json_path}")
