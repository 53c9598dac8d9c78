"""The verdict words, the interval-width rule and how verdicts combine (checklist, causal score)."""

from __future__ import annotations

from collections.abc import Iterable

PASS, FAIL, INCONCLUSIVE, REPORTED, NOT_RUN = "pass", "fail", "inconclusive", "reported", "not_run"
#: an interval wider than this cannot decide (the paper's pre-registered 0.15 rule)
MAX_WIDTH = 0.15


def combine(verdicts: Iterable[str]) -> str:
    """All pass -> pass; any fail -> fail; otherwise inconclusive (empty -> inconclusive)."""
    vs = list(verdicts)
    if vs and all(v == PASS for v in vs):
        return PASS
    if any(v == FAIL for v in vs):
        return FAIL
    return INCONCLUSIVE
