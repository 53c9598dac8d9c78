"""The checklist of DESIGN section 6, as small named checks over computed metrics.

Each check takes the numbers of one seed (or one draw) and returns a :class:`Verdict`: ``pass``,
``fail`` or ``inconclusive``, or ``reported`` for diagnostic items, with the numbers behind it.
Aggregation over seeds and draws is explicit: an item passes only if it passes everywhere.

Two interval rules:

* a *comparison* (items 1, 2, 4: estimator minus a control, paired 95% cluster-bootstrap interval)
  passes when the interval lies above 0; it fails when it does not and is at most ``MAX_WIDTH``
  wide (or lies at or below 0); an interval that straddles 0 and is wider than ``MAX_WIDTH`` is
  inconclusive (too little data to tell);
* an *estimate* of the estimator's own metric (items 2, 3, 7) is inconclusive when its 95%
  interval is wider than ``MAX_WIDTH`` (the paper's pre-registered 0.15 rule); otherwise it
  passes when the interval's lower end clears the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from benchmark.verdicts import (
    FAIL,
    INCONCLUSIVE,
    MAX_WIDTH,
    NOT_RUN,
    PASS,
    REPORTED,
    combine,
)

#: a draw with fewer within-group (behavior, non-behavior) pairs cannot decide a comparison
MIN_PAIRS = 30
#: a control whose point estimate is this close to the metric's ceiling cannot be beaten
CEILING_EPS = 1e-9

#: item number -> (key, title)
ITEMS: dict[int, tuple[str, str]] = {
    1: ("magnitude", "beats norm-only and advantage-only (paired interval excludes 0)"),
    2: ("fluency", "beats raw fluency AUC; residualized AUC lower bound > 0.5"),
    3: ("headroom", "precision above chance, reported as lift and fraction of headroom; never a "
                    "pass where the causal score is at or below the random reference"),
    4: ("timing", "beats the step-order control inside the learning window; never a pass where "
                  "the causal score is at or below the random reference"),
    5: ("seeds", "all seeds scored; items 1-4 pass on every seed"),
    6: ("draws", ">= 2 independent draws per seed; item 2 passes on every draw"),
    7: ("precision_of_estimate", "the estimator's own intervals are <= 0.15 wide"),
    8: ("ties", "step-granular scores use tie-aware precision (tie-break range reported)"),
    9: ("token_level", "trigger-token gradients align with the in-context target (diagnostic)"),
    10: ("causal", "causal score above the random reference, norm-only's, step-order's and the "
                   "strongest control's (paired)"),
    11: ("live", "the margin over the random reference carries over from the public release "
                 "to the season panel's draws (fresh runs of the task family)"),
}
GATED = (1, 2, 3, 4, 5, 6, 7)
#: the items decided per task (:func:`task_checklist`); item 11 is decided once per entry, from
#: its season-panel draws (:func:`live_item`; ``benchmark.submissions.panel.panel_summary``)
TASK_ITEMS = tuple(i for i in ITEMS if i != 11)


@dataclass
class Verdict:
    """One item's verdict at one place (seed or draw), with the numbers behind it."""

    verdict: str
    numbers: dict = field(default_factory=dict)
    reason: str = ""

    def to_dict(self) -> dict:
        """Plain-JSON form."""
        out = {"verdict": self.verdict, "numbers": self.numbers}
        if self.reason:
            out["reason"] = self.reason
        return out


def beats(diff: Mapping[str, float], max_width: float = MAX_WIDTH) -> str:
    """Verdict of one paired difference ``{"point", "lo", "hi"}`` (estimator minus control).

    Pass when the interval lies above 0. Otherwise fail, unless the interval straddles 0 and is
    wider than ``max_width`` (inconclusive). An undefined interval (NaN, e.g. a draw without a
    negative response) is inconclusive.
    """
    if not _finite(diff["lo"], diff["hi"]):
        return INCONCLUSIVE
    if diff["lo"] > 0:
        return PASS
    if diff["hi"] > 0 and diff["hi"] - diff["lo"] > max_width:
        return INCONCLUSIVE
    return FAIL


