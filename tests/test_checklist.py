"""Checklist items: verdict rules on hand-made numbers."""

from __future__ import annotations

import math

from benchmark import checklist as C


def test_beats_rule():
    assert C.beats({"point": .1, "lo": .02, "hi": .12}) == C.PASS
    assert C.beats({"point": .3, "lo": .01, "hi": .6}) == C.PASS  # wide but above 0
    assert C.beats({"point": .0, "lo": -.02, "hi": .05}) == C.FAIL  # narrow, straddles 0
    assert C.beats({"point": .1, "lo": -.05, "hi": .2}) == C.INCONCLUSIVE  # wide, straddles 0
    assert C.beats({"point": -.3, "lo": -.5, "hi": -.1}) == C.FAIL  # below 0, however wide
    assert C.beats({"point": 0.0, "lo": 0.0, "hi": 0.0}) == C.FAIL  # identical methods
    assert C.beats({"point": math.nan, "lo": math.nan, "hi": math.nan}) == C.INCONCLUSIVE


def test_above_rule():
    assert C.above({"lo": .55, "hi": .65}, .5) == C.PASS
    assert C.above({"lo": .45, "hi": .55}, .5) == C.FAIL
    assert C.above({"lo": .55, "hi": .75}, .5) == C.INCONCLUSIVE  # the paper's 0.15 rule


def test_fluency_item_needs_both_parts():
    good = {"point": .1, "lo": .05, "hi": .15}
    assert C.fluency(good, {"point": .6, "lo": .55, "hi": .65}).verdict == C.PASS
    assert C.fluency(good, {"point": .55, "lo": .49, "hi": .6}).verdict == C.FAIL
    bad = {"point": -.1, "lo": -.15, "hi": -.05}
    assert C.fluency(bad, {"point": .6, "lo": .55, "hi": .65}).verdict == C.FAIL
    v = C.fluency(None, None)
    assert v.verdict == C.INCONCLUSIVE and "does not score generation draws" in v.reason


def test_headroom_and_combine_and_overall():
    assert C.headroom({"point": .5, "lo": .45, "hi": .55, "chance": .4}).verdict == C.PASS
    assert C.headroom({"point": .5, "lo": .39, "hi": .52, "chance": .4}).verdict == C.FAIL
    assert C.combine([C.PASS, C.PASS]) == C.PASS
    assert C.combine([C.PASS, C.INCONCLUSIVE]) == C.INCONCLUSIVE
    assert C.combine([C.INCONCLUSIVE, C.FAIL]) == C.FAIL
    assert C.combine([]) == C.INCONCLUSIVE
    items = dict.fromkeys(C.GATED, C.PASS) | {8: C.REPORTED, 9: C.REPORTED, 10: C.NOT_RUN}
    assert C.overall(items) == C.PASS
    assert C.overall(items | {4: C.FAIL}) == C.FAIL
    assert C.overall(items | {10: C.FAIL}) == C.FAIL


def test_precision_of_estimate():
    assert C.precision_of_estimate({"a": .1, "b": .15}).verdict == C.PASS
    v = C.precision_of_estimate({"a": .1, "b": .2, "c": math.nan})
    assert v.verdict == C.INCONCLUSIVE and set(v.numbers["too_wide"]) == {"b", "c"}
