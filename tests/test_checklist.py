"""Checklist items: verdict rules on hand-made numbers."""

from __future__ import annotations

import math

from benchmark import checklist as C
from benchmark import panel_rule as R


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
    # item 11 counts once it has run, like item 10
    assert C.overall(items | {11: C.NOT_RUN}) == C.PASS
    assert C.overall(items | {11: C.FAIL}) == C.FAIL
    assert C.overall(items | {11: C.INCONCLUSIVE}) == C.INCONCLUSIVE


def test_precision_of_estimate():
    assert C.precision_of_estimate({"a": .1, "b": .15}).verdict == C.PASS
    v = C.precision_of_estimate({"a": .1, "b": .2, "c": math.nan})
    assert v.verdict == C.INCONCLUSIVE and set(v.numbers["too_wide"]) == {"b", "c"}


# ---------------------------------------------------------------------------------------------
# one test per rule of docs/evaluation.md ("a verdict is only given for what could be measured")


def test_fluency_at_the_ceiling_is_inconclusive_never_failed():
    raw = {"point": 0.0, "lo": 0.0, "hi": 0.0}  # the estimator ties fluency at AUC 1.0
    res = {"point": .7, "lo": .62, "hi": .74}
    v = C.fluency(raw, res, control_raw=1.0, pairs=500)
    assert v.verdict == C.INCONCLUSIVE  # the residualized part passes, the raw part cannot
    assert v.numbers["raw_minus_fluency"]["verdict"] == C.INCONCLUSIVE
    assert v.numbers["residualized_auc"]["verdict"] == C.PASS
    assert "ceiling" in v.reason
    # below the ceiling the same tie fails
    assert C.fluency(raw, res, control_raw=0.9, pairs=500).verdict == C.FAIL


def test_a_draw_with_too_few_pairs_is_inconclusive():
    good = {"point": .1, "lo": .05, "hi": .15}
    v = C.fluency(good, {"point": .6, "lo": .55, "hi": .65}, control_raw=.5, pairs=C.MIN_PAIRS - 1)
    assert v.verdict == C.INCONCLUSIVE and "too few within-group pairs" in v.reason


def test_magnitude_without_draws_is_inconclusive_never_passed():
    diffs = {"norm-only": {"point": .2, "lo": .1, "hi": .3},
             "advantage-only": {"point": .2, "lo": .1, "hi": .3}}
    assert C.magnitude(diffs).verdict == C.PASS
    v = C.magnitude(diffs, draws_scored=False)
    assert v.verdict == C.INCONCLUSIVE and "not measured" in v.reason
    bad = diffs | {"norm-only": {"point": -.2, "lo": -.3, "hi": -.1}}
    assert C.magnitude(bad, draws_scored=False).verdict == C.FAIL  # a fail is still a fail


def test_a_control_at_its_ceiling_cannot_be_beaten():
    tie = {"point": 0.0, "lo": -0.01, "hi": 0.01}
    assert C.beats_control(tie, control_point=1.0) == C.INCONCLUSIVE
    assert C.beats_control(tie, control_point=0.8) == C.FAIL
    assert C.timing(tie, control_point=1.0).verdict == C.INCONCLUSIVE


def _v(verdict, **numbers):
    return C.Verdict(verdict, numbers)


def _places(verdict_by_item, seeds=(0, 1, 2), draws=2, width=0.1):
    out = {i: {} for i in C.ITEMS}
    for s in seeds:
        for i in (1, 3, 4, 8):
            out[i][str(s)] = _v(verdict_by_item.get(i, C.PASS))
        out[7][f"{s}/precision"] = _v(C.REPORTED, width=width)
        for d in range(draws):
            out[2][f"{s}/qzxbt/step0030_draw{d}"] = C.Verdict(
                verdict_by_item.get(2, C.PASS), {"raw_minus_fluency": {}})
            out[7][f"{s}/qzxbt/step0030_draw{d}/auc"] = _v(C.REPORTED, width=width)
    return out


