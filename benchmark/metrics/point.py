"""Point metrics: tie-aware precision, chance, ceiling, within-group AUC, and input checks.

Pure functions (the conventions are :mod:`benchmark.metrics`'); their intervals are in
:mod:`benchmark.metrics.bootstrap`.
"""

from __future__ import annotations

import math

import numpy as np

from benchmark.errors import MetricInputError

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
