"""The scikit-learn style estimator :class:`FedSONMF` and its function twin.

Views follow mvlearn's multi-view convention: ``Xs`` is a list of arrays or
sparse matrices, view p of shape (n_samples, n_features_p).  Internally a
client holds X_p = view_p^T (d_p x n) as in ALGORITHM.md.
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from fedsonmf._validation import check_seed, check_views
from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.exceptions import ParameterError
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import FitResult

__all__ = ["FedSONMF", "federated_sonmf"]


def federated_sonmf(
    Xs,
    n_components: int = 6,
    *,
    mu: float = 1.0,
    tau: int = 10,
    alpha: float = 0.01,
    eta_g: float = 1.5,
    rho1: float = 1.0,
    max_rounds: int = 200,
    tol: float = 1e-4,
    correction: bool = True,
    algorithm: str = "fedsonmf",
    init_u: str = "random",
    init_v: str = "projection",
    ustep: PenaltyOptions | None = None,
    diagnostics: bool = True,
    random_state=None,
    n_jobs: int = 1,
    blas_threads: int | None = None,
    callback=None,
    masks=None,
) -> FitResult:
    """Federated sparse ONMF of the views ``Xs`` (one client per view), in process.

    Parameters
    ----------
    Xs : list of {array-like, sparse matrix} of shape (n_samples, n_features_p)
    n_components : int
        Rank r; must not exceed any view's n_features_p.
    mu, tau, alpha, eta_g, rho1, correction, init_u, init_v, diagnostics
        See :class:`fedsonmf.protocol.config.FedConfig`.
    max_rounds : int
        Communication rounds at most.
    tol : float
        Stop when R^s / R^1 <= tol; 0 runs all ``max_rounds``.
    algorithm : str
        Name of a federated algorithm (``fedsonmf.algorithms.ALGORITHMS``).
    random_state : None, int or Generator
        Seeds every random choice (bases, V init).  The seed used is
        recorded in the result.
    n_jobs : int
        Clients run in this many threads (results do not depend on it).
    blas_threads : int or None
        Limit BLAS/OpenMP threads during the fit (threadpoolctl); None leaves
        them as they are.  1 is fastest for small problems (thread start-up
        dominates tiny products) and makes runs bit-reproducible across
        machines with different core counts.
    masks : list of (None, bool array of length n_samples, or int array of sample ids), optional
        Incomplete views (ALGORITHM.md §15.1): the samples each view holds;
        rows of a view outside its mask are never read.  None: complete views.

    Returns
    -------
    FitResult
        ``V`` (r, n), ``bases`` [(d_p, r)], ``history``, ``n_rounds``, ...
    """
    cfg = FedConfig(
        n_components=n_components, mu=mu, alpha=alpha, tau=tau, eta_g=eta_g, rho1=rho1,
        correction=correction, init_u=init_u, init_v=init_v, diagnostics=diagnostics,
        ustep=ustep or PenaltyOptions(),
    )
    views = check_views(Xs, n_components)
    seed = check_seed(random_state)
    if blas_threads is not None and (isinstance(blas_threads, bool) or not isinstance(blas_threads, int)
                                     or blas_threads < 1):
        raise ParameterError(f"blas_threads must be None or an integer >= 1, got {blas_threads!r}")
    with threadpool_limits(limits=blas_threads):
        return run_inprocess(
            views, cfg, algorithm, max_rounds=max_rounds, tol=tol, seed=seed, callback=callback, n_jobs=n_jobs,
            masks=masks,
        )


class FedSONMF:
    """Federated sparse orthogonal NMF of multi-view data.

    Each view is one client's private data; every client learns its own
    nonnegative orthonormal basis U_p and all agree on one nonnegative,
    row-sparse representation V (r x n) of the samples.

    Parameters are those of :func:`federated_sonmf` (keyword-only; validated
    in ``fit``).

    Attributes
    ----------
    embedding_ : ndarray of shape (n_samples, n_components)
        V^T, the shared representation of the samples.
    components_ : list of ndarray of shape (n_components, n_features_p)
        U_p^T for each view.
    history_ : History
        Per-round objective, residuals, effective rank, bytes, seconds.
    n_rounds_ : int
    result_ : FitResult
    """

    def __init__(
        self,
        n_components: int = 6,
        *,
        mu: float = 1.0,
        tau: int = 10,
        alpha: float = 0.01,
        eta_g: float = 1.5,
        rho1: float = 1.0,
        max_rounds: int = 200,
        tol: float = 1e-4,
        correction: bool = True,
        algorithm: str = "fedsonmf",
        init_u: str = "random",
        init_v: str = "projection",
        ustep: PenaltyOptions | None = None,
        diagnostics: bool = True,
        random_state=None,
        n_jobs: int = 1,
        blas_threads: int | None = None,
        verbose: bool = False,
    ):
        self.n_components = n_components
        self.mu = mu
        self.tau = tau
        self.alpha = alpha
        self.eta_g = eta_g
        self.rho1 = rho1
        self.max_rounds = max_rounds
        self.tol = tol
        self.correction = correction
        self.algorithm = algorithm
        self.init_u = init_u
        self.init_v = init_v
        self.ustep = ustep
        self.diagnostics = diagnostics
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.blas_threads = blas_threads
        self.verbose = verbose

    _params = (
        "n_components", "mu", "tau", "alpha", "eta_g", "rho1", "max_rounds", "tol", "correction",
        "algorithm", "init_u", "init_v", "ustep", "diagnostics", "random_state", "n_jobs", "blas_threads",
    )

    def get_params(self, deep: bool = True) -> dict:
        return {k: getattr(self, k) for k in self._params + ("verbose",)}

    def set_params(self, **params) -> "FedSONMF":
        for k, v in params.items():
            if k not in self._params + ("verbose",):
                raise ValueError(f"invalid parameter {k!r} for FedSONMF")
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("n_components", "mu", "tau", "alpha"))
        return f"FedSONMF({args}, ...)"

    def _fit(self, Xs) -> FitResult:
        callback = None
        if self.verbose:
            def callback(row):
                msg = f"round {row['round']:4d}"
                if "R_rel" in row:
                    msg += f"  F={row['objective']:.6g}  R/R1={row['R_rel']:.3e}"
                print(msg + f"  rank={row['effective_rank']}")
        kwargs = {k: getattr(self, k) for k in self._params}
        res = federated_sonmf(Xs, callback=callback, **kwargs)
        self.result_ = res
        self.embedding_ = res.V.T.copy()
        self.components_ = [U.T.copy() for U in res.bases]
        self.history_ = res.history
        self.n_rounds_ = res.n_rounds
        self.n_features_in_ = [U.shape[0] for U in res.bases]
        return res

    def fit(self, Xs, y=None) -> "FedSONMF":
        """Fit on the list of views ``Xs``; ``y`` is ignored."""
        self._fit(Xs)
        return self

    def fit_transform(self, Xs, y=None) -> np.ndarray:
        """Fit and return the embedding V^T of shape (n_samples, n_components)."""
        self._fit(Xs)
        return self.embedding_

    def reconstruction_error(self, Xs) -> float:
        """``(1/m) sum_p ||X_p - U_p V||_F^2`` of the fitted model on ``Xs``."""
        from fedsonmf.core.objective import loss

        views = check_views(Xs, self.n_components)
        V = self.embedding_.T
        return float(np.mean([loss(X, C.T, V) for X, C in zip(views, self.components_)]))
