"""Step-order control: earliest step first (all rollouts of a step tie)."""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, RunView


class StepOrder(BaseEstimator):
    """``-step``: a timing prior that knows nothing about the behavior."""

    name = "step-order"

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return -np.asarray(view.steps, np.float64)