def test_task_checklist_aggregates_by_the_documented_rules():
    causal = {"verdict": C.PASS, "per_seed": {"0": {"verdict": C.PASS, "checks": {},
                                                    "comparisons": {}}}}
    items, verdict = C.task_checklist(_places({}), [0, 1, 2], [0, 1, 2], causal)
    got = {i["key"]: i["verdict"] for i in items}
    assert verdict == C.PASS and got["seeds"] == C.PASS and got["draws"] == C.PASS
    assert got["causal"] == C.PASS
    assert all(i["gated"] for i in items if i["item"] not in (8, 9))
    # item 11 (live) is decided per results file, never per task
    assert [i["item"] for i in items] == list(range(1, 11))
    # item 5: fewer seeds than the release -> inconclusive (not pass)
    _, v = C.task_checklist(_places({}, seeds=(0,)), [0], [0, 1, 2], causal)
    assert v == C.INCONCLUSIVE
    # item 6: one draw per seed -> inconclusive
    items, v = C.task_checklist(_places({}, draws=1), [0, 1, 2], [0, 1, 2], causal)
    assert {i["key"]: i["verdict"] for i in items}["draws"] == C.INCONCLUSIVE
    # item 7: an interval wider than 0.15 -> inconclusive
    items, _ = C.task_checklist(_places({}, width=0.2), [0, 1, 2], [0, 1, 2], causal)
    assert {i["key"]: i["verdict"] for i in items}["precision_of_estimate"] == C.INCONCLUSIVE
    # a fail anywhere fails the task; item 10 not run does not count
    _, v = C.task_checklist(_places({4: C.FAIL}), [0, 1, 2], [0, 1, 2], causal)
    assert v == C.FAIL
    items, v = C.task_checklist(_places({}), [0, 1, 2], [0, 1, 2], None, "skipped")
    assert v == C.PASS and {i["key"]: i["verdict"] for i in items}["causal"] == C.NOT_RUN
    _, v = C.task_checklist(_places({}), [0, 1, 2], [0, 1, 2],
                            causal | {"verdict": C.FAIL})
    assert v == C.FAIL


def _causal(margins: dict[str, float | None]) -> dict:
    """A task's causal part with, per seed, the margin of the score over the band's top (its
    interval's upper end ``hi``; None: no causal score on that seed)."""
    per = {}
    for s, hi in margins.items():
        comp = {} if hi is None else {"random_band": {"point": hi - 0.1, "lo": hi - 0.2,
                                                      "hi": hi}}
        per[s] = {"verdict": C.PASS, "checks": {}, "comparisons": comp}
    return {"verdict": C.PASS, "per_seed": per}


def test_precision_items_cannot_pass_at_or_below_the_random_band():
    # seed 0 well above the band, seed 1 below it (upper end -0.05), seed 2 within the
    # cross-machine tolerance of the band's top (upper end 0.004)
    causal = _causal({"0": 0.3, "1": -0.05, "2": 0.004})
    places = _places({})
    items, verdict = C.task_checklist(places, [0, 1, 2], [0, 1, 2], causal)
    got = {i["key"]: i for i in items}
    for key in ("headroom", "timing"):
        per = got[key]["per"]
        assert [per[s]["verdict"] for s in ("0", "1", "2")] == [C.PASS, C.FAIL, C.INCONCLUSIVE]
        assert per["1"]["numbers"]["causal_gate"] == {
            "score_minus_band_top": causal["per_seed"]["1"]["comparisons"]["random_band"],
            "verdict": C.FAIL}
        assert "at or below the random reference" in per["1"]["reason"]
        assert got[key]["verdict"] == C.FAIL
    assert got["seeds"]["verdict"] == C.FAIL and verdict == C.FAIL
    # the gate only caps: a failed precision item stays failed, a seed without a causal score
    # (no bonus paid, or --no-causal) is not capped, and item 1 is not gated
    items, _ = C.task_checklist(_places({3: C.FAIL}), [0, 1, 2], [0, 1, 2],
                                _causal({"0": 0.3, "1": None, "2": 0.3}))
    got = {i["key"]: i for i in items}
    assert {s: v["verdict"] for s, v in got["headroom"]["per"].items()} == {
        "0": C.FAIL, "1": C.FAIL, "2": C.FAIL}
    assert got["timing"]["verdict"] == C.PASS and got["magnitude"]["verdict"] == C.PASS
    assert "causal_gate" not in got["timing"]["per"]["1"]["numbers"]


