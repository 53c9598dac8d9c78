"""The fresh-draw gate of ``bt-bench verify``: every entry on one draw nobody chose in advance.

Each verify run scores every entry on one new draw (``--live-draw``, ``$BT_BENCH_LIVE_DRAW``, else
an id drawn now) and fails an entry whose public claim collapses there
(:func:`benchmark.live.live_gate`). Attack controls must be caught: verify fails one the gate lets
through, so the mechanism proves itself on every run.
"""

from __future__ import annotations

from pathlib import Path

from benchmark.errors import BenchmarkError
from benchmark.submissions.files import Submission, _is_attack_file

#: attack controls (submission name) and the entry each is built on: on the season panel an
#: attack must rank no higher than its base (:func:`attack_panel_checks`)
ATTACK_BASES = {"public-tuned-tracincp": "tracincp", "label-first": "tracincp"}


def _is_attack_control(sub: Submission) -> bool:
    """True when ``sub`` is a control whose file is one of :data:`ATTACK_CONTROLS_DIR`'s."""
    return sub.meta.get("kind") == "control" and _is_attack_file(sub.estimator_file)


def live_check(sub: Submission, fresh: dict, draw_id: int, scale: str | None, progress: bool,
               limits, env, report) -> None:
    """Score ``sub`` on live draw ``draw_id`` and apply :func:`benchmark.live.live_gate`.

    The live margin (suite causal score minus the random reference) is the new draw's pooled
    with the entry's season-panel draws (:func:`benchmark.checklist.pool_draws`): one run can
    be hard for an honest method (season 2026-12-07-77e84f: on draw 1315847760 no cell was
    measurable and every method fell to the random reference; on 1645512152 TRAK's margin was
    +0.012 [+0.003, +0.021]), an answer key collapses on every fresh run. Without a causal score
    on any of them the gate decides nothing (``decided: False``). The outcome goes to
    ``report.live_check`` (and a fix to ``report.fix`` when it fails).
    """
    from benchmark import live
    from benchmark.causal.score import CROSS_MACHINE_TOLERANCE

    scale = scale or live.LIVE_SCALE
    cmd = f"bt-bench verify {sub.path} --live-draw {draw_id}" + (
        f" --live-scale {scale}" if scale != live.LIVE_SCALE else "")
    check = {"draw_id": int(draw_id), "scale": scale, "reproduce": cmd}
    est = fresh["estimator"]["name"]
    answer_key = _is_attack_control(sub) and Path(sub.path).name not in ATTACK_BASES
    if sub.meta.get("kind") == "control" and not _is_attack_control(sub):
        # the evaluator's own controls are trusted reference methods, re-scored from
        # estimators/controls on the public release and every panel draw: the gate has nothing
        # to catch in them, so they are not scored on its draw (it keeps CI short)
        report.live_check = check | {"ok": True, "gated": False,
                                     "reason": "control, not gated (trusted code, scored on the "
                                               "public release and every panel draw)"}
        return
    try:
        rec = live.score_live(sub.estimator_file, draw_id, scale, progress, isolation=limits,
                              env=env)
    except BenchmarkError as exc:
        report.live_check = check | {"ok": False,
                                     "reason": f"{est}: scoring on the live draw failed: {exc}"}
        return
    margins = [(int(draw_id), rec["suite"].get("vs_random"))] + [
        (d, m) for d, m in _panel_margins(sub) if d != int(draw_id)]  # each run once
    scored = [(d, m) for d, m in margins if m is not None]
    if not scored:
        # no draw shows an effect attribution can find (no causal score): nothing to decide,
        # for an answer key as for a method
        report.live_check = check | {"ok": True, "decided": False, "reason": (
            f"{est}: no causal score on the new draw or the panel's draws; nothing to compare")}
        return
    from benchmark.checklist import pool_draws

    pooled = pool_draws([m for _, m in scored]) if len(scored) > 1 else scored[0][1]
    ok, reason = live.live_gate(fresh["suite"], {"vs_random": pooled}, est,
                                CROSS_MACHINE_TOLERANCE)
    if len(scored) > 1:
        reason += (f" (live margin pooled over the new draw and the season panel's draws: "
                   f"{', '.join(str(d) for d, _ in scored)})")
    check["pooled_over"] = [d for d, _ in scored]
    if answer_key:
        # an answer-key attack control (the memorizer: no method behind it) exists to be caught:
        # verify fails it when the live check lets it through, so the mechanism proves itself on
        # every run; an attack built on a method (ATTACK_BASES) is that method on this draw and
        # is gated like an entry, its rank checked on the panel (attack_panel_checks)
        report.live_check = check | {
            "ok": not ok, "expected": "fail",
            "reason": ("attack control, caught as expected: " + reason) if not ok else
                      ("attack control NOT caught (the live check should fail it): " + reason)}
        if ok and report.fix is None:
            report.fix = ("the live check no longer tells this answer key from a method: see "
                          "docs/evaluation.md (Live draws) before changing benchmark/live.py.")
        return
    report.live_check = check | {"ok": ok, "reason": reason}
    if not ok and report.fix is None:
        report.fix = ("the entry's public score does not carry over to a run it has not seen: "
                      "run the reproduce command, and make the estimator attribute from the run "
                      "it is given (public labels or references do not transfer).")


def _panel_margins(sub: Submission) -> list[tuple[int, dict | None]]:
    """``(draw id, suite vs_random)`` of each draw of the entry's ``panel.json`` (none without)."""
    from benchmark.io import read_json
    from benchmark.submissions.panel import PANEL_FILE

    f = Path(sub.path) / PANEL_FILE
    if not f.is_file():
        return []
    try:
        return [(int(d["draw_id"]), d["results"]["suite"].get("vs_random"))
                for d in read_json(f)["draws"]]
    except (BenchmarkError, KeyError, TypeError, ValueError):
        return []  # verify's panel check reports a malformed file


def attack_panel_checks(reports: list, panel) -> None:
    """Attack controls on the season panel: each must rank no higher than its base method.

    For every report of an attack control named in :data:`ATTACK_BASES` whose base was verified
    beside it, the attack's panel score must not be significantly above the base's (the paired
    panel comparison of :func:`benchmark.submissions.panel.panel_pair`). A failure is recorded in
    the attack's report: public answers bought rank on runs they do not describe.
    """
    from benchmark.checklist import signed_interval
    from benchmark.io import read_json
    from benchmark.submissions.panel import PANEL_FILE, panel_pair

    by_name = {Path(r.path).name: r for r in reports}
    for attack, base in ATTACK_BASES.items():
        ra, rb = by_name.get(attack), by_name.get(base)
        if ra is None or rb is None or not ra.ok or not rb.ok:
            continue
        try:
            a = read_json(Path(ra.path) / PANEL_FILE)
            b = read_json(Path(rb.path) / PANEL_FILE)
            diff = panel_pair(a, b, panel.season)
        except (BenchmarkError, KeyError, TypeError, ValueError) as exc:
            ra.error = f"attack control: its panel rank could not be compared with {base}'s ({exc})"
            continue
        if diff is None:
            continue
        shown = signed_interval(diff)
        if diff["verdict"] == "better":
            ra.error = (f"attack control ranks above its base {base!r} on the season panel "
                        f"(panel score difference {shown}): public answers bought rank")
            ra.fix = ("the panel no longer tells an answer key from its base method: see "
                      "docs/leaderboard.md (Seasons) before changing the panel or the ranking")
        else:
            ra.notes.append(f"attack control on the season panel: not above {base} "
                            f"({shown}), as expected")