def above(estimate: Mapping[str, float], threshold: float, max_width: float = MAX_WIDTH) -> str:
    """Verdict of an own estimate ``{"lo", "hi"}``: its lower end must clear ``threshold``.

    Inconclusive when the interval is undefined or wider than ``max_width``.
    """
    if not _finite(estimate["lo"], estimate["hi"]) or estimate["hi"] - estimate["lo"] > max_width:
        return INCONCLUSIVE
    return PASS if estimate["lo"] > threshold else FAIL


def magnitude(diffs: Mapping[str, Mapping[str, float]],
              control_points: Mapping[str, float] | None = None,
              draws_scored: bool = True) -> Verdict:
    """Item 1 for one seed: ``diffs`` maps comparison name -> paired difference.

    Each comparison is :func:`beats_control` against its control's point estimate (when given);
    an estimator that scores no draws is inconclusive on the draw part, so never passes.
    """
    cp = control_points or {}
    per = {k: beats_control(v, cp.get(k)) for k, v in diffs.items()}
    verdicts = list(per.values()) + ([] if draws_scored else [INCONCLUSIVE])
    reason = "" if draws_scored else "the draw part is not measured (no score_draw)"
    return Verdict(combine(verdicts), {k: dict(v) | {"verdict": per[k]}
                                       for k, v in diffs.items()}, reason)


def fluency(
    raw_diff: Mapping[str, float] | None, residualized: Mapping[str, float] | None,
    control_raw: float | None = None, pairs: int | None = None,
) -> Verdict:
    """Item 2 for one draw: raw AUC minus fluency's raw AUC, and the residualized AUC interval.

    Inconclusive, never failed, where it cannot be measured: the estimator scores no draws, the
    draw has fewer than :data:`MIN_PAIRS` within-group pairs, or fluency's raw AUC already sits at
    the ceiling (1.0: nothing can beat it, so only the residualized part is decided).
    """
    if raw_diff is None or residualized is None:
        return Verdict(INCONCLUSIVE, {}, "the estimator does not score generation draws")
    if pairs is not None and pairs < MIN_PAIRS:
        return Verdict(INCONCLUSIVE, {"pairs": pairs},
                       f"too few within-group pairs ({pairs} < {MIN_PAIRS}) to tell")
    at_ceiling = control_raw is not None and control_raw >= 1.0 - CEILING_EPS
    v_raw = INCONCLUSIVE if at_ceiling else beats(raw_diff)
    v_res = above(residualized, 0.5)
    numbers = {"raw_minus_fluency": dict(raw_diff) | {"verdict": v_raw},
               "residualized_auc": dict(residualized) | {"verdict": v_res}}
    reason = "fluency's raw AUC is at the ceiling (1.0); only the residualized AUC decides" \
        if at_ceiling else ""
    return Verdict(combine([v_raw, v_res]), numbers, reason)


def beats_control(diff: Mapping[str, float], control_point: float | None,
                  ceiling: float = 1.0) -> str:
    """:func:`beats`, but inconclusive when the control already sits at the ceiling."""
    if control_point is not None and control_point >= ceiling - CEILING_EPS:
        return INCONCLUSIVE
    return beats(diff)


def headroom(window: Mapping[str, float]) -> Verdict:
    """Item 3 for one seed: precision interval in the learning window must clear chance."""
    return Verdict(above(window, window["chance"]), dict(window))


def timing(diff: Mapping[str, float], control_point: float | None = None) -> Verdict:
    """Item 4 for one seed: paired precision difference against step-order in the window."""
    return Verdict(beats_control(diff, control_point), dict(diff))


def precision_of_estimate(widths: Mapping[str, float]) -> Verdict:
    """Item 7: the estimator's own intervals (precision per seed, AUC per draw) <= ``MAX_WIDTH``."""
    too_wide = {k: w for k, w in widths.items() if not w <= MAX_WIDTH}  # NaN counts as wide
    finite = [w for w in widths.values() if _finite(w)]
    worst = max(finite) if finite else None
    return Verdict(PASS if not too_wide else INCONCLUSIVE,
                   {"max_width": worst, "limit": MAX_WIDTH, "too_wide": too_wide})


