"""Federated multi-view clustering: federated sparse ONMF, then k-means on V^T.

Each view is one client's private data (ALGORITHM.md §10).  The clients and the
server run :class:`~fedsonmf.estimators.sonmf.FedSONMF`; k-means runs on the shared
representation V^T (n x r), which every party holds after the last round.

Label-free defaults (issue "Table 1", item 5) -- nothing here looks at labels:

* ``n_components=None``: r = ``n_clusters``.
* ``mu="auto"`` (the library-wide default): the l2,1 weight is set from the
  data's own scale.  The server prox shrinks every row of V-bar by
  ``eta_tilde * mu``; the server puts that threshold at ``mu_scale`` (default
  0.1) times the median row norm of the initial V-bar^1 it builds anyway
  (:func:`fedsonmf.protocol.config.resolve_mu`): a mild shrinkage that does not
  depend on how the views are scaled and leaves all r rows alive on every
  dataset we tried.  One scalar per round message, nothing else.
* ``normalize_embedding=True``: each sample's embedding (row of V^T) is scaled
  to unit l2 norm before k-means (all-zero rows stay zero).  This uses no
  labels, is the standard step of spectral and cosine (spherical) clustering,
  and it makes k-means see the *direction* of a sample in the r latent
  components rather than its length, which for documents mostly reflects how
  long the document is.  ``False`` gives the paper's literal "k-means on V^T".

The evaluation protocol over seeds and the centralized context methods live in
:mod:`fedsonmf.experiments.evaluation`.
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.utils.validation import check_is_fitted

from fedsonmf._validation import check_views
from fedsonmf.estimators.sonmf import FedSONMF
from fedsonmf.exceptions import InputError, ParameterError
from fedsonmf.preprocessing import normalize_views
from fedsonmf.protocol.params import (
    CLUSTER_PARAMS,
    FED_PARAMS,
    RUN_PARAMS,
    default,
    make_init,
)

__all__ = [
    "FedMultiViewClustering",
    "auto_mu",
    "kmeans_on_embedding",
    "normalize_rows",
]

def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


# ----------------------------------------------------------------------------- building blocks


def normalize_rows(E: np.ndarray) -> np.ndarray:
    """Scale every row of ``E`` to unit l2 norm; all-zero rows stay zero (no NaN).

    >>> normalize_rows(np.array([[3.0, 4.0], [0.0, 0.0]]))
    array([[0.6, 0.8],
           [0. , 0. ]])
    """
    E = np.asarray(E, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", E, E))
    out = np.zeros_like(E)
    ok = norms > 0
    out[ok] = E[ok] / norms[ok, None]
    return out


def kmeans_on_embedding(
    E, n_clusters: int, *, normalize: bool = True, n_init: int = 10, max_iter: int = 300, random_state=None
):
    """k-means (scikit-learn, ``n_init`` replicates, ``max_iter`` iterations) on an embedding.

    Parameters
    ----------
    E : {ndarray, sparse matrix} of shape (n_samples, n_features)
    n_clusters : int
    normalize : bool, default=True
        Row-normalise ``E`` first (:func:`normalize_rows`; dense embeddings only).

    Returns
    -------
    labels : ndarray of shape (n_samples,)
    kmeans : sklearn.cluster.KMeans, fitted
    """
    from sklearn.cluster import KMeans

    if normalize:
        E = normalize_rows(E.toarray() if sp.issparse(E) else E)
    km = KMeans(n_clusters=n_clusters, n_init=n_init, max_iter=max_iter, random_state=random_state)
    labels = km.fit_predict(E)
    return labels, km


def auto_mu(Xs, n_components: int, *, eta_tilde: float, mu_scale: float = default("mu_scale"),
            init_u: str = default("init_u"), init_v: str = default("init_v"), seed: int = 0) -> float:
    """The number ``mu="auto"`` resolves to for these views and this seed (for inspection).

    The federation computes it on the server from V-bar^1
    (:func:`fedsonmf.protocol.config.resolve_mu`); this recomputes V-bar^1 exactly
    as the clients' seeded setup builds it.
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


