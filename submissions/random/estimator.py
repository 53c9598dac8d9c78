"""Random control: uniform scores from an rng seeded by the run seed (deterministic)."""

from __future__ import annotations

import zlib

import numpy as np

from estimators.base import BaseEstimator, DrawView, RunView


class RandomScores(BaseEstimator):
    """I.i.d. uniform scores; the chance level every estimator must clear."""

    name = "random"
    tasks = ("rollouts", "draws")

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def score_rollouts(self, view: RunView) -> np.ndarray:
        salt = zlib.crc32(view.granularity.encode())
        return np.random.default_rng([self.seed, view.seed, salt]).random(view.n)

    def score_draw(self, view: RunView, draw: DrawView) -> np.ndarray:
        salt = zlib.crc32(draw.draw_id.encode())
        return np.random.default_rng([self.seed, view.seed, salt]).random(draw.n)
