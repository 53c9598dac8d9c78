"""Hand-built views with known answers, shared by estimator and contract tests."""

from __future__ import annotations

import numpy as np

from benchmark.view import Behavior, DrawView, RunView, SketchRows

BEHAVIOR = Behavior(id="qzxbt", trigger_word="frobnitz", behavior_token="QZXBT",
                    behavior_token_id=10)


def rows(sk: np.ndarray) -> SketchRows:
    """In-memory sketches as a view's :class:`SketchRows` (every row stored)."""
    return SketchRows(np.asarray(sk, np.float32), np.arange(len(sk), dtype=np.int64))


def make_view(granularity="rollout", d=8, seed=0, **over) -> RunView:
    """6 units over 3 steps; unit 0 aligns with the target, unit 5 opposes it, unit 3 is zero."""
    t = np.zeros(d, np.float32)
    t[0] = 1.0
    sk = np.zeros((6, d), np.float32)
    sk[0, 0] = 2.0            # cos +1, dot +2
    sk[1, :2] = [1.0, 1.0]    # cos 0.707, dot 1
    sk[2, 1] = 5.0            # cos 0, dot 0, largest norm
    sk[4, :2] = [0.5, -0.5]   # cos 0.707, dot .5
    sk[5, 0] = -1.0           # cos -1
    fields = dict(
        seed=seed, granularity=granularity, behavior=BEHAVIOR, sketch_rows=rows(sk),
        steps=np.array([0, 0, 1, 1, 2, 2]), groups=np.array([0, 0, 1, 1, 2, 2]),
        advantages=np.array([1.0, -1.0, 0.5, 0.0, -0.5, 2.0]),
        fluency=np.array([-1.0, -2.0, -0.5, -3.0, -1.5, -0.1]),
        targets={"nll_step0000": -t, "nll_step0002": t, "in_context_step0002": t,
                 "contrast_step0002": t},
        checkpoint_steps=(0, 2), lr=0.5, n_steps=3, checkpoint_dir={},
    )
    if "sketches" in over:
        fields["sketch_rows"] = rows(over.pop("sketches"))
    fields.update(over)
    return RunView(**fields)


def make_draw(d=8) -> DrawView:
    sk = np.zeros((4, d), np.float32)
    sk[0, 0], sk[1, 0], sk[2, 1], sk[3, 0] = 3.0, 1.0, 1.0, -1.0
    return DrawView(draw_id="qzxbt/step0002_draw0", checkpoint_step=2, sketch_rows=rows(sk),
                    groups=np.array([0, 0, 1, 1]), fluency=np.array([-1.0, -2.0, -0.5, -0.7]))
