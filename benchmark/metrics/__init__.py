"""Pure metric functions: tie-aware precision, chance, ceiling, within-group AUC, bootstraps.

Every function here is pure (no I/O, no global state; randomness only through an explicit
``seed``) and validates its inputs with a :class:`~benchmark.errors.MetricInputError` that names the
bad value and the fix.

Conventions
-----------
* ``scores``: float array of shape ``(n,)``; higher means "more responsible for the behavior".
  Exact float equality defines ties. ``-inf`` is allowed (it ranks last); ``nan`` is an error.
* ``is_gt`` / ``labels``: bool array of shape ``(n,)``.
* ``groups``: integer (or any hashable-as-numpy) array of shape ``(n,)``; the cluster of each row
  (a GRPO group, a generation group, a step). Bootstraps resample these clusters.
* Intervals are percentile intervals of a cluster bootstrap; see :class:`Interval`.
"""

from benchmark.metrics.bootstrap import (
    Interval,
    auc_bootstrap,
    auc_difference_bootstrap,
    bootstrap_counts,
    mean_bootstrap,
    percentile_interval,
    precision_bootstrap,
    precision_difference_bootstrap,
    precision_resamples,
)
from benchmark.metrics.point import (
    chance,
    fraction_of_headroom,
    lift,
    precision_at_k,
    precision_ceiling,
    precision_tie_range,
    residualize_within_group,
    within_group_auc,
)

__all__ = [
    "Interval",
    "auc_bootstrap",
    "auc_difference_bootstrap",
    "bootstrap_counts",
    "chance",
    "fraction_of_headroom",
    "lift",
    "mean_bootstrap",
    "precision_at_k",
    "precision_tie_range",
    "precision_bootstrap",
    "precision_ceiling",
    "percentile_interval",
    "precision_difference_bootstrap",
    "precision_resamples",
    "residualize_within_group",
    "within_group_auc",
]