def overall(items: Mapping[int, str]) -> str:
    """Overall verdict from the aggregated gated items (10 and 11 count once they have run)."""
    gated = [items[i] for i in GATED if i in items]
    for i in (10, 11):
        if i in items and items[i] not in (REPORTED, NOT_RUN):
            gated.append(items[i])
    return combine(gated)


def _finite(*values: float | None) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


# ----------------------------------------------------------------------------------------------
# one (seed, task), then one task


def seed_verdicts(td, est: str, training: dict, draws: dict, comparisons: dict, has_gt: bool,
                  scores_draws: bool) -> dict[int, dict[str, Verdict]]:
    """Items 1-4, 7 (widths), 8 and 9 at one seed of one task, keyed by place.

    Places: the seed (``"0"``) for training items, ``"<seed>/<draw id>"`` for draw items; item 7
    collects interval widths under ``"<seed>/precision"`` and ``"<seed>/<draw id>/auc"``.
    """
    seed = str(td.seed)
    out: dict[int, dict[str, Verdict]] = {i: {} for i in TASK_ITEMS}
    no_gt = "no ground-truth rollout in the learning window of this seed"

    def window(name):
        return training[name]["rollout"]["group"].get("window")

    # item 1: magnitude (training: window, group label; draws: residualized AUC vs norm-only)
    if has_gt:
        diffs = {c: comparisons["precision"][c] for c in ("norm-only", "advantage-only")
                 if c in comparisons["precision"]}
        points = {c: window(c)["precision"] for c in diffs}
        for did, comp in comparisons["draws"].items():
            if "norm-only" in comp:
                diffs[f"norm-only/{did}/residualized_auc"] = comp["norm-only"]["residualized"]
                points[f"norm-only/{did}/residualized_auc"] = \
                    draws["norm-only"][did]["residualized"]["point"]
        out[1][seed] = magnitude(diffs, points, draws_scored=scores_draws or not td.draws)
    else:
        out[1][seed] = Verdict(INCONCLUSIVE, {}, no_gt)
    # item 2: fluency, per draw; item 7's draw widths
    for d in td.draws:
        key = f"{seed}/{d.draw_id}"
        mine = draws[est].get(d.draw_id)
        if mine is None:
            out[2][key] = fluency(None, None)
            continue
        res = mine["residualized"]
        out[2][key] = fluency(comparisons["draws"][d.draw_id]["fluency"]["raw"], res,
                              control_raw=draws["fluency"][d.draw_id]["raw"]["point"],
                              pairs=int(mine["raw"].get("n", 0)))
        out[7][f"{key}/auc"] = Verdict(REPORTED, {"width": res["hi"] - res["lo"]})
    # item 9: token level (diagnostic, a property of the release)
    for d in td.draws:
        out[9][f"{seed}/{d.draw_id}"] = Verdict(REPORTED, {}, "")
    if not has_gt:
        for i in (3, 4, 8):
            out[i][seed] = Verdict(INCONCLUSIVE, {}, no_gt)
        return out
    win = window(est)
    v3 = headroom({"point": win["precision"], "lo": win["interval"][0],
                   "hi": win["interval"][1], "chance": win["chance"],
                   "ceiling": win["ceiling"], "lift": win["lift"],
                   "fraction_of_headroom": win["fraction_of_headroom"]})
    step_win = training[est]["step"]["group"]["window"]
    v3.numbers["step_level"] = {k: step_win[k] for k in
                                ("precision", "chance", "ceiling", "lift",
                                 "fraction_of_headroom")}
    v3.numbers["all_steps"] = {k: training[est]["rollout"]["group"]["all"][k]
                               for k in ("precision", "chance", "lift")}
    out[3][seed] = v3
    out[4][seed] = timing(comparisons["precision"]["step-order"],
                          window("step-order")["precision"])
    out[7][f"{seed}/precision"] = Verdict(REPORTED,
                                          {"width": win["interval"][1] - win["interval"][0]})
    # item 8: ties (the caller adds the tie-break ranges of the estimator's own scores)
    out[8][seed] = Verdict(REPORTED, {
        "step_level": {"tie_aware": step_win["precision"]},
        "rollout_level": {"tie_aware": win["precision"]},
    })
    return out


