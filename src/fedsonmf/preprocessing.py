"""Preprocessing of multi-view data before factorization.

The real-data protocol (ALGORITHM.md §10) divides every view by its Frobenius norm,
``X_p <- X_p / ||X_p||_F``. Views may hold negative entries (the model only constrains the
factors), all-zero samples and all-zero features; none of these produces NaN here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["normalize_views", "tfidf_views"]

_METHODS = ("frobenius",)


def _check_views(views: Sequence) -> list:
    """Validate a list of 2-D views that share axis 0; return dense views as float ndarrays."""
    if isinstance(views, np.ndarray) or sp.issparse(views):
        raise TypeError("views must be a list of matrices, one per view, not a single matrix")
    views = list(views)
    if not views:
        raise ValueError("views is empty: need at least one view")
    out = []
    for p, X in enumerate(views):
        if sp.issparse(X):
            X = X if X.format in ("csr", "csc") else X.tocsr()
        else:
            X = np.asarray(X)
            if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
                raise ValueError(f"view {p} has non-numeric dtype {X.dtype}")
        if X.ndim != 2:
            raise ValueError(f"view {p} must be 2-D (n_samples, n_features), got shape {X.shape}")
        values = X.data if sp.issparse(X) else X
        if not np.all(np.isfinite(values)):
            raise ValueError(f"view {p} contains NaN or infinite values")
        out.append(X)
    n = {X.shape[0] for X in out}
    if len(n) > 1:
        raise ValueError(
            f"views disagree on n_samples (axis 0): shapes {[X.shape for X in out]}"
        )
    return out


def _float(X):
    """Copy of ``X`` as float: float32/float64 kept, other dtypes become float64."""
    dtype = X.dtype if X.dtype in (np.float32, np.float64) else np.float64
    return X.astype(dtype, copy=True)


def normalize_views(views: Sequence, method: str = "frobenius", *, scales: Sequence[float] | None = None,
                    return_scales: bool = False):
    """Scale each view to unit Frobenius norm.

    Parameters
    ----------
    views : list of {array-like, sparse matrix}
        ``views[p]`` has shape (n_samples, d_p). Negative entries are allowed.
    method : {"frobenius"}, default="frobenius"
        ``"frobenius"``: ``X_p / ||X_p||_F`` (ALGORITHM.md §10).
    scales : sequence of float, optional
        Divide view p by ``scales[p]`` instead of its own norm (new samples are
        scaled like the training samples: pass the training views' norms).
    return_scales : bool, default=False
        Also return the divisors used.

    Returns
    -------
    normalized : list of {ndarray, sparse matrix}
        New objects of the same shapes; CSR and CSC inputs keep their format, other sparse
        formats become CSR. float32 and float64 are kept, other dtypes become float64.
    scales : list of float
        Only with ``return_scales``.

    Raises
    ------
    ValueError
        If ``method`` is unknown, a view is all zero (its index is named), not 2-D, holds
        NaN/inf, or the views disagree on n_samples.
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    views = _check_views(views)
    if scales is not None and len(scales) != len(views):
        raise ValueError(f"{len(scales)} scales for {len(views)} views")
    out, used = [], []
    for p, X in enumerate(views):
        X = _float(X)
        if sp.issparse(X):
            X.sum_duplicates()  # canonical form, so that ||X.data|| is the norm
        norm = np.linalg.norm(X.data if sp.issparse(X) else X) if scales is None else float(scales[p])
        if not norm > 0:
            raise ValueError(f"view {p} is all zero: its Frobenius norm is 0")
        if sp.issparse(X):
            X.data /= norm  # X is a private copy
        else:
            X /= norm
        out.append(X)
        used.append(float(norm))
    return (out, used) if return_scales else out


def tfidf_views(
    views: Sequence,
    *,
    norm: str | None = "l2",
    use_idf: bool = True,
    smooth_idf: bool = True,
    sublinear_tf: bool = False,
) -> list:
    """Apply TF-IDF weighting to term-count views (samples = documents).

    A thin wrapper of :class:`sklearn.feature_extraction.text.TfidfTransformer`, fitted on each
    view separately. With ``smooth_idf=True`` all-zero terms get a finite idf, and all-zero
    documents stay zero under ``norm="l2"``.

    Parameters
    ----------
    views : list of {array-like, sparse matrix}
        ``views[p]`` has shape (n_samples, d_p) and nonnegative entries (counts).
    norm : {"l2", "l1"} or None, default="l2"
        Row normalisation after weighting.
    use_idf, smooth_idf, sublinear_tf : bool
        Passed to ``TfidfTransformer``.

    Returns
    -------
    weighted : list of {ndarray, sparse matrix}
        Same shapes as ``views``; dense inputs give dense float64 arrays, sparse inputs give
        CSR (``csr_array`` for sparse arrays, ``csr_matrix`` otherwise).

    Raises
    ------
    ValueError
        If a view has negative entries (its index is named), or on the errors of
        :func:`normalize_views` other than the all-zero view.
    """
    from sklearn.feature_extraction.text import TfidfTransformer

    out = []
    for p, X in enumerate(_check_views(views)):
        values = X.data if sp.issparse(X) else X
        if values.size and values.min() < 0:
            raise ValueError(f"view {p} has negative entries; TF-IDF needs counts")
        transformer = TfidfTransformer(
            norm=norm, use_idf=use_idf, smooth_idf=smooth_idf, sublinear_tf=sublinear_tf
        )
        W = sp.csr_array(transformer.fit_transform(sp.csr_array(_float(X))))
        if not sp.issparse(X):
            W = W.toarray()
        elif not isinstance(X, sp.sparray):
            W = sp.csr_matrix(W)
        out.append(W)
    return out
