"""Metric tests: hand-computed cases, independent implementations, invariants."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from benchmark import metrics as M
from benchmark.errors import MetricInputError

# Tolerances: the metrics are float64 ratios of counts, ranks and means of at most a few hundred
# values, so two computations of one agree to n * 2**-53 <= 1e-13 relative; pytest.approx's
# default (rel 1e-6) and abs=1e-12 are far above that (docs/testing.md, "Tolerances").

# ---------------------------------------------------------------------------------------------
# independent (slow, obvious) reference implementations


def brute_precision(scores, is_gt, k):
    """Average top-k precision over every tie-breaking permutation (exact expectation)."""
    scores = np.asarray(scores, float)
    is_gt = np.asarray(is_gt, bool)
    n = len(scores)
    total, count = 0.0, 0
    for perm in itertools.permutations(range(n)):
        # a permutation defines a tie-break: sort by (-score, position in perm)
        pos = np.empty(n, int)
        pos[list(perm)] = np.arange(n)
        order = sorted(range(n), key=lambda i: (-scores[i], pos[i]))
        total += is_gt[order[:k]].sum() / k
        count += 1
    return total / count


def brute_auc(scores, labels, groups):
    wins, pairs = 0.0, 0
    for i, j in itertools.product(range(len(scores)), repeat=2):
        if groups[i] == groups[j] and labels[i] and not labels[j]:
            pairs += 1
            wins += 1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
    return (wins / pairs if pairs else math.nan), pairs


def explicit_resample(groups, counts):
    """Row indices and relabelled groups of one resample (duplicated groups kept separate)."""
    uniq = np.unique(groups)
    rows, new_groups = [], []
    label = 0
    for g, c in zip(uniq, counts, strict=True):
        idx = np.flatnonzero(groups == g)
        for _ in range(c):
            rows.append(idx)
            new_groups.append(np.full(idx.size, label))
            label += 1
    return np.concatenate(rows), np.concatenate(new_groups)


def draw(n_groups=40, size=8, seed=0, p=0.6):
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_groups), size)
    labels = rng.random(groups.size) < p
    fluency = rng.normal(size=groups.size) + 0.8 * labels
    scores = 0.5 * labels + rng.normal(size=groups.size) + 0.7 * fluency
    return scores, labels, groups, fluency


# ---------------------------------------------------------------------------------------------
# precision


def test_precision_hand_computed():
    # k = |GT| = 2; block {3}: 1 hit; block {2,2} gets 1 slot of 2 with 1 hit -> 0.5
    assert M.precision_at_k([3, 2, 2, 1], [1, 0, 1, 0]) == pytest.approx(0.75)
    # all tied: precision = base rate
    assert M.precision_at_k([1, 1, 1, 1], [1, 0, 0, 0]) == pytest.approx(0.25)
    # perfect and worst
    assert M.precision_at_k([4, 3, 2, 1], [1, 1, 0, 0]) == 1.0
    assert M.precision_at_k([1, 2, 3, 4], [1, 1, 0, 0]) == 0.0
    # explicit k
    assert M.precision_at_k([4, 3, 2, 1], [1, 0, 1, 0], k=3) == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", range(6))
def test_precision_matches_brute_force_expectation(seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 3, size=7).astype(float)
    is_gt = rng.random(7) < 0.4
    is_gt[0] = True
    for k in (1, int(is_gt.sum()), 5):
        expected = brute_precision(scores, is_gt, k)
        assert M.precision_at_k(scores, is_gt, k) == pytest.approx(expected)


def test_precision_invariances():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 20, size=300).astype(float)
    is_gt = rng.random(300) < 0.2
    base = M.precision_at_k(scores, is_gt)
    perm = rng.permutation(300)
    assert M.precision_at_k(scores[perm], is_gt[perm]) == pytest.approx(base, abs=1e-12)
    # strictly monotone rescaling keeps every tie block
    assert M.precision_at_k(np.exp(scores / 7) * 3 - 1, is_gt) == pytest.approx(base, abs=1e-12)
    # order inside tie blocks does not matter: reorder rows within each block
    order = np.lexsort((rng.random(300), scores))
    assert M.precision_at_k(scores[order], is_gt[order]) == pytest.approx(base, abs=1e-12)


def test_precision_neg_inf_ranks_last():
    assert M.precision_at_k([-np.inf, 1.0, 0.0], [1, 1, 0]) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scores": [1, 2], "is_gt": [0, 0]}, "ground truth is empty"),
        ({"scores": [1, 2], "is_gt": [1, 0], "k": 0}, "k must be an integer with 1 <= k <= n = 2"),
        ({"scores": [1, 2], "is_gt": [1, 0], "k": 3}, "k must be an integer"),
        ({"scores": [1, np.nan], "is_gt": [1, 0]}, "NaN at positions \\[1\\]"),
        ({"scores": [1, 2, 3], "is_gt": [1, 0]}, "is_gt must have shape \\(3,\\)"),
        ({"scores": [[1, 2]], "is_gt": [1, 0]}, "1-D array"),
        ({"scores": [1, 2], "is_gt": [2, 0]}, "boolean"),
    ],
)
def test_precision_bad_input(kwargs, match):
    with pytest.raises(MetricInputError, match=match):
        M.precision_at_k(**kwargs)


def test_ceiling_chance_lift_headroom():
    steps = np.array([0, 0, 1, 1, 2, 2])
    gt = np.array([1, 1, 1, 0, 0, 0], bool)
    # densities 1, .5, 0 -> take step 0 (2 hits) then half of step 1 (.5 hit) -> 2.5/3
    assert M.precision_ceiling(steps, gt) == pytest.approx(2.5 / 3)
    assert M.chance(3, 6) == 0.5
    assert M.lift(0.25, 0.125) == 2.0
    assert M.fraction_of_headroom(0.6, 0.5, 0.7) == pytest.approx(0.5)
    assert math.isnan(M.fraction_of_headroom(0.6, 0.5, 0.5))
    with pytest.raises(MetricInputError, match="lift needs chance > 0"):
        M.lift(0.3, 0.0)
    with pytest.raises(MetricInputError, match="0 <= n_gt <= n"):
        M.chance(5, 3)


def test_ceiling_bounds_every_step_granular_ranker():
    rng = np.random.default_rng(3)
    steps = np.repeat(np.arange(30), 8)
    gt = rng.random(steps.size) < rng.random(30)[steps]
    ceiling = M.precision_ceiling(steps, gt)
    for _ in range(50):
        step_scores = rng.normal(size=30)[steps]
        assert M.precision_at_k(step_scores, gt) <= ceiling + 1e-12


# ---------------------------------------------------------------------------------------------
# AUC and residualization


def test_auc_single_group_matches_sklearn():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=60).astype(float)  # many ties
    labels = rng.random(60) < 0.5
    auc, pairs = M.within_group_auc(scores, labels, np.zeros(60))
    assert auc == pytest.approx(roc_auc_score(labels, scores))
    assert pairs == labels.sum() * (~labels).sum()


@pytest.mark.parametrize("seed", range(4))
def test_auc_pooled_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, 5, size=30)
    scores = rng.integers(0, 4, size=30).astype(float)
    labels = rng.random(30) < 0.5
    auc, pairs = M.within_group_auc(scores, labels, groups)
    ref_auc, ref_pairs = brute_auc(scores, labels, groups)
    assert pairs == ref_pairs
    assert auc == pytest.approx(ref_auc)


def test_auc_hand_computed_and_degenerate():
    # group 0: pos 3 vs negs 1, 3 -> 1 + .5; group 1: only positives -> ignored
    auc, pairs = M.within_group_auc([3, 1, 3, 9, 9], [1, 0, 0, 1, 1], [0, 0, 0, 1, 1])
    assert (auc, pairs) == (0.75, 2)
    auc, pairs = M.within_group_auc([1, 2], [1, 1], [0, 0])
    assert math.isnan(auc) and pairs == 0


def test_auc_invariances():
    scores, labels, groups, _ = draw(seed=5)
    base, _ = M.within_group_auc(scores, labels, groups)
    perm = np.random.default_rng(9).permutation(scores.size)
    assert M.within_group_auc(scores[perm], labels[perm], groups[perm])[0] == pytest.approx(base)
    assert M.within_group_auc(np.tanh(scores) * 5 + 2, labels, groups)[0] == pytest.approx(base)
    # relabelling groups changes nothing
    assert M.within_group_auc(scores, labels, groups * 7 + 100)[0] == pytest.approx(base)


def test_residualize_matches_direct_regression():
    scores, _, groups, fluency = draw(seed=2)
    resid = M.residualize_within_group(scores, fluency, groups)
    # independent: demean per group with a loop, then least squares without intercept
    yc, xc = scores.copy(), fluency.copy()
    for g in np.unique(groups):
        m = groups == g
        yc[m] -= yc[m].mean()
        xc[m] -= xc[m].mean()
    slope = np.linalg.lstsq(xc[:, None], yc, rcond=None)[0][0]
    # float64 least squares on ~100 values of order 1 (condition ~1): <= ~1e-13 apart (derived);
    # measured 2.5e-12, 0.16% of the bound
    np.testing.assert_allclose(resid, yc - slope * xc, atol=1e-9)
    assert abs(np.dot(resid, xc)) < 1e-8  # residual is orthogonal to the centred covariate


# ---------------------------------------------------------------------------------------------
# bootstraps


def test_bootstrap_counts_shape_and_seed():
    c = M.bootstrap_counts(10, 50, seed=3)
    assert c.shape == (50, 10) and (c.sum(1) == 10).all()
    np.testing.assert_array_equal(c, M.bootstrap_counts(10, 50, seed=3))
    assert not np.array_equal(c, M.bootstrap_counts(10, 50, seed=4))
    assert (c > 1).any()  # duplicates occur and are counted, not merged


def test_auc_bootstrap_matches_explicit_resampling():
    scores, labels, groups, _ = draw(n_groups=12, seed=4)
    iv = M.auc_bootstrap(scores, labels, groups, n_boot=40, seed=11)
    counts = M.bootstrap_counts(12, 40, seed=11)
    ref = []
    for c in counts:
        rows, g = explicit_resample(groups, c)
        ref.append(M.within_group_auc(scores[rows], labels[rows], g)[0])
    ref = np.array(ref)
    lo, hi = np.quantile(ref[np.isfinite(ref)], [0.025, 0.975])
    assert (iv.lo, iv.hi) == pytest.approx((lo, hi))
    assert iv.point == pytest.approx(M.within_group_auc(scores, labels, groups)[0])


def test_residualized_bootstrap_refits_slope_per_resample():
    scores, labels, groups, fluency = draw(n_groups=10, seed=6)
    iv = M.auc_bootstrap(scores, labels, groups, covariate=fluency, n_boot=30, seed=2)
    counts = M.bootstrap_counts(10, 30, seed=2)
    ref = []
    for c in counts:
        rows, g = explicit_resample(groups, c)
        resid = M.residualize_within_group(scores[rows], fluency[rows], g)
        ref.append(M.within_group_auc(resid, labels[rows], g)[0])
    lo, hi = np.quantile(np.array(ref), [0.025, 0.975])
    assert (iv.lo, iv.hi) == pytest.approx((lo, hi))
    resid = M.residualize_within_group(scores, fluency, groups)
    assert iv.point == pytest.approx(M.within_group_auc(resid, labels, groups)[0])


def test_bootstrap_covers_point_and_shrinks_with_data():
    small = draw(n_groups=20, seed=8)
    big = draw(n_groups=320, seed=8)
    iv_s = M.auc_bootstrap(*small[:3], n_boot=2000, seed=0)
    iv_b = M.auc_bootstrap(*big[:3], n_boot=2000, seed=0)
    for iv in (iv_s, iv_b):
        assert iv.lo <= iv.point <= iv.hi
    assert iv_b.width < 0.5 * iv_s.width


def test_precision_bootstrap_matches_explicit_resampling():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(15), 4)
    steps = groups // 3
    scores = rng.normal(size=5)[steps]  # step-granular scores with ties
    gt = rng.random(60) < 0.3
    iv = M.precision_bootstrap(scores, gt, groups, n_boot=30, seed=5)
    counts = M.bootstrap_counts(15, 30, seed=5)
    ref = []
    for c in counts:
        rows, _ = explicit_resample(groups, c)
        ref.append(M.precision_at_k(scores[rows], gt[rows]) if gt[rows].any() else np.nan)
    ref = np.array(ref)
    lo, hi = np.quantile(ref[np.isfinite(ref)], [0.025, 0.975])
    assert (iv.lo, iv.hi) == pytest.approx((lo, hi))
    assert iv.point == pytest.approx(M.precision_at_k(scores, gt))
    assert iv.n == gt.sum()


def test_paired_differences():
    scores, labels, groups, fluency = draw(n_groups=30, seed=3)
    other = scores + np.random.default_rng(1).normal(size=scores.size)
    d = M.auc_difference_bootstrap(scores, other, labels, groups, n_boot=500, seed=4)
    a = M.within_group_auc(scores, labels, groups)[0]
    b = M.within_group_auc(other, labels, groups)[0]
    assert d.point == pytest.approx(a - b)
    # identical methods: the paired difference is exactly zero in every resample
    z = M.auc_difference_bootstrap(scores, scores, labels, groups, n_boot=200, seed=4)
    assert (z.point, z.lo, z.hi) == (0.0, 0.0, 0.0)
    zp = M.precision_difference_bootstrap(scores, scores, labels, groups, n_boot=100)
    assert (zp.point, zp.lo, zp.hi) == (0.0, 0.0, 0.0)
    dp = M.precision_difference_bootstrap(scores, other, labels, groups, n_boot=100)
    expected = M.precision_at_k(scores, labels) - M.precision_at_k(other, labels)
    assert dp.point == pytest.approx(expected)


def test_interval_helpers_and_bad_arguments():
    iv = M.Interval(point=0.6, lo=0.55, hi=0.7, level=0.95, n_boot=10, n_valid=10, n=5)
    assert iv.width == pytest.approx(0.15)
    assert iv.excludes(0.5) and not iv.excludes(0.6)
    assert iv.to_dict()["lo"] == 0.55
    s, y, g, _ = draw(n_groups=5)
    with pytest.raises(MetricInputError, match="n_boot must be >= 1"):
        M.auc_bootstrap(s, y, g, n_boot=0)
    with pytest.raises(MetricInputError, match="level must be in"):
        M.auc_bootstrap(s, y, g, level=95)
    with pytest.raises(MetricInputError, match="groups must have shape"):
        M.auc_bootstrap(s, y, g[:-1])


def test_tie_range_brackets_tie_aware_precision():
    scores = np.array([3, 2, 2, 2, 1.0])
    gt = np.array([0, 1, 0, 1, 1], bool)
    lo, hi = M.precision_tie_range(scores, gt)  # k = 3: {3} then 2 of the 3 tied
    assert (lo, hi) == (pytest.approx(1 / 3), pytest.approx(2 / 3))
    assert lo <= M.precision_at_k(scores, gt) <= hi


def test_mean_bootstrap_matches_explicit_resampling():
    rng = np.random.default_rng(0)
    values = rng.normal(size=30)
    groups = np.repeat(np.arange(10), 3)
    iv = M.mean_bootstrap(values, groups, n_boot=50, seed=1)
    counts = M.bootstrap_counts(10, 50, seed=1)
    ref = [values[explicit_resample(groups, c)[0]].mean() for c in counts]
    assert (iv.lo, iv.hi) == pytest.approx(tuple(np.quantile(ref, [0.025, 0.975])))
    assert iv.point == pytest.approx(values.mean()) and iv.n == 30
    with pytest.raises(MetricInputError, match="values is empty"):
        M.mean_bootstrap([])


def test_precision_resamples_are_paired_and_pool():
    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(20), 5)
    gt = rng.random(100) < 0.3
    a, b = rng.normal(size=100), rng.normal(size=100)
    sa = M.precision_resamples(a, gt, groups, n_boot=300, seed=7)
    sb = M.precision_resamples(b, gt, groups, n_boot=300, seed=7)
    d = M.precision_difference_bootstrap(a, b, gt, groups, n_boot=300, seed=7)
    iv = M.percentile_interval(d.point, sa - sb, n=int(gt.sum()))
    assert (iv.lo, iv.hi) == pytest.approx((d.lo, d.hi))
    single = M.precision_bootstrap(a, gt, groups, n_boot=300, seed=7)
    assert (single.lo, single.hi) == pytest.approx(tuple(np.quantile(sa, [0.025, 0.975])))
