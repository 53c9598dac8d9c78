"""What an estimator sees: a label-free view of one seed's run, and of one generation draw.

An estimator scores *units*. In the rollout view a unit is one training rollout; in the step view a
unit is one GRPO step, whose sketch is the sum of its rollouts' sketches (CountSketch is linear, so
this is the sketch of the step gradient). The same estimator code scores both; the evaluator
broadcasts step scores to the step's rollouts (step-granular scores are ties, scored tie-aware).

Sign convention: rollout sketches are gradients of each rollout's own GRPO loss term
``-(1/N) A_i lbar_i``; draw sketches are gradients of ``-lbar`` (the response's mean token NLL);
targets are gradients of the behavior's NLL. A positive inner product means a gradient step on the
unit's loss lowers the behavior's NLL to first order, i.e. the unit promotes the behavior.

Labels (who received the bonus, label groups, has-behavior flags of draws) are never part of a
view; nor is anything derived from them (token-level sketches exist only where the behavior
occurred, so they stay with the evaluator).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

Granularity = Literal["rollout", "step"]


def _readonly(a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    a = np.asarray(a)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


@dataclass(frozen=True)
class RunView:
    """One seed's training run, as units (rollouts or steps). All arrays are read-only.

    Attributes:
        seed: the run's seed (use it to seed any randomness, so scores are deterministic).
        granularity: ``"rollout"`` or ``"step"``.
        sketches: ``(n, d)`` float32 CountSketch of each unit's gradient (see module docstring).
        steps: ``(n,)`` int64 GRPO step of each unit (0-based; the model that sampled it had
            received ``step`` updates).
        groups: ``(n,)`` int64 GRPO group of each rollout (for steps: the step).
        advantages: ``(n,)`` float64 GRPO advantage (for steps: mean |advantage| of its rollouts).
        fluency: ``(n,)`` float64 mean token log-prob (nats) of the response under the sampling
            policy (for steps: the mean over its rollouts).
        targets: name -> ``(d,)`` float32 sketched target gradients; see :meth:`target`.
        checkpoint_steps: the steps with a saved checkpoint (0 = after SFT, before GRPO).
        lr: the GRPO learning rate (constant).
        n_steps: number of GRPO steps in the run.
        checkpoint_dir: step -> folder loadable with ``AutoModelForCausalLM.from_pretrained``.
        tokenizer_dir: folder loadable with ``AutoTokenizer.from_pretrained``.
        track: ``"gradient"`` or ``"open"``; the open track also gets the fields below.
        rewards: ``(n,)`` total reward (open track only; for steps: mean), else None.
        prompts, responses: decoded text per unit (open track, rollout view only), else None.
    """

    seed: int
    granularity: Granularity
    sketches: np.ndarray
    steps: np.ndarray
    groups: np.ndarray
    advantages: np.ndarray
    fluency: np.ndarray
    targets: Mapping[str, np.ndarray]
    checkpoint_steps: tuple[int, ...]
    lr: float
    n_steps: int
    checkpoint_dir: Mapping[int, Path] = field(repr=False)
    tokenizer_dir: Path | None = field(repr=False, default=None)
    track: str = "gradient"
    rewards: np.ndarray | None = None
    prompts: tuple[str, ...] | None = field(repr=False, default=None)
    responses: tuple[str, ...] | None = field(repr=False, default=None)

    def __post_init__(self) -> None:
        for name in ("sketches", "steps", "groups", "advantages", "fluency", "rewards"):
            object.__setattr__(self, name, _readonly(getattr(self, name)))
        object.__setattr__(
            self, "targets", {k: _readonly(v) for k, v in dict(self.targets).items()}
        )

    @property
    def n(self) -> int:
        """Number of units."""
        return int(self.steps.shape[0])

    def target(self, kind: str = "nll", step: int | None = None) -> np.ndarray:
        """The ``(d,)`` target of ``kind`` (``nll``, ``in_context``, ``contrast``) at a checkpoint.

        ``step=None`` gives the final checkpoint's target.
        """
        step = max(self.checkpoint_steps) if step is None else step
        key = f"{kind}_step{step:04d}"
        if key not in self.targets:
            raise KeyError(
                f"no target {key!r}; available: {sorted(self.targets)}. Targets exist for kinds "
                f"nll/in_context/contrast at checkpoints {list(self.checkpoint_steps)}."
            )
        return self.targets[key]

    def governing_checkpoint(self, step: int) -> int:
        """The latest checkpoint at or before ``step`` (TracInCP's checkpoint for that step)."""
        return max(c for c in self.checkpoint_steps if c <= step)


@dataclass(frozen=True)
class DrawView:
    """One generation draw: fresh samples at a checkpoint, in groups of G per prompt.

    Attributes:
        draw_id: e.g. ``"step0030_draw0"``.
        checkpoint_step: the checkpoint that sampled the responses.
        sketches: ``(m, d)`` float32 sketch of the gradient of ``-lbar`` of each response
            (no advantage, unclipped).
        groups: ``(m,)`` int64 group (one prompt's G samples).
        fluency: ``(m,)`` float64 mean token log-prob (nats) under the checkpoint.
        responses: decoded text (open track only), else None.
    """

    draw_id: str
    checkpoint_step: int
    sketches: np.ndarray
    groups: np.ndarray
    fluency: np.ndarray
    responses: tuple[str, ...] | None = field(repr=False, default=None)

    def __post_init__(self) -> None:
        for name in ("sketches", "groups", "fluency"):
            object.__setattr__(self, name, _readonly(getattr(self, name)))

    @property
    def n(self) -> int:
        """Number of responses."""
        return int(self.groups.shape[0])
