"""Federated multi-view clustering: federated sparse ONMF, then k-means on V^T.

Each view is one client's private data (docs/algorithm.md §10).  The clients and the
server run :class:`~fedsonmf.estimators.sonmf.FedSONMF`; k-means runs on the shared
representation V^T (n x r), which every party holds after the last round.

Label-free defaults (the rules and their measured effect are in
``docs/clustering.md``) -- nothing here looks at labels.
The mechanism they answer: for fixed bases the best V is mean_p U_p^T X_p, so
the fit maximises the energy of the shared projection, and for nonnegative data
one *background component* collects the features every sample has; with every
feature exclusive to one component, it steals them from the others.

* ``n_components="auto"``: r = 2c, a spare component per cluster for the
  background (k-means still makes c clusters); a view narrower than r is padded
  with zero features (its client cannot explain the extra components) with a
  warning naming it -- no data set that k-means can cluster is refused.
  ``"paper"`` is r = c.
* ``preprocess="auto"``, by each client on its own view: every sample scaled to
  unit l2 norm (documents differ mostly by length); then, only when the mean
  sample holds more than half of the view's energy (dense image features, a
  statistic the client computes alone; text views never trigger it), every
  feature is centred and scaled to unit variance, which removes the rank-one
  background the fit would otherwise spend (almost) everything on, and every
  sample is scaled to unit norm again (after centring, outlying samples would
  carry most of the energy the fit maximises; ``docs/clustering.md``).  Degenerate
  views (constant, near-constant features, mostly all-zero rows) warn, naming the view.
* ``MethodOptions(normalize_views=True)``: each view divided by its Frobenius norm (the paper's step).
* ``MethodOptions(mu="auto")`` (library-wide): the server sets the l2,1 weight from V-bar^1.
* ``MethodOptions(normalize_embedding=True)``: each sample's row of V^T scaled to unit norm
  before k-means (its direction over the components, not its length).
* ``n_init="auto"``: five federated fits with different seeds, and the fit whose
  partition (k-means of its V) the others agree with most is kept and refined
  (the medoid): the factorisation has seed-dependent local minima,
  some of which cluster far worse, and a bad one rarely has company
  (docs/clustering.md; one fit when no objective is reported, e.g. under
  differential privacy).

:meth:`FedMultiViewClustering.paper` gives the literal protocol of the paper
(r = c, no preprocessing besides the Frobenius scaling, k-means on raw V^T).
The evaluation protocol over seeds and the centralized context methods live in
:mod:`fedsonmf.experiments.evaluation`.
"""

from __future__ import annotations

import dataclasses
import secrets
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from numbers import Integral
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from fedsonmf._validation import (
    ViewsSplitGuard,
    as_view_list,
    check_callback,
    check_constant_views,
    check_feature_names,
    check_fitted_widths,
    check_n_jobs,
    check_seed,
    check_views,
    refuse_list_split_by_sklearn,
    view_feature_names,
    views_checked,
)
from fedsonmf.core.init import resolve_init_u
from fedsonmf.core.masks import held_columns
from fedsonmf.core.server import total
from fedsonmf.estimators.options import MethodOptions, check_params, constraints, flat
from fedsonmf.estimators.sonmf import FedSONMF, _blas_limit, _progress_callback
from fedsonmf.exceptions import DataWarning, InputError, ParameterError, warn
from fedsonmf.pipeline.graph import check_graph_search, client_graph, client_links, client_products
from fedsonmf.pipeline.rank_rule import RANK_RULES, resolve_rank
from fedsonmf.pipeline.refine import client_refine, refine_stages, refine_view, score_weight
from fedsonmf.pipeline.restarts import resolve_n_init, restart_seeds
from fedsonmf.pipeline.row_norms import normalize_rows
from fedsonmf.pipeline.stages import STAGE_EXCHANGES, STAGE_OPTIONS, cluster_fits
from fedsonmf.pipeline.steps import (
    apply_view,
    assign_to_centers,
    kmeans_on_embedding,
    prepare_view,
    stop_rule,
    warn_unsettled,
)
from fedsonmf.protocol.params import CLUSTERING_SIGNATURE, FED_PARAMS, RUN_PARAMS, default

__all__ = [
    "FedMultiViewClustering",
    "auto_mu",
    "kmeans_on_embedding",
    "normalize_rows",
]

# ----------------------------------------------------------------------------- building blocks
# normalize_rows and kmeans_on_embedding live in clustering_steps (the Flower apps run them too)


def auto_mu(Xs, n_components: int, *, eta_tilde: float, mu_scale: float = default("mu_scale"),
            init_u: str = default("init_u"), init_v: str = default("init_v"), seed: int = 0) -> float:
    """The number ``mu="auto"`` resolves to for these views and this seed (for inspection).

    The federation computes it on the server from V-bar^1
    (:func:`fedsonmf.protocol.config.resolve_mu`); this recomputes V-bar^1 exactly
    as the clients' seeded setup builds it.  ``init_u="auto"`` is a factorisation's (random
    supports); a clustering fit's is ``"svd"`` (:func:`fedsonmf.core.init.resolve_init_u`).
    """
    from fedsonmf.core._linalg import sqnorm, ut_x
    from fedsonmf.core.init import client_rng, init_basis, server_rng
    from fedsonmf.protocol.config import resolve_mu

    views = check_views(Xs, n_components)
    if init_v == "projection":
        Vbar = np.mean(
            [np.maximum(ut_x(init_basis(X, n_components, init_u, client_rng(seed, p)), X), 0.0)
             for p, X in enumerate(views)],
            axis=0,
        )
    else:  # as FederatedAlgorithm.server_setup
        Vbar = server_rng(seed).uniform(size=(n_components, views[0].shape[1]))
        Vbar *= np.sqrt(np.mean([sqnorm(X) for X in views])) / max(np.linalg.norm(Vbar), 1e-300)
    return resolve_mu(mu_scale, eta_tilde, Vbar)


# ----------------------------------------------------------------------------- estimator


