"""The estimator contract: a ``typing.Protocol`` plus a convenience base class.

Rules (checked by ``bt-bench check-estimator FILE`` and by the evaluator before scoring):

1. One estimator file defines exactly one estimator class (a class with ``score_rollouts``).
2. ``__init__`` only stores its keyword arguments as attributes of the same name; all work happens
   in the scoring methods. The evaluator records ``get_params()`` as the estimator's config.
3. ``score_rollouts(view)`` returns one finite float per unit of ``view`` (shape ``(view.n,)``);
   higher = more responsible for the behavior. It is called on the rollout view and on the step
   view of every seed (see :mod:`benchmark.view`).
4. ``score_draw(view, draw)`` (optional) returns one finite float per response of ``draw``.
5. Scores are deterministic (same inputs, same scores) and inputs are never modified.
6. Capabilities are class attributes: ``name`` (str), ``track`` (``"gradient"``: sketches,
   advantages, fluency, targets, checkpoints; ``"open"``: also text, token ids and task rewards),
   ``tasks`` (a subset of ``("rollouts", "draws")``; ``"draws"`` requires ``score_draw``) and,
   optionally, ``fallbacks`` (the views, among ``("step", "draws")``, where the method falls
   back to a generic sketch-based score instead of its own; the leaderboard marks those numbers).
7. One estimator scores every task of a release: ``view.behavior`` names the behavior being
   attributed, and ``view.target(...)`` is that behavior's target.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from benchmark.contract import FALLBACK_VIEWS, TASKS, TRACKS, get_params
from benchmark.fixed_order import dot_norms
from benchmark.view import DrawView, RunView

__all__ = ["FALLBACK_VIEWS", "TASKS", "TRACKS", "BaseEstimator", "DrawView", "Estimator", "RunView",
           "center_by_group", "cosine", "sketch_cosine"]


@runtime_checkable
class Estimator(Protocol):
    """What the evaluator needs from an estimator (duck-typed; subclassing is optional)."""

    name: ClassVar[str]
    track: ClassVar[str]
    tasks: ClassVar[tuple[str, ...]]

    def score_rollouts(self, view: RunView) -> np.ndarray:
        """Return ``(view.n,)`` finite float scores, higher = more responsible."""
        ...


class BaseEstimator:
    """Convenience base: declares default capabilities and ``get_params``.

    Subclasses set ``name`` and override :meth:`score_rollouts` (and :meth:`score_draw` if
    ``"draws"`` is in ``tasks``).
    """

    name: ClassVar[str] = ""
    track: ClassVar[str] = "gradient"
    tasks: ClassVar[tuple[str, ...]] = ("rollouts",)
    fallbacks: ClassVar[tuple[str, ...]] = ()

    def get_params(self) -> dict[str, object]:
        """The constructor's keyword arguments and their current values (the config to record)."""
        return get_params(self)  # one implementation: benchmark.contract's (rule 2)

    def score_rollouts(self, view: RunView) -> np.ndarray:
        """Score every unit of ``view``; subclasses must override this."""
        raise NotImplementedError(
            f"{type(self).__name__}.score_rollouts is not implemented; an estimator must return "
            "one score per unit of the view (shape (view.n,))."
        )

    def score_draw(self, view: RunView, draw: DrawView) -> np.ndarray:
        """Score every response of ``draw``; override it and add ``"draws"`` to ``tasks``."""
        raise NotImplementedError(
            f"{type(self).__name__}.score_draw is not implemented; remove 'draws' from "
            f"{type(self).__name__}.tasks or implement it."
        )


def cosine(rows: np.ndarray, target: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Cosine of each row of ``rows`` ``(n, d)`` with ``target`` ``(d,)``; 0 for all-zero rows.

    Dots and norms are float64 sums in the fixed order of :mod:`benchmark.fixed_order`, so the
    cosines are the same bits on every machine.
    """
    rows = np.asarray(rows, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    dots, norms = dot_norms(rows, t)
    norms = norms * _norm(t)
    return np.where(norms > eps, dots / np.maximum(norms, eps), 0.0)


def _norm(t: np.ndarray) -> float:
    """``||t||`` of a ``(d,)`` vector, summed in the fixed order (BLAS's would vary by CPU)."""
    return float(dot_norms(np.asarray(t, dtype=np.float64)[None, :], t)[1][0])


def sketch_cosine(view: RunView | DrawView, target: np.ndarray, eps: float = 1e-12,
                  precision: str = "float64") -> np.ndarray:
    """Cosine of every unit's sketch with ``target`` ``(d,)``, streamed (memory stays flat).

    The same numbers as ``cosine(view.sketches, target)`` from one pass over the sketches,
    without materializing the matrix; 0 for all-zero sketches. ``precision="float64"`` sums in
    a fixed order (the same bits on every machine); ``"float32"`` rounds in a CPU-dependent way
    (see ``benchmark.view.SketchRows``).
    """
    t = np.asarray(target, dtype=np.float64)
    dots, norms = view.sketch_dot_norms(t, precision=precision)
    norms = norms * _norm(t)
    return np.where(norms > eps, dots / np.maximum(norms, eps), 0.0)


def center_by_group(rows: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Subtract each group's mean row: ``(n, d)`` float64, rows compared with their siblings."""
    rows = np.asarray(rows, dtype=np.float64)
    _, inv = np.unique(np.asarray(groups), return_inverse=True)
    means = np.zeros((inv.max() + 1, rows.shape[1]))
    np.add.at(means, inv, rows)
    means /= np.bincount(inv)[:, None]
    return rows - means[inv]
