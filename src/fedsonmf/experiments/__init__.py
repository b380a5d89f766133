"""Experiment runners that reproduce the paper's studies (separate from the algorithm code)."""

from fedsonmf.experiments.synthetic_study import (
    Cell,
    StudyConfig,
    run_cell,
    run_study,
    study_cells,
)

__all__ = ["StudyConfig", "Cell", "study_cells", "run_cell", "run_study"]