# ---------------------------------------------------------------------------------------------
# item 11: the margin over the random reference, public against live (hand-computed)

PUBLIC = {"point": .5, "lo": .47, "hi": .54}  # half-widths 0.03 below, 0.04 above


def _iv(point, lo, hi):
    return {"point": point, "lo": lo, "hi": hi}


def _close(d, point, lo, hi):
    assert math.isclose(d["point"], point, abs_tol=1e-12)
    assert math.isclose(d["lo"], lo, abs_tol=1e-12) and math.isclose(d["hi"], hi, abs_tol=1e-12)


def test_pool_draws_one_keeps_its_interval_n_combine_half_widths():
    _close(C.pool_draws([_iv(.4, .35, .47)]), .4, .35, .47)
    # half-widths (0.03, 0.04) and (0.04, 0.03): sqrt(.03^2 + .04^2) / 2 = 0.025 each side
    pooled = C.pool_draws([_iv(.4, .37, .44), _iv(.2, .16, .23)])
    _close(pooled, .3, .275, .325)
    assert pooled["n"] == 2


def test_live_margin_combines_independent_runs():
    # live - public = -0.1; below: hypot(live .03, public above .04) = .05; above: hypot(.04, .03)
    _close(C.live_margin(PUBLIC, _iv(.4, .37, .44)), -.1, -.15, -.05)


def _suite(est, margin):
    """A suite whose ``vs_random`` (the entry's margin over the random reference) is ``margin``;
    its raw scores say something else, so a test passing on them would show."""
    return {"causal_score": {est: _iv(.9, .8, .95), "oracle": _iv(.4, .3, .5)},
            "vs_random": margin, "tasks": ["a"], "verdicts": {"a": C.PASS}}


def _live(est, *margins):
    return [{"draw_id": 7 + i, "release": {}, "suite": _suite(est, m), "verdict": C.PASS}
            for i, m in enumerate(margins)]


def test_live_item_verdicts():
    pub = _suite("m", PUBLIC)  # significantly above the random reference: a claim
    # above the random reference live too, far below the public margin: pass (the runs differ)
    it = C.live_item(pub, _live("m", _iv(.1, .05, .16)), "m", .01)
    assert it["verdict"] == C.PASS and "on the panel" in it["reason"]
    _close(it["margin"], -.4, -.4 - math.hypot(.05, .04), -.4 + math.hypot(.06, .03))
    assert it["live"]["n_draws"] == 1 and it["live"]["draw_ids"] == [7]
    assert it["public"] == PUBLIC
    # a memorizer: at the random reference live, far below its public margin: fail
    it = C.live_item(pub, _live("m", _iv(.01, -.03, .05)), "m", .01)
    assert it["verdict"] == C.FAIL and "does not carry over" in it["reason"]
    # live lower end exactly at the tolerance is not above it
    assert C.live_item(pub, _live("m", _iv(.05, .01, .09)), "m", .01)["verdict"] == C.FAIL
    # at the random reference live but within reach of the public margin: inconclusive
    # (upper end 0.46 + 0.01 = 0.47 is not below the public lower end 0.47)
    it = C.live_item(pub, _live("m", _iv(.2, -.06, .46)), "m", .01)
    assert it["verdict"] == C.INCONCLUSIVE and "too little to tell" in it["reason"]
    # nothing claimed in public (lower end 0.01 <= tol): pass whatever happens live
    it = C.live_item(_suite("m", _iv(.05, .01, .09)), _live("m", _iv(-.3, -.4, -.2)), "m", .01)
    assert it["verdict"] == C.PASS and "nothing to carry over" in it["reason"]
    # two draws pooled: 0.3 [0.275, 0.325]; above: pass; one at the band drags the pool down
    it = C.live_item(pub, _live("m", _iv(.4, .37, .44), _iv(.2, .16, .23)), "m", .01)
    assert it["verdict"] == C.PASS and it["live"]["n_draws"] == 2
    _close(it["live"], .3, .275, .325)
    it = C.live_item(pub, _live("m", _iv(.02, -.02, .06), _iv(0., -.04, .04)), "m", .01)
    assert it["verdict"] == C.FAIL and it["live"]["n_draws"] == 2


