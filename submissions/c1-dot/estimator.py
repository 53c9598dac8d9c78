"""C1-dot: the raw inner product of each unit's gradient sketch with the final target."""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, DrawView, RunView


class C1Dot(BaseEstimator):
    """``<sketch, target>``: direction and magnitude together (compare with norm-only)."""

    name = "C1-dot"
    tasks = ("rollouts", "draws")

    def __init__(self, target: str = "nll") -> None:
        self.target = target

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return view.sketch_dot(view.target(self.target))

    def score_draw(self, view: RunView, draw: DrawView) -> np.ndarray:
        t = view.target(self.target, draw.checkpoint_step).astype(np.float64)
        return draw.sketch_dot(t)
