"""Fluency control: mean token log-prob of the response under the sampling policy."""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, DrawView, RunView


class Fluency(BaseEstimator):
    """Higher mean log-prob = higher score; no gradient, no target."""

    name = "fluency"
    tasks = ("rollouts", "draws")

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return np.asarray(view.fluency, np.float64).copy()

    def score_draw(self, view: RunView, draw: DrawView) -> np.ndarray:
        return np.asarray(draw.fluency, np.float64).copy()