def test_live_item_is_inconclusive_without_live_draws_or_margins():
    pub = _suite("m", PUBLIC)
    it = C.live_item(pub, [], "m", .01)
    assert it["verdict"] == C.INCONCLUSIVE and it["live"] is None and it["reason"] == "no live draw"
    no_causal = [{"draw_id": 1, "suite": {"tasks": ["a"], "verdicts": {}}}]
    it = C.live_item(pub, no_causal, "m", .01)
    assert it["verdict"] == C.INCONCLUSIVE and "has a causal score" in it["reason"]
    it = C.live_item({"tasks": ["a"]}, _live("m", _iv(.4, .37, .44)), "m", .01)
    assert it["verdict"] == C.INCONCLUSIVE and it["public"] is None
    bad = _suite("m", _iv(float("nan"), .1, .2))  # not a finite margin: none
    assert C.live_item(bad, _live("m", PUBLIC), "m", .01)["public"] is None
    # the default tolerance is the cross-machine one
    from benchmark.causal.score import CROSS_MACHINE_TOLERANCE

    assert C.live_item(pub, [], "m")["tolerance"] == CROSS_MACHINE_TOLERANCE


def test_live_item_agrees_with_the_fresh_draw_gate():
    """Item 11 is the gate's rule on the pooled draws: where the gate fails an entry, item 11
    fails it; where the gate passes it with both margins above, item 11 passes it."""
    from benchmark.live import live_gate

    for pub, live in [(PUBLIC, _iv(.01, -.03, .05)), (PUBLIC, _iv(.1, .05, .16)),
                      (PUBLIC, _iv(.2, -.06, .46)), (_iv(.05, .01, .09), _iv(-.3, -.4, -.2))]:
        ok, _ = live_gate({"vs_random": pub}, {"vs_random": live}, "m", .01)
        v = C.live_item(_suite("m", pub), _live("m", live), "m", .01)["verdict"]
        assert (v == C.FAIL) == (not ok)


def test_unmeasurable_cells_are_reported_never_counted():
    """Seed 1 of the task is unmeasurable: its item-4 fail and its item-10 fail decide nothing;
    the counts say 2 of 2 measurable seeds pass item 4 (1 not counted), and the same for 10."""
    causal = {"verdict": C.FAIL, "per_seed": {
        "0": {"verdict": C.PASS, "checks": {}, "comparisons": {}, "measurable": True},
        "1": {"verdict": C.FAIL, "checks": {}, "comparisons": {}, "measurable": False,
              "measurable_reason": "the oracle does not clear the random reference"},
        "2": {"verdict": C.PASS, "checks": {}, "comparisons": {}, "measurable": True}}}
    places = _places({})
    places[4]["1"] = _v(C.FAIL)
    items, verdict = C.task_checklist(places, [0, 1, 2], [0, 1, 2], causal)
    by = {i["item"]: i for i in items}
    assert verdict == C.PASS and by[4]["verdict"] == C.PASS and by[10]["verdict"] == C.PASS
    assert by[4]["counts"] == {"pass": 2, "fail": 0, "inconclusive": 0, "not_counted": 1}
    assert by[10]["counts"] == {"pass": 2, "fail": 0, "inconclusive": 0, "not_counted": 1}
    assert by[2]["counts"]["not_counted"] == 2 and by[2]["counts"]["pass"] == 4  # 2 draws/seed
    assert by[4]["per"]["1"]["numbers"]["counted"] is False
    assert "oracle does not clear" in by[4]["per"]["1"]["reason"]
    assert "oracle does not clear" in by[10]["per"]["1"]["reason"]
    # the same cell measurable: the fail counts and fails the task
    causal["per_seed"]["1"]["measurable"] = True
    items, verdict = C.task_checklist(_places({4: C.FAIL}), [0, 1, 2], [0, 1, 2], causal)
    assert verdict == C.FAIL
    # every cell unmeasurable: nothing is decided (inconclusive, never pass or fail)
    for b in causal["per_seed"].values():
        b["measurable"] = False
    _, verdict = C.task_checklist(_places({}), [0, 1, 2], [0, 1, 2], causal)
    assert verdict == C.INCONCLUSIVE