#: the precision items a causal score at or below the random band caps (:func:`causal_gate`)
GATED_BY_CAUSAL = (3, 4)


def causal_gate(verdicts: dict[int, dict[str, Verdict]], causal: dict | None) -> None:
    """Cap the precision items (3, 4) of each seed by that seed's causal score, in place.

    A precision item cannot pass where the estimator's causal score is at or below the random
    reference (``benchmark.causal.score.above_band_gate`` on the seed's paired margin over the
    random reference, the mean of the random sets; the key keeps its old name): the
    labels then credit rollouts whose removal does not move the behavior. The gate's verdict
    caps the item's (fail < inconclusive < pass); the margin and the gate are recorded under
    ``numbers["causal_gate"]``. Seeds without a causal score (not run, no bonus paid) are not
    capped.
    """
    from benchmark.causal.score import above_band_gate

    per_seed = (causal or {}).get("per_seed") or {}
    order = {FAIL: 0, INCONCLUSIVE: 1, PASS: 2}
    for seed, block in per_seed.items():
        margin = (block.get("comparisons") or {}).get("random_band")
        if margin is None:
            continue
        gate = above_band_gate(margin)
        for i in GATED_BY_CAUSAL:
            v = verdicts.get(i, {}).get(str(seed))
            if v is None:
                continue
            v.numbers["causal_gate"] = {"score_minus_band_top": dict(margin), "verdict": gate}
            if v.verdict in order and order[gate] < order[v.verdict]:
                v.verdict = gate
                note = ("the causal score is at or below the random reference" if gate == FAIL
                        else "the causal score is within the cross-machine tolerance of the "
                        "random reference")
                v.reason = f"{v.reason}; {note}" if v.reason else note


#: why the label metrics (precision, AUC) of an open-track entry measure nothing
OPEN_TRACK_LABELS = (
    "not measurable in the open track: its view (text, task rewards and advantages) determines "
    "the labels. GRPO's advantage normalises the total reward within a group, bonus included, "
    "so beside the task reward it gives the bonus (the rollout label) away; precision and AUC "
    "against those labels measure reading them off, not attribution (the causal score does not "
    "read labels and stays the measure)")


def label_metrics(track: str) -> dict:
    """Whether an entry's label metrics (precision, AUC) measure attribution in its track.

    ``{"measurable": True}`` in the gradient track; ``{"measurable": False, "reason":
    OPEN_TRACK_LABELS}`` in the open track (docs/evaluation.md, "Label metrics in the open
    track").
    """
    if track == "open":
        return {"measurable": False, "reason": OPEN_TRACK_LABELS}
    return {"measurable": True}


#: the items whose places (seeds, draws) are counted in the verdict summary
COUNTED_ITEMS = (1, 2, 3, 4, 10)
NOT_COUNTED = "not counted: the (seed, task) cell is not measurable"


def unmeasurable_seeds(causal: dict | None) -> dict[str, str]:
    """Seed -> reason, for the (seed, task) cells the causal reference marks unmeasurable.

    A cell is measurable where the bonus-off effect is significant and a reference removal
    (oracle or provenance) clears the random reference (``benchmark.causal.stats.measurability``;
    docs/evaluation.md). Blocks without the mark (older results, no causal score) count as
    measurable.
    """
    per_seed = (causal or {}).get("per_seed") or {}
    return {str(s): str(b.get("measurable_reason", "")) for s, b in per_seed.items()
            if isinstance(b, Mapping) and b.get("measurable") is False}


def _place_seed(place: str) -> str:
    return str(place).split("/", 1)[0]


