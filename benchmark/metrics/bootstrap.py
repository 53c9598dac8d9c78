"""Cluster-bootstrap intervals of the metrics: :class:`Interval`, resamples, paired differences.

Pure functions (the conventions are :mod:`benchmark.metrics`'); randomness only through an
explicit ``seed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmark.errors import MetricInputError
from benchmark.metrics.point import (
    _as_bool,
    _as_groups,
    _as_scores,
    _centre,
    _check_level,
    _check_n_boot,
    _group_auc_stats,
    precision_at_k,
)

# ----------------------------------------------------------------------------------------------
# cluster bootstrap


@dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile cluster-bootstrap interval.

    Attributes:
        point: the estimate on the full data.
        lo, hi: the ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles of the resamples.
        level: nominal coverage, e.g. 0.95.
        n_boot: resamples drawn; ``n_valid`` of them defined the statistic (others had no pair).
        n: the size the statistic is computed on (pairs for AUC, k for precision).
    """

    point: float
    lo: float
    hi: float
    level: float
    n_boot: int
    n_valid: int
    n: int

    @property
    def width(self) -> float:
        """``hi - lo``."""
        return self.hi - self.lo

    def excludes(self, value: float) -> bool:
        """True when ``value`` lies strictly outside ``[lo, hi]``."""
        return bool(value < self.lo or value > self.hi)

    def to_dict(self) -> dict[str, float | int]:
        """Plain-JSON form (snake_case keys)."""
        return {
            "point": self.point, "lo": self.lo, "hi": self.hi, "level": self.level,
            "n_boot": self.n_boot, "n_valid": self.n_valid, "n": self.n,
        }


def bootstrap_counts(n_groups: int, n_boot: int, seed: int) -> np.ndarray:
    """How often each group appears in each resample of a cluster bootstrap.

    Each resample draws ``n_groups`` groups uniformly with replacement; a group drawn twice
    counts twice (duplicates are kept as separate groups).

    Returns:
        ``(n_boot, n_groups)`` int64 multiplicities; every row sums to ``n_groups``.
    """
    _check_n_boot(n_boot)
    if n_groups < 1:
        raise MetricInputError(f"a cluster bootstrap needs >= 1 group, got {n_groups}.")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_groups, size=(n_boot, n_groups))
    flat = (np.arange(n_boot)[:, None] * n_groups + draws).ravel()
    return np.bincount(flat, minlength=n_boot * n_groups).reshape(n_boot, n_groups)


