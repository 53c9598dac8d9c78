"""Property-based tests (hypothesis): metric and checklist invariants on random inputs."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmark import checklist as C
from benchmark import metrics as M

# Tolerances (math.isclose rel 1e-9, slack 1e-12): float64 ratios of counts and ranks of <= 40
# values, exact up to a few 2**-53 (derived; docs/testing.md)

# scores drawn from a small set of values, so ties are frequent
small_scores = st.lists(st.integers(-3, 3).map(float), min_size=2, max_size=40)


@st.composite
def ranked(draw):
    scores = np.array(draw(small_scores))
    n = scores.size
    gt = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    if not gt.any():
        gt[draw(st.integers(0, n - 1))] = True
    groups = np.array(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    return scores, gt, groups


@settings(max_examples=150, deadline=None)
@given(ranked(), st.integers(0, 10**6))
def test_precision_bounds_and_invariances(data, seed):
    scores, gt, groups = data
    rng = np.random.default_rng(seed)
    p = M.precision_at_k(scores, gt)
    assert 0.0 <= p <= 1.0
    lo, hi = M.precision_tie_range(scores, gt)
    assert lo - 1e-12 <= p <= hi + 1e-12
    perm = rng.permutation(scores.size)
    assert math.isclose(M.precision_at_k(scores[perm], gt[perm]), p, abs_tol=1e-12)
    assert math.isclose(M.precision_at_k(2 * scores + 5, gt), p, abs_tol=1e-12)
    ceiling = M.precision_ceiling(groups, gt)
    block_scores = rng.normal(size=5)[groups]  # any block-granular ranking
    assert M.precision_at_k(block_scores, gt) <= ceiling + 1e-12
    assert M.chance(int(gt.sum()), gt.size) <= ceiling + 1e-12


@settings(max_examples=150, deadline=None)
@given(ranked(), st.integers(0, 10**6))
def test_auc_bounds_and_invariances(data, seed):
    scores, labels, groups = data
    auc, pairs = M.within_group_auc(scores, labels, groups)
    if pairs == 0:
        assert math.isnan(auc)
        return
    assert 0.0 <= auc <= 1.0
    perm = np.random.default_rng(seed).permutation(scores.size)
    assert math.isclose(M.within_group_auc(scores[perm], labels[perm], groups[perm])[0], auc)
    assert math.isclose(M.within_group_auc(np.exp(scores), labels, groups)[0], auc)
    # reversing the ranking mirrors the AUC
    assert math.isclose(M.within_group_auc(-scores, labels, groups)[0], 1.0 - auc)


@settings(max_examples=60, deadline=None)
@given(ranked(), st.integers(0, 1000))
def test_bootstrap_intervals_contain_their_point_or_are_undefined(data, seed):
    scores, labels, groups = data
    iv = M.auc_bootstrap(scores, labels, groups, n_boot=200, seed=seed)
    if iv.n == 0:
        assert math.isnan(iv.point)
        return
    assert 0.0 <= iv.lo <= iv.hi <= 1.0
    pv = M.precision_bootstrap(scores, labels, groups, n_boot=200, seed=seed)
    assert 0.0 <= pv.lo <= pv.hi <= 1.0
    d = M.precision_difference_bootstrap(scores, scores, labels, groups, n_boot=50, seed=seed)
    assert (d.point, d.lo, d.hi) == (0.0, 0.0, 0.0)


interval = st.tuples(st.floats(-1, 1), st.floats(0, 1)).map(
    lambda t: {"lo": t[0], "hi": t[0] + t[1], "point": t[0] + t[1] / 2})


@settings(max_examples=300, deadline=None)
@given(interval)
def test_checklist_rules_are_consistent(iv):
    v = C.beats(iv)
    assert v in (C.PASS, C.FAIL, C.INCONCLUSIVE)
    if iv["lo"] > 0:
        assert v == C.PASS
    if iv["hi"] <= 0:
        assert v == C.FAIL
    if v == C.INCONCLUSIVE:
        assert iv["lo"] <= 0 < iv["hi"] and iv["hi"] - iv["lo"] > C.MAX_WIDTH
    a = C.above(iv, 0.5)
    if iv["hi"] - iv["lo"] > C.MAX_WIDTH:
        assert a == C.INCONCLUSIVE
    elif a == C.PASS:
        assert iv["lo"] > 0.5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([C.PASS, C.FAIL, C.INCONCLUSIVE]), max_size=8))
def test_combine_needs_every_pass(verdicts):
    out = C.combine(verdicts)
    if verdicts and all(v == C.PASS for v in verdicts):
        assert out == C.PASS
    elif C.FAIL in verdicts:
        assert out == C.FAIL
    else:
        assert out == C.INCONCLUSIVE
