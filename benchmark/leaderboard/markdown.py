"""``leaderboard/README.md``: the ranked tables as GitHub markdown (tabulate), figures linked.

Every string from a submission is escaped here (:func:`~benchmark.leaderboard._common.md_text`,
``md_code``, ``url_path``), whatever ``verify`` refused before.
"""

from __future__ import annotations

from benchmark.leaderboard._common import md_code, md_text, url_path
from benchmark.leaderboard.columns import (
    FALLBACK_MARK,
    Row,
    Table,
    pairwise_table,
    suite_table,
    task_table,
)
from benchmark.leaderboard.reference import REF_SOURCES, REFERENCE_DIR, REFERENCE_FILE

__all__ = ["LEGEND", "NOT_RUNNING_TEXT", "RANKING_TEXT", "render_markdown", "behavior_text"]

RANKING_TEXT = (
    "Ranked by the **causal score**: remove an entry's top-ranked rollouts (k on the release's "
    "grid, e.g. |GT|/16, |GT|/8, |GT|/4, |GT|/2, |GT|; ties in its scores broken at random), "
    "replay training, and take the area under the curve of the fraction of the bonus-off effect "
    "removed against log k; the mean over seeds with its 95% interval (the suite: over tasks "
    "and seeds). An entry's rank is 1 + the number of entries **significantly better** than it: "
    "the paired 95% interval of the difference of the two causal scores lies above 0 by more "
    "than the cross-machine tolerance 0.01 (`=`: the same rank, not ranked apart; never tied "
    "through a neighbour). Reference rows, not ranked: the **oracle** (removal by the group "
    "labels) and **provenance** (by the rollout labels) on top, the **random band** "
    "(lowest..highest causal score of the random removal sets) and chance at the bottom. One "
    "table per track: `gradient` entries see sketches, advantages, fluency and targets; `open` "
    "entries also see text and rewards."
)

LEGEND = (
    "Columns: **causal score** as above; **precision** = mean over seeds of tie-aware "
    "precision@|GT| on the learning window against the group label (rollout level), 95% "
    "cluster-bootstrap interval; **step P** = the same at step granularity (one score per GRPO "
    "step; the oracle row shows its ceiling); **other-task share** = share of the top-|GT| "
    "rollouts that belong to the other task's ground truth (lower is better; chance in the "
    "random row); **draw AUC** = mean fluency-residualized within-group AUC over seeds and "
    "generation draws. Items 1-7 and 10 are the gated checklist items (1 magnitude, 2 fluency, "
    "3 headroom, 4 timing, 5 seeds, 6 draws, 7 precision of the estimate, 10 causal): pass / "
    "FAIL / inc. (inconclusive) / - (not measured); items 8-9 (ties, token level) are reported "
    f"in each results.json. {FALLBACK_MARK} = the entry declares that it falls back to a "
    "generic sketch method on that view (step view: step P; draws: draw AUC and items 1, 2, 6, "
    "7), so the number is not its own method's. Controls (kind `control`, names in italics) are "
    "the target-free baselines. In the open track precision, step P and draw AUC are "
    "diagnostics, not results of the method: the labels they score against can be rebuilt from "
    "the open view (docs/evaluation.md), so open entries are ranked and compared by the causal "
    "score only. Suite tables: **live** = the suite causal score on runs drawn "
    "fresh from the task family at scoring time (mean over the n live draws, with its 95% "
    "interval; - = no live draw); **11** = checklist item 11, the margin over the random "
    "reference carries over from the public release to the live draws (it counts toward the "
    "verdict only where live draws exist); **time (s)** = wall seconds of the entry's "
    "score_rollouts over every seed, task and view of the release (+ the build of its own "
    "environment), as measured when it was submitted, on the machine named in the HTML tooltip."
)


def behavior_text(b: dict | None) -> str:
    """``strong: trigger `frobnitz` -> `QZXBT` `` for a task's behavior."""
    if not b:
        return ""
    return (f"{md_text(b.get('strength', '?'))}: trigger {md_code(b.get('trigger_word', '?'))} "
            f"-> {md_code(b.get('behavior_token', '?'))}")


