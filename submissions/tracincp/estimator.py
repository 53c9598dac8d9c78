"""TracInCP: learning-rate-weighted inner product with the target at the governing checkpoint.

Each unit at step ``s`` is scored against the NLL target of the latest saved checkpoint at or
before ``s`` (the release ships the post-SFT checkpoint 0, so every step has one), times the
learning rate. Adam preconditioning is ignored, as in the paper.
"""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, RunView


class TracInCP(BaseEstimator):
    """``lr * <sketch_u, target(checkpoint(step_u))>``."""

    name = "TracInCP"

    def __init__(self, target: str = "nll") -> None:
        self.target = target

    def score_rollouts(self, view: RunView) -> np.ndarray:
        sk = np.asarray(view.sketches, np.float64)
        out = np.zeros(view.n)
        ckpt = np.array([view.governing_checkpoint(int(s)) for s in view.steps])
        for c in np.unique(ckpt):
            rows = ckpt == c
            out[rows] = view.lr * (sk[rows] @ view.target(self.target, int(c)).astype(np.float64))
        return out
