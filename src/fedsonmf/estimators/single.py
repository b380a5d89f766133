"""Centralized sparse ONMF of one matrix: :class:`SparseONMF`, the federated core with one client.

``X`` (n_samples, n_features) is factorized as ``X ~ W H`` with ``H = U^T``
(n_components, n_features) nonnegative with orthonormal rows and ``W = V^T``
(n_samples, n_components) nonnegative and column-sparse (the l2,1 penalty on V's
rows switches whole components off).  Internally the one client holds
``X^T`` (n_features x n_samples), exactly as a client of
:class:`~fedsonmf.estimators.sonmf.FedSONMF`; the fit runs the same round loop.

This estimator follows scikit-learn's contract in full (``check_estimator``
passes, ``tests/test_sklearn_single.py``): it is the proof that the core honours
it (sparse input, float32 kept, the standard error messages), and a plain
transformer for data that live in one place.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from fedsonmf._validation import check_int
from fedsonmf.core.objective import loss
from fedsonmf.estimators.sonmf import FedSONMF
from fedsonmf.exceptions import InputError
from fedsonmf.protocol.params import default

__all__ = ["SparseONMF"]

#: the parameters SparseONMF passes on to the one-client FedSONMF
_PASSED = ("mu", "mu_scale", "tau", "alpha", "eta_g", "rho1", "init_u", "init_v", "ustep", "max_rounds", "tol",
           "random_state", "blas_threads", "verbose")


class SparseONMF(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Sparse orthogonal NMF of one matrix (the federated core with a single client).

    ``X ~ W H``: ``H`` (n_components, n_features) is nonnegative with orthonormal
    rows, ``W`` (n_samples, n_components) is nonnegative and column-sparse.
    Negative entries of ``X`` are valid (only the factors are constrained).

    Parameters
    ----------
    n_components : int or None, default=None
        Rank r, at most n_features.  None: n_features (as scikit-learn's NMF).
    mu : float >= 0 or "auto", default="auto"
        Weight of the l2,1 penalty on W's columns; "auto" is scale-free (see
        :class:`~fedsonmf.FedSONMF`).  The number used is ``mu_``.
    mu_scale, tau, alpha, eta_g, rho1, init_u, init_v, ustep
        As in :class:`~fedsonmf.FedSONMF` (same defaults: one parameter table).
    max_rounds : int, default=200
        Outer iterations (rounds of the one-client federation) at most.
    tol : float, default=1e-4
        Stop when R / R^1 <= tol; 0 runs all ``max_rounds``.
    random_state : None, int, RandomState or Generator, default=None
    blas_threads : int or None, default=None
    verbose : int, default=0
        0 silent, 1 a progress line every 10 rounds and a summary, 2 one line per round.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        ``H = U^T`` (nonnegative, orthonormal rows).
    embedding_ : ndarray of shape (n_samples, n_components)
        ``W = V^T`` of the training samples.
    n_components_ : int
    n_iter_ : int
        Rounds run.
    reconstruction_err_ : float
        Frobenius norm ``||X - W H||_F`` on the training data (as scikit-learn's NMF).
    mu_ : float
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Only when ``X`` has string column names (a DataFrame).
    history_ : History

    Examples
    --------
    >>> import numpy as np
    >>> from fedsonmf.estimators import SparseONMF
    >>> X = np.random.default_rng(0).random((30, 8))
    >>> model = SparseONMF(n_components=3, random_state=0)
    >>> W = model.fit_transform(X)
    >>> W.shape, model.components_.shape
    ((30, 3), (3, 8))
    """

    def __init__(
        self,
        n_components=None,
        *,
        mu=default("mu"), mu_scale=default("mu_scale"), tau=default("tau"), alpha=default("alpha"),
        eta_g=default("eta_g"), rho1=default("rho1"), init_u=default("init_u"), init_v=default("init_v"),
        ustep=default("ustep"), max_rounds=default("max_rounds"), tol=default("tol"),
        random_state=default("random_state"), blas_threads=default("blas_threads"), verbose=0,
    ):
        self.n_components = n_components
        self.mu = mu
        self.mu_scale = mu_scale
        self.tau = tau
        self.alpha = alpha
        self.eta_g = eta_g
        self.rho1 = rho1
        self.init_u = init_u
        self.init_v = init_v
        self.ustep = ustep
        self.max_rounds = max_rounds
        self.tol = tol
        self.random_state = random_state
        self.blas_threads = blas_threads
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    # ------------------------------------------------------------------ fit
    def _rank(self, n_features: int) -> int:
        if self.n_components is None:
            return n_features
        r = check_int("n_components", self.n_components, min=1)
        if r > n_features:
            raise InputError(f"n_components={r} is larger than n_features={n_features}; a nonnegative orthonormal "
                             "basis needs n_features >= n_components (lower n_components)")
        return r

    def _fit(self, X):
        X = validate_data(self, X, accept_sparse=("csr", "csc"), dtype=[np.float64, np.float32],
                          ensure_min_samples=1, ensure_min_features=1)
        r = self._rank(X.shape[1])
        inner = FedSONMF(r, correction=False, diagnostics=True, n_jobs=1,
                         **{k: getattr(self, k) for k in _PASSED})
        inner._fit([X], single_view_ok=True)
        self._inner = inner
        self.components_ = inner.components_[0]
        self.embedding_ = inner.embedding_
        self.n_components_ = r
        self.n_iter_ = inner.n_iter_
        self.mu_ = inner.mu_
        self.history_ = inner.history_
        self.reconstruction_err_ = inner.reconstruction_err_
        # the sample-wise out-of-sample map: max(H x, 0) scaled by each component's training shrink factor
        Z = np.maximum(_matmul(X, self.components_.T.astype(np.float64)), 0.0)
        norms = np.linalg.norm(Z, axis=0)
        t = 0.5 * self.mu_
        with np.errstate(divide="ignore", invalid="ignore"):
            self._shrink = np.where(norms > t, 1.0 - t / np.where(norms > 0, norms, 1.0), 0.0)
        return X

    def fit(self, X, y=None):
        """Fit on ``X`` {array-like, sparse matrix} of shape (n_samples, n_features); ``y`` is ignored."""
        self._fit(X)
        return self

    def fit_transform(self, X, y=None):
        """Fit and return ``W`` (n_samples, n_components) of the training samples."""
        X = self._fit(X)
        return self._transform(X)

    # ------------------------------------------------------------------ use
    def _transform(self, X):
        Z = np.maximum(_matmul(X, self.components_.T.astype(np.float64)), 0.0) * self._shrink
        return Z.astype(X.dtype, copy=False)

    def transform(self, X):
        """``W`` of (new) samples for the fitted ``H``: shape (n_samples, n_components).

        Sample by sample: ``max(H x, 0)`` scaled by each component's shrink factor
        of the training fit (the l2,1 prox of the training samples, so the
        training samples get the exact V-minimiser for the fitted ``H``, and a
        sample's embedding does not depend on the batch it comes in).
        """
        check_is_fitted(self, "components_")
        X = validate_data(self, X, accept_sparse=("csr", "csc"), dtype=[np.float64, np.float32], reset=False)
        return self._transform(X)

    def inverse_transform(self, X):
        """``W H``: the reconstruction of shape (n_samples, n_features) from ``W`` (n_samples, n_components)."""
        check_is_fitted(self, "components_")
        W = _check_embedding(X, self.n_components_)
        return np.asarray(_matmul(W, self.components_.astype(W.dtype, copy=False)))

    def score(self, X, y=None) -> float:
        """Negative Frobenius reconstruction error ``-||X - W H||_F`` with W = ``transform(X)``."""
        check_is_fitted(self, "components_")
        X = validate_data(self, X, accept_sparse=("csr", "csc"), dtype=[np.float64, np.float32], reset=False)
        W = self._transform(X).astype(np.float64)
        U = self.components_.T.astype(np.float64)
        XT = X.T.tocsc() if sp.issparse(X) else np.asarray(X, dtype=np.float64).T
        return -float(np.sqrt(max(loss(XT, U, W.T), 0.0)))


def _matmul(X, M):
    out = X @ M
    return np.asarray(out.toarray() if sp.issparse(out) else out)


def _check_embedding(W, r: int) -> np.ndarray:
    from sklearn.utils import check_array

    W = check_array(W, dtype=[np.float64, np.float32])
    if W.shape[1] != r:
        raise ValueError(f"X has {W.shape[1]} features, but SparseONMF.inverse_transform is expecting {r} "
                         "(n_components_)")
    return W