class FedMultiViewClustering(ViewsSplitGuard, TransformerMixin, ClusterMixin, BaseEstimator):
    """Federated multi-view clustering: :class:`~fedsonmf.FedSONMF` on the views, then k-means on V^T.

    Parameters
    ----------
    n_clusters : int, default=8
        Number of clusters c.
    n_components : {"auto", "paper"} or int, default="auto"
        Rank r: 2c with narrow views zero-padded; c (capped at the narrowest view); or the
        given number (capped) -- see :func:`~fedsonmf.pipeline.rank_rule.resolve_rank`.
    preprocess : {"auto", "l2", "none"}, default="auto"
        Each client's transform of its own view
        (:func:`~fedsonmf.pipeline.view_rule.preprocess_view`).
    n_init : "auto" or int, default="auto"
        Federated fits with different seeds: ``"auto"`` = 5, or 1 when no objective is
        reported to choose by (``diagnostics=False``) or under differential privacy (every fit
        would spend the budget again; more is refused there).  The fit whose partition (k-means
        of its V) has the highest summed adjusted Rand index to the others -- the medoid -- is
        kept (``best_restart_``; ties, always with two fits, go to the lower final objective)
        and refined.  With ``n_jobs`` > 1 (or -1), up to ``n_jobs`` of the in-process fits run
        at once in threads: the same partitions, sooner (docs/speed.md).
    refine : {"auto", "kmeans+graph", "kmeans", "graph", "none"}, default="auto"
        The last steps, each one exchange per iteration with the clients, who learn the partition.
        ``"kmeans"``: refine the kept fit's partition by federated k-means on the views with every
        sample scaled to unit norm, started from it (:mod:`fedsonmf.pipeline.refine`: each
        client sends only its n x c distance matrix, masked under secure aggregation).
        ``"graph"``: refine it by weighted kernel k-means for the normalized cut of the sum of the
        clients' k-NN graphs of their own views (:mod:`fedsonmf.pipeline.graph`: each client
        sends only its n x c neighbour counts per cluster, masked), with a spectral step
        (:mod:`fedsonmf.pipeline.spectral`) and the medoid of the stage's three partitions.
        ``"kmeans+graph"``: both, in that order.  ``"none"``: the partition of k-means on V.
        ``"auto"``: ``"kmeans+graph"``, or ``"none"`` under differential privacy (the refinements
        read the exact views; an explicit rule under DP warns that they are not covered).
    max_rounds : int, default=200
        Communication rounds of each fit at most.
    tol : float, default=1e-4
        A fit stops when the server's step residual has fallen to tol of its first round's,
        R_step/R_step1 <= tol (docs/algorithm.md §7.5; it needs no upload, unlike the paper's R/R1),
        or when its partition has settled (``MethodOptions.early_stop``); 0 runs every round.
    method : MethodOptions or None, default=None
        The factorisation's parameters (mu, tau, alpha, eta_g, rho1, correction, init_u, init_v,
        diagnostics, ustep: as in :class:`~fedsonmf.FedSONMF`), the views' Frobenius scaling, k-means
        on V and the label-free stopping rule (:class:`~fedsonmf.estimators.options.MethodOptions`);
        None = the defaults.  ``init_u="auto"`` starts the clustering fits from each view's leading
        singular vectors (docs/clustering.md, "The bases' start").
    refinement : RefineOptions or None, default=None
        The refinement's starts, seeded starts and spectral steps
        (:class:`~fedsonmf.estimators.options.RefineOptions`); ``refine_start_``, ``spectral_kept_``
        and ``graph_chosen_`` say what they gave.  None = the defaults.
    privacy : PrivacyOptions or None, default=None
        Secure aggregation and differential privacy
        (:class:`~fedsonmf.estimators.options.PrivacyOptions`); None = no DP, secure aggregation off
        in process (a Flower deployment always masks; the in-process fit with
        ``secure_aggregation=True`` gives the same V bit for bit).
    federation : InProcess, Flower or None, default=None
        Where the federation runs: None or :class:`~fedsonmf.estimators.options.InProcess` in this
        process; :class:`~fedsonmf.estimators.options.Flower` on a loopback Flower deployment (a
        SuperLink and one SuperNode per view, separate processes; needs ``fedsonmf[flower]``): each
        view is written to its own client folder under ``run_dir``, its node preprocesses it, and one
        deployment's ServerApp runs the fits side by side, keeps the medoid and refines it; the same
        seed gives the same labels and V as in process.  ``predict``/``transform`` run one exchange
        over the deployment again; ``masks`` are written beside each node's view and used by that
        node alone; ``callback``, ``n_jobs`` and ``checkpoint_dir`` do not apply there.
    random_state : None, int, RandomState or Generator, default=None
        Seed of every random choice (the fits' seeds, k-means, the refinements).
    n_jobs : int, default=1
        In process: up to this many fits at once in threads (results do not depend on it).
    checkpoint_dir : path or None, default=None
        Save every fit's state after every round (``checkpoint_dir/restart-<i>``) and resume from it.
    verbose : int, default=0
        >= 1 prints the whole fit's progress to stderr: each fit's rounds prefixed "fit i/n", which
        fit was kept, each stage's exchanges and the total time (``stopping_reason_``); 2 prints every
        round.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
    embedding_ : ndarray of shape (n_samples, n_components_)
        V^T of the fit kept (``best_restart_``), as learned (not row-normalised).
    cluster_centers_ : ndarray of shape (n_clusters, n_components_)
        Centres of ``labels_`` in the (normalised) embedding of the fit kept; ``predict`` uses them.
    factorization_ : FedSONMF
        The fit kept (``transform`` embeds new samples).
    n_components_ : int
    preprocessing_ : list of dict
        What each client did to its view (``preprocess_view``'s info; never sent).
        None with ``engine="flower"`` (it stays on the nodes, as ``view_scales_``).
    padded_views_ : list of int
        Views padded with zero features to reach r.
    view_scales_ : list of float
        The Frobenius divisor of each view (1.0 without ``normalize_views``).
    mu_, seed_, result_, history_, n_rounds_, kmeans_
        Of the fit kept.
    privacy_ : dict or None
        With DP, the (epsilon, delta) of the fit.
    seeds_ : list of int
        The seed of every restart.
    effective_rank_ : int
        Nonzero rows of V.
    n_init_ : int
        The number of fits run (``n_init`` resolved).
    best_restart_ : int
        The index of the fit kept (the medoid).
    refine_iter_, refine_start_ : list of int
        With a k-means stage, per refined fit: the refinement's exchanges (all its starts, side by side)
        and the index of the start whose refined partition was kept (0: the fit's partition).
    graph_iter_ : list of int
        With a graph stage, per refined fit: its exchanges (round trips; the spectral step's included,
        its products sharing the graph refinement's exchanges: :func:`~fedsonmf.pipeline.spectral.graph_stage`).
    spectral_kept_ : list of bool
        With a graph stage, per refined fit: whether the spectral step's partition was kept.
    graph_chosen_ : list of str
        With a graph stage, per refined fit: the partition it returned, ``"refined"`` (the cut rule's),
        ``"start"`` or ``"spectral"`` (the medoid of the three).
    n_iter_ : int
        Rounds of the fit kept (``n_rounds_``).
    fit_rounds_ : list of int
        Rounds of every fit, in restart order.
    fit_report_ : dict
        The whole fit: ``n_fits``, ``best_fit``, ``rounds`` (per fit), ``total_rounds``,
        ``kept_fit_stopping_reason``, ``refine_exchanges``, ``graph_exchanges``, ``stage_exchanges``
        (the kept fit's clustering-stage round trips per kind,
        :data:`~fedsonmf.pipeline.stages.STAGE_EXCHANGES`: they sum to the two before),
        ``spectral_steps`` (the spectral step's products made) and ``seconds`` (wall time of the whole
        ``fit`` call: every fit and stage).
    stopping_reason_ : str
        ``fit_report_`` in one line (``result_.stopping_reason`` is the kept fit's alone).
    n_features_in_ : list of int
        Features of each view.
    feature_names_in_ : list of (ndarray or None)
        Each view's column names (DataFrame views); only when some view has them.
    """

    _parameter_constraints: dict = constraints(
        CLUSTERING_SIGNATURE, n_components=[StrOptions(set(RANK_RULES)), Interval(Integral, 1, None, closed="left")])

    def __init__(
        self,
        n_clusters=default("n_clusters"),
        *,
        n_components="auto", preprocess=default("preprocess"), n_init=default("n_init"), refine=default("refine"),
        max_rounds=default("max_rounds"), tol=default("tol"), method=default("method"),
        refinement=default("refinement"), privacy=default("privacy"), federation=default("federation"),
        random_state=default("random_state"), n_jobs=default("n_jobs"), checkpoint_dir=default("checkpoint_dir"),
        verbose=default("verbose"),
    ):
        self.n_clusters = n_clusters
        self.n_components = n_components
        self.preprocess = preprocess
        self.n_init = n_init
        self.refine = refine
        self.max_rounds = max_rounds
        self.tol = tol
        self.method = method
        self.refinement = refinement
        self.privacy = privacy
        self.federation = federation
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.checkpoint_dir = checkpoint_dir
        self.verbose = verbose

    @classmethod
    def paper(cls, n_clusters=default("n_clusters"), **params) -> FedMultiViewClustering:
        """The paper's literal protocol: r = c, no preprocessing besides the Frobenius
        scaling, k-means on the raw V^T (docs/algorithm.md §10); ``params`` as the constructor's."""
        method = dataclasses.replace(params.pop("method", None) or MethodOptions(), normalize_embedding=False)
        return cls(n_clusters, **{"n_components": "paper", "preprocess": "none", "method": method, **params})

    # ------------------------------------------------------------------ fit
    def _resolve(self) -> SimpleNamespace:
        """Check every parameter against its declared constraints (before any computation) and open the
        option objects: ``self._o`` holds every table name's value for this fit."""
        params = self.get_params(deep=False)
        check_params(type(self).__name__, params, self._parameter_constraints)
        for key in ("method", "refinement", "privacy", "federation"):
            if params[key] is not None:  # a field may have been assigned since the object was made
                params[key].check()
        self._o = SimpleNamespace(**flat(params))
        return self._o

    def _validate(self, n_samples: int) -> None:
        o = self._resolve()
        if self.n_clusters > n_samples:
            raise ParameterError(f"n_clusters={self.n_clusters} is larger than n_samples={n_samples}")
        if self._dp() and self._n_init() > 1:
            raise ParameterError(f"n_init={self.n_init!r} under differential privacy: every fit would spend the "
                                 "privacy budget again on the same views; use n_init=1 (what 'auto' gives under DP)")
        if self._dp() and refine_stages(self.refine, dp=True):
            warn(f"refine={self.refine!r}: the clustering refinements read each client's exact view; their "
                 "exchanges are not covered by the differential privacy of the fit (refine='auto' skips "
                 "them under differential privacy)", UserWarning)
        check_n_jobs(o.n_jobs)

    def _n_init(self) -> int:
        """The number of fits: ``n_init``, with ``"auto"`` resolved (5; 1 when no objective is reported)."""
        return resolve_n_init(self.n_init, dp=self._dp(), diagnostics=bool(self._o.diagnostics))

    def _dp(self) -> bool:
        """Whether the fits run with differential privacy."""
        return self._o.dp_epsilon is not None or self._o.dp_noise_multiplier is not None

    def _factorization(self, r: int, seed: int, restart: int) -> FedSONMF:
        o = self._o
        params = {k: getattr(o, k) for k in FED_PARAMS + RUN_PARAMS if k not in ("n_components", "algorithm")}
        params["algorithm"] = self._algorithm()
        params["random_state"] = seed
        params["init_u"] = resolve_init_u(o.init_u, clustering=True)  # "auto": the clustering start (svd)
        params["verbose"] = 0  # the clustering fit reports its fits and stages itself (_say)
        if o.checkpoint_dir is not None and self._n_init() > 1:
            params["checkpoint_dir"] = Path(o.checkpoint_dir) / f"restart-{restart}"
        return FedSONMF(r, **params)

    def _algorithm(self) -> str:
        """The federated algorithm of the fits (the paper's; the experiments run baselines through it)."""
        return str(default("algorithm"))

    def _client_views(self, Xs, fitted: bool, masks=None):
        """Each client's own preprocessing, padding and scaling of its view (nothing is sent).

        With ``masks`` a client's statistics come from the samples it holds only.
        The steps are :mod:`~fedsonmf.pipeline.steps`' (the Flower nodes run the same).
        """
        out, scales = [], []
        for p, X in enumerate(Xs):
            if fitted:
                Y = apply_view(X, {**self.preprocessing_[p], "scale": self.view_scales_[p]},
                               n_components=self.n_components_, normalize_views=self._o.normalize_views)
                scales.append(self.view_scales_[p])
            else:
                held = None if masks is None else held_columns(masks[p], X.shape[0], client=p)
                try:
                    Y, info = prepare_view(X, preprocess=self.preprocess, n_components=self.n_components_,
                                           normalize_views=self._o.normalize_views, held=held, view=p)
                except InputError as exc:
                    _explain_empty_after_preprocessing(exc, X, p, self.preprocess)
                    raise
                scales.append(info.pop("scale"))
                self.preprocessing_.append(info)
            out.append(Y)
        return out, scales

    def fit(self, Xs, y=None, *, callback=None, masks=None) -> FedMultiViewClustering:
        """Factorize the views ``Xs`` federatedly and cluster the samples; ``y`` is ignored.

        ``callback(row)`` is called with every round's history row (progress display), with
        ``row["restart"]`` (0-based) and ``row["n_restarts"]`` added; with ``n_jobs`` > 1 the
        restarts' rows interleave, one call at a time.
        ``masks`` (incomplete views, docs/algorithm.md §15.1): per view None, a boolean array of
        length n_samples or int sample ids; see :func:`~fedsonmf.estimators.sonmf.federated_sonmf`.
        """
        started = time.perf_counter()
        refuse_list_split_by_sklearn(Xs)
        Xs = as_view_list(Xs)
        if sp.issparse(Xs) or not isinstance(Xs, (list, tuple)) or len(Xs) == 0:
            check_views(Xs)  # raises the InputError that names the problem
        views = _check_view_structure(Xs)  # every check but the scale one (normalising rescues that)
        check_constant_views(views)
        callback = check_callback(callback)
        n = views[0].shape[0]
        self._validate(n)
        check_graph_search(self.refine, n, dp=self._dp())  # the graph stage's extra, before any fit runs
        if len(views) == 1:
            warn("FedMultiViewClustering got a single view: a federation of one client (nothing is "
                 "federated); pass every view as a list", UserWarning)
        self.n_features_in_ = [int(X.shape[1]) for X in views]
        names = view_feature_names(Xs)
        if names is not None:
            self.feature_names_in_ = names
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        if masks is not None and len(masks) != len(views):
            raise InputError(f"{len(masks)} masks for {len(views)} views")
        r, message = resolve_rank(self.n_clusters, [X.shape[1] for X in views], self.n_components)
        if message and self._o.engine != "flower":  # on Flower the server resolves r and run_flower warns
            warn(message, DataWarning)
        seed = check_seed(self.random_state)
        seed = secrets.randbits(32) if seed is None else seed
        self.n_init_ = n_init = self._n_init()
        seeds = restart_seeds(seed, n_init)
        models = [self._factorization(r, s, i) for i, s in enumerate(seeds)]
        for m in models:
            m._validate()  # every parameter checked before any computation
        self.n_components_ = r
        self.padded_views_ = [p for p, X in enumerate(views) if X.shape[1] < r]
        if self._o.engine == "flower":
            self._fit_flower(views, models, seeds, masks)
            return self._report(started)
        # the whole pipeline under the fit's BLAS limit, not only the factorisation: k-means, the
        # preprocessing and the refinements call BLAS too, and with more threads their sums round
        # differently -- enough to flip the restart medoid on a seed (3Sources, seed 5: 81.7 against
        # 62.7 ACC with two threads or one) -- so results would depend on the machine's cores and differ
        # from the Flower engine, whose processes run BLAS on one thread (docs/speed.md)
        with threadpool_limits(limits=_blas_limit(self._o.blas_threads, views, r, check_n_jobs(self.n_jobs))):
            self._fit_inprocess(views, masks, models, seeds, callback)
        return self._report(started)

    def _say(self, message: str) -> None:
        """One progress line of the whole fit to stderr (``verbose`` >= 1); plain text, so it also shows
        off a terminal."""
        if self.verbose:
            print(f"FedMultiViewClustering: {message}", file=sys.stderr, flush=True)

    def _report(self, started: float) -> FedMultiViewClustering:
        """``fit_report_`` and ``stopping_reason_``: the whole fit -- every fit's rounds, the stages'
        exchanges and the wall time from the call of ``fit`` -- and its one-line summary."""
        seconds = time.perf_counter() - started
        rounds = [int(r) for r in self.fit_rounds_]
        counts, steps = getattr(self, "_stage_counts", (_stage_counts({}), 0))  # no stage ran: none
        report = {"n_fits": len(rounds), "best_fit": self.best_restart_, "rounds": rounds,
                  "total_rounds": int(sum(rounds)), "kept_fit_stopping_reason": self.result_.stopping_reason,
                  "refine_exchanges": int(sum(self.refine_iter_)), "graph_exchanges": int(sum(self.graph_iter_)),
                  "stage_exchanges": dict(counts), "spectral_steps": int(steps),
                  "seconds": float(seconds)}
        self.fit_report_ = report
        parts = [f"{len(rounds)} fit(s), {report['total_rounds']} rounds in all; fit {self.best_restart_ + 1} "
                 f"kept (the medoid): {report['kept_fit_stopping_reason']}"]
        if self.refine_iter_:
            parts.append(f"k-means refinement {report['refine_exchanges']} exchanges")
        if self.graph_iter_:
            parts.append(f"graph stage {report['graph_exchanges']} exchanges")
        self.stopping_reason_ = "; ".join(parts) + f"; {seconds:.2f} s in all"
        self._say(f"done: {self.stopping_reason_}")
        return self

    def _fit_inprocess(self, views, masks, models, seeds, callback) -> FedMultiViewClustering:
        """The in-process fit from the checked ``views`` (n_samples x d_p each), their ``masks``, the
        restarts' factorisation ``models`` and ``seeds``: preprocessing, the fits, the kept restart,
        the refinements; sets the fitted attributes."""
        self.preprocessing_: Any = []  # None on the Flower engine (node-local)
        Xs, self.view_scales_ = self._client_views(views, fitted=False, masks=masks)
        workers = min(check_n_jobs(self.n_jobs), len(models))
        lock, cancel = threading.Lock(), threading.Event()

        def restart(i, model, s):
            tol = float(model._validate()[1]["tol"])
            stop = stop_rule(self._o.early_stop, self.n_clusters, seed=s, tol=tol,
                             normalize_embedding=self._o.normalize_embedding)  # None at tol = 0
            if workers > 1:  # a restart in a thread ends at its next round once another has failed
                stop = _cancellable(stop, cancel)
            rows = None
            printer = (_progress_callback(int(self.verbose), int(model.max_rounds), float(model.tol),
                                          prefix=f"fit {i + 1}/{len(models)}  ") if self.verbose else None)
            if callback is not None or printer is not None:
                def rows(row):  # one call at a time, whichever thread the restart runs in; the row says whose
                    with lock:
                        if printer is not None:
                            printer(row)
                        if callback is not None:
                            callback({**row, "restart": i, "n_restarts": len(models)})
            # one view: warned above
            # the loop's own R/R1 test is off: it would have every client send an r x n gradient each round
            res = model._fit(Xs, callback=rows, masks=masks, single_view_ok=True, stop_rule=stop, loop_tol=0.0)
            warn_unsettled(res, tol)
            # the server's last state (V-bar and V, two r x n arrays) is kept for a resume the clustering
            # never makes from memory (its checkpoints are files): n_init of them would be held to the
            # end, beside each fit's V (the kept one's is refined; the others' partitions pick it)
            res.server_state = None
            if model.embedding_.dtype == res.V.dtype:  # V^T as a view, not a second copy of V per fit
                model.embedding_ = res.V.T
            self._say(f"fit {i + 1}/{len(models)}: {res.n_rounds} rounds, {res.stopping_reason}")
            labels, km = kmeans_on_embedding(
                res.V.T, self.n_clusters, normalize=self._o.normalize_embedding, n_init=self._o.kmeans_n_init,
                max_iter=self._o.kmeans_max_iter, random_state=s,
            )
            return labels, (model, res, km)

        if workers > 1:
            # the restarts are independent fits with their own seeds: up to n_jobs of them at once, in
            # threads (the U-step's compiled loops and BLAS release the GIL; 2 threads ran two 4-view BBC
            # fits 1.77x faster, docs/speed.md), each with its clients in turn and BLAS on one thread, so
            # no core is oversubscribed; the same partitions as one after the other
            for model in models:
                model.n_jobs = 1
            with threadpool_limits(limits=1):
                pool = ThreadPoolExecutor(workers)
                try:
                    futures = [pool.submit(restart, i, m, s) for i, (m, s) in enumerate(zip(models, seeds))]
                    wait(futures, return_when=FIRST_EXCEPTION)  # a failure anywhere ends the wait
                    for f in futures:
                        error = f.exception() if f.done() else None
                        if error is not None:
                            raise error
                    done = [f.result() for f in futures]
                except BaseException:
                    # Ctrl-C, or a restart (or its callback) raised: the queued restarts never start and
                    # the running ones stop at their next round, instead of all running to their end
                    cancel.set()
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
                pool.shutdown()
        else:
            done = [restart(i, model, s) for i, (model, s) in enumerate(zip(models, seeds))]
        fits = [fit for _, fit in done]
        self.fit_rounds_ = [int(res.n_rounds) for _, res, _ in fits]
        # what follows the fits, as the Flower ServerApp runs it (pipeline.stages.cluster_fits): the medoid of
        # the fits' partitions (k-means of each V, computed in each restart above), chosen from what the
        # server has before any refinement exchange; only the kept fit is refined
        stages = refine_stages(self.refine, dp=self._dp())
        secure = bool(models[0].secure_aggregation)
        kmeans = [(lab, km.cluster_centers_, km) for lab, (_, _, km) in done]
        done = []

        def exchanges(best):
            # the medoid is chosen: the fits not kept (each model holds its r x n V) are dropped here and in
            # cluster_fits' lists, so the stages run without them (4 of the 5 V at 10^6 samples: 610 MB)
            for i in range(len(fits)):
                if i != best:
                    fits[i] = models[i] = None
            return self._stage_exchanges(views, masks, stages, secure=secure)

        best, labels, centers, km, report = cluster_fits(
            [res.V for _, res, _ in fits], seeds, self.n_clusters,
            opts={key: getattr(self._o, key) for key in STAGE_OPTIONS},
            results=[res for _, res, _ in fits], kmeans=kmeans, exchanges=exchanges, say=self._say)
        self._stage_attributes(report, stages)
        self.best_restart_ = best
        model, res, _ = fits[best]  # the fit whose V, bases and centres the model keeps
        self.factorization_: Any = model  # None on the Flower engine (the bases stay on the nodes)
        self.seeds_ = seeds
        self.mu_ = model.mu_
        self.seed_ = res.seed
        self.result_ = res
        self.history_ = res.history
        self.n_rounds_ = self.n_iter_ = res.n_rounds
        self.embedding_ = model.embedding_
        self.kmeans_ = km
        self.cluster_centers_ = np.asarray(centers, dtype=np.float64)
        self.labels_ = np.asarray(labels)
        self.effective_rank_ = int(np.count_nonzero(np.linalg.norm(res.V, axis=1) > 0))
        self.privacy_ = model.privacy_
        return self

    def _stage_exchanges(self, views, masks, stages, *, secure: bool) -> dict:
        """The in-process exchanges of the stages after the fit (:func:`~fedsonmf.pipeline.stages.finish_clustering`,
        the Flower ServerApp's too): each client's reply from its own view, summed as the server sums them."""
        ex: dict = {"refine": self._refine_exchange(views, masks, secure=secure) if "kmeans" in stages else None}
        if "graph" in stages:
            ex["graph"], ex["spectral"], ex["both"] = self._graph_exchanges(views, masks, secure=secure)
        return ex

    def _stage_attributes(self, report: dict, stages) -> None:
        """``refine_iter_``, ``refine_start_``, ``graph_iter_``, ``spectral_kept_``, ``graph_chosen_`` from the
        stages' report (one entry per refined fit, empty for a stage that did not run)."""
        if report["error"]:  # a client's exchange failed: the partition reached before it is kept
            warn(f"the clustering stages ended early ({report['error']}); the partition reached before is kept",
                 RuntimeWarning)
        ran_kmeans, ran_graph = "kmeans" in stages, "graph" in stages
        self.refine_iter_ = [int(report["refine_iterations"])] if ran_kmeans else []
        self.refine_start_ = [int(report["refine_start"] or 0)] if ran_kmeans else []
        self.graph_iter_ = [int(report["graph_iterations"])] if ran_graph else []
        self.spectral_kept_ = [bool(report["spectral_kept"])] if ran_graph else []
        self.graph_chosen_ = [str(report["graph_chosen"] or "refined")] if ran_graph else []
        self._stage_counts = (_stage_counts(report), int(report.get("spectral_steps", 0)))

    def _refine_exchange(self, views, masks, secure: bool):
        """The in-process driver of the refinement: each client's distances from its own view, summed
        as the server sums them (the fixed-point sum of secure aggregation when it is on)."""
        held = _held_samples(views, masks)
        rviews = [refine_view(X, held=h) for X, h in zip(views, held)]
        scores = [score_weight(Y, held=h) for Y, h in zip(rviews, held)]  # each client from its own view

        def exchange(labels):
            replies = [client_refine(Y, labels, self.n_clusters, held=h, scores=sc)
                       for Y, h, sc in zip(rviews, held, scores)]
            # degree-0 items: the public exponent 0, as the ServerApp's (a block of partitions is 3-D)
            return (_server_sum([D for D, _ in replies], secure, exp=0),
                    _server_sum([S for _, S in replies], secure, exp=0))

        return exchange

    def _graph_exchanges(self, views, masks, secure: bool):
        """The in-process drivers of the graph refinement and its spectral step: each client's
        neighbour counts A_p Z / n, its products A_p M / n with a block of the server's, and the two
        side by side in one exchange, from its own k-NN graph (built once, on the client), summed as
        the server sums them."""
        held = _held_samples(views, masks)
        graphs = [client_graph(X, held=h, n_clusters=self.n_clusters) for X, h in zip(views, held)]

        def exchange(labels):  # summed at the Flower exchange's public scale (exponent 0)
            return _server_sum([client_links(A, labels, self.n_clusters) for A in graphs], secure, exp=0)

        def products(M):  # entries of M at most 1: the same public scale
            return _server_sum([client_products(A, M) for A in graphs], secure, exp=0)

        def both(labels, M):  # one round trip for the two: each client replies [A_p Z | A_p M] / n
            c = self.n_clusters
            L = _server_sum([np.hstack([client_links(A, labels, c), client_products(A, M)]) for A in graphs], secure,
                            exp=0)
            return L[:, :c], L[:, c:]

        return exchange, products, both

    # ------------------------------------------------------------------ engine="flower"
    def _fit_flower(self, views, models, seeds, masks=None) -> FedMultiViewClustering:
        """``fit`` on a loopback Flower deployment (:func:`~fedsonmf.federation.flower.run_flower`).

        Each view is written to its own client folder ``<flower_run_dir>/clients/p<i>/`` and
        served by its own SuperNode, which preprocesses it; the ServerApp runs k-means.  The
        per-client ``preprocessing_`` and ``view_scales_`` stay on the nodes (None here), as do
        the bases (``factorization_`` is None; ``transform``/``predict`` run over a deployment
        again).  ``callback``, ``n_jobs`` and ``checkpoint_dir`` do not apply (the deployment
        checkpoints in its run folder); BLAS is pinned to one thread in every process.
        """
        import tempfile

        from fedsonmf.federation.flower.launcher import run_flower, write_masks, write_views

        dep = self._o.deployment
        if dep is not None:  # a started deployment: its nodes serve their own files, which must be these views
            paths, mask_paths = list(dep.view_paths), None
            _check_deployment_views(dep, views, masks)
        else:
            base = Path(self._o.run_dir) if self._o.run_dir is not None else \
                Path(tempfile.mkdtemp(prefix="fedsonmf-flower-"))
            paths = [write_views([X], base / "clients" / f"p{p}")[0] for p, X in enumerate(views)]
            # incomplete views: each node's availability mask beside its view (the node's own file, 0600)
            mask_paths = (None if masks is None else
                          [None if mk is None else write_masks([mk], base / "clients" / f"p{p}" / "mask")[0]
                           for p, mk in enumerate(masks)])
        options = {"rank": self.n_components, "preprocess": self.preprocess, "normalize_views": self._o.normalize_views,
                   "normalize_embedding": self._o.normalize_embedding, "kmeans_n_init": self._o.kmeans_n_init,
                   "kmeans_max_iter": self._o.kmeans_max_iter, "early_stop": self._o.early_stop,
                   "refine": self.refine, "refine_starts": self._o.refine_starts,
                   "refine_seeded_starts": self._o.refine_seeded_starts,
                   "refine_spectral_steps": self._o.refine_spectral_steps, "n_init": len(models)}
        stages = refine_stages(self.refine, dp=self._dp())
        cfg, run, _ = models[0]._validate()
        # one deployment: its ServerApp runs the n_init fits from the same seeds (restart_seeds), keeps the
        # medoid and refines it, as in process (each restart its own job on the nodes)
        run_dir = dep.run_dir if dep is not None else base / "run"
        res = run_flower(paths, cfg, run_dir=run_dir, algorithm=run["algorithm"], max_rounds=run["max_rounds"],
                         tol=run["tol"], seed=seeds[0], n_clusters=self.n_clusters, clustering=options,
                         mask_paths=mask_paths, deployment=dep)
        self.best_restart_ = int(res.extra["clustering"].get("restarts", {}).get("best_restart", 0))
        return self._keep_flower_fit(res, run_dir, res.extra["labels"], res.extra["cluster_centers"], [res],
                                     stages, paths, seeds)

    def _keep_flower_fit(self, res, run_dir, labels, centers, kept, stages, paths, seeds) -> FedMultiViewClustering:
        """The fitted attributes of ``engine="flower"`` from the kept run ``res`` (its folder ``run_dir``),
        the final ``labels`` and ``centers``, and the refinement reports of the runs ``kept``."""
        self.n_components_ = int(res.V.shape[0])
        self.fit_rounds_ = [int(k) for k in res.extra["clustering"].get("restarts", {}).get("n_rounds", [res.n_rounds])]
        reports = [f.extra.get("clustering", {}) for f in kept]
        self.refine_iter_ = [int(c.get("refine_iterations", 0)) for c in reports] if "kmeans" in stages else []
        self.refine_start_ = [int(c.get("refine_start") or 0) for c in reports] if "kmeans" in stages else []
        self.graph_iter_ = [int(c.get("graph_iterations", 0)) for c in reports] if "graph" in stages else []
        self.spectral_kept_ = [bool(c.get("spectral_kept", False)) for c in reports] if "graph" in stages else []
        self.graph_chosen_ = [str(c.get("graph_chosen", "refined")) for c in reports] if "graph" in stages else []
        self._stage_counts = (_stage_counts(reports[0] if reports else {}),
                              int(reports[0].get("spectral_steps", 0)) if reports else 0)
        self.flower_run_dir_ = run_dir
        self.flower_view_paths_ = paths
        self.factorization_ = None
        self.preprocessing_ = self.view_scales_ = None  # node-local
        self.seeds_ = seeds
        self.mu_ = float(res.config["mu_value"])
        self.seed_ = res.seed
        self.result_ = res
        self.history_ = res.history
        self.n_rounds_ = self.n_iter_ = res.n_rounds
        self.embedding_ = res.V.T.copy()
        self.kmeans_ = None  # fitted in the ServerApp; its centres are cluster_centers_
        self.cluster_centers_ = np.asarray(centers, dtype=np.float64)
        self.labels_ = np.asarray(labels)
        self.effective_rank_ = int(np.count_nonzero(np.linalg.norm(res.V, axis=1) > 0))
        return self

    def _predict_flower(self, views):
        """The new samples' (labels, V) over a loopback deployment of the fitted run."""
        from fedsonmf.federation.flower.launcher import predict_flower, write_views

        if self.result_.extra.get("flower", {}).get("shared_deployment"):
            raise ParameterError("predict/transform of a fit on a shared deployment (Flower(deployment=...)) is not "
                                 "available: a predict run needs nodes started with the new samples' files; fit "
                                 "with Flower(run_dir=...) to predict over a deployment of its own")
        if len(views) != len(self.flower_view_paths_):
            raise InputError(f"the model was fitted on {len(self.flower_view_paths_)} views; got {len(views)}")
        new = []
        for p, X in enumerate(views):
            folder = Path(self.flower_view_paths_[p]).parent / "new"
            for old in folder.glob("view0.np[yz]"):
                old.unlink()
            new.append(write_views([X], folder)[0])
        out = predict_flower(self.flower_view_paths_, new, run_dir=self.flower_run_dir_)
        return out.labels, out.V

    def fit_predict(self, Xs, y=None, *, callback=None, masks=None) -> np.ndarray:
        """Fit and return the cluster labels, shape (n_samples,)."""
        return self.fit(Xs, callback=callback, masks=masks).labels_

    def transform(self, Xs) -> np.ndarray:
        """Embed new samples (every view) with the fitted bases: shape (n_samples_new, n_components_).

        Each client applies its fitted preprocessing (training mean / scale, padding,
        Frobenius divisor) to its new samples, then one federated round embeds them
        (:meth:`FedSONMF.transform`).
        """
        check_is_fitted(self, "labels_")
        refuse_list_split_by_sklearn(Xs)
        check_feature_names(getattr(self, "feature_names_in_", None), as_view_list(Xs))
        views = _check_view_structure(as_view_list(Xs))
        check_fitted_widths(self.n_features_in_, [X.shape[1] for X in views])
        if self._o.engine == "flower":
            return self._predict_flower(views)[1].T
        Xs, _ = self._client_views(views, fitted=True)
        with views_checked():  # the samples of every view were split together (or not at all): checked above
            return self.factorization_.transform(Xs)

    def predict(self, Xs) -> np.ndarray:
        """Assign new samples (every view) to the fitted clusters: shape (n_samples_new,).

        The samples are embedded with the fitted bases (:meth:`transform`: one
        federated round), normalised as in ``fit`` and given the nearest of
        ``cluster_centers_``.

        On the training samples this is not ``labels_``, and cannot be: ``labels_`` is the partition
        the refinements reached with the clients' exact views (federated k-means on the row-normalised
        views, the normalized cut of their k-NN graphs), which no assignment in V alone reproduces;
        ``predict`` has only V to go by.  Measured on the four shared sets (seed 0) the two agree on
        85-97 % of the training samples.  For the training samples use ``labels_`` (``fit_predict``
        returns it); ``predict`` is for new samples.
        """
        check_is_fitted(self, "labels_")
        if self._o.engine == "flower":
            check_is_fitted(self, "labels_")
            views = _check_view_structure(as_view_list(Xs))
            check_fitted_widths(self.n_features_in_, [X.shape[1] for X in views])
            return self._predict_flower(views)[0]
        return assign_to_centers(self.transform(Xs), self.cluster_centers_,
                                 normalize_embedding=self._o.normalize_embedding)

    def score(self, Xs, y=None) -> float:
        """Label-free score of the clustering on the views ``Xs``: the opposite of the k-means
        inertia (as :meth:`sklearn.cluster.KMeans.score`), higher is better; ``y`` is ignored.

        The samples are embedded with the fitted bases (:meth:`transform`), normalised as in
        ``fit`` (unit rows with ``normalize_embedding``, so that fits of different rank compare)
        and the squared distances to their nearest centre are summed.  Usable by
        :class:`fedsonmf.model_selection.GridSearchCV` to choose parameters without labels
        (the inertia shrinks as ``n_clusters`` grows: compare equal ``n_clusters``).
        """
        E = self.transform(Xs)
        E = normalize_rows(E) if self._o.normalize_embedding else np.asarray(E, dtype=np.float64)
        d2 = ((E[:, None, :] - self.cluster_centers_[None, :, :]) ** 2).sum(axis=2)
        return -float(d2.min(axis=1).sum())

    def get_feature_names_out(self, input_features=None) -> np.ndarray:
        """Names of :meth:`transform`'s columns: ``fedmultiviewclustering0``, ... (``input_features`` ignored)."""
        check_is_fitted(self, "labels_")
        return np.asarray([f"fedmultiviewclustering{k}" for k in range(self.n_components_)], dtype=object)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.transformer_tags.preserves_dtype = ["float64"]
        return tags


