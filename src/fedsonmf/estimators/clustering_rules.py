"""The label-free rules of federated multi-view clustering, gathered under their former name.

Each rule lives in a module with one job; this module only re-exports them:

* :mod:`~fedsonmf.estimators.view_rule` -- the per-client preprocessing rule and its guards;
* :mod:`~fedsonmf.estimators.rank_rule` -- r from c and the views' widths, zero padding;
* :mod:`~fedsonmf.estimators.consensus` -- the consensus of several restarts' partitions;
* :mod:`~fedsonmf.estimators.row_norms` -- row normalisers (views, and V^T before k-means).

The mechanism behind them and every measurement are in ``docs/clustering.md``.
"""

from __future__ import annotations

from fedsonmf.estimators.consensus import co_association, consensus_labels
from fedsonmf.estimators.rank_rule import RANK_RULES, pad_view, resolve_rank
from fedsonmf.estimators.row_norms import normalize_rows, row_normalize
from fedsonmf.estimators.view_rule import (
    MEAN_SHARE_THRESHOLD,
    PREPROCESS_RULES,
    apply_view_preprocessing,
    mean_energy_share,
    preprocess_view,
    view_warnings,
)

__all__ = [
    "MEAN_SHARE_THRESHOLD",
    "PREPROCESS_RULES",
    "RANK_RULES",
    "apply_view_preprocessing",
    "co_association",
    "consensus_labels",
    "mean_energy_share",
    "normalize_rows",
    "pad_view",
    "preprocess_view",
    "resolve_rank",
    "row_normalize",
    "view_warnings",
]
