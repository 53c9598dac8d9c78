"""Norm-only control: the gradient sketch's L2 norm (magnitude, no target)."""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, DrawView, RunView


class NormOnly(BaseEstimator):
    """``||sketch||_2``: what an estimator must beat to show it uses direction."""

    name = "norm-only"
    tasks = ("rollouts", "draws")

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return view.sketch_norms()

    def score_draw(self, view: RunView, draw: DrawView) -> np.ndarray:
        return draw.sketch_norms()
