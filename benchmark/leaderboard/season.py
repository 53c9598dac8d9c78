"""The season table: every entry ranked on the season panel's draws (issues 32, 39).

The rank comes from the panel (:mod:`benchmark.submissions.panel`): each entry's panel score is
the mean of its suite causal scores over the panel's draws, with replicates that resample
prompts, random sets and training noise inside each draw, **the draws held fixed** (the draws are
the season's test set; :func:`benchmark.submissions.panel.panel_score`). An entry's rank is 1 +
the ranked entries of its track significantly better than it (paired, as on the public tables).
Beside it stands the **family interval**, which also resamples the draws (how far the panel's
ordering is expected to carry to other runs of the screened family); it does not rank. The
public ``tiny`` score stands beside them as the development score, with the rank it would have
there. Provisional entries (frozen after the panel, or changed since) are scored and shown, not
ranked. The verdict is the panel's rule per item (:func:`benchmark.panel_rule.panel_items`), with
its counts; where an estimator fails an item, the table's notes say on which cells.
"""

from __future__ import annotations

from typing import Any

from benchmark.contract import TRACKS
from benchmark.leaderboard._common import LeaderboardError, get

__all__ = ["SEASON_TEXT", "failure_notes", "rank_moves_text", "season_board",
           "season_figure_data", "season_header", "season_table"]


def _public_ranks(releases: list[dict]) -> dict[str, dict]:
    """Name -> ``{"rank", "causal_score"}`` on the public release's suite tables."""
    out: dict[str, dict] = {}
    for rel in releases:
        for table in rel["suite"]["tracks"]:
            for r in table["rows"]:
                out[r["name"]] = {"rank": r.get("rank"), "causal_score": r.get("causal_score"),
                                  "release": rel["id"]}
    return out


def season_board(panel: Any, docs: dict[str, dict], entries: dict[str, dict],
                 releases: list[dict]) -> dict | None:
    """The ``season`` block of ``leaderboard.json`` (None without a panel).

    Args:
        panel: the :class:`~benchmark.submissions.panel.Panel`, or None.
        docs: submission name -> its ``panel.json`` (entries without one are listed as unscored).
        entries: submission name -> ``{"track", "kind", "estimator_sha256"}`` (and optionally
            ``"cost"``, shown as the time column).
        releases: the board's public release blocks (for the development score and rank).

    Raises:
        LeaderboardError: a panel document of another season, or one whose stored curves do
            not give its recorded scores.
    """
    import numpy as np

    from benchmark.causal.score import interval, paired_difference
    from benchmark.panel_rule import panel_items, panel_verdict
    from benchmark.submissions.panel import _suite_of, entry_status, family_score, panel_score
    from benchmark.submissions.seasons import entry_power

    if panel is None:
        return None
    public = _public_ranks(releases)
    reps: dict[str, tuple[float, np.ndarray]] = {}
    rows: dict[str, dict] = {}
    for name in sorted(entries):
        e = entries[name]
        doc = docs.get(name)
        row: dict[str, Any] = {"name": name, "kind": e["kind"], "track": e["track"],
                               "status": entry_status(panel, name, e["estimator_sha256"]),
                               "public": public.get(name, {}).get("causal_score"),
                               "public_rank": public.get(name, {}).get("rank"),
                               "panel_score": None, "family": None, "per_draw": {},
                               "verdict": None, "item11": None, "items": {},
                               "cost": e.get("cost")}
        if doc is None:
            row["status"] = "unscored"
            rows[name] = row
            continue
        if doc.get("season") != panel.season:
            raise LeaderboardError(
                f"submission {name!r}: panel.json is of season {doc.get('season')!r}, the panel "
                f"is {panel.season}; re-score it: bt-bench panel score {name}")
        try:
            suites = [_suite_of(d["results"]) for d in doc["draws"]]
            items = panel_items([(d["draw_id"], d["results"]) for d in doc["draws"]])
        except (KeyError, TypeError) as exc:
            raise LeaderboardError(f"submission {name!r}: panel.json cannot be read ({exc}); "
                                   f"re-score it: bt-bench panel score {name}") from exc
        scored, fam = panel_score(suites), family_score(suites, panel.season)
        summary = doc.get("summary") or {}
        if scored is not None:
            reps[name] = scored
            row["panel_score"] = interval(scored[0], scored[1])
            row["family"] = interval(fam[0], fam[1])
        row["per_draw"] = summary.get("per_draw") or {}
        row["items"] = items
        row["item11"] = get(summary, "item", "verdict")
        row["verdict"] = panel_verdict(items, row["item11"])
        rows[name] = row
    tracks = []
    for tr in TRACKS:
        names = [n for n in sorted(rows) if rows[n]["track"] == tr]
        if not names:
            continue
        ranked = [n for n in names if rows[n]["status"] == "ranked" and n in reps]
        pw = {a: {b: paired_difference(reps[a], reps[b]) for b in names if b != a and b in reps}
              for a in names if a in reps}
        for n in names:
            r = rows[n]
            r["rank"], r["better_than"] = None, []
            if n not in reps:
                continue
            # a provisional entry gets the rank it would have among the ranked ones (shown in
            # brackets); only ranked rows hold a place
            r["rank"] = 1 + sum(pw[m][n]["verdict"] == "better" for m in ranked if m != n)
            r["better_than"] = sorted(m for m in ranked if m != n
                                      and pw[n][m]["verdict"] == "better")
        order = sorted(names, key=lambda n: (rows[n]["status"] != "ranked",
                                             rows[n].get("rank") or 10**6,
                                             -(rows[n]["panel_score"] or {"point": -1e9})["point"],
                                             n))
        moves = [{"name": n, "public_rank": rows[n]["public_rank"], "panel_rank": rows[n]["rank"]}
                 for n in order if rows[n]["status"] == "ranked"
                 and rows[n].get("public_rank") is not None and rows[n].get("rank") is not None]
        tracks.append({"track": tr, "rows": [rows[n] for n in order], "pairwise": pw,
                       "rank_moves": moves})
    return {"season": panel.season, "created_utc": panel.created_utc,
            "family_version": panel.family_version, "scale": panel.scale,
            "rotation": panel.to_dict()["rotation"],
            "draws": [{"draw_id": d["draw_id"], "trajectory_sha256": d["trajectory_sha256"],
                       "cells": sorted(d.get("cells") or {})} for d in panel.draws],
            "screen": {"rule": panel.screen.get("rule"), "candidates": len(panel.candidates),
                       "accepted": len(panel.draws), "cells": panel.n_cells,
                       "min_cells": panel.min_cells,
                       "rejected": [{"draw_id": c["draw_id"], "reason": c["reason"]}
                                    for c in panel.candidates if not c["accepted"]]},
            "power": {"entries": entry_power(docs), "design": (panel.power or {}).get("design")},
            "ranked_entries": sorted(panel.entries),
            "tracks": tracks}


