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
        ckpts = list(view.checkpoint_steps)
        targets = np.stack([view.target(self.target, c) for c in ckpts], axis=1)  # (d, C)
        dots = view.sketch_dot(targets)  # (n, C), streamed
        col = np.array([ckpts.index(view.governing_checkpoint(int(s))) for s in view.steps])
        return view.lr * dots[np.arange(view.n), col]