def task_checklist(verdicts: dict[int, dict[str, Verdict]], seeds: list[int],
                   release_seeds: list[int], causal: dict | None,
                   causal_reason: str | None = None) -> tuple[list[dict], str]:
    """Aggregate one task's per-place verdicts into the ten items and the task's verdict.

    Rules (docs/evaluation.md): items 1-4 pass only where every counted seed passes; item 5 needs
    every seed of the release (>= 3) and items 1-4; item 6 needs >= 2 draws per seed and item 2;
    item 7 needs every interval <= 0.15 wide; item 10 is the causal verdict (combined over
    seeds). Items 3 and 4 are first capped by each seed's causal score (:func:`causal_gate`).
    Places (seeds, draws) of an unmeasurable (seed, task) cell (:func:`unmeasurable_seeds`) are
    reported with ``counted: false`` and their reason, and decide nothing; each item records its
    ``counts`` (:func:`count_places`).
    """
    causal_gate(verdicts, causal)
    skip = unmeasurable_seeds(causal)
    for i in (1, 2, 3, 4, 7):
        for place, v in verdicts.get(i, {}).items():
            if _place_seed(place) in skip:
                v.numbers = dict(v.numbers) | {"counted": False}
                note = f"{NOT_COUNTED} ({skip[_place_seed(place)]})"
                v.reason = f"{v.reason}; {note}" if v.reason else note

    def counted(i: int) -> list[Verdict]:
        return [v for k, v in verdicts[i].items() if _place_seed(k) not in skip]

    agg: dict[int, str] = {}
    for i in (1, 2, 3, 4):
        agg[i] = combine(v.verdict for v in counted(i))
    v5 = combine([agg[1], agg[2], agg[3], agg[4]])
    if len(seeds) < max(3, len(release_seeds)):
        v5 = INCONCLUSIVE if v5 != FAIL else FAIL
    agg[5] = v5
    draws_per_seed = {str(s): sum(1 for k in verdicts[2] if k.startswith(f"{s}/")) for s in seeds}
    scored = any(v.numbers for v in verdicts[2].values())
    enough = all(n >= 2 for n in draws_per_seed.values())
    agg[6] = agg[2] if (enough and scored) or agg[2] == FAIL else INCONCLUSIVE
    widths = {k: v.numbers["width"] for k, v in verdicts[7].items() if _place_seed(k) not in skip}
    v7 = precision_of_estimate(widths)
    agg[7] = v7.verdict
    agg[8] = REPORTED
    agg[9] = REPORTED
    if causal and skip:  # the causal score's own task verdict counts measurable cells too
        agg[10] = combine(b["verdict"] for s, b in causal["per_seed"].items()
                          if str(s) not in skip)
    else:
        agg[10] = causal["verdict"] if causal else NOT_RUN
    items = []
    for i in TASK_ITEMS:
        key, title = ITEMS[i]
        entry = {"item": i, "key": key, "title": title, "verdict": agg[i],
                 "gated": i in GATED or i == 10}
        if i in (1, 2, 3, 4, 8, 9):
            entry["per"] = {k: v.to_dict() for k, v in verdicts[i].items()}
            if i in COUNTED_ITEMS:
                entry["counts"] = count_places(entry["per"])
        elif i == 5:
            entry["numbers"] = {"seeds_scored": seeds, "release_seeds": release_seeds,
                                "items_1_to_4": {str(j): agg[j] for j in (1, 2, 3, 4)}}
        elif i == 6:
            entry["numbers"] = {"draws_per_seed": draws_per_seed, "item_2": agg[2],
                                "draws_scored": scored}
        elif i == 7:
            entry["numbers"] = v7.numbers
        elif i == 10:
            if causal and causal.get("per_seed"):
                entry["per"] = {s: {"verdict": b["verdict"], "numbers": {
                    "checks": b["checks"], "comparisons": b["comparisons"]}
                    | ({"counted": False} if str(s) in skip else {}),
                    **({"reason": f"{NOT_COUNTED} ({skip[str(s)]})"} if str(s) in skip else {})}
                    for s, b in causal["per_seed"].items()}
                entry["counts"] = count_places(entry["per"])
            else:
                entry["reason"] = causal_reason or ""
        items.append(entry)
    return items, overall(agg)