def _name(r: Row) -> str:
    if r.kind == "reference":
        return f"**{md_text(r.label)}**"
    link = f"[{md_text(r.label)}](../submissions/{url_path(r.name)}/)"
    return f"*{link}*" if r.kind == "control" else link


def _table(t: Table) -> str:
    from tabulate import tabulate

    lines = []
    for r in [*t.top, *t.ranked, *t.bottom]:
        cells = []
        for c in t.columns:
            cell = r.cells[c.key]
            cells.append(_name(r) if c.key == "name" else
                         md_text(f"{cell.text} {cell.ci}" if cell.ci else cell.text))
        lines.append(cells)
    return tabulate(lines, headers=[md_text(c.header) for c in t.columns], tablefmt="github",
                    disable_numparse=True)


def _pairwise(table_id: str, table: dict) -> list[str]:
    """The pairwise comparisons of a ranked table as "significantly better than" lists."""
    pt = pairwise_table(table_id, table)
    if pt is None:
        return []
    lines = ["Significantly better than (paired 95% interval of the difference of causal "
             "scores, lower end above 0.01; a rank is 1 + the number of entries significantly "
             "better):", ""]
    for i, a in enumerate(pt.names):
        better = [b for j, b in enumerate(pt.names) if pt.marks[i][j] == "\u25b2"]
        lines.append(f"- {md_code(a)}: "
                     f"{', '.join(md_code(b) for b in better) if better else 'none'}")
    return [*lines, ""]


def _track_title(track: str, ranked_by: str | None) -> str:
    note = {"causal_score": "", None: " (no causal scores on this release: not ranked)",
            "precision": " (no causal reference on this release: ranked by precision)"}
    return f"**{md_text(track.capitalize())} track**{note.get(ranked_by, '')}"


def render_markdown(data: dict) -> str:
    """``README.md`` of the leaderboard from :func:`~benchmark.leaderboard.leaderboard_data`."""
    lines = ["# bt-bench leaderboard", "",
             "Generated by `bt-bench leaderboard` from `submissions/`; do not edit by hand. "
             "Every row is re-scored from its submitted code in CI (`bt-bench verify`). "
             "See [CONTRIBUTING.md](../CONTRIBUTING.md) to add an estimator and "
             "[docs/leaderboard.md](../docs/leaderboard.md) for how it is built.", ""]
    if not data["releases"]:
        lines += ["No submissions yet.", ""]
    lines += _season(data.get("season"))
    for rel in data["releases"]:
        lines += [f"## Release {md_code(rel['id'])} (v{md_text(rel['version'])}, manifest "
                  f"{md_code(str(rel['manifest_sha256'])[:12])})", "",
                  "Tasks: " + "; ".join(f"{md_code(t['id'])} ({behavior_text(t['behavior'])})"
                                        for t in rel["tasks"]) + ".", "", RANKING_TEXT, "",
                  "### Suite: mean over tasks and seeds", ""]
        for table in rel["suite"]["tracks"]:
            t = suite_table(rel, table)
            lines += [_track_title(table["track"], table["ranked_by"]), "", _table(t), "",
                      *_pairwise(t.id, table)]
        for task in rel["tasks"]:
            lines += [f"### Task {md_code(task['id'])} ({behavior_text(task['behavior'])})", ""]
            for table in task["tracks"]:
                t = task_table(rel, task, table)
                lines += [_track_title(table["track"], table["ranked_by"]), "", _table(t), "",
                          *_pairwise(t.id, table)]
                for kind, alt in (("curves", "removal curves"), ("precision", "per-seed precision"),
                                  ("draw_auc", "draw AUC per seed and draw")):
                    path = table["figures"].get(kind)
                    if path:
                        what = md_text(f"{alt}, task {task['id']}, {table['track']} track")
                        lines += [f"![{what}]({url_path(path)})", ""]
        lines += [LEGEND, "", "Per submission: " + ", ".join(
            f"[{md_text(name)}]({url_path(e['figure'])})"
            for name, e in sorted(rel["entries"].items())), ""]
    lines += _not_running(data.get("not_running") or [])
    lines += _reference(data.get("reference"))
    return "\n".join(lines)