def _held_samples(views, masks) -> list:
    """Per client, the sample ids it holds (None: all of them)."""
    n = views[0].shape[0]
    return [None if masks is None else held_columns(masks[p], n, client=p) for p in range(len(views))]


def _server_sum(items, secure: bool, exp: int | None = None):
    """The sum of the clients' degree-0 uploads as the server decodes it: the fixed-point sum of
    secure aggregation when it is on (at the public exponent ``exp`` when given, else each upload's
    own), else the plain sum."""
    if secure and len(items) > 1:
        from fedsonmf.federation.secagg import fixed_point_sum

        return fixed_point_sum(items, degree=0, exp=exp)
    return total(items)


class _Cancelled(Exception):
    """A restart stopped because another one failed or the fit was interrupted (never escapes ``fit``)."""


def _cancellable(stop, cancel):
    """``stop`` (a run's stop rule, or None) that first raises :class:`_Cancelled` once ``cancel`` is set."""

    def rule(round_, V, row):
        if cancel.is_set():
            raise _Cancelled
        return None if stop is None else stop(round_, V, row)

    return rule


def _explain_empty_after_preprocessing(exc: InputError, X, p: int, preprocess: str) -> None:
    """Raise a clearer error when a nonzero view became all zero in its client's preprocessing."""
    if "is all zero" not in str(exc) or not np.any(X.data if sp.issparse(X) else np.asarray(X)):
        return
    what = f"it has n_features = {X.shape[1]}" if X.shape[1] == 1 else "a constant view, or a single feature"
    raise InputError(
        f"view {p} carries nothing to cluster on after preprocess={preprocess!r}: every sample points the same way "
        f"({what}), so once each sample is scaled to unit norm and centred the view is all zero -- drop the "
        "view, or use preprocess='none'"
    ) from None