def count_places(per: Mapping[str, Mapping]) -> dict[str, int]:
    """Counts of one item's places: ``{"pass", "fail", "inconclusive", "not_counted"}``.

    ``per`` is an item's ``per`` map (place -> ``{"verdict", "numbers", ...}``); a place whose
    numbers say ``counted: false`` (an unmeasurable cell) adds to ``not_counted`` only, and
    ``reported``/``not_run`` places add to nothing.
    """
    out = {PASS: 0, FAIL: 0, INCONCLUSIVE: 0, "not_counted": 0}
    for v in per.values():
        if (v.get("numbers") or {}).get("counted") is False:
            out["not_counted"] += 1
        elif v.get("verdict") in out:
            out[v["verdict"]] += 1
    return out


def results_counts(tasks: Mapping[str, Mapping]) -> dict[str, dict]:
    """Per counted item, its places' counts summed over the tasks of a results file.

    Returns ``{str(item): {"key", "pass", "fail", "inconclusive", "not_counted", "measurable",
    "verdict"}}`` for :data:`COUNTED_ITEMS` (``measurable`` = pass + fail + inconclusive;
    ``verdict`` combines the item's task verdicts). Items without ``counts`` (results written
    before measurable cells) are counted from their ``per`` places, every place counted.
    """
    out: dict[str, dict] = {}
    for task in tasks.values():
        for it in task.get("checklist") or []:
            if it.get("item") not in COUNTED_ITEMS or not ("counts" in it or "per" in it):
                continue
            counts = it.get("counts") or count_places(it["per"])  # older results: every place
            d = out.setdefault(str(it["item"]), {"key": it["key"], PASS: 0, FAIL: 0,
                                                  INCONCLUSIVE: 0, "not_counted": 0,
                                                  "verdicts": []})
            for k in (PASS, FAIL, INCONCLUSIVE, "not_counted"):
                d[k] += int(counts.get(k, 0))
            d["verdicts"].append(it["verdict"])
    for d in out.values():
        d["measurable"] = d[PASS] + d[FAIL] + d[INCONCLUSIVE]
        d["verdict"] = combine(d.pop("verdicts"))
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def counts_line(item: str, c: Mapping) -> str:
    """One item's counts in words, e.g. ``item 10 (causal): 10 of 11 measurable places pass``."""
    line = (f"item {item} ({c['key']}): {c[PASS]} of {c['measurable']} measurable places pass, "
            f"{c[FAIL]} fail, {c[INCONCLUSIVE]} inconclusive")
    return line + (f" ({c['not_counted']} not counted)" if c.get("not_counted") else "")


def counts_short(counts: Mapping[str, Mapping]) -> str:
    """All items' counts in a compact cell: ``1: 9/11 2: 20/24 ... 10: 10/11`` (pass/measurable)."""
    return " ".join(f"{i}: {c[PASS]}/{c['measurable']}" for i, c in counts.items())


#: what the strict overall verdict means, per verdict
VERDICT_MEANING = {
    PASS: "every gated item passed on every measurable seed and draw of every task",
    FAIL: "at least one gated item failed on at least one measurable seed or draw (the counts "
          "say how many of each item's places pass); unmeasurable cells were not counted",
    INCONCLUSIVE: "nothing counted failed, but at least one gated item could not be decided on "
                  "some measurable seed or draw (interval too wide, or within the cross-machine "
                  "tolerance)",
    NOT_RUN: "the checklist did not run",
}


def verdict_sentence(verdict: str) -> str:
    """One sentence saying what a strict overall verdict means (the summary prints it)."""
    return f"{verdict.upper()}: {VERDICT_MEANING.get(verdict, 'no meaning recorded')}."


# ----------------------------------------------------------------------------------------------
# item 11: the margin over the random reference on runs drawn fresh from the task family