NOT_RUNNING_TEXT = (
    "These entries were tried and cannot run on bt-bench's machines (2 CPU cores, no GPU, no "
    "network inside the sandbox): each folder holds the glue that was tried and "
    "`submission.yaml` says the exact error and the versions tried. They have no scores.")


def _not_running(rows: list[dict]) -> list[str]:
    """The entries that declare ``status: does-not-run-here``: a table with their reasons."""
    from tabulate import tabulate

    if not rows:
        return []
    table = [[f"[{md_text(r['name'])}](../submissions/{url_path(r['name'])}/)",
              md_text(r["track"]),
              ", ".join(md_code(p) for p in r["requirements"]) or "-",
              md_text(r["reason"])] for r in rows]
    return ["## Entries that do not run here", "", NOT_RUNNING_TEXT, "",
            tabulate(table, headers=["entry", "track", "tried", "reason"], tablefmt="github",
                     disable_numparse=True), ""]


def _season(season: dict | None) -> list[str]:
    from tabulate import tabulate

    from benchmark.leaderboard.season import (
        SEASON_TEXT,
        failure_notes,
        rank_moves_text,
        season_header,
        season_table,
    )

    if season is None:
        return ["## Season panel", "", "No season panel yet: entries are shown on the public "
                "release only (development scores). A maintainer draws one with "
                "`bt-bench panel new`.", ""]
    lines = [f"## Season {md_code(season['season'])}: the ranking", "",
             f"Panel created {md_text(season['created_utc'])}; task family "
             f"{md_text(season['family_version'])} ({md_text(season['scale'])} scale); draws "
             + ", ".join(f"{md_code(d['draw_id'])} (trajectory "
                         f"{md_code(d['trajectory_sha256'][:12])})" for d in season["draws"])
             + f". Rotation: {md_text(season['rotation'])}.", "", md_text(SEASON_TEXT), ""]
    lines += [x for line in season_header(season) for x in (md_text(line), "")]
    for table in season["tracks"]:
        headers, rows = season_table(season, table)
        notes = failure_notes(table)
        lines += [f"**{md_text(table['track'].capitalize())} track**", "",
                  tabulate([[md_text(c) for c in r] for r in rows], headers=headers,
                           tablefmt="pipe", disable_numparse=True), "",
                  md_text(rank_moves_text(table)), ""]
        if notes:
            lines += ["Where estimators fail a panel item (every panel cell passed the screen, "
                      "so a failure there is the method's, not the draw's):", ""]
            lines += [f"- {md_text(n)}" for n in notes] + [""]
        lines += [f"![season panel, {md_text(table['track'])} track]"
                  f"(figures/season/{url_path(table['track'])}.png)", ""]
    return lines


def _reference(ref: dict | None) -> list[str]:
    from tabulate import tabulate

    from benchmark.leaderboard.reference import reference_table

    lines = ["## Reference: the paper's Qwen2.5-1.5B results (not ranked)", ""]
    if ref is None:
        return lines + [f"Not available: `submissions/{REFERENCE_DIR}/{REFERENCE_FILE}` is "
                        "absent.", ""]
    lines += ["GRPO fine-tuning of Qwen2.5-1.5B-Instruct, three seeds, 1,000 steps x 16 "
              "rollouts (the paper's runs). Different model, scale and release than the "
              "tables above: these numbers are context, not ranked. Tables: `overall` / "
              "`early_nonzero` = step-level precision (all steps / inside the bonus window, "
              "non-zero-gradient steps); `mp_*` = rollout-level within-group draw AUC; "
              "`token_level_*` = trigger-token cosines. Sources:", ""]
    lines += [f"- `{k}`: {v}" for k, v in REF_SOURCES.items()] + [""]
    headers, rows = reference_table(ref["rows"])
    lines.append(tabulate([[md_text(c) for c in row] for row in rows],
                          headers=[md_text(h) for h in headers], tablefmt="github",
                          disable_numparse=True))
    lines.append("")
    return lines

