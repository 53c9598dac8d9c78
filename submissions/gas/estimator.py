"""GAS: renormalized TracInCP, the cosine of each unit's gradient sketch with the behavior target.

Training units are scored against the final checkpoint's target; draw responses are centred on
their group mean first (the paper's ``GAS_centered``), so what is scored is how a response differs
from its siblings.
"""

from __future__ import annotations

import numpy as np

from estimators.base import (
    BaseEstimator,
    DrawView,
    RunView,
    center_by_group,
    cosine,
    sketch_cosine,
)


class GAS(BaseEstimator):
    """Cosine with the target (``target``: nll, in_context or contrast)."""

    name = "GAS"
    tasks = ("rollouts", "draws")

    def __init__(self, target: str = "nll") -> None:
        self.target = target

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return sketch_cosine(view, view.target(self.target))

    def score_draw(self, view: RunView, draw: DrawView) -> np.ndarray:
        centred = center_by_group(draw.sketches, draw.groups)
        return cosine(centred, view.target(self.target, draw.checkpoint_step))