def _check_view_structure(Xs) -> list:
    """The view checks without the scale one, as InputError (a ValueError) naming the view."""
    from fedsonmf.preprocessing import _check_views

    try:
        return _check_views(Xs)
    except InputError:
        raise
    except TypeError as exc:
        raise InputError(str(exc)) from None


def _stage_counts(report: dict) -> dict:
    """The clustering stages' round trips per kind (:data:`~fedsonmf.pipeline.stages.STAGE_EXCHANGES`) of
    a stages' report (in process) or a run's clustering summary (Flower's result.json); 0 where absent."""
    given = report.get("exchanges") or {}
    return {key: int(given.get(key, 0)) for key in STAGE_EXCHANGES}


def _check_deployment_views(dep, views, masks) -> None:
    """An :class:`InputError` unless ``views`` equal, value for value, the view files the started
    deployment ``dep`` serves (its nodes read their files, never these arrays), and no masks are given
    (a deployment's masks are its nodes' files)."""
    import scipy.sparse as sp

    if masks is not None and any(m is not None for m in masks):
        raise InputError("masks with Flower(deployment=...): give them to the deployment (mask_paths) instead")
    if len(views) != len(dep.view_paths):
        raise InputError(f"the deployment serves {len(dep.view_paths)} views; fit got {len(views)}")
    for p, (X, path) in enumerate(zip(views, dep.view_paths)):
        if path.suffix == ".npy":
            held = np.load(path, mmap_mode="r")
        elif path.suffix == ".npz":
            held = sp.load_npz(path)
        else:
            raise InputError(f"view {p}: the deployment serves {path}; Flower(deployment=...) compares .npy or "
                             ".npz view files only")
        same = held.shape == X.shape and (
            (abs(sp.csr_matrix(held) - sp.csr_matrix(X)).nnz == 0) if sp.issparse(held) or sp.issparse(X)
            else bool(np.array_equal(np.asarray(held), np.asarray(X))))
        if not same:
            raise InputError(f"view {p} is not the file {path} the deployment's node {p} serves: a fit on a shared "
                             "deployment runs on its nodes' files, so give fit the same views")
