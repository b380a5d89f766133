"""The rank rule of federated multi-view clustering: r from the number of clusters and the views' widths.

The server settles r at setup from c and the widths d_p the clients report (it learns them
anyway: U_p has d_p rows and r must be agreed on).  Why 2c (``docs/clustering.md``): for fixed
bases the best V is mean_p U_p^T X_p, so the fit maximises the energy of the shared projection;
for nonnegative data one *background component* collects the features every sample has, and
with r = c the c clusters get c - 1 directions.  A spare component per cluster leaves room for it.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fedsonmf._validation import is_int

__all__ = ["RANK_RULES", "resolve_rank", "pad_view"]

RANK_RULES = ("auto", "paper")


def resolve_rank(n_clusters: int, view_widths, rule="auto"):
    """The rank r of the factorization for ``n_clusters`` clusters.

    Parameters
    ----------
    n_clusters : int
        Number of clusters c (k-means on V^T always produces c clusters).
    view_widths : sequence of int
        Number of features d_p of each view (each client knows its own; the
        server learns them at setup anyway, since U_p has d_p rows locally and
        r must be agreed on).
    rule : {"auto", "paper"} or int, default="auto"
        * ``"auto"``: r = 2c.  One component per cluster is not enough because
          the fit spends one component (or more) on the background shared by
          all samples; with r = c, c clusters get c - 1 directions.  2c leaves a
          spare per cluster (measured: 3c is no better).  Views narrower than r
          are to be **padded** with zero features (:func:`pad_view`); the
          message says which.  Padding never changes the data of a wide view
          and lets a narrow client take part with the components it can
          explain; capping r at a 6-feature view would give fewer components
          than clusters.
        * ``"paper"``: r = c (the paper's protocol), capped at the narrowest view
          (no padding; a message says r was capped).  Never below 1.
        * int: that rank, capped likewise.

    Returns
    -------
    r : int
    message : str or None
        A warning text when r was capped or views have to be padded, else None.

    Notes
    -----
    With ``"auto"`` the returned r may exceed some d_p: the caller must pad
    those views to r features (:func:`pad_view`) before fitting.  With every
    other rule r <= min_p d_p.
    """
    if not is_int(n_clusters) or n_clusters < 1:
        raise ValueError(f"n_clusters must be a positive integer, got {n_clusters!r}")
    widths = [int(d) for d in view_widths]
    if not widths or min(widths) < 1:
        raise ValueError(f"view_widths must be a non-empty list of positive integers, got {view_widths!r}")
    dmin = min(widths)
    if rule == "auto":
        r = 2 * n_clusters
        narrow = [p for p, d in enumerate(widths) if d < r]
        if narrow:
            return r, (f"rank r = 2 x n_clusters = {r} exceeds the width of view(s) {narrow} "
                       f"({[widths[p] for p in narrow]} features); those views are padded with zero "
                       f"features up to {r} (their clients cannot explain the extra components)")
        return r, None
    if rule == "paper":
        want = n_clusters
    elif is_int(rule) and rule >= 1:
        want = int(rule)
    else:
        raise ValueError(f"rule must be one of {RANK_RULES} or a positive integer, got {rule!r}")
    if want > dmin:
        return dmin, (f"rank r = {want} exceeds the narrowest view ({dmin} features); r is capped at "
                      f"{dmin} (k-means still produces {n_clusters} clusters)")
    return want, None


def pad_view(X, n_features: int):
    """Append all-zero features to ``X`` (n_samples, d) so that it has ``n_features`` columns.

    A zero feature adds nothing to ``||X - U V||`` for any V, and an orthonormal
    nonnegative U of width r exists once d >= r; the client simply cannot
    explain the extra components.  Views already at least that wide are
    returned unchanged (the same object).
    """
    d = X.shape[1]
    if d >= n_features:
        return X
    if sp.issparse(X):
        Z = sp.csr_matrix((X.shape[0], n_features - d), dtype=X.dtype)
        return sp.hstack([sp.csr_matrix(X), Z], format="csr")
    X = np.asarray(X)
    dtype = X.dtype if np.issubdtype(X.dtype, np.floating) else np.float64
    return np.hstack([X.astype(dtype, copy=False), np.zeros((X.shape[0], n_features - d), dtype=dtype)])