def pool_draws(intervals: list[Mapping[str, float]]) -> dict:
    """The mean of independent draws' causal scores, with its interval: ``{point, lo, hi, n}``.

    Each draw is a separate run, so the draws' errors are independent. Each draw's half-widths
    (``point - lo`` below, ``hi - point`` above) are taken as independent normal errors at the
    interval's level; the mean's half-width is then ``sqrt(sum w_i^2) / n`` on each side. One draw
    keeps its own interval exactly. (The mean of the draws' ``lo`` and ``hi`` would not shrink
    with ``n``, as the error of a mean of independent estimates does.)

    Args:
        intervals: one ``{"point", "lo", "hi"}`` per draw (causal score units: a fraction of the
            bonus-off effect), at least one.

    Raises:
        ValueError: no interval given.
    """
    if not intervals:
        raise ValueError("pool_draws needs at least one draw's interval; got none")
    n = len(intervals)
    if n == 1:  # its own interval, bit for bit
        return {k: float(intervals[0][k]) for k in ("point", "lo", "hi")} | {"n": 1}
    point = sum(float(d["point"]) for d in intervals) / n
    below = math.sqrt(sum((float(d["point"]) - float(d["lo"])) ** 2 for d in intervals)) / n
    above_ = math.sqrt(sum((float(d["hi"]) - float(d["point"])) ** 2 for d in intervals)) / n
    return {"point": point, "lo": point - below, "hi": point + above_, "n": n}


def live_margin(public: Mapping[str, float], live: Mapping[str, float]) -> dict:
    """``live - public`` with its interval ``{point, lo, hi}``; the two runs are independent.

    Independent normal errors again: the lower half-width combines live's lower and public's
    upper half-widths (``sqrt(a^2 + b^2)``), the upper one live's upper and public's lower.
    """
    point = float(live["point"]) - float(public["point"])
    below = math.hypot(float(live["point"]) - float(live["lo"]),
                       float(public["hi"]) - float(public["point"]))
    above_ = math.hypot(float(live["hi"]) - float(live["point"]),
                        float(public["point"]) - float(public["lo"]))
    return {"point": point, "lo": point - below, "hi": point + above_}


def _margin_of(suite: object) -> dict | None:
    """``suite["vs_random"]`` when it is a finite ``{point, lo, hi}``, else None."""
    d = suite.get("vs_random") if isinstance(suite, Mapping) else None
    if not isinstance(d, Mapping) or not _finite(d.get("point"), d.get("lo"), d.get("hi")):
        return None
    return {k: float(d[k]) for k in ("point", "lo", "hi")}


def signed_interval(m: Mapping[str, float]) -> str:
    """``{point, lo, hi}`` as ``+0.123 [+0.100, +0.150]`` (margins and differences)."""
    return f"{m['point']:+.3f} [{m['lo']:+.3f}, {m['hi']:+.3f}]"


def carry_over(public: Mapping[str, float], live: Mapping[str, float] | None,
               tol: float) -> str:
    """Whether a margin over the random reference carries over to other runs: the case.

    Item 11's rule and the fresh-draw gate's (:func:`benchmark.live.live_gate`), in one place.
    ``public`` and ``live`` are margins ``{point, lo, hi}`` (``live`` None: no margin there).
    Returns ``"unclaimed"`` (the public margin's lower end is not above ``tol``), ``"unchecked"``
    (claimed, but there is no live margin), ``"above"`` (the live margin's lower end is above
    ``tol``), ``"fell"`` (the live margin's upper end + ``tol`` lies below the public lower end:
    significantly below the claim) or ``"at the reference"`` (neither: at the random reference
    live, within reach of the claim).
    """
    if not public["lo"] > tol:
        return "unclaimed"
    if live is None:
        return "unchecked"
    if live["lo"] > tol:
        return "above"
    if live["hi"] + tol < public["lo"]:
        return "fell"
    return "at the reference"


