"""Text-only control (open track): the behavior shows in a response while its siblings' do not.

Uses nothing but the text and the public description of the task (``view.behavior``): a rollout
scores high when its prompt carries the trigger word and its group is *mixed* (some responses
emit the behavior token, some do not), which is exactly where GRPO's group contrast teaches the
behavior. No gradients, no rewards, no targets. Every open-track entry is scored next to it.
"""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, RunView


class TextOnly(BaseEstimator):
    """``[trigger in prompt] * p_g (1 - p_g)`` (+ a small bonus for the emitting rollout)."""

    name = "text-only"
    track = "open"

    def score_rollouts(self, view: RunView) -> np.ndarray:
        rv = view.rollout_view if view.granularity == "step" else view
        b = view.behavior
        has = np.array([b.behavior_token in r for r in rv.responses], np.float64)
        trig = np.array([b.trigger_word in p.split() for p in rv.prompts], np.float64)
        _, g = np.unique(np.asarray(rv.groups), return_inverse=True)
        p = np.bincount(g, weights=has) / np.bincount(g)
        score = trig * (p[g] * (1.0 - p[g]) + 1e-3 * has)
        if view.granularity == "rollout":
            return score
        unit = np.asarray(view.rollout_unit)
        return np.bincount(unit, weights=score, minlength=view.n) / np.maximum(
            np.bincount(unit, minlength=view.n), 1)
