"""The season table: every entry ranked on the season panel's draws (issue 32).

The rank comes from the panel (:mod:`benchmark.submissions.panel`): each entry's panel score is
the mean of its suite causal scores over the panel's draws, with replicates that resample
prompts, random sets and training noise inside each draw and the draws themselves (the same draw
resample for every entry of a season, so entries pair). An entry's rank is 1 + the ranked
entries of its track significantly better than it (paired, as on the public tables). The public
``tiny`` score stands beside it as the development score, with the rank it would have there.
Provisional entries (frozen after the panel, or changed since) are scored and shown, not ranked.
"""

from __future__ import annotations

from typing import Any

from benchmark.contract import TRACKS
from benchmark.leaderboard._common import LeaderboardError, get

__all__ = ["SEASON_TEXT", "rank_moves_text", "season_board", "season_figure_data",
           "season_table"]


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
        entries: submission name -> ``{"track", "kind", "estimator_sha256"}``.
        releases: the board's public release blocks (for the development score and rank).

    Raises:
        LeaderboardError: a panel document of another season, or one whose stored curves do
            not give its recorded scores.
    """
    import numpy as np

    from benchmark.causal.score import interval, paired_difference
    from benchmark.submissions.panel import _suite_of, entry_status, panel_score

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
                               "panel_score": None, "per_draw": {}, "verdict": None,
                               "item11": None, "counts": {}}
        if doc is None:
            row["status"] = "unscored"
            rows[name] = row
            continue
        if doc.get("season") != panel.season:
            raise LeaderboardError(
                f"submission {name!r}: panel.json is of season {doc.get('season')!r}, the panel "
                f"is {panel.season}; re-score it: bt-bench panel score {name}")
        try:
            scored = panel_score([_suite_of(d["results"]) for d in doc["draws"]], panel.season)
        except (KeyError, TypeError) as exc:
            raise LeaderboardError(f"submission {name!r}: panel.json cannot be read ({exc}); "
                                   f"re-score it: bt-bench panel score {name}") from exc
        summary = doc.get("summary") or {}
        if scored is not None:
            reps[name] = scored
            row["panel_score"] = interval(scored[0], scored[1])
        row["per_draw"] = summary.get("per_draw") or {}
        row["counts"] = _panel_counts(doc)
        row["verdict"] = summary.get("verdict")
        row["item11"] = get(summary, "item", "verdict")
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
            "draws": [{"draw_id": d["draw_id"], "trajectory_sha256": d["trajectory_sha256"]}
                      for d in panel.draws],
            "ranked_entries": sorted(panel.entries),
            "tracks": tracks}


def _panel_counts(doc: dict) -> dict[str, dict]:
    """Per checklist item, its measurable places' counts summed over the panel's draws."""
    from benchmark.checklist import results_counts

    out: dict[str, dict] = {}
    for d in doc.get("draws") or []:
        res = d.get("results") or {}
        counts = res.get("checklist_counts") or results_counts(res.get("tasks") or {})
        for item, c in counts.items():
            o = out.setdefault(item, {"key": c["key"], "pass": 0, "fail": 0, "inconclusive": 0,
                                      "not_counted": 0, "measurable": 0})
            for k in ("pass", "fail", "inconclusive", "not_counted", "measurable"):
                o[k] += int(c.get(k, 0))
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def season_figure_data(season: dict, colours: dict[str, dict]) -> dict[str, dict]:
    """Figure path -> spec of each track's panel-vs-public plot (``kind`` ``"season"``)."""
    out = {}
    for table in season["tracks"]:
        rows = [{"name": r["name"], "status": r["status"], "panel": r["panel_score"],
                 "public": r["public"], **colours.get(r["name"], {})}
                for r in table["rows"] if r["panel_score"] is not None]
        if not rows:
            continue
        out[f"figures/season/{table['track']}.png"] = {
            "kind": "season",
            "data": {"season": season["season"], "track": table["track"], "rows": rows},
            "what": (f"season {season['season']}, {table['track']} track: each entry's panel "
                     "score (mean over the panel's draws, 95% interval) beside its public "
                     "development score")}
    return out


#: one paragraph under the season table, in both renderings
SEASON_TEXT = (
    "Ranked on the season panel: every entry is scored on the same draws of the task family, "
    "drawn after the ranked entries were frozen (estimator sha256 and time recorded at submit). "
    "Panel score = mean suite causal score over the draws, 95% interval over prompts, random "
    "sets and draws; rank = 1 + ranked entries of the track significantly better (paired). "
    "`public` is the score on the public `tiny` release: the development score, not ranked "
    "(`dev rank` is the rank it would give). Provisional entries (frozen after the panel) show "
    "in brackets the rank they would have, and are ranked from the next panel on. The board's "
    "verdict is the panel's: `panel checks` counts, per checklist item, the measurable places of "
    "the panel's draws that pass; `item 11`: the margin over the random reference carries over "
    "from the public release to the panel (fails an entry above it in public, at it on the "
    "panel and significantly below its public margin there); `panel verdict` combines every "
    "draw's strict verdict with item 11.")


def _iv_text(d: dict | None) -> str:
    if not d or d.get("point") is None:
        return "-"
    return f"{d['point']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]"


def season_table(season: dict, table: dict) -> tuple[list[str], list[list[str]]]:
    """One track's season table as text: ``(headers, rows)``."""
    from benchmark.checklist import counts_short

    ids = [str(d["draw_id"]) for d in season["draws"]]
    headers = (["rank", "submission", "kind", "status", "panel score [95% CI]"]
               + [f"draw {i}" for i in ids]
               + ["public (dev)", "dev rank", "panel checks (pass/measurable)", "item 11",
                  "panel verdict"])
    rows = []
    for r in table["rows"]:
        rank = r.get("rank")
        shown = "-" if rank is None else (str(rank) if r["status"] == "ranked" else f"({rank})")
        per = [(r["per_draw"].get(i) or {}).get("point") for i in ids]
        rows.append([shown, r["name"], r["kind"], r["status"], _iv_text(r["panel_score"])]
                    + ["-" if p is None else f"{p:.3f}" for p in per]
                    + [_iv_text(r["public"]),
                       "-" if r.get("public_rank") is None else str(r["public_rank"]),
                       counts_short(r["counts"]) if r.get("counts") else "-",
                       r.get("item11") or "-", r.get("verdict") or "-"])
    return headers, rows


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
