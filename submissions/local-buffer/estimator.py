"""Local-buffer baseline: cosine with the target, only for the most recent steps of training.

Units in the last ``window`` fraction of steps get their cosine in [-1, 1]; every other unit gets
-2 (tied, below every cosine). A recency heuristic: it cannot find a behavior taught early, which
is what the benchmark plants; it is kept as the paper's strawman baseline.
"""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, RunView, sketch_cosine


class LocalBuffer(BaseEstimator):
    """Cosine inside the last ``window`` fraction of steps, -2 elsewhere."""

    name = "local-buffer"

    def __init__(self, window: float = 0.1, target: str = "nll") -> None:
        self.window = window
        self.target = target

    def score_rollouts(self, view: RunView) -> np.ndarray:
        start = view.n_steps - max(1, int(round(self.window * view.n_steps)))
        cos = sketch_cosine(view, view.target(self.target))
        return np.where(np.asarray(view.steps) >= start, cos, -2.0)
