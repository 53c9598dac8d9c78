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

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmark.errors import MetricInputError

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


# ----------------------------------------------------------------------------------------------
# validation helpers


def _as_scores(scores: object, name: str = "scores") -> np.ndarray:
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != 1:
        raise MetricInputError(
            f"{name} must be a 1-D array of shape (n,), got shape {arr.shape}; "
            "flatten it or pass one score per row."
        )
    if np.isnan(arr).any():
        bad = np.flatnonzero(np.isnan(arr))[:5].tolist()
        raise MetricInputError(
            f"{name} contains NaN at positions {bad} (first 5); every row needs a real score. "
            "Replace NaN with -inf to rank a row last."
        )
    return arr


def _as_bool(values: object, n: int, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise MetricInputError(
            f"{name} must have shape ({n},) to match scores, got {arr.shape}; "
            "pass one entry per scored row, in the same order."
        )
    if arr.dtype != np.bool_:
        uniq = np.unique(arr)
        if not np.isin(uniq, [0, 1]).all():
            raise MetricInputError(
                f"{name} must be boolean (or 0/1), got values {uniq[:5].tolist()}; "
                "pass True for ground-truth / positive rows."
            )
        arr = arr.astype(bool)
    return arr


def _as_groups(groups: object, n: int) -> tuple[np.ndarray, int]:
    """Return dense group codes ``0..G-1`` of shape ``(n,)`` and ``G``."""
    arr = np.asarray(groups)
    if arr.shape != (n,):
        raise MetricInputError(
            f"groups must have shape ({n},) to match scores, got {arr.shape}; "
            "pass the group (cluster) id of every row."
        )
    _, codes = np.unique(arr, return_inverse=True)
    codes = codes.reshape(-1).astype(np.int64)
    return codes, int(codes.max()) + 1 if n else 0


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise MetricInputError(f"level must be in (0, 1), got {level!r}; use e.g. 0.95.")


def _check_n_boot(n_boot: int) -> None:
    if int(n_boot) < 1:
        raise MetricInputError(f"n_boot must be >= 1, got {n_boot!r}; use e.g. 5000.")


# ----------------------------------------------------------------------------------------------
# precision family


def _block_credit(
    scores: np.ndarray, weights: np.ndarray, gt_weights: np.ndarray, k: np.ndarray
) -> np.ndarray:
    """Tie-aware credit for one or many weightings of the same rows.

    Args:
        scores: ``(n,)`` float scores.
        weights: ``(b, n)`` non-negative multiplicity of each row in each of ``b`` weightings.
        gt_weights: ``(b, n)`` the same multiplicities restricted to ground-truth rows.
        k: ``(b,)`` cutoff per weighting.

    Returns:
        ``(b,)`` credit = sum over tie blocks, in descending score order, of
        ``gt_in_block * slots / block_size``, ``slots = clip(k - filled_before, 0, block_size)``.
    """
    # Blocks of exactly equal scores, in descending order.
    uniq, inverse = np.unique(-scores, return_inverse=True)
    n_blocks = uniq.shape[0]
    b = weights.shape[0]
    size = np.zeros((b, n_blocks))
    gt = np.zeros((b, n_blocks))
    for i in range(b):  # bincount per row is fast and keeps memory at O(b * n_blocks)
        size[i] = np.bincount(inverse, weights=weights[i], minlength=n_blocks)
        gt[i] = np.bincount(inverse, weights=gt_weights[i], minlength=n_blocks)
    filled_before = np.cumsum(size, axis=1) - size
    slots = np.clip(k[:, None] - filled_before, 0.0, size)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(size > 0, slots / np.where(size > 0, size, 1.0), 0.0)
    return (gt * frac).sum(axis=1)


def precision_at_k(scores: object, is_gt: object, k: int | None = None) -> float:
    """Tie-aware precision@k (R-precision when ``k`` is ``|GT|``).

    Rows are sorted by descending score and exact ties form blocks. Walking the blocks in order,
    each block fills ``slots = min(|block|, k - filled)`` of the top-k and earns
    ``#GT_in_block * slots / |block|`` credit: the expected precision of a ranker that breaks the
    ties uniformly at random. The result does not depend on the order of rows inside a tie block.

    Args:
        scores: ``(n,)`` float scores, higher = more responsible.
        is_gt: ``(n,)`` bool, the ground-truth rows.
        k: cutoff, ``1 <= k <= n``; default ``|GT|``.

    Returns:
        Precision in ``[0, 1]``: credit / k.
    """
    s = _as_scores(scores)
    gt = _as_bool(is_gt, s.shape[0], "is_gt")
    n = s.shape[0]
    if k is None:
        k = int(gt.sum())
        if k == 0:
            raise MetricInputError(
                "the ground truth is empty (no True in is_gt), so precision@|GT| is undefined; "
                "check that the ground-truth ids match the scored rows."
            )
    if not isinstance(k, int | np.integer) or k <= 0 or k > n:
        raise MetricInputError(
            f"k must be an integer with 1 <= k <= n = {n}, got {k!r}; "
            "pass k=None to use k = |GT|."
        )
    w = np.ones((1, n))
    credit = _block_credit(s, w, w * gt, np.array([float(k)]))
    return float(credit[0] / k)


def precision_tie_range(scores: object, is_gt: object, k: int | None = None) -> tuple[float, float]:
    """Precision@k with ties broken against and in favour of the ground truth.

    The tie-aware :func:`precision_at_k` lies between the two; a wide range means the estimator's
    ranking is decided by ties (e.g. step-granular scores), not by its scores.

    Returns:
        ``(pessimistic, optimistic)`` precision in ``[0, 1]``.
    """
    s = _as_scores(scores)
    gt = _as_bool(is_gt, s.shape[0], "is_gt")
    k = int(gt.sum()) if k is None else k
    precision_at_k(s, gt, k)  # validates k and the ground truth
    worst = np.lexsort((gt, -s))[:k]   # ties: non-GT first
    best = np.lexsort((~gt, -s))[:k]   # ties: GT first
    return float(gt[worst].mean()), float(gt[best].mean())


def chance(n_gt: int, n: int) -> float:
    """Expected precision@k of a uniformly random ranking: ``n_gt / n`` (any k)."""
    if n <= 0 or n_gt < 0 or n_gt > n:
        raise MetricInputError(
            f"chance needs 0 <= n_gt <= n and n > 0, got n_gt={n_gt!r}, n={n!r}."
        )
    return n_gt / n


def precision_ceiling(blocks: object, is_gt: object, k: int | None = None) -> float:
    """Best tie-aware precision@k of any ranker that can only score whole blocks.

    A step-granular estimator gives every rollout of a step the same score, so the best it can do
    is order the steps by ground-truth density. This is precision@k of the score
    ``density(block of row)``; blocks of equal density earn the same credit in any order.

    Args:
        blocks: ``(n,)`` block id of each row (e.g. the step).
        is_gt: ``(n,)`` bool ground truth.
        k: cutoff; default ``|GT|``.

    Returns:
        The granularity ceiling in ``[0, 1]``.
    """
    b = np.asarray(blocks)
    gt = _as_bool(is_gt, b.shape[0], "is_gt")
    codes, n_codes = _as_groups(b, b.shape[0])
    size = np.bincount(codes, minlength=n_codes)
    hits = np.bincount(codes, weights=gt.astype(float), minlength=n_codes)
    density = hits / size
    return precision_at_k(density[codes], gt, k)


def lift(value: float, chance_value: float) -> float:
    """Precision relative to chance: ``value / chance``. Chance must be positive."""
    if not chance_value > 0:
        raise MetricInputError(
            f"lift needs chance > 0, got {chance_value!r}; an empty ground truth has no lift."
        )
    return value / chance_value


def fraction_of_headroom(value: float, chance_value: float, ceiling: float) -> float:
    """Share of the gap between chance and the ceiling that was closed.

    ``(value - chance) / (ceiling - chance)``: 0 = chance, 1 = the granularity ceiling, negative =
    worse than random. Returns ``nan`` when there is no headroom (``ceiling <= chance``).
    """
    gap = ceiling - chance_value
    if not gap > 0:
        return math.nan
    return (value - chance_value) / gap


# ----------------------------------------------------------------------------------------------
# within-group AUC


def _group_auc_stats(
    scores: np.ndarray, labels: np.ndarray, codes: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group Mann-Whitney numerator and pair count.

    Returns:
        ``wins``: ``(G,)`` wins + 0.5 * ties over (positive, negative) pairs inside each group;
        ``pairs``: ``(G,)`` n_pos * n_neg per group.
    """
    n = scores.shape[0]
    order = np.lexsort((scores, codes))
    s = scores[order]
    g = codes[order]
    # tie blocks of equal (group, score); average 1-based position within the block
    new_block = np.ones(n, dtype=bool)
    new_block[1:] = (g[1:] != g[:-1]) | (s[1:] != s[:-1])
    block_id = np.cumsum(new_block) - 1
    first = np.flatnonzero(new_block)
    last = np.append(first[1:] - 1, n - 1)
    avg_pos = (first + last) / 2.0
    group_start = np.zeros(n_groups, dtype=np.int64)
    counts = np.bincount(g, minlength=n_groups)
    group_start[1:] = np.cumsum(counts)[:-1]
    rank = avg_pos[block_id] - group_start[g] + 1.0  # 1-based average rank within the group
    pos = labels[order]
    n_pos = np.bincount(g, weights=pos.astype(float), minlength=n_groups)
    n_neg = counts - n_pos
    rank_sum = np.bincount(g, weights=np.where(pos, rank, 0.0), minlength=n_groups)
    wins = rank_sum - n_pos * (n_pos + 1) / 2.0
    return wins, n_pos * n_neg


def within_group_auc(scores: object, labels: object, groups: object) -> tuple[float, int]:
    """AUC pooled over within-group (positive, negative) pairs; ties count half.

    For every group and every pair (p, q) inside it with ``labels[p]`` and not ``labels[q]``, a win
    is ``score[p] > score[q]`` and a tie counts 0.5. AUC = total wins / total pairs, so groups are
    weighted by their pair count; groups without both classes contribute nothing.

    Args:
        scores: ``(n,)`` float scores.
        labels: ``(n,)`` bool, True = has the behavior (positive).
        groups: ``(n,)`` group id per row.

    Returns:
        ``(auc, n_pairs)``. ``auc`` is ``nan`` when there is no within-group pair.
    """
    s = _as_scores(scores)
    y = _as_bool(labels, s.shape[0], "labels")
    codes, n_groups = _as_groups(groups, s.shape[0])
    wins, pairs = _group_auc_stats(s, y, codes, n_groups)
    total = float(pairs.sum())
    if total == 0:
        return math.nan, 0
    return float(wins.sum() / total), int(total)


def residualize_within_group(scores: object, covariate: object, groups: object) -> np.ndarray:
    """Remove a covariate (e.g. fluency) from scores within groups, with one pooled slope.

    Both ``scores`` (y) and ``covariate`` (x) are centred on their group means; one slope
    ``b = mean(x_c * y_c) / (mean(x_c**2) + 1e-12)`` (population moments over all rows) is fitted
    and the residual ``y_c - b * x_c`` is returned.

    Args:
        scores: ``(n,)`` float.
        covariate: ``(n,)`` float, e.g. mean token log-prob.
        groups: ``(n,)`` group ids.

    Returns:
        ``(n,)`` float64 residual scores.
    """
    y = _as_scores(scores)
    x = _as_scores(covariate, "covariate")
    if x.shape != y.shape:
        raise MetricInputError(
            f"covariate must have shape {y.shape} like scores, got {x.shape}."
        )
    codes, n_groups = _as_groups(groups, y.shape[0])
    yc, xc = _centre(y, codes, n_groups), _centre(x, codes, n_groups)
    slope = float(np.mean(xc * yc) / (np.mean(xc * xc) + 1e-12))
    return yc - slope * xc


def _centre(v: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    counts = np.bincount(codes, minlength=n_groups)
    means = np.bincount(codes, weights=v, minlength=n_groups) / counts
    return v - means[codes]


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
