"""The real-data experiment of the paper's Table 1 (docs/algorithm.md §10), over every dataset found.

Every method sees the same views as loaded and the same seeds; each applies its own
scaling.  Methods:

* ``fedsonmf`` -- ours, :class:`~fedsonmf.estimators.clustering.FedMultiViewClustering`
  with its label-free defaults (the headline row);
* the simple centralized references of :data:`fedsonmf.experiments.references.REFERENCES`
  (``kmeans-rownorm``, ``kmeans-frobenius``, ``nmf-kmeans``, ``mv-spectral``): what a user
  with pooled data tries first; the table marks the best of them per data set;
* ``fedmvl`` and the other federated comparison methods with a model of their own
  (:data:`fedsonmf.algorithms.CLUSTERING_METHODS`), run in process;
* every other federated algorithm registered in
  :data:`fedsonmf.algorithms.ALGORITHMS` (e.g. the adapted FedMAvg / FedMGS),
  run through the same clustering wrapper with the same parameters.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedsonmf.algorithms import CLUSTERING_METHODS
from fedsonmf.datasets.mat import MultiViewDataset, find_datasets, load_mat
from fedsonmf.exceptions import DataWarning, InputError
from fedsonmf.experiments.evaluation import (
    ClusteringReport,
    evaluate_clustering,
    evaluate_method,
)
from fedsonmf.experiments.references import REFERENCES, best_reference, run_reference

__all__ = ["PAPER_TABLE1", "PAPER_BEST_BASELINE", "CONTEXT_METHODS", "DatasetResult", "run_dataset", "run_table1",
           "available_methods", "paper_key", "standing"]

#: the paper's Table 1, proposed method, % (ACC, NMI, purity), mean of 10 seeds
PAPER_TABLE1 = {
    "3Sources": (56.90, 56.90, 72.58),
    "BBCSport": (84.80, 76.45, 86.00),
    "Caltech101": (49.48, 50.40, 87.51),
    "NUS-WIDE": (56.35, 43.34, 57.52),
}
#: the paper's strongest baseline per metric on the two sets we have (method name in the value)
PAPER_BEST_BASELINE = {
    "3Sources": ((54.50, "FedMVL"), (50.32, "FedMVL"), (70.24, "FedMVL")),
    "BBCSport": ((80.88, "EFIMVC"), (65.76, "EFIMVC"), (82.10, "EFIMVC")),
}

#: the centralized references, in display order (fedsonmf.experiments.references)
CONTEXT_METHODS = tuple(REFERENCES)
#: earlier names of two references, still accepted by ``--method``
METHOD_ALIASES = {"kmeans-concat": "kmeans-frobenius", "nmf-concat": "nmf-kmeans"}


def available_methods() -> list[str]:
    """Ours first, then the context methods, then any other registered federated algorithm."""
    from fedsonmf.algorithms import ALGORITHMS, CLUSTERING_METHODS

    others = [name for name in ALGORITHMS if name != "fedsonmf"]
    return ["fedsonmf", *CONTEXT_METHODS, *others, *CLUSTERING_METHODS]


def paper_key(path: Path, root: Path | None = None) -> str:
    """The dataset name used by the paper for ``path`` (its top folder under ``root``, else the stem)."""
    path = Path(path)
    if root is not None:
        try:
            return path.relative_to(root).parts[0]
        except ValueError:
            pass
    return path.stem


@dataclass
class DatasetResult:
    """All methods on one dataset file."""

    key: str  # e.g. "3Sources"
    label: str  # e.g. "3Sources/ChuanbinZhang/3Sources.mat"
    n_samples: int
    n_views: int
    n_features: list[int]
    n_classes: int
    reports: dict[str, ClusteringReport] = field(default_factory=dict)
    seconds: float = 0.0
    note: str = ""

    def to_dict(self) -> dict:
        return {
            "key": self.key, "label": self.label, "n_samples": self.n_samples, "n_views": self.n_views,
            "n_features": self.n_features, "n_classes": self.n_classes, "seconds": self.seconds,
            "note": self.note, "paper": PAPER_TABLE1.get(self.key),
            "best_reference": best_reference({k: 100 * r.mean("acc") for k, r in self.reports.items()}),
            "reports": {k: r.to_dict() for k, r in self.reports.items()},
        }


def run_dataset(
    ds: MultiViewDataset,
    *,
    key: str,
    label: str,
    methods: Iterable[str] = ("fedsonmf", *CONTEXT_METHODS),
    seeds: Iterable[int] = range(10),
    params: dict | None = None,
    average_method: str = "arithmetic",
    n_clusters: int | None = None,
    on_seed: Callable[[str, int, dict], None] | None = None,
    on_round: Callable[[dict], None] | None = None,
) -> DatasetResult:
    """Run ``methods`` on one dataset over ``seeds``.

    Every method gets the views as loaded: the centralized references apply their own
    scaling (:mod:`~fedsonmf.experiments.references`), the federated methods run the
    estimator's own per-client pipeline (``params`` may switch it to the paper's protocol).
    ``n_clusters`` defaults to the number of classes.
    """
    params = dict(params or {})
    seeds = [int(s) for s in seeds]
    methods = [METHOD_ALIASES.get(m, m) for m in methods]
    c = int(n_clusters or ds.n_classes or 0)
    out = DatasetResult(key, label, ds.n_samples, ds.n_views, ds.n_features, c)
    masks = None
    if ds.mask is not None:  # the proposed method takes the file's availability mask (§15.1)
        masks = [np.asarray(ds.mask[:, p], dtype=bool) for p in range(ds.n_views)]
        out.note = ("incomplete views: fedsonmf and the comparison methods built for them (efimvc) use the "
                    "file's availability mask; the other methods see a missing view as an all-zero row")
    t0 = time.perf_counter()
    for method in methods:
        cb = (lambda seed, row, _m=method: on_seed(_m, seed, row)) if on_seed else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning of capped runs: rounds are reported
            warnings.simplefilter("once", DataWarning)  # what the data needs said (a padded or degenerate view)
            if method in CLUSTERING_METHODS:  # a federated comparison method with its own model
                fn = CLUSTERING_METHODS[method]
                extra = {"masks": masks} if masks is not None and "masks" in inspect.signature(fn).parameters else {}

                def fit_predict(s, _fn=fn, _extra=extra):
                    return np.asarray(_fn(ds.views, c, random_state=s, **_extra)), {}

                rep = evaluate_method(
                    method, fit_predict,
                    ds.labels, seeds, average_method=average_method, callback=cb, params={"method": method})
            elif method in REFERENCES:
                def reference(s, _m=method):
                    return run_reference(_m, ds.views, c, random_state=s), {}

                rep = evaluate_method(
                    method, reference,
                    ds.labels, seeds, average_method=average_method, callback=cb,
                    params={"reference": method, "centralized": True})
            else:
                # the estimator runs its own per-client pipeline (preprocessing, then the Frobenius scaling)
                p = {**params, "algorithm": method}
                try:
                    rep = evaluate_clustering(ds.views, ds.labels, c, seeds=seeds, average_method=average_method,
                                              method=method, callback=cb, round_callback=on_round,
                                              masks=masks if method == "fedsonmf" else None, **p)
                except InputError as exc:  # e.g. a view with fewer features than r
                    out.note = (out.note + "; " if out.note else "") + f"{method} skipped: {exc}"
                    continue
        out.reports[method] = rep
    out.seconds = time.perf_counter() - t0
    return out


def _parts(text: str) -> list[str]:
    return [p.lower() for p in Path(text).with_suffix("").parts] if text.lower().endswith(".mat") else \
        [p.lower() for p in Path(text).parts]


def select_datasets(paths, root, include: Iterable[str] | None = None) -> list:
    """The files of ``paths`` that ``include`` names (all without ``include``).

    A name matches whole path components from the data folder's root: a data-set
    name (``BBCSport``: every file of that data set), a data set and its source
    (``BBCSport/zskong``) or one file (``BBCSport/zskong/BBCSport.mat``); case does
    not matter.  A name that matches no file is an :class:`InputError` listing the
    data sets, never a silent substring match (``zskong`` is a source, not a data set).
    """
    root = Path(root)
    paths = list(paths)
    if not include:
        return paths
    labels = [_parts(str(Path(p).relative_to(root))) for p in paths]
    chosen, unmatched = set(), []
    for name in include:
        want = _parts(str(name).strip("/"))
        hit = {i for i, lab in enumerate(labels) if want and lab[:len(want)] == want}
        if not hit:
            unmatched.append(str(name))
        chosen |= hit
    if unmatched:
        names = sorted({str(Path(p).relative_to(root)).split("/")[0] for p in paths})
        raise InputError(f"--only {', '.join(map(repr, unmatched))} names no data set under {root}; data sets: "
                         f"{', '.join(names)} (or one source, e.g. {names[0] if names else 'NAME'}/<source>)")
    return [p for i, p in enumerate(paths) if i in chosen]


def run_table1(
    data_dir,
    *,
    methods: Iterable[str] | None = None,
    seeds: Iterable[int] = range(10),
    params: dict | None = None,
    average_method: str = "arithmetic",
    include: Iterable[str] | None = None,
    on_dataset: Callable[[str, MultiViewDataset], None] | None = None,
    on_seed=None,
    on_round=None,
    on_result: Callable[[DatasetResult], None] | None = None,
) -> list[DatasetResult]:
    """Run every ``.mat`` dataset under ``data_dir`` (or those ``include`` names: :func:`select_datasets`)."""
    root = Path(data_dir)
    methods = list(methods or available_methods())
    results = []
    for path in select_datasets(find_datasets(root), root, include):
        label = str(path.relative_to(root))
        ds = load_mat(path)
        if on_dataset is not None:
            on_dataset(label, ds)
        res = run_dataset(ds, key=paper_key(path, root), label=label, methods=methods, seeds=seeds,
                          params=params, average_method=average_method, on_seed=on_seed, on_round=on_round)
        results.append(res)
        if on_result is not None:
            on_result(res)
    return results


def fmt(mean: float, std: float | None = None) -> str:
    return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"


def rows_for(result: DatasetResult) -> list[dict]:
    """Table rows (strings) for one dataset: our methods, then the paper's rows."""
    rows = []
    top = best_reference({k: r.mean("acc") for k, r in result.reports.items()})
    for name, rep in result.reports.items():
        s = rep.summary()
        if top is not None and name == top[0]:
            name = f"{name} (best reference)"
        rows.append({"dataset": result.label, "method": name, "acc": fmt(s["acc"], s["acc_std"]),
                     "nmi": fmt(s["nmi"], s["nmi_std"]), "purity": fmt(s["purity"], s["purity_std"]),
                     "seconds": f"{s['seconds']:.1f}"})
    paper = PAPER_TABLE1.get(result.key)
    if paper:
        rows.append({"dataset": result.label, "method": "paper: proposed", "acc": fmt(paper[0]),
                     "nmi": fmt(paper[1]), "purity": fmt(paper[2]), "seconds": ""})
    best = PAPER_BEST_BASELINE.get(result.key)
    if best:
        rows.append({"dataset": result.label, "method": "paper: best baseline",
                     **{k: f"{v:.2f} ({m})" for k, (v, m) in zip(("acc", "nmi", "purity"), best)},
                     "seconds": ""})
    return rows


def standing(result: DatasetResult, method: str = "fedsonmf") -> str:
    """One line: ``method``'s mean ACC against the best centralized reference of the same run, or ''."""
    rep = result.reports.get(method)
    top = best_reference({k: 100 * r.mean("acc") for k, r in result.reports.items()})
    if rep is None or top is None:
        return ""
    ours = 100 * rep.mean("acc")
    return (f"{result.label}: {method} ACC {ours:.1f} against the best centralized reference, {top[0]} "
            f"{top[1]:.1f} ({ours - top[1]:+.1f} points)")


def mean_seconds(rep: ClusteringReport) -> float:
    return float(np.mean(rep.seconds))