def mean_bootstrap(
    values: object,
    groups: object | None = None,
    *,
    n_boot: int = 5000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Mean of ``values`` with a cluster-bootstrap interval (each value its own cluster by default).

    Args:
        values: ``(n,)`` finite floats (e.g. per-response cosines).
        groups: optional ``(n,)`` cluster ids; whole clusters are resampled.
        n_boot: resamples. level: coverage. seed: rng seed.

    Returns:
        :class:`Interval` of the mean, ``n`` = number of values.
    """
    _check_level(level)
    v = _as_scores(values, "values")
    if v.size == 0:
        raise MetricInputError("values is empty; a mean needs at least one value.")
    codes, n_groups = _as_groups(np.arange(v.size) if groups is None else groups, v.size)
    sums = np.bincount(codes, weights=v, minlength=n_groups)
    sizes = np.bincount(codes, minlength=n_groups).astype(float)
    counts = bootstrap_counts(n_groups, n_boot, seed)
    return _interval(float(v.mean()), (counts @ sums) / (counts @ sizes), level, int(v.size))


def _interval(point: float, samples: np.ndarray, level: float, n: int) -> Interval:
    valid = samples[np.isfinite(samples)]
    if valid.size == 0:
        lo = hi = math.nan
    else:
        lo, hi = np.quantile(valid, [(1 - level) / 2, (1 + level) / 2])
    return Interval(
        point=float(point), lo=float(lo), hi=float(hi), level=float(level),
        n_boot=int(samples.shape[0]), n_valid=int(valid.size), n=int(n),
    )


def _pair_table(
    labels: np.ndarray, codes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All within-group (positive, negative) index pairs, sorted by group.

    Returns ``(pos_idx, neg_idx, pair_group)``, each of shape ``(P,)``.
    """
    order = np.argsort(codes, kind="stable")
    g = codes[order]
    bounds = np.flatnonzero(np.diff(g)) + 1
    pos_list, neg_list, grp_list = [], [], []
    for idx in np.split(order, bounds):
        if idx.size == 0:
            continue
        p = idx[labels[idx]]
        q = idx[~labels[idx]]
        if p.size and q.size:
            pp, qq = np.meshgrid(p, q, indexing="ij")
            pos_list.append(pp.ravel())
            neg_list.append(qq.ravel())
            grp_list.append(np.full(pp.size, codes[idx[0]]))
    if not pos_list:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return np.concatenate(pos_list), np.concatenate(neg_list), np.concatenate(grp_list)


def _auc_resamples(
    scores: np.ndarray, labels: np.ndarray, codes: np.ndarray, n_groups: int,
    counts: np.ndarray, covariate: np.ndarray | None,
) -> tuple[float, np.ndarray]:
    """Point AUC and ``(n_boot,)`` resampled AUCs (nan where a resample has no pair).

    With ``covariate`` the scores are fluency-residualized, and the pooled slope is refitted inside
    every resample from the resampled groups (duplicates weighted by their multiplicity).
    """
    if covariate is None:
        wins, pairs = _group_auc_stats(scores, labels, codes, n_groups)
        total = pairs.sum()
        point = wins.sum() / total if total > 0 else math.nan
        num = counts @ wins
        den = counts @ pairs
        with np.errstate(invalid="ignore", divide="ignore"):
            return float(point), np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
    # residualized: the ranking inside a group depends on the slope, so work on explicit pairs.
    yc = _centre(scores, codes, n_groups)
    xc = _centre(covariate, codes, n_groups)
    sxy = np.bincount(codes, weights=xc * yc, minlength=n_groups)
    sxx = np.bincount(codes, weights=xc * xc, minlength=n_groups)
    size = np.bincount(codes, minlength=n_groups).astype(float)
    p_idx, q_idx, p_grp = _pair_table(labels, codes)
    if p_idx.size == 0:
        return math.nan, np.full(counts.shape[0], np.nan)
    dy = yc[p_idx] - yc[q_idx]
    dx = xc[p_idx] - xc[q_idx]

    def auc_for(slope: np.ndarray, weights: np.ndarray) -> np.ndarray:
        # slope: (b,), weights: (b, G) -> (b,)
        d = dy[None, :] - slope[:, None] * dx[None, :]
        win = (d > 0) + 0.5 * (d == 0)
        # sum wins per group, then weight groups
        per_group = np.zeros((slope.shape[0], n_groups))
        starts = np.flatnonzero(np.r_[True, p_grp[1:] != p_grp[:-1]])
        sums = np.add.reduceat(win, starts, axis=1)
        per_group[:, p_grp[starts]] = sums
        pair_count = np.bincount(p_grp, minlength=n_groups).astype(float)
        den = weights @ pair_count
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, (per_group * weights).sum(1) / np.where(den > 0, den, 1),
                            np.nan)

    n_total = size.sum()
    point_slope = (sxy.sum() / n_total) / (sxx.sum() / n_total + 1e-12)
    point = auc_for(np.array([point_slope]), np.ones((1, n_groups)))[0]
    out = np.empty(counts.shape[0])
    chunk = max(1, int(2_000_000 // max(1, p_idx.size)))
    for start in range(0, counts.shape[0], chunk):
        c = counts[start:start + chunk].astype(float)
        n_rows = c @ size
        slope = (c @ sxy / n_rows) / (c @ sxx / n_rows + 1e-12)
        out[start:start + chunk] = auc_for(slope, c)
    return float(point), out


def _prepare_auc(
    scores: object, labels: object, groups: object, covariate: object | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray | None]:
    s = _as_scores(scores)
    y = _as_bool(labels, s.shape[0], "labels")
    codes, n_groups = _as_groups(groups, s.shape[0])
    x = None
    if covariate is not None:
        x = _as_scores(covariate, "covariate")
        if x.shape != s.shape:
            raise MetricInputError(f"covariate must have shape {s.shape}, got {x.shape}.")
    return s, y, codes, n_groups, x


def auc_bootstrap(
    scores: object,
    labels: object,
    groups: object,
    *,
    covariate: object | None = None,
    n_boot: int = 5000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Within-group AUC with a cluster-bootstrap percentile interval.

    Groups are resampled with replacement (duplicates kept as separate groups); resamples without
    any within-group pair are dropped (``Interval.n_valid`` counts the rest). Vectorized: the AUC
    of every resample is a ratio of per-group sums.

    Args:
        scores, labels, groups: as in :func:`within_group_auc`, shape ``(n,)``.
        covariate: optional ``(n,)`` covariate (fluency). When given, the AUC is computed on
            :func:`residualize_within_group` residuals and the pooled slope is refitted inside
            every resample, so the interval includes the slope's uncertainty.
        n_boot: number of resamples. level: interval coverage. seed: rng seed.

    Returns:
        :class:`Interval` with ``n`` = number of within-group pairs.
    """
    _check_level(level)
    s, y, codes, n_groups, x = _prepare_auc(scores, labels, groups, covariate)
    counts = bootstrap_counts(n_groups, n_boot, seed)
    point, samples = _auc_resamples(s, y, codes, n_groups, counts, x)
    n_pairs = int(_group_auc_stats(s, y, codes, n_groups)[1].sum())
    return _interval(point, samples, level, n_pairs)


def auc_difference_bootstrap(
    scores_a: object,
    scores_b: object,
    labels: object,
    groups: object,
    *,
    covariate: object | None = None,
    n_boot: int = 5000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Paired cluster bootstrap of ``AUC(a) - AUC(b)`` on the same rows and group resamples.

    Both methods are evaluated on identical resamples, so the interval reflects the uncertainty of
    the difference, not of each AUC separately. Arguments as in :func:`auc_bootstrap`.
    """
    _check_level(level)
    a, y, codes, n_groups, x = _prepare_auc(scores_a, labels, groups, covariate)
    b = _as_scores(scores_b, "scores_b")
    if b.shape != a.shape:
        raise MetricInputError(f"scores_b must have shape {a.shape} like scores_a, got {b.shape}.")
    counts = bootstrap_counts(n_groups, n_boot, seed)
    pa, sa = _auc_resamples(a, y, codes, n_groups, counts, x)
    pb, sb = _auc_resamples(b, y, codes, n_groups, counts, x)
    n_pairs = int(_group_auc_stats(a, y, codes, n_groups)[1].sum())
    return _interval(pa - pb, sa - sb, level, n_pairs)


def _precision_resamples(
    scores: np.ndarray, gt: np.ndarray, codes: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Tie-aware precision@|GT| for each row of ``counts`` (``(b, G)`` group multiplicities).

    Rows are first aggregated per (group, tie block): a resample's block sizes and ground-truth
    counts are then one matrix product of its group multiplicities with those tables, so the cost
    is ``O(b * G * blocks)`` flops in a few BLAS calls instead of ``b`` passes over the rows.
    """
    out = np.empty(counts.shape[0])
    uniq, inverse = np.unique(-scores, return_inverse=True)  # tie blocks, descending score
    n_blocks = uniq.shape[0]
    n_groups = counts.shape[1]
    cell = codes * n_blocks + inverse
    a_size = np.bincount(cell, minlength=n_groups * n_blocks).reshape(n_groups, n_blocks)
    a_gt = np.bincount(cell, weights=gt.astype(float),
                       minlength=n_groups * n_blocks).reshape(n_groups, n_blocks)
    a_size = a_size.astype(float)
    chunk = max(1, int(4_000_000 // max(1, n_blocks)))
    for start in range(0, counts.shape[0], chunk):
        c = counts[start:start + chunk].astype(float)
        size = c @ a_size
        gtb = c @ a_gt
        k = gtb.sum(axis=1)
        filled_before = np.cumsum(size, axis=1) - size
        slots = np.clip(k[:, None] - filled_before, 0.0, size)
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(size > 0, slots / np.where(size > 0, size, 1.0), 0.0)
            credit = (gtb * frac).sum(axis=1)
            out[start:start + chunk] = np.where(k > 0, credit / np.where(k > 0, k, 1), np.nan)
    return out


def precision_resamples(
    scores: object, is_gt: object, groups: object, *, n_boot: int = 2000, seed: int = 0
) -> np.ndarray:
    """Tie-aware precision@|GT| in each of ``n_boot`` cluster-bootstrap resamples of ``groups``.

    The resamples depend only on the number of groups, ``n_boot`` and ``seed``, so two methods
    scored on the same rows with the same seed are paired; differences or cross-seed means of the
    returned arrays give paired or pooled intervals (see :func:`percentile_interval`).

    Returns:
        ``(n_boot,)`` float64, ``nan`` where a resample holds no ground truth.
    """
    s = _as_scores(scores)
    gt = _as_bool(is_gt, s.shape[0], "is_gt")
    codes, n_groups = _as_groups(groups, s.shape[0])
    return _precision_resamples(s, gt, codes, bootstrap_counts(n_groups, n_boot, seed))


def percentile_interval(
    point: float, samples: object, *, level: float = 0.95, n: int = 0
) -> Interval:
    """Percentile interval of bootstrap ``samples`` around ``point`` (``nan`` samples dropped)."""
    _check_level(level)
    return _interval(point, np.asarray(samples, dtype=np.float64), level, n)


def precision_bootstrap(
    scores: object,
    is_gt: object,
    groups: object,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Tie-aware precision@|GT| with a cluster-bootstrap interval over ``groups``.

    In each resample a group drawn ``c`` times contributes each of its rows ``c`` times (as
    separate, tied copies) and ``k`` is the resample's own ``|GT|``.

    Args:
        scores: ``(n,)``; is_gt: ``(n,)`` bool; groups: ``(n,)`` cluster ids (e.g. GRPO groups).

    Returns:
        :class:`Interval` with ``n`` = |GT|.
    """
    _check_level(level)
    s = _as_scores(scores)
    gt = _as_bool(is_gt, s.shape[0], "is_gt")
    codes, n_groups = _as_groups(groups, s.shape[0])
    point = precision_at_k(s, gt)
    counts = bootstrap_counts(n_groups, n_boot, seed)
    return _interval(point, _precision_resamples(s, gt, codes, counts), level, int(gt.sum()))


def precision_difference_bootstrap(
    scores_a: object,
    scores_b: object,
    is_gt: object,
    groups: object,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Paired cluster bootstrap of ``precision(a) - precision(b)`` on the same group resamples."""
    _check_level(level)
    a = _as_scores(scores_a, "scores_a")
    b = _as_scores(scores_b, "scores_b")
    if b.shape != a.shape:
        raise MetricInputError(f"scores_b must have shape {a.shape} like scores_a, got {b.shape}.")
    gt = _as_bool(is_gt, a.shape[0], "is_gt")
    codes, n_groups = _as_groups(groups, a.shape[0])
    point = precision_at_k(a, gt) - precision_at_k(b, gt)
    counts = bootstrap_counts(n_groups, n_boot, seed)
    diff = _precision_resamples(a, gt, codes, counts) - _precision_resamples(b, gt, codes, counts)
    return _interval(point, diff, level, int(gt.sum()))