def test_results_counts_sum_items_over_tasks_and_say_it_in_words():
    """Two tasks: item 10 passes 2 of 3 measurable seeds on one and 1 of 2 on the other (one
    inconclusive, one not counted): 3 of 5 pass over the file."""
    def task(p, f, i, n):
        return {"checklist": [{"item": 10, "key": "causal", "verdict": C.FAIL if f else
                               (C.INCONCLUSIVE if i else C.PASS),
                               "counts": {"pass": p, "fail": f, "inconclusive": i,
                                          "not_counted": n}},
                              {"item": 8, "key": "ties", "verdict": C.REPORTED}]}
    counts = C.results_counts({"a": task(2, 1, 0, 0), "b": task(1, 0, 1, 1)})
    assert counts == {"10": {"key": "causal", "pass": 3, "fail": 1, "inconclusive": 1,
                             "not_counted": 1, "measurable": 5, "verdict": C.FAIL}}
    assert C.counts_line("10", counts["10"]) == (
        "item 10 (causal): 3 of 5 measurable places pass, 1 fail, 1 inconclusive "
        "(1 not counted)")
    assert C.counts_short(counts) == "10: 3/5"
    assert C.verdict_sentence(C.FAIL).startswith("FAIL: at least one gated item failed")
    assert C.count_places({"0": {"verdict": C.REPORTED}}) == {
        "pass": 0, "fail": 0, "inconclusive": 0, "not_counted": 0}


# ---------------------------------------------------------------------------- the panel rule
def test_panel_rule_by_hand():
    """Pass: a strict majority passes and nothing fails significantly; fail: a strict majority
    fails; everything else (ties, mixed evidence, nothing measurable) is inconclusive."""
    rule = R.panel_rule
    assert rule(7, 2, 0, 12) == "pass"          # 7 of 12 > half, no significant failure
    assert rule(6, 0, 0, 12) == "inconclusive"  # exactly half is not a majority
    assert rule(7, 1, 1, 12) == "inconclusive"  # a majority, but one significant failure
    assert rule(11, 1, 1, 12) == "inconclusive"
    assert rule(0, 7, 0, 12) == "fail"          # 7 of 12 fail (none significantly)
    assert rule(5, 7, 3, 12) == "fail"
    assert rule(3, 3, 0, 6) == "inconclusive"
    assert rule(0, 0, 0, 0) == "inconclusive"
    assert R.panel_verdict({"1": {"verdict": "pass"}, "10": {"verdict": "pass"}}, "pass") == "pass"
    assert R.panel_verdict({"1": {"verdict": "pass"}}, "inconclusive") == "inconclusive"
    assert R.panel_verdict({"1": {"verdict": "fail"}}, "pass") == "fail"


def _place(verdict, **numbers):
    return {"verdict": verdict, "numbers": numbers}


