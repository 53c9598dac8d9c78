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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PASS, FAIL, INCONCLUSIVE, REPORTED, NOT_RUN = "pass", "fail", "inconclusive", "reported", "not_run"
MAX_WIDTH = 0.15

#: item number -> (key, title)
ITEMS: dict[int, tuple[str, str]] = {
    1: ("magnitude", "beats norm-only and advantage-only (paired interval excludes 0)"),
    2: ("fluency", "beats raw fluency AUC; residualized AUC lower bound > 0.5"),
    3: ("headroom", "precision above chance, reported as lift and fraction of headroom"),
    4: ("timing", "beats the step-order control inside the learning window"),
    5: ("seeds", "all seeds scored; items 1-4 pass on every seed"),
    6: ("draws", ">= 2 independent draws per seed; item 2 passes on every draw"),
    7: ("precision_of_estimate", "the estimator's own intervals are <= 0.15 wide"),
    8: ("ties", "step-granular scores use tie-aware precision (tie-break range reported)"),
    9: ("token_level", "trigger-token gradients align with the in-context target (diagnostic)"),
    10: ("causal", "removing the top rollouts moves the behavior more than controls"),
}
GATED = (1, 2, 3, 4, 5, 6, 7)


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


def combine(verdicts: Iterable[str]) -> str:
    """All pass -> pass; any fail -> fail; otherwise inconclusive (empty -> inconclusive)."""
    vs = list(verdicts)
    if vs and all(v == PASS for v in vs):
        return PASS
    if any(v == FAIL for v in vs):
        return FAIL
    return INCONCLUSIVE


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


def magnitude(diffs: Mapping[str, Mapping[str, float]]) -> Verdict:
    """Item 1 for one seed: ``diffs`` maps control name -> paired precision difference."""
    per = {k: beats(v) for k, v in diffs.items()}
    return Verdict(combine(per.values()), {k: dict(v) | {"verdict": per[k]}
                                           for k, v in diffs.items()})


def fluency(
    raw_diff: Mapping[str, float] | None, residualized: Mapping[str, float] | None
) -> Verdict:
    """Item 2 for one draw: raw AUC minus fluency's raw AUC, and the residualized AUC interval."""
    if raw_diff is None or residualized is None:
        return Verdict(INCONCLUSIVE, {}, "the estimator does not score generation draws")
    v_raw = beats(raw_diff)
    v_res = above(residualized, 0.5)
    return Verdict(combine([v_raw, v_res]), {
        "raw_minus_fluency": dict(raw_diff) | {"verdict": v_raw},
        "residualized_auc": dict(residualized) | {"verdict": v_res},
    })


def headroom(window: Mapping[str, float]) -> Verdict:
    """Item 3 for one seed: precision interval in the learning window must clear chance."""
    return Verdict(above(window, window["chance"]), dict(window))


def timing(diff: Mapping[str, float]) -> Verdict:
    """Item 4 for one seed: paired precision difference against step-order in the window."""
    return Verdict(beats(diff), dict(diff))


def precision_of_estimate(widths: Mapping[str, float]) -> Verdict:
    """Item 7: the estimator's own intervals (precision per seed, AUC per draw) <= ``MAX_WIDTH``."""
    too_wide = {k: w for k, w in widths.items() if not w <= MAX_WIDTH}  # NaN counts as wide
    finite = [w for w in widths.values() if _finite(w)]
    worst = max(finite) if finite else None
    return Verdict(PASS if not too_wide else INCONCLUSIVE,
                   {"max_width": worst, "limit": MAX_WIDTH, "too_wide": too_wide})


def overall(items: Mapping[int, str]) -> str:
    """Overall verdict from the aggregated gated items (10 counts once it has run)."""
    gated = [items[i] for i in GATED if i in items]
    if 10 in items and items[10] not in (REPORTED, NOT_RUN):
        gated.append(items[10])
    return combine(gated)


def _finite(*values: float | None) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)
