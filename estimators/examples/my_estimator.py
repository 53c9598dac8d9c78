"""An example estimator: copy this file, change the scoring, run ``bt-bench evaluate FILE``.

It scores units by the cosine between their gradient sketch and the *in-context* target (the
gradient of the behavior token's log-prob at the places where sampled responses emitted it),
instead of GAS's teacher-forced target. Everything an estimator may use is on ``view``
(see ``benchmark/view.py``); labels never are.
"""

from __future__ import annotations

import numpy as np

# The base class is optional (any class with these attributes and methods works), but it gives
# get_params() for free and clear errors for missing methods.
from estimators.base import (
    BaseEstimator,
    DrawView,
    RunView,
    center_by_group,
    cosine,
    sketch_cosine,
)


class InContextCosine(BaseEstimator):
    """Cosine with the in-context target; draws are centred on their group mean first."""

    # Capabilities, checked before anything runs:
    name = "in-context-cosine"        # the name shown in tables
    track = "gradient"                # sketches, advantages, fluency, targets only (no text)
    tasks = ("rollouts", "draws")     # it scores training units and generation draws

    def __init__(self, target: str = "in_context") -> None:
        # __init__ only stores hyperparameters (recorded as the estimator's config).
        self.target = target

    def score_rollouts(self, view: RunView) -> np.ndarray:
        # The units' gradient sketches (rollouts, or whole steps) are read in place from the
        # release: sketch_cosine streams them in chunks (view.iter_sketches, view.sketch_dot);
        # view.sketches would give the whole (n, d) matrix. view.behavior names the task.
        # Return one finite score per unit; higher = more responsible for the behavior.
        return sketch_cosine(view, view.target(self.target))

    def score_draw(self, view: RunView, draw: DrawView) -> np.ndarray:
        # draw.sketches: (m, d) sketches of fresh responses at draw.checkpoint_step, in groups
        # of G samples of one prompt. Centring on the group mean compares siblings.
        centred = center_by_group(draw.sketches, draw.groups)
        return cosine(centred, view.target(self.target, draw.checkpoint_step))
