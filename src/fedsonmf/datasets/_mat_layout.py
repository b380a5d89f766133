"""Where a ``.mat`` file keeps its views, labels and availability mask.

Public multi-view datasets come in many layouts: views in a cell array (``X``, ``fea``,
``data``...) or in numbered variables (``V1``, ``V2``...), stored samples x features or
features x samples, dense or sparse, with labels under one of several names
(:data:`LABEL_KEYS`).  The functions here take the variables :mod:`._mat_read` read
and find the labels, the views (each oriented samples first) and the mask.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from fedsonmf.datasets._mat_read import _is_cell, _is_numeric
from fedsonmf.exceptions import InputError

__all__ = ["LABEL_KEYS", "VIEW_KEYS", "MASK_KEYS"]

# Candidate names, in order of preference (matched case-sensitively first, then ignoring case).
#: names of the label variable, as the field's datasets spell them
LABEL_KEYS = ("y", "Y", "gt", "truelabel", "truelabels", "label", "labels", "gnd", "Label", "truth",
              "ground_truth", "groundtruth", "gt_labels", "true_labels", "true_label", "labels_true", "target",
              "targets", "class", "classes")
#: names of a cell array of views
VIEW_KEYS = ("X", "fea", "data", "views", "x", "Xs")
#: names of the availability mask (samples x views, nonzero = held)
MASK_KEYS = ("ind", "mask")
_NUMBERED = re.compile(r"^(?P<prefix>[A-Za-z]+)_?(?P<num>\d+)$")


def _describe(v) -> str:
    if _is_cell(v):
        return f"(cell {'x'.join(map(str, v.shape))})"
    kind = "sparse" if sp.issparse(v) else str(v.dtype)
    return f"({'x'.join(map(str, v.shape))} {kind})"


def _lookup(variables: dict, candidates: Sequence[str]) -> str | None:
    """First candidate present in ``variables``: exact match first, then ignoring case."""
    for key in candidates:
        if key in variables:
            return key
    lower = {k.lower(): k for k in variables}
    for key in candidates:
        if key.lower() in lower:
            return lower[key.lower()]
    return None


def _as_label_vector(v) -> np.ndarray | None:
    """A dense numeric vector (any 1 x n / n x 1 shape), or None."""
    if sp.issparse(v):
        v = v.toarray()
    if not isinstance(v, np.ndarray) or not _is_numeric(v) or v.size == 0:
        return None
    if sum(s > 1 for s in v.shape) > 1:
        return None
    return v.ravel()


def _find_labels(variables: dict, labels_key: str | None, seen: str) -> tuple[str, np.ndarray]:
    key: str | None
    if labels_key is not None:
        if labels_key not in variables:
            raise InputError(f"labels_key {labels_key!r} is not in the file; variables: {seen}")
        key = labels_key
    else:
        key = _lookup(variables, LABEL_KEYS)
        if key is None:
            raise InputError(
                f"no label variable found (looked for {', '.join(LABEL_KEYS)}); variables: {seen}"
            )
    value = variables[key]
    parts = list(value.ravel(order="F")) if _is_cell(value) else [value]
    found = [_as_label_vector(p) for p in parts]
    vectors = [v for v in found if v is not None]
    if not vectors or len(vectors) < len(found):
        raise InputError(
            f"label variable {key!r} is not a vector or a cell of vectors; variables: {seen}"
        )
    labels = vectors[0]
    if any(v.shape != labels.shape or not np.array_equal(v, labels) for v in vectors[1:]):
        raise InputError(f"label cell {key!r} holds label vectors that differ")
    if np.issubdtype(labels.dtype, np.floating) and not np.all(labels == np.round(labels)):
        raise InputError(f"label variable {key!r} has non-integer values")
    return key, labels


def _from_triplets(v, n: int):
    """A view stored as MATLAB ``[i, j, value] = find(X)`` triplets (``spconvert``'s input: k x 3,
    1-based integer indices in the first two columns, one index column reaching n) as a CSC matrix
    of shape (max i, max j) -- a few public text sets (e.g. a 600-document 5-view Reuters copy) store
    their sparse views this way. Anything else (including a matrix with an axis of length n already,
    which is read as a view as it stands) is returned unchanged."""
    if (sp.issparse(v) or not isinstance(v, np.ndarray) or not _is_numeric(v) or v.ndim != 2
            or v.shape[1] != 3 or v.shape[0] in (0, n) or n == 3 or v.dtype == bool):
        return v
    idx = v[:, :2]
    if not np.all(idx == np.round(idx)) or idx.min() < 1:
        return v
    shape = (int(idx[:, 0].max()), int(idx[:, 1].max()))
    if n not in shape:
        return v
    # 32-bit indices where they fit, as scipy.io gives for a stored sparse matrix: scikit-learn's
    # k-means (the references) refuses 64-bit ones
    index = np.int32 if max(max(shape), v.shape[0]) < np.iinfo(np.int32).max else np.int64
    rows, cols = idx[:, 0].astype(index) - 1, idx[:, 1].astype(index) - 1
    out = sp.coo_array((np.asarray(v[:, 2], dtype=np.float64), (rows, cols)), shape=shape)
    return out.tocsc()  # duplicate triplets are summed, as spconvert does


def _expand_triplets(variables: dict, n: int) -> dict:
    """``variables`` with every triplet-stored matrix (:func:`_from_triplets`), alone or in a
    cell, replaced by the sparse matrix it describes."""
    out = {}
    for key, v in variables.items():
        if _is_cell(v):
            elements = [_from_triplets(e, n) for e in v.ravel(order="F")]
            if any(e is not o for e, o in zip(elements, v.ravel(order="F"))):
                cell = np.empty(v.shape, dtype=object)
                for i, e in zip(np.ndindex(*v.shape[::-1]), elements):
                    cell[i[::-1]] = e  # Fortran order, as read
                v = cell
        else:
            v = _from_triplets(v, n)
        out[key] = v
    return out


def _has_sample_axis(v, n: int) -> bool:
    return _is_numeric(v) and v.ndim == 2 and n in v.shape


def _find_views(variables: dict, views_key, n: int, seen: str, exclude: set) -> tuple[list, list]:
    if views_key is not None:
        keys = [views_key] if isinstance(views_key, str) else list(views_key)
        missing = [k for k in keys if k not in variables]
        if missing:
            raise InputError(f"views_key {missing} not in the file; variables: {seen}")
        if len(keys) == 1 and _is_cell(variables[keys[0]]):
            return _cell_views(keys[0], variables[keys[0]])
        return keys, [variables[k] for k in keys]

    cells = [k for k, v in variables.items() if _is_cell(v) and k not in exclude]
    preferred = _lookup({k: None for k in cells}, VIEW_KEYS)
    for key in ([preferred] if preferred else []) + cells:
        elements = variables[key].ravel(order="F")
        if elements.size and all(_has_sample_axis(e, n) for e in elements):
            return _cell_views(key, variables[key])
    if preferred:  # the views' cell, with a matrix that does not fit the labels: never dropped silently
        elements = variables[preferred].ravel(order="F")
        if any(_has_sample_axis(e, n) for e in elements):
            names, _ = _cell_views(preferred, variables[preferred])
            _refuse_misfits(names, list(elements), n)

    groups: dict[str, list[tuple[int, str]]] = {}
    for key, v in variables.items():
        match = _NUMBERED.match(key)
        if match and key not in exclude and _is_numeric(v) and v.ndim == 2:
            groups.setdefault(match["prefix"], []).append((int(match["num"]), key))
    fitting = {prefix: sum(_has_sample_axis(variables[k], n) for _, k in members)
               for prefix, members in groups.items()}
    if groups and max(fitting.values()) > 0:
        prefix = max(groups, key=lambda g: (fitting[g], len(groups[g])))
        keys = [k for _, k in sorted(groups[prefix])]
        _refuse_misfits(keys, [variables[k] for k in keys], n)
        return keys, [variables[k] for k in keys]
    # One plain matrix under a views' name (Deng Cai's ``fea`` + ``gnd`` layout, ``X`` + ``y``): a
    # single-view dataset -- still a valid input (the estimator warns that one client is no federation).
    matrices = {k: v for k, v in variables.items() if k not in exclude and _is_numeric(v) and v.ndim == 2}
    single = _lookup(matrices, VIEW_KEYS)
    if single is not None and _has_sample_axis(matrices[single], n):
        return [single], [matrices[single]]
    raise InputError(
        f"no views found: expected a cell array of matrices (e.g. {', '.join(VIEW_KEYS)}), "
        f"numbered variables (V1, V2, ...) or one matrix named {', '.join(VIEW_KEYS)}, with an axis of "
        f"length n_samples={n}; variables: {seen}"
    )


def _refuse_misfits(names: list, values: list, n: int) -> None:
    """An InputError naming the views none of whose axes has the labels' length n (such a view is
    never left out of the dataset without a word)."""
    bad = [f"{name!r} {_describe(v)}" for name, v in zip(names, values) if not _has_sample_axis(v, n)]
    if bad:
        raise InputError(
            f"view {', '.join(bad)} has no axis of length n_samples={n} (the length of the labels), unlike the "
            f"other views ({', '.join(repr(k) for k, v in zip(names, values) if _has_sample_axis(v, n))}); every "
            "view needs one row per labelled sample -- fix the file, or pick the views with views_key"
        )


def _cell_views(key: str, cell: np.ndarray) -> tuple[list, list]:
    elements = list(cell.ravel(order="F"))
    return [f"{key}{{{i + 1}}}" for i in range(len(elements))], elements


def _orient(v, n: int, name: str):
    """Return view ``v`` as (n_samples, d) float64, dense C-contiguous or CSR."""
    if not _is_numeric(v) or v.ndim != 2:
        raise InputError(f"view {name!r} is not a numeric matrix")
    if np.iscomplexobj(v.data if sp.issparse(v) else v):
        raise InputError(f"view {name!r} holds complex numbers; views must be real")
    if v.shape[0] != n:
        if v.shape[1] != n:
            raise InputError(f"view {name!r} has shape {v.shape}; no axis has n_samples={n}")
        v = v.T
    if sp.issparse(v):
        out = sp.csr_array(v, dtype=np.float64)
        out.sort_indices()
        return out
    return np.ascontiguousarray(v, dtype=np.float64)


def _nonzero_rows(v) -> np.ndarray:
    """True for the rows (samples) of ``v`` with at least one nonzero entry."""
    if sp.issparse(v):
        return np.diff(sp.csr_array(v).indptr) > 0  # stored zeros are eliminated by the loader's tocsr()
    return np.asarray(np.asarray(v != 0).any(axis=1))


def _fill_missing_rows(v, name: str):
    """Return ``(v, missing)``: view ``v`` (oriented, samples first) with its all-NaN rows set to
    zero, and the boolean vector of those rows.

    An all-NaN row is how several public incomplete datasets (e.g. the IMVC-CBG files) mark a
    sample that a view does not hold; it is read as "missing from this view", never as data. A
    row with some NaN entries but not all, or any infinite entry, is not a recognisable missing
    marker (imputing it would be a silent modelling choice), so it is refused, naming the view.
    """
    n, d = v.shape
    if sp.issparse(v):
        bad = ~np.isfinite(v.data)
        if not bad.any():
            return v, np.zeros(n, dtype=bool)
        if np.isinf(v.data).any():
            raise InputError(f"view {name!r} contains infinite values; views must be finite")
        rows = np.repeat(np.arange(n), np.diff(v.indptr))
        per_row = np.bincount(rows[bad], minlength=n)
        missing = per_row == d
        partial = (per_row > 0) & ~missing
        v = v.copy()
        v.data[bad] = 0.0
        v.eliminate_zeros()
    else:
        if np.isinf(v).any():
            raise InputError(f"view {name!r} contains infinite values; views must be finite")
        isnan = np.isnan(v)
        if not isnan.any():
            return v, np.zeros(n, dtype=bool)
        per_row = isnan.sum(axis=1)
        missing = per_row == d
        partial = (per_row > 0) & ~missing
        v = np.where(isnan, 0.0, v)
    if partial.any():
        first = int(np.flatnonzero(partial)[0])
        raise InputError(
            f"view {name!r} has {int(partial.sum())} row(s) with some but not all entries NaN (first: sample "
            f"{first}); an all-NaN row is read as a sample missing from the view, a partly-NaN row is not "
            "-- impute or drop those entries before loading"
        )
    return v, missing


def _find_mask(variables: dict, n: int, n_views: int) -> np.ndarray | None:
    key = _lookup(variables, MASK_KEYS)
    if key is None:
        return None
    m = variables[key]
    m = m.toarray() if sp.issparse(m) else m
    if not _is_numeric(m) or m.ndim != 2 or n_views not in m.shape or n not in m.shape:
        return None
    m = m if m.shape == (n, n_views) else m.T
    if not np.isin(m, (0, 1)).all():
        return None
    return m.astype(bool)
