"""The season panel's verdict (issue 39): per item over every panel draw, then per entry.

Each counted item is decided over its measurable places on every panel draw; the entry's panel
verdict combines those items with item 11. Split from :mod:`benchmark.checklist` (the per-task
checklist and item 11), whose item numbers it reads; :mod:`benchmark.submissions.panel` and the
season board call it. The rule is stated in ``docs/evaluation.md`` ("The panel verdict").
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from benchmark.checklist import COUNTED_ITEMS, ITEMS
from benchmark.verdicts import FAIL, INCONCLUSIVE, PASS, combine

#: the panel verdict's items: the counted task items and, once per entry, item 11
PANEL_ITEMS = COUNTED_ITEMS
#: the panel rule, as the board and docs/evaluation.md state it
PANEL_RULE = ("per counted item (1, 2, 3, 4, 10), over its measurable places on every panel draw: "
              "pass when it passes on more than half of them and fails significantly on none; "
              "fail when it fails on more than half of them; inconclusive otherwise (no "
              "measurable place, or mixed); the panel verdict combines these items with item 11 "
              "(any fail: fail; all pass: pass; else inconclusive)")
#: how many failing places a panel item lists (the board shows where an item fails)
MAX_LISTED = 24


def _below(d: object, bar: float) -> bool:
    """Whether an interval ``{lo, hi}`` lies wholly below ``bar`` (finite ``hi < bar``)."""
    hi = d.get("hi") if isinstance(d, Mapping) else None
    return isinstance(hi, int | float) and not isinstance(hi, bool) and math.isfinite(hi) \
        and hi < bar


def significant_fail(item: int, place: Mapping, tol: float | None = None) -> bool:
    """Whether a failed place of a counted item fails **significantly**.

    Its deciding interval lies wholly on the failing side of its bar, not merely short of
    clearing it.

    A ``fail`` verdict also covers an interval that straddles the bar and is narrow (the method
    is precisely not better than the control); a significant failure is one where it is worse:

    * item 1: a comparison with norm-only or advantage-only that failed, with ``hi < 0``;
    * item 2: the raw AUC minus fluency's with ``hi < 0``, or the residualized AUC with
      ``hi < 0.5``;
    * item 3: precision with ``hi < chance``, or the causal gate failed (the causal score's
      margin over the random reference lies below ``-tol``);
    * item 4: the difference with step-order with ``hi < 0``, or the causal gate failed;
    * item 10: a failed check whose comparison has ``hi < -tol`` (the cross-machine tolerance,
      as item 10 itself uses).

    Args:
        item: the item number.
        place: one place of the item's ``per`` map (``{"verdict", "numbers", ...}``).
        tol: the cross-machine tolerance (default
            :data:`benchmark.causal.score.CROSS_MACHINE_TOLERANCE`).
    """
    if place.get("verdict") != FAIL:
        return False
    if tol is None:
        from benchmark.causal.score import CROSS_MACHINE_TOLERANCE

        tol = CROSS_MACHINE_TOLERANCE
    n = place.get("numbers") or {}
    gate = (n.get("causal_gate") or {}).get("verdict") == FAIL
    if item == 1:
        return any(isinstance(v, Mapping) and v.get("verdict") == FAIL and _below(v, 0.0)
                   for v in n.values())
    if item == 2:
        raw, res = n.get("raw_minus_fluency") or {}, n.get("residualized_auc") or {}
        return (raw.get("verdict") == FAIL and _below(raw, 0.0)) or \
            (res.get("verdict") == FAIL and _below(res, 0.5))
    if item == 3:
        chance = n.get("chance")
        return gate or (isinstance(chance, int | float) and _below(n, float(chance)))
    if item == 4:
        return gate or _below(n, 0.0)
    if item == 10:
        checks, comps = n.get("checks") or {}, n.get("comparisons") or {}
        return any(v == FAIL and _below(comps.get(k), -tol) for k, v in checks.items())
    return False


def panel_items(draws: list[tuple[int, Mapping]]) -> dict[str, dict]:
    """The panel rule per counted item, over every draw's measurable places.

    Args:
        draws: ``[(draw id, results)]``: the entry's results document on each panel draw.

    Returns:
        ``{str(item): {"key", "verdict", "pass", "fail", "significant_fail", "inconclusive",
        "measurable", "not_counted", "failing": [{"place", "significant"}]}}`` for
        :data:`PANEL_ITEMS`; a place is ``"<draw>/<task>/<place>"``; ``failing`` lists up to
        :data:`MAX_LISTED` failed places (significant ones first). The rule is
        :data:`PANEL_RULE`.
    """
    out: dict[str, dict] = {}
    for i in PANEL_ITEMS:
        out[str(i)] = {"key": ITEMS[i][0], PASS: 0, FAIL: 0, "significant_fail": 0,
                       INCONCLUSIVE: 0, "not_counted": 0, "failing": []}
    for did, res in draws:
        for task, tb in sorted(((res or {}).get("tasks") or {}).items()):
            for it in tb.get("checklist") or []:
                i = it.get("item")
                if i not in PANEL_ITEMS:
                    continue
                o = out[str(i)]
                for place, v in sorted((it.get("per") or {}).items()):
                    if not isinstance(v, Mapping):
                        continue
                    if (v.get("numbers") or {}).get("counted") is False:
                        o["not_counted"] += 1
                        continue
                    verdict = v.get("verdict")
                    if verdict not in (PASS, FAIL, INCONCLUSIVE):
                        continue
                    o[verdict] += 1
                    if verdict == FAIL:
                        sig = significant_fail(i, v)
                        o["significant_fail"] += int(sig)
                        o["failing"].append({"place": f"{did}/{task}/{place}",
                                             "significant": sig})
    for o in out.values():
        m = o[PASS] + o[FAIL] + o[INCONCLUSIVE]
        o["measurable"] = m
        o["failing"] = sorted(o["failing"], key=lambda f: (not f["significant"],
                                                           f["place"]))[:MAX_LISTED]
        o["verdict"] = panel_rule(o[PASS], o[FAIL], o["significant_fail"], m)
    return out


def panel_rule(passed: int, failed: int, significant: int, measurable: int) -> str:
    """One item's panel verdict from its counts (:data:`PANEL_RULE`).

    ``pass`` when ``2 * passed > measurable`` and ``significant == 0``; ``fail`` when
    ``2 * failed > measurable``; ``inconclusive`` otherwise (``measurable == 0`` included).
    """
    if measurable <= 0:
        return INCONCLUSIVE
    if 2 * passed > measurable and significant == 0:
        return PASS
    if 2 * failed > measurable:
        return FAIL
    return INCONCLUSIVE


def panel_verdict(items: Mapping[str, Mapping], item11: str | None) -> str:
    """The panel verdict: :func:`benchmark.verdicts.combine` of the panel items and item 11."""
    vs = [str(o["verdict"]) for o in items.values()]
    if item11 is not None:
        vs.append(item11)
    return combine(vs)
