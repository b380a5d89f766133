"""Synthetic data (docs/algorithm.md §8), loaders for multi-view ``.mat`` files and for one file per view."""

from fedsonmf.datasets.files import (
    SUPPORTED_FORMATS,
    load_views,
    read_ids,
    read_labels,
    read_view,
    write_assignments,
)
from fedsonmf.datasets.mat import (
    MultiViewDataset,
    default_data_dir,
    find_datasets,
    load_mat,
)
from fedsonmf.datasets.synthetic import SyntheticData, make_synthetic

__all__ = [
    "SyntheticData", "make_synthetic", "MultiViewDataset", "load_mat", "default_data_dir", "find_datasets",
    "load_views", "read_view", "read_ids", "read_labels", "write_assignments", "SUPPORTED_FORMATS",
]
