"""Text-and-advantage control (open track): the strongest heuristic without attribution we have.

Uses the open view's text, advantages and task rewards, and the public task description
(``view.behavior``); no gradients, no targets, no model. A rollout scores high when

* its prompt carries the trigger word and its group is *mixed*: some responses show the behavior
  (token or phrase), some do not,
* its update moved probability towards the behavior: it shows the behavior and was pushed up
  (advantage > 0), or it does not and was pushed down (advantage < 0). GRPO's group contrast
  teaches through both: on tiny 2.0 removing only the responses that got the bonus removed
  nothing of the strong behavior (its alternatives' push-down did the teaching), while removing
  whole groups also removes behavior responses that were pushed *down* (ineligible for the
  bonus), which works against the weak behavior,
* its step lies at or before the last step where the advantages show a bonus: in a group with no
  bonus the advantages are the task rewards standardized within the group, so a rollout whose
  advantage departs from that was paid something beyond the task reward. The bonus window's end
  is public in the builder's code and config anyway; this reads it from the data,
* and, among those, earliest steps first (what is learned early is built on by everything
  after it), larger |advantage| first within a step.

score = [trigger] * [mixed group] * [sign(adv) = +1 if behavior else -1] * (n_steps - step +
|adv| / (1 + |adv|)), zero after the last bonus step (the second term lies in [0, 1): it orders
within a step only). Every open-track entry is scored next to it (item 10's strongest control of
the track): an open-track method counts only where it beats this, paired. It exists because the
issue-23 audit found that this heuristic, untuned, led the open track (docs/evaluation.md).
"""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, RunView

#: advantage departing from the task-reward-implied one by more than this marks a bonus (the
#: builder's advantages are float32: about 1e-7 relative error; a bonus moves them by >= 0.1)
BONUS_EVIDENCE = 1e-3


def _standardize(values: np.ndarray, groups: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``(v - group mean) / (group std + eps)`` per rollout (GRPO's advantage of ``v``)."""
    _, g = np.unique(groups, return_inverse=True)
    count = np.bincount(g)
    mean = np.bincount(g, weights=values) / count
    var = np.bincount(g, weights=(values - mean[g]) ** 2) / np.maximum(count - 1, 1)
    out = (values - mean[g]) / (np.sqrt(var)[g] + eps)
    return np.where(var[g] == 0, 0.0, out)  # all-equal groups get exactly 0 (the builder's rule)


def last_bonus_step(view: RunView, trigger: np.ndarray) -> int:
    """The last step where a trigger prompt's group shows a bonus (-1 when none does).

    A group shows a bonus where its advantages depart from its task rewards' standardized ones;
    ``trigger`` ``(n,)`` bool marks the rollouts whose prompt carries the trigger word.
    """
    adv = np.asarray(view.advantages, np.float64)
    rewards = np.asarray(view.rewards, np.float64)
    groups = np.asarray(view.groups)
    implied = _standardize(rewards, groups)
    steps = np.asarray(view.steps)
    paid = (np.abs(adv - implied) > BONUS_EVIDENCE) & trigger
    return int(steps[paid].max()) if paid.any() else -1


def shows(behavior, response: str) -> bool:
    """Whether ``response`` shows the behavior (its token, or its phrase in order)."""
    phrase = tuple(behavior.behavior_token.split())  # "ZORP GLIX": a phrase (release 3.0)
    words = response.split()
    n = len(phrase)
    return any(tuple(words[i:i + n]) == tuple(phrase) for i in range(len(words) - n + 1))


class TextAdvantage(BaseEstimator):
    """Rollouts of mixed trigger groups that moved towards the behavior, earliest first."""

    name = "text-advantage"
    track = "open"

    def score_rollouts(self, view: RunView) -> np.ndarray:
        rv = view.rollout_view if view.granularity == "step" else view
        b = rv.behavior
        has = np.array([shows(b, r) for r in rv.responses], np.float64)
        trig = np.array([b.trigger_word in p.split() for p in rv.prompts], np.float64)
        steps = np.asarray(rv.steps, np.float64)
        signed = np.asarray(rv.advantages, np.float64)
        adv = np.abs(signed)
        towards = np.where(has > 0, signed > 0, signed < 0)
        _, g = np.unique(np.asarray(rv.groups), return_inverse=True)
        p = np.bincount(g, weights=has) / np.bincount(g)
        mixed = (p[g] > 0) & (p[g] < 1)
        order = int(rv.n_steps) - steps + adv / (1.0 + adv)
        score = trig * mixed * towards * order * (steps <= last_bonus_step(rv, trig > 0))
        if view.granularity == "rollout":
            return score
        unit = np.asarray(view.rollout_unit)
        return np.bincount(unit, weights=score, minlength=view.n)
