"""Advantage-only control: the GRPO advantage (for steps, the mean |advantage|)."""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, RunView


class AdvantageOnly(BaseEstimator):
    """Rollouts pushed up hardest rank first; no gradient, no target."""

    name = "advantage-only"

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return np.asarray(view.advantages, np.float64).copy()