def test_significant_fail_reads_the_deciding_interval_of_each_item():
    sig = R.significant_fail
    iv = lambda lo, hi, v="fail": {"point": (lo + hi) / 2, "lo": lo, "hi": hi, "verdict": v}  # noqa: E731
    # item 1: a failed comparison with norm-only below 0 / merely not above it
    assert sig(1, _place("fail", **{"norm-only": iv(-0.3, -0.1)}))
    assert not sig(1, _place("fail", **{"norm-only": iv(-0.05, 0.05)}))
    assert not sig(1, _place("pass", **{"norm-only": iv(-0.3, -0.1)}))  # only failed places
    # item 2: the residualized AUC's bar is 0.5, the raw difference's is 0
    assert sig(2, _place("fail", raw_minus_fluency=iv(-0.1, 0.1), residualized_auc=iv(0.3, 0.45)))
    assert not sig(2, _place("fail", raw_minus_fluency=iv(-0.1, 0.1),
                             residualized_auc=iv(0.45, 0.55)))
    assert sig(2, _place("fail", raw_minus_fluency=iv(-0.2, -0.01),
                         residualized_auc=iv(0.45, 0.55, "pass")))
    # item 3: precision below chance, or the causal gate failed
    assert sig(3, _place("fail", lo=0.05, hi=0.10, chance=0.2))
    assert not sig(3, _place("fail", lo=0.15, hi=0.25, chance=0.2))
    assert sig(3, _place("fail", lo=0.5, hi=0.6, chance=0.2, causal_gate={"verdict": "fail"}))
    # item 4: the difference with step-order below 0, or the gate
    assert sig(4, _place("fail", lo=-0.2, hi=-0.01))
    assert not sig(4, _place("fail", lo=-0.1, hi=0.05))
    # item 10: a failed check whose comparison lies below -tol (0.01)
    checks = {"random_band": "pass", "step-order": "fail"}
    assert sig(10, _place("fail", checks=checks, comparisons={
        "random_band": iv(0.1, 0.2, "x"), "step-order": iv(-0.2, -0.02, "x")}))
    assert not sig(10, _place("fail", checks=checks, comparisons={
        "random_band": iv(0.1, 0.2, "x"), "step-order": iv(-0.2, -0.005, "x")}))  # within tol
    assert not sig(10, _place("fail", checks=checks, comparisons={
        "random_band": iv(0.1, 0.2, "x"), "step-order": iv(-0.02, 0.06, "x")}))


def test_panel_items_count_measurable_places_over_draws():
    iv = {"point": -0.1, "lo": -0.2, "hi": -0.05}
    ok = {"point": 0.1, "lo": 0.05, "hi": 0.2}

    def res(places):
        return {"tasks": {"t": {"checklist": [
            {"item": 10, "per": places},
            {"item": 3, "per": {"s": {"verdict": "pass", "numbers": {}}}},
            {"item": 5, "verdict": "pass"}]}}}

    d1 = res({"1": {"verdict": "pass", "numbers": {"checks": {"a": "pass"},
                                                  "comparisons": {"a": ok}}},
              "2": {"verdict": "fail", "numbers": {"checks": {"a": "fail"},
                                                  "comparisons": {"a": iv}}},
              "3": {"verdict": "fail", "numbers": {"counted": False}}})
    d2 = res({"1": {"verdict": "pass", "numbers": {}}, "2": {"verdict": "inconclusive"}})
    items = R.panel_items([(11, d1), (12, d2)])
    assert set(items) == {"1", "2", "3", "4", "10"}
    ten = items["10"]
    assert (ten["pass"], ten["fail"], ten["significant_fail"], ten["inconclusive"],
            ten["not_counted"], ten["measurable"]) == (2, 1, 1, 1, 1, 4)
    assert ten["failing"] == [{"place": "11/t/2", "significant": True}]
    assert ten["verdict"] == "inconclusive"  # 2 of 4 pass: not a majority (and one sig. fail)
    assert items["3"]["pass"] == 2 and items["3"]["verdict"] == "pass"
    assert items["1"]["measurable"] == 0 and items["1"]["verdict"] == "inconclusive"
