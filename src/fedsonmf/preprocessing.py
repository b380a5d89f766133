"""Preprocessing of multi-view data before factorization.

The real-data protocol (docs/algorithm.md §10) divides every view by its Frobenius norm,
``X_p <- X_p / ||X_p||_F``. Views may hold negative entries (the model only constrains the
factors), all-zero samples and all-zero features; none of these produces NaN here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from fedsonmf._validation import _as_matrix, check_view_orientation
from fedsonmf.exceptions import InputError, ParameterError

__all__ = ["normalize_views", "tfidf_views"]

_METHODS = ("frobenius",)


def _check_views(views: Sequence) -> list:
    """Validate a list of 2-D views that share axis 0 (the checks of
    :func:`fedsonmf._validation.check_views`, without the scale check: normalising
    is what rescues a view too large or too small for the algorithm's arithmetic).

    Sparse views are returned as CSR/CSC, dense views as float ndarrays.  Bad views raise
    :class:`~fedsonmf.exceptions.InputError` (a ValueError) naming the view.
    """
    if isinstance(views, np.ndarray) or sp.issparse(views):
        raise TypeError("views must be a list of matrices, one per view, not a single matrix")
    try:
        views = list(views)
    except TypeError:
        raise TypeError(f"views must be a list of matrices, one per view, got {type(views).__name__}") from None
    if not views:
        raise InputError("views is empty: need at least one view")
    out = [_as_matrix(X, p, check_scale=False) for p, X in enumerate(views)]
    for p, X in enumerate(out):
        if 0 in X.shape:
            raise InputError(f"view {p} is empty (shape {X.shape})")
    check_view_orientation(out)  # rows that differ, or views that look transposed
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
        ``"frobenius"``: ``X_p / ||X_p||_F`` (docs/algorithm.md §10).
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
        raise ParameterError(f"method must be one of {_METHODS}, got {method!r}")
    views = _check_views(views)
    if scales is not None and len(scales) != len(views):
        raise ParameterError(f"{len(scales)} scales for {len(views)} views")
    out, used = [], []
    for p, X in enumerate(views):
        X = _float(X)
        if sp.issparse(X):
            X.sum_duplicates()  # canonical form, so that ||X.data|| is the norm
        values = X.data if sp.issparse(X) else X
        if scales is not None:
            norm = float(scales[p])
            if not (np.isfinite(norm) and norm > 0):
                raise ParameterError(f"scales[{p}] must be a positive finite number, got {scales[p]!r}")
        else:
            amax = float(np.max(np.abs(values))) if values.size else 0.0
            if amax == 0:
                raise InputError(f"view {p} is all zero: its Frobenius norm is 0")
            # scale by the largest entry first: no overflow (1e200) or underflow (1e-200) in the norm
            norm = amax * float(np.linalg.norm(values / amax))
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
            raise InputError(f"view {p} has negative entries; TF-IDF needs counts")
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
