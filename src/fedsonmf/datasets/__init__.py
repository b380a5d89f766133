"""Synthetic data (ALGORITHM.md §8) and loaders for multi-view ``.mat`` files."""

from fedsonmf.datasets.mat import (
    MultiViewDataset,
    default_data_dir,
    find_datasets,
    load_mat,
)
from fedsonmf.datasets.synthetic import SyntheticData, make_synthetic

__all__ = [
    "SyntheticData", "make_synthetic", "MultiViewDataset", "load_mat", "default_data_dir", "find_datasets",
]