class FedMultiViewClustering(ClusterMixin, BaseEstimator):
    """Federated multi-view clustering: :class:`~fedsonmf.FedSONMF` on the views, then k-means on V^T.

    Parameters
    ----------
    n_clusters : int, default=8
        Number of clusters c.
    n_components : int or None, default=None
        Rank r; None means r = ``n_clusters``.
    normalize_embedding : bool, default=True
        Row-normalise V^T before k-means (see the module docstring for why).
    normalize_views : bool, default=True
        Divide each view by its Frobenius norm first (the paper's preprocessing;
        new samples in ``predict`` are divided by the training norms).
    n_init, kmeans_max_iter : int, default=10, 300
        k-means replicates and iterations.
    mu, mu_scale, tau, alpha, eta_g, rho1, correction, init_u, init_v, diagnostics, ustep,
    max_rounds, tol, algorithm, random_state, n_jobs, blas_threads, checkpoint_dir, verbose
        As in :class:`~fedsonmf.FedSONMF` (same defaults: one parameter table).
        ``random_state`` also seeds k-means.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
    embedding_ : ndarray of shape (n_samples, n_components_)
        V^T as learned (not row-normalised).
    factorization_ : FedSONMF
        The fitted factorization (``transform`` embeds new samples).
    n_components_ : int
    mu_ : float
        The l2,1 weight actually used.
    seed_ : int
        The seed actually used (drawn when ``random_state`` is None).
    view_scales_ : list of float
        The divisor of each view (1.0 without ``normalize_views``).
    result_, history_, n_rounds_
        As :class:`~fedsonmf.FedSONMF`'s ``result_``, ``history_``, ``n_rounds_``.
    kmeans_ : sklearn.cluster.KMeans
    effective_rank_ : int
        Nonzero rows of V.
    """

    __init__ = make_init(
        ("n_clusters", "n_components") + CLUSTER_PARAMS[1:] + tuple(n for n in FED_PARAMS if n != "n_components")
        + RUN_PARAMS,
        overrides={"n_components": None},  # None: r = n_clusters
    )

    # ------------------------------------------------------------------ fit
    def _validate(self, n_samples: int) -> int:
        for name in ("n_clusters", "n_init", "kmeans_max_iter"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ParameterError(f"{name} must be a positive integer, got {v!r}")
        if self.n_clusters > n_samples:
            raise ParameterError(f"n_clusters={self.n_clusters} is larger than n_samples={n_samples}")
        r = self.n_clusters if self.n_components is None else self.n_components
        if not _is_int(r) or r < 1:
            raise ParameterError(f"n_components must be None or a positive integer, got {self.n_components!r}")
        for name in ("normalize_embedding", "normalize_views"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ParameterError(f"{name} must be True or False, got {getattr(self, name)!r}")
        return int(r)

    def _factorization(self, r: int) -> FedSONMF:
        params = {k: getattr(self, k) for k in FED_PARAMS + RUN_PARAMS if k != "n_components"}
        return FedSONMF(r, **params)

    def _scaled(self, Xs, scales=None):
        if not self.normalize_views:
            return Xs, [1.0] * len(Xs)
        try:
            return normalize_views(Xs, scales=scales, return_scales=True)
        except (TypeError, ValueError) as exc:
            raise InputError(str(exc)) from None

    def fit(self, Xs, y=None, *, callback=None) -> "FedMultiViewClustering":
        """Factorize the views ``Xs`` federatedly and cluster the samples; ``y`` is ignored.

        ``callback(row)`` is called with every round's history row (progress display).
        """
        views = check_views(Xs)  # every input check before any computation
        r = self._validate(views[0].shape[1])
        model = self._factorization(r)
        model._validate()
        Xs, scales = self._scaled(Xs)
        res = model._fit(Xs, callback=callback)
        labels, km = kmeans_on_embedding(
            res.V.T, self.n_clusters, normalize=self.normalize_embedding, n_init=self.n_init,
            max_iter=self.kmeans_max_iter, random_state=res.seed,
        )
        self.factorization_ = model
        self.view_scales_ = scales
        self.n_components_ = r
        self.mu_ = model.mu_
        self.seed_ = res.seed
        self.result_ = res
        self.history_ = res.history
        self.n_rounds_ = res.n_rounds
        self.embedding_ = model.embedding_
        self.kmeans_ = km
        self.labels_ = labels
        self.effective_rank_ = int(np.count_nonzero(np.linalg.norm(res.V, axis=1) > 0))
        return self

    def fit_predict(self, Xs, y=None, *, callback=None) -> np.ndarray:
        """Fit and return the cluster labels, shape (n_samples,)."""
        return self.fit(Xs, callback=callback).labels_

    def transform(self, Xs) -> np.ndarray:
        """Embed new samples (every view) with the fitted bases: shape (n_samples_new, n_components_)."""
        check_is_fitted(self, "labels_")
        Xs, _ = self._scaled(Xs, self.view_scales_)
        return self.factorization_.transform(Xs)

    def predict(self, Xs) -> np.ndarray:
        """Assign new samples (every view) to the fitted clusters: shape (n_samples_new,).

        The samples are scaled like the training views, embedded with the fitted
        bases (:meth:`FedSONMF.transform`: one federated round) and given the
        nearest k-means centre, with the same embedding normalisation as ``fit``.
        """
        E = self.transform(Xs).astype(np.float64)
        if self.normalize_embedding:
            E = normalize_rows(E)
        return self.kmeans_.predict(E)