def season_figure_data(season: dict, colours: dict[str, dict]) -> dict[str, dict]:
    """Figure path -> spec of each track's panel-vs-public plot (``kind`` ``"season"``)."""
    out = {}
    for table in season["tracks"]:
        rows = [{"name": r["name"], "status": r["status"], "panel": r["panel_score"],
                 "family": r.get("family"), "public": r["public"],
                 **colours.get(r["name"], {})}
                for r in table["rows"] if r["panel_score"] is not None]
        if not rows:
            continue
        out[f"figures/season/{table['track']}.png"] = {
            "kind": "season",
            "data": {"season": season["season"], "track": table["track"], "rows": rows},
            "what": (f"season {season['season']}, {table['track']} track: each entry's panel "
                     "score (mean over the panel's draws, 95% interval with the draws fixed), "
                     "its family interval and its public development score")}
    return out


#: one paragraph under the season table, in both renderings
SEASON_TEXT = (
    "Ranked on the season panel: every entry is scored on the same draws of the task family, "
    "drawn after the ranked entries were frozen (estimator sha256 and time recorded at submit) "
    "and screened before any entry was scored (every cell of a draw must show the planted "
    "effect from its causal reference alone). Panel score = mean suite causal score over the "
    "draws, 95% interval over prompts, random sets and training noise with the draws held "
    "fixed (the season's test set); rank = 1 + ranked entries of the track significantly "
    "better (paired). `family` is the interval that also resamples the draws (how far the "
    "ordering carries to other runs of the family); it does not rank. `public` is the score on "
    "the public `tiny` release: the development score, not ranked (`dev rank` is the rank it "
    "would give). Provisional entries (frozen after the panel) show in brackets the rank they "
    "would have. `panel checks`: per checklist item, the measurable places of the panel's "
    "draws that pass / fail (significantly) / measurable, and the item's panel verdict: pass "
    "when it passes on more than half and fails significantly on none, fail when it fails on "
    "more than half, else inconclusive; `item 11`: the margin over the random reference carries "
    "over from the public release to the panel; `panel verdict` combines the items and item 11. "
    "`time`: the entry's scoring time on `tiny` (2-core CPU).")


