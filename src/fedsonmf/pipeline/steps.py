"""The clustering pipeline split by party: what a client does to its own view, what the server does with V.

One code path for both engines: :class:`~fedsonmf.estimators.clustering.FedMultiViewClustering`
calls these functions in process, and the Flower apps call the same functions on each
SuperNode and in the ServerApp (:mod:`fedsonmf.federation.flower.clustering` imports this
package, which sits below the federation layer).

Client (each on its own view, statistics never leave it):
    :func:`prepare_view` -- the label-free preprocessing rule, zero padding to r, Frobenius scaling;
    :func:`apply_view` -- the same fitted transform on new samples of that view.
Server (on what it holds anyway):
    :func:`~fedsonmf.pipeline.rank_rule.resolve_rank` -- the rank rule from c and the views' widths d_p;
    :func:`cluster_embedding` -- k-means on V^T (row-normalised), seeded as the estimator seeds it;
    :mod:`~fedsonmf.pipeline.restarts` -- the restarts: how many
    fits, their seeds, and which fit is kept (the medoid of their partitions);
    :func:`assign_to_centers` -- new samples to the nearest fitted centre.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fedsonmf.exceptions import DataWarning, InputError, warn
from fedsonmf.pipeline.rank_rule import pad_view
from fedsonmf.pipeline.row_norms import normalize_rows
from fedsonmf.pipeline.view_rule import apply_view_preprocessing, preprocess_view, view_warnings
from fedsonmf.preprocessing import normalize_views as _frobenius_scale  # the parameter below has its name

__all__ = ["prepare_view", "apply_view", "cluster_embedding", "assign_to_centers", "stop_rule", "warn_unsettled",
           "embedding_centers", "refine_starts", "kmeans_on_embedding"]


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


# ----------------------------------------------------------------------------- client


def prepare_view(X, *, preprocess: str, n_components: int, normalize_views: bool = True, held=None, view: int = 0):
    """One client's view as the federated fit sees it: preprocess, pad, scale.

    Parameters
    ----------
    X : {ndarray, sparse matrix} of shape (n_samples, d_p)
        The client's raw view.
    preprocess : str
        Rule of :func:`~fedsonmf.pipeline.view_rule.preprocess_view`.
    n_components : int
        The rank r: a narrower (preprocessed) view is padded with zero features to r.
    normalize_views : bool
        Divide the view by its Frobenius norm.
    held : int array or None
        Rows (samples) the client holds (incomplete views); the transform is
        fitted on them only and the other rows stay zero.  None: every row.
    view : int
        The view's index, for error messages.

    Returns
    -------
    Y : ndarray or sparse matrix of shape (n_samples, max(d_p', r))
    info : dict
        ``preprocess_view``'s info plus ``"scale"`` (the Frobenius divisor, 1.0
        without ``normalize_views``).  It holds the statistic that decided the
        rule, and the training mean / scales: it stays with the client.
    """
    try:
        if held is None:
            Y, info = preprocess_view(X, preprocess)
        else:  # fit the transform on the held rows; rows outside the mask stay zero (never read)
            Yh, info = preprocess_view(X[held], preprocess)
    except InputError as ex:  # the rule sees one view: its name is added here
        raise InputError(f"view {view}: {ex}") from None
    if held is not None:
        # scatter back to n rows without densifying a sparse view
        k = held.size
        S = sp.csr_matrix((np.ones(k), (held, np.arange(k))), shape=(X.shape[0], k))
        Y = S @ Yh
    for message in view_warnings(info, view):  # the guards: the client warns about its own view
        warn(message, DataWarning)
    Y = pad_view(Y, n_components)
    scale = 1.0
    if normalize_views:
        if not np.any(Y.data if sp.issparse(Y) else Y):  # named here: the scaling sees one view at a time
            raise InputError(f"view {view} is all zero: its Frobenius norm is 0")
        (Y,), (scale,) = _frobenius_scale([Y], return_scales=True)
    return Y, {**info, "scale": float(scale)}


def apply_view(X, info: dict, *, n_components: int, normalize_views: bool = True):
    """New samples (n_new, d_p) of a view through the transform :func:`prepare_view` fitted (``info``)."""
    Y = pad_view(apply_view_preprocessing(X, info), n_components)
    if normalize_views:
        (Y,) = _frobenius_scale([Y], scales=[info["scale"]])
    return Y


# ----------------------------------------------------------------------------- server


def cluster_embedding(V, n_clusters: int, *, seed: int, normalize_embedding: bool = True, kmeans_n_init: int = 10,
                      kmeans_max_iter: int = 300):
    """k-means on the samples' rows of V^T, seeded with the run seed (as the estimator does).

    Parameters
    ----------
    V : ndarray of shape (r, n_samples)

    Returns
    -------
    labels : ndarray of shape (n_samples,)
    centers : ndarray of shape (n_clusters, r)
        In the (normalised) embedding; :func:`assign_to_centers` uses them.
    kmeans : sklearn.cluster.KMeans
    """
    labels, km = kmeans_on_embedding(np.asarray(V).T, n_clusters, normalize=normalize_embedding,
                                     n_init=kmeans_n_init, max_iter=kmeans_max_iter, random_state=seed)
    return np.asarray(labels), np.asarray(km.cluster_centers_, dtype=np.float64), km


def refine_starts(V, labels, n_clusters: int, *, seed: int, n_starts: int, normalize_embedding: bool = True,
                  kmeans_max_iter: int = 300) -> list[np.ndarray]:
    """The starts of the refinement: the fit's partition ``labels`` first, then ``n_starts - 1``
    partitions of k-means on V (one replicate each, seeds ``(1000 seed + j) mod 2^32``: diverse starts,
    from V alone; docs/clustering.md).  Shape of each: (n_samples,)."""
    starts = [np.asarray(labels, dtype=np.int64)]
    for j in range(1, int(n_starts)):
        lab, _ = kmeans_on_embedding(np.asarray(V).T, n_clusters, normalize=normalize_embedding, n_init=1,
                                     max_iter=kmeans_max_iter, random_state=(1000 * int(seed) + j) % 2**32)
        starts.append(np.asarray(lab, dtype=np.int64))
    return starts


def assign_to_centers(E, centers, *, normalize_embedding: bool = True) -> np.ndarray:
    """The nearest centre of each row of the embedding ``E`` (n_new, r): shape (n_new,)."""
    E = np.asarray(E, dtype=np.float64)
    if normalize_embedding:
        E = normalize_rows(E)
    d2 = ((E[:, None, :] - np.asarray(centers)[None, :, :]) ** 2).sum(axis=2)
    return np.argmin(d2, axis=1)


def stop_rule(early_stop: str, n_clusters: int, *, seed: int, tol: float, normalize_embedding: bool = True):
    """The server's stopping rule of a clustering fit, or None (``tol`` = 0: every round runs).

    :class:`fedsonmf.pipeline.stopping.StepResidual` (R_step/R_step1 <= ``tol``), then with
    ``early_stop="labels"`` :class:`fedsonmf.pipeline.stopping.LabelStability` (the server's
    warm-started k-means of V unchanged for a few rounds).  The fit itself runs with the loop's
    ``tol`` = 0, so no client sends the r x n gradient that R/R1 needs.
    """
    if not tol > 0:
        return None
    from fedsonmf.pipeline.stopping import FirstOf, LabelStability, StepResidual  # imports this module

    labels = (LabelStability(n_clusters, normalize=normalize_embedding, random_state=seed)
              if early_stop == "labels" else None)
    return FirstOf(StepResidual(tol), labels)


def warn_unsettled(res, tol: float) -> None:
    """A :class:`~fedsonmf.exceptions.ConvergenceWarning` when a clustering fit (``res``, a FitResult)
    ran all its rounds before its :func:`stop_rule` stopped it, as the loop warns for R/R1."""
    # neither its tolerance, its stopping rule (converged) nor the divergence guard stopped it: its budget did
    if not (tol > 0 and not res.converged and not res.extra.get("diverged", False)):
        return
    from fedsonmf.exceptions import ConvergenceWarning, warn  # ConvergenceWarning imports scikit-learn

    rel = res.history.rows[-1].get("R_step_rel", float("nan")) if res.history.rows else float("nan")
    warn(f"stopped after max_rounds={res.n_rounds} with R_step/R_step1 = {rel:.3g} > tol = {tol:g}; "
         "increase max_rounds or tol", ConvergenceWarning)


def embedding_centers(V, labels, n_clusters: int, *, normalize_embedding: bool = True) -> np.ndarray:
    """The centre of every cluster of ``labels`` in the embedding k-means works in (rows of V^T,
    normalised when ``normalize_embedding``): shape (n_clusters, r); an empty cluster's is zero."""
    E = normalize_rows(np.asarray(V).T) if normalize_embedding else np.asarray(V, dtype=np.float64).T
    labels = np.asarray(labels)
    return np.array([E[labels == k].mean(axis=0) if np.any(labels == k) else np.zeros(E.shape[1])
                     for k in range(n_clusters)])