def live_item(public_suite: Mapping, live_draws: list[Mapping], est: str,
              tol: float | None = None) -> dict:
    """Item 11 from the public suite and the live (season-panel) draws' suites of one estimator.

    Compares margins over the random reference, never raw scores: the drawn runs are other
    runs than the public ones (other strengths, windows, confounds), usually harder, so every
    method's score moves between them; what must carry over is the margin a method claims
    over random removal. ``suite["vs_random"]`` is that margin, ``{point, lo, hi}``
    (:func:`benchmark.causal.score.band_margins`). The rule is the fresh-draw gate's
    (:func:`benchmark.live.live_gate`) on the pooled draws:

    * **pass** when the public margin is not significantly above 0 (``lo <= tol``: nothing is
      claimed), or when the pooled live margin is (``lo > tol``);
    * **fail** when the public margin is significantly above 0, the live one is not, and the
      live one lies significantly below the public one (``live.hi + tol < public.lo``): the
      public score does not carry over to new runs (an answer key, a memorizer);
    * **inconclusive** otherwise (at the random reference live, within reach of the public
      margin: too little to tell), or when either side has no margin.

    The cases are :func:`carry_over`'s.

    Args:
        public_suite: ``results["suite"]`` with ``vs_random`` ``{point, lo, hi}``.
        live_draws: ``[{"draw_id", "suite", ...}]``, each ``suite`` shaped as ``public_suite``.
        est: the estimator's name (for the reason).
        tol: the cross-machine tolerance (default
            :data:`benchmark.causal.score.CROSS_MACHINE_TOLERANCE`, 0.01).

    Returns:
        ``{"verdict", "public": {point, lo, hi}, "live": {point, lo, hi, n_draws, draw_ids},
        "margin": {point, lo, hi}, "tolerance", "reason"}``: ``public`` and ``live`` are
        margins over the random reference (``live`` pools the draws that have one,
        :func:`pool_draws`) and ``margin`` is ``live - public`` (:func:`live_margin`); None for
        what is missing.
    """
    if tol is None:
        from benchmark.causal.score import CROSS_MACHINE_TOLERANCE

        tol = CROSS_MACHINE_TOLERANCE
    public = _margin_of(public_suite)
    scored = [(d.get("draw_id"), _margin_of(d.get("suite"))) for d in live_draws]
    scored = [(i, c) for i, c in scored if c is not None]
    live = None
    if scored:
        pooled = pool_draws([c for _, c in scored])
        live = {"point": pooled["point"], "lo": pooled["lo"], "hi": pooled["hi"],
                "n_draws": pooled["n"], "draw_ids": [i for i, _ in scored]}
    out = {"public": public, "live": live, "margin": None, "tolerance": tol}
    if public is None:
        return out | {"verdict": INCONCLUSIVE, "reason": "no public margin over the random "
                      "reference to compare with (causal not run)"}
    if live is None:
        why = ("no live draw" if not live_draws else
               f"none of the {len(live_draws)} live draw(s) has a causal score")
        return out | {"verdict": INCONCLUSIVE, "reason": why}
    out["margin"] = live_margin(public, live)
    show = signed_interval
    case = carry_over(public, live, tol)
    if case == "unclaimed":
        return out | {"verdict": PASS, "reason": (
            f"{est} is not significantly above the random reference in public "
            f"({show(public)}, lower end <= {tol}): nothing to carry over")}
    if case == "above":
        return out | {"verdict": PASS, "reason": (
            f"{est} is above the random reference in public ({show(public)}) and on the panel "
            f"({show(live)})")}
    if case == "fell":
        return out | {"verdict": FAIL, "reason": (
            f"{est} is significantly above the random reference in public ({show(public)}) but "
            f"not on the panel ({show(live)}), and significantly below its public margin there "
            f"(upper end + {tol} < {public['lo']:+.3f}): its public score does not carry over "
            "to new runs")}
    return out | {"verdict": INCONCLUSIVE, "reason": (
        f"{est} is at the random reference on the panel ({show(live)}) but not significantly "
        f"below its public margin ({show(public)}): too little to tell")}