def season_header(season: dict) -> list[str]:
    """The lines above the season tables (plain text; the renderers escape them)."""
    from benchmark.submissions.seasons import power_lines

    sc = season.get("screen") or {}
    out = [f"Screen: {sc.get('candidates', '-')} candidate draws screened in the season seed's "
           f"sequence, {sc.get('accepted', '-')} accepted, {sc.get('cells', '-')} measurable "
           f"cells (at least {sc.get('min_cells', '-')}); rejected: "
           + ("; ".join(f"{r['draw_id']} ({r['reason'][:160]})" for r in sc.get("rejected", []))
              or "none") + "."]
    out += [line + "." for line in power_lines(season.get("power") or {})]
    return out


def _iv_text(d: dict | None) -> str:
    if not d or d.get("point") is None:
        return "-"
    return f"{d['point']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]"


def _counts_cell(items: dict) -> str:
    """``1: 9/0/12 pass ...``: per item, pass/significant fails/measurable and the verdict."""
    return " ".join(f"{i}: {o['pass']}/{o['significant_fail']}/{o['measurable']} {o['verdict']}"
                    for i, o in items.items())


def _time_cell(cost: dict | None) -> str:
    """The entry's ``score_rollouts`` seconds on ``tiny``, as the public time column writes it."""
    from benchmark.leaderboard.columns import time_cell

    return time_cell(cost).text


def season_table(season: dict, table: dict) -> tuple[list[str], list[list[str]]]:
    """One track's season table as text: ``(headers, rows)``."""
    ids = [str(d["draw_id"]) for d in season["draws"]]
    headers = (["rank", "submission", "kind", "status", "panel score [95% CI]", "family [95%]"]
               + [f"draw {i}" for i in ids]
               + ["public (dev)", "dev rank", "panel checks (pass/sig. fail/measurable)",
                  "item 11", "panel verdict", "time (s, tiny)"])
    rows = []
    for r in table["rows"]:
        rank = r.get("rank")
        shown = "-" if rank is None else (str(rank) if r["status"] == "ranked" else f"({rank})")
        per = [(r["per_draw"].get(i) or {}).get("point") for i in ids]
        rows.append([shown, r["name"], r["kind"], r["status"], _iv_text(r["panel_score"]),
                     _iv_text(r.get("family"))]
                    + ["-" if p is None else f"{p:.3f}" for p in per]
                    + [_iv_text(r["public"]),
                       "-" if r.get("public_rank") is None else str(r["public_rank"]),
                       _counts_cell(r["items"]) if r.get("items") else "-",
                       r.get("item11") or "-", r.get("verdict") or "-",
                       _time_cell(r.get("cost"))])
    return headers, rows


def failure_notes(table: dict) -> list[str]:
    """Where each estimator (not a control) fails a panel item: the item, counts, failing cells.

    Every panel cell passed the screen (the labels' removal clears random removal there), so a
    failure on it belongs to the method, not to the draw.
    """
    out = []
    for r in table["rows"]:
        if r["kind"] != "estimator" or not r.get("items"):
            continue
        bad = [(i, o) for i, o in r["items"].items() if o["verdict"] == "fail"]
        if not bad:
            continue
        parts = []
        for i, o in bad:
            where = ", ".join(f["place"] + (" (significant)" if f["significant"] else "")
                              for f in o["failing"][:4])
            more = o["fail"] - min(4, len(o["failing"]))
            parts.append(f"item {i} ({o['key']}) {o['verdict']}: passes {o['pass']}, fails "
                         f"{o['fail']} ({o['significant_fail']} significantly), inconclusive "
                         f"{o['inconclusive']} of {o['measurable']} measurable places"
                         + (f"; fails at {where}" if where else "")
                         + (f" and {more} more" if more > 0 else ""))
        out.append(f"{r['name']}: " + "; ".join(parts) + ".")
    return out


def rank_moves_text(table: dict) -> str:
    """How far ranks moved from the public release to the panel, in one sentence."""
    moves = table["rank_moves"]
    if not moves:
        return "No ranked entry has both a public and a panel rank."
    moved = [m for m in moves if m["public_rank"] != m["panel_rank"]]
    total = sum(abs(m["public_rank"] - m["panel_rank"]) for m in moves)
    detail = "; ".join(f"{m['name']} {m['public_rank']} -> {m['panel_rank']}" for m in moved)
    return (f"Ranks from the public release to the panel: {len(moved)} of {len(moves)} ranked "
            f"entries moved (sum of |moves| {total})" + (f": {detail}." if detail else "."))
