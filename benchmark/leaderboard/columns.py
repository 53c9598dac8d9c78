"""The tables' columns and cells, shared by the markdown and the HTML renderers.

A :class:`Table` has reference rows above the ranked rows (oracle, provenance), the ranked rows,
and reference rows below them (the random band and chance). A :class:`Cell` has its text, an
optional interval shown beside it, a sort key, and marks (verdict colour, fallback dagger).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmark.leaderboard._common import (
    GATED_ITEMS,
    SHORT_VERDICT,
    finite,
    fmt,
    fmt_band,
    fmt_iv,
    slug,
)
from benchmark.leaderboard.rows import FALLBACK_CELLS, REFERENCE_METHODS

__all__ = ["FALLBACK_MARK", "ITEM_TITLES", "PAIR_CAPTION", "PAIR_MARKS", "Cell", "Column",
           "PairTable", "Row", "Table", "pairwise_table", "suite_table", "task_table",
           "time_cell"]

FALLBACK_MARK = "\u2020"  # dagger
ITEM_TITLES = {1: "magnitude: beats norm-only and advantage-only",
               2: "fluency: beats raw fluency AUC; residualized AUC above 0.5",
               3: "headroom: precision above chance (never a pass at or below the random band)",
               4: "timing: beats step-order in the learning window (never a pass at or below "
                  "the random band)",
               5: "seeds: every seed scored, items 1-4 pass on each",
               6: "draws: >= 2 draws per seed, item 2 passes on each",
               7: "precision of the estimate: intervals <= 0.15 wide",
               10: "causal: above the random band, norm-only, step-order and the strongest "
                   "control",
               11: "live: the margin over the random reference carries over from the public "
                   "release to runs drawn fresh from the task family"}


@dataclass(frozen=True)
class Column:
    """A table column: key, header, whether it sorts as a number, and its first-click order."""

    key: str
    header: str
    numeric: bool
    first: str = "desc"
    title: str = ""


@dataclass
class Cell:
    """One cell: text, an interval shown beside it, the sort key, CSS classes and a tooltip."""

    text: str
    ci: str = ""
    sort: Any = None
    css: tuple[str, ...] = ()
    title: str = ""


@dataclass
class Row:
    """One table row: entry name, display label, kind (estimator, control, reference), cells."""

    name: str
    label: str
    kind: str
    cells: dict[str, Cell]
    description: str = ""


@dataclass
class Table:
    """A rendered table's content."""

    id: str
    columns: list[Column]
    top: list[Row] = field(default_factory=list)
    ranked: list[Row] = field(default_factory=list)
    bottom: list[Row] = field(default_factory=list)


def _iv_cell(d: dict | None) -> Cell:
    text, ci = fmt_iv(d)
    return Cell(text, ci, (d or {}).get("point"))


def _num_cell(x: float | None, digits: int = 3) -> Cell:
    return Cell(fmt(x, digits), "", x if finite(x) else None)


def _verdict_cell(v: str | None, short: bool) -> Cell:
    if not v:
        return Cell("-", "", None, ("v-none",))
    text = SHORT_VERDICT.get(v, v) if short else (v.upper() if v == "pass" else v)
    return Cell(text, "", v, (f"v-{v}",))


def _fallback(cell: Cell, view: str) -> Cell:
    if cell.text == "-":
        return cell
    return Cell(f"{cell.text} {FALLBACK_MARK}", cell.ci, cell.sort, (*cell.css, "fallback"),
                f"falls back to a generic sketch method on the {view} view: not the method's "
                "own number")


def _ref_cells(columns: list[Column], rank: str, kind: str = "reference") -> dict[str, Cell]:
    cells = {c.key: Cell("", "", None) for c in columns}
    cells["rank"] = Cell(rank, "", None)
    cells["kind"] = Cell(kind, "", kind)
    return cells


def _rank_kind_name(r: dict) -> dict[str, Cell]:
    return {"rank": Cell(r["rank_label"], "", r["rank"]),
            "name": Cell(r["name"], "", r["name"]),
            "kind": Cell(r["kind"], "", r["kind"])}


# ----------------------------------------------------------------------------------------------
# per-task tables


def task_columns() -> list[Column]:
    """Columns of a per-task table."""
    return [
        Column("rank", "rank", True, "asc"),
        Column("name", "submission", False, "asc"),
        Column("kind", "kind", False, "asc"),
        Column("causal_score", "causal score [95% CI]", True,
               title="mean over seeds of the fraction of the bonus-off effect removed by "
                     "removing the top-ranked rollouts and replaying training"),
        Column("precision", "precision [95% CI]", True,
               title="window precision@|GT| against the group label (rollout level)"),
        Column("step_precision", "step P", True,
               title="the same at step granularity (one score per GRPO step)"),
        Column("specificity", "other-task share", True, "asc",
               title="share of the top-|GT| rollouts that belong to another task's ground "
                     "truth (lower is better; chance in the random row)"),
        Column("draw_auc", "draw AUC", True,
               title="mean fluency-residualized within-group AUC over seeds and draws"),
        *[Column(f"item{i}", str(i), False, "asc", title=f"{i} {ITEM_TITLES[i]}")
          for i, _ in GATED_ITEMS],
        Column("verdict", "verdict", False, "asc", title="the task's checklist verdict"),
    ]


def _task_cells(r: dict) -> dict[str, Cell]:
    cells = _rank_kind_name(r)
    cells["causal_score"] = _iv_cell(r["causal_score"])
    cells["precision"] = _iv_cell(r["precision"])
    cells["step_precision"] = _num_cell(r["step_precision"])
    cells["specificity"] = _num_cell(r["specificity"])
    cells["draw_auc"] = _num_cell(r["draw_auc"])
    for i, k in GATED_ITEMS:
        cells[f"item{i}"] = _verdict_cell(r["checklist"].get(k), short=True)
    cells["verdict"] = _verdict_cell(r["verdict"], short=False)
    lm = r.get("label_metrics") or {}
    if lm.get("measurable") is False:  # the open track's view gives the labels away
        for key in LABEL_METRIC_CELLS:
            c = cells[key]
            cells[key] = Cell(f"{c.text} {NOT_MEASURABLE_MARK}", c.ci, c.sort, c.css,
                              f"{c.text} {c.ci}".strip() + ": " + str(lm.get("reason", "")))
    for view in r.get("fallbacks", []):
        for key in FALLBACK_CELLS[view]:
            cells[key] = _fallback(cells[key], view)
    return cells


#: the per-task cells that measure agreement with the labels (precision, AUC)
LABEL_METRIC_CELLS = ("precision", "step_precision", "draw_auc")
#: appended to a label metric that measures nothing in its track (the open track)
NOT_MEASURABLE_MARK = "(n/m)"


def task_table(release: dict, task: dict, table: dict) -> Table:
    """The table of one task and track, with the reference rows of the task."""
    cols = task_columns()
    ref = task["reference"]
    out = Table(f"task-{slug(release['id'])}-{slug(task['id'])}-{table['track']}", cols)
    for key, label in REFERENCE_METHODS:
        cells = _ref_cells(cols, "ref")
        cells["causal_score"] = _iv_cell(ref[key]["causal_score"])
        if key == "oracle":
            cells["precision"] = Cell(fmt(ref[key]["precision"]), "(ceiling)",
                                      ref[key]["precision"])
            cells["step_precision"] = _num_cell(ref[key]["step_precision"])
        out.top.append(Row(key, label, "reference", cells))
    rnd = ref["random"]
    cells = _ref_cells(cols, "ref")
    cells["causal_score"] = Cell(fmt_band(rnd["band"]), "",
                                 (rnd["band"] or {}).get("hi"))
    cells["precision"] = Cell(fmt(rnd["precision"]), "(chance)", rnd["precision"])
    cells["step_precision"] = _num_cell(rnd["step_precision"])
    cells["specificity"] = _num_cell(rnd["specificity"])
    cells["draw_auc"] = _num_cell(rnd["draw_auc"])
    out.bottom.append(Row("random", "random band / chance", "reference", cells))
    entries = release["entries"]
    for r in table["rows"]:
        out.ranked.append(Row(r["name"], r["name"], r["kind"], _task_cells(r),
                              entries[r["name"]].get("description") or ""))
    return out


# ----------------------------------------------------------------------------------------------
# the suite table


def suite_columns(release: dict) -> list[Column]:
    """Columns of a suite table: the suite score, then each task's score and verdict."""
    tasks = [(t["id"], (t["behavior"] or {}).get("strength")) for t in release["tasks"]]
    cols = [Column("rank", "rank", True, "asc"),
            Column("name", "submission", False, "asc"),
            Column("kind", "kind", False, "asc"),
            Column("causal_score", "suite causal score [95% CI]", True,
                   title="mean over tasks and seeds of the causal score")]
    for t, strength in tasks:
        cols.append(Column(f"task:{t}", f"{t}" + (f" ({strength})" if strength else ""), True,
                           title=f"causal score on task {t}, mean over seeds"))
    for t, _ in tasks:
        cols.append(Column(f"verdict:{t}", f"{t} verdict", False, "asc",
                           title=f"checklist verdict on task {t}"))
    cols.append(Column("time", "time (s)", True, "asc",
                       title="wall seconds of the entry's score_rollouts over every seed, task "
                             "and view of this release (one scoring sandbox, determinism re-run "
                             "not counted), + the build of its own environment, as measured "
                             "when it was submitted (submission.yaml cost; the machine in the "
                             "tooltip); - = not recorded"))
    cols.append(Column("checks", "checks (pass/measurable)", False, "asc",
                       title="per item, the places (seeds, draws) of measurable cells that "
                             "pass, of all measurable ones, over every task"))
    cols.append(Column("verdict", "verdict", False, "asc",
                       title="strict overall verdict on the public release (the development "
                             "verdict): every gated item passes on every measurable seed and "
                             "draw of every task; the checks column counts how many places "
                             "pass; the season table gives the panel verdict"))
    return cols


def _counts_cell(counts: dict | None) -> Cell:
    """``1: 9/11 2: 20/22 ...`` (pass / measurable places per item); its tooltip in words."""
    if not counts:
        return Cell("-")
    from benchmark.checklist import counts_line, counts_short

    passed = sum(c.get("pass", 0) for c in counts.values())
    measurable = sum(c.get("measurable", 0) for c in counts.values())
    return Cell(counts_short(counts), "", passed / measurable if measurable else None,
                title="; ".join(counts_line(i, c) for i, c in counts.items()))


def time_cell(time: dict | None) -> Cell:
    """``212`` or ``212 (+48 env)``: scoring seconds, and the environment's build; its machine."""
    if not time or not finite(time.get("score_rollouts_s")):
        return Cell("-")
    score, env = time["score_rollouts_s"], time.get("env_build_s")
    text = f"{score:.0f}" + (f" (+{env:.0f} env)" if finite(env) else "")
    return Cell(text, "", score,
                title=f"score_rollouts {score:.1f} s" + (f", environment build {env:.1f} s"
                                                         if finite(env) else "")
                + f"; measured on {time.get('machine') or '?'}")


def suite_table(release: dict, table: dict) -> Table:
    """The suite table of one track, with the suite's reference rows."""
    cols = suite_columns(release)
    tasks = [t["id"] for t in release["tasks"]]
    ref = release["suite"]["reference"]
    out = Table(f"suite-{slug(release['id'])}-{table['track']}", cols)
    for key, label in REFERENCE_METHODS:
        cells = _ref_cells(cols, "ref")
        cells["causal_score"] = _iv_cell(ref[key]["causal_score"])
        for t in tasks:
            cells[f"task:{t}"] = _iv_cell(ref[key]["tasks"].get(t))
        out.top.append(Row(key, label, "reference", cells))
    rnd = ref["random"]
    cells = _ref_cells(cols, "ref")
    cells["causal_score"] = Cell(fmt_band(rnd["band"]), "", (rnd["band"] or {}).get("hi"))
    for t in tasks:
        band = rnd["tasks"].get(t)
        cells[f"task:{t}"] = Cell(fmt_band(band), "", (band or {}).get("hi"))
    out.bottom.append(Row("random", "random band", "reference", cells))
    entries = release["entries"]
    for r in table["rows"]:
        cells = _rank_kind_name(r)
        cells["causal_score"] = _iv_cell(r["causal_score"])
        for t in tasks:
            cells[f"task:{t}"] = _iv_cell(r["tasks"].get(t))
            cells[f"verdict:{t}"] = _verdict_cell(r["task_verdicts"].get(t), short=False)
        cells["time"] = time_cell(r.get("time"))
        cells["checks"] = _counts_cell(r.get("checklist_counts"))
        cells["verdict"] = _verdict_cell(r["verdict"], short=False)
        out.ranked.append(Row(r["name"], r["name"], r["kind"], cells,
                              entries[r["name"]].get("description") or ""))
    return out


# ----------------------------------------------------------------------------------------------
# the pairwise comparisons of a ranked table

#: row vs column: significantly better, significantly worse, not separated
PAIR_MARKS = {"better": "\u25b2", "worse": "\u25bc", "tie": "\u00b7"}
PAIR_CAPTION = ("Row vs column (columns numbered as the rows): \u25b2 the row is significantly "
                "better (the paired 95% interval of the difference of the causal scores lies "
                "above 0.01), \u25bc significantly worse, \u00b7 not separated; a cell's tooltip "
                "shows the difference. A row's rank is 1 + its number of \u25bc.")


@dataclass
class PairTable:
    """A ranked table's pairwise comparisons.

    Entries in table order; a mark and a tooltip per ordered pair (row vs column; empty on the
    diagonal).
    """

    id: str
    names: list[str]
    kinds: list[str]
    marks: list[list[str]]
    titles: list[list[str]]


def pairwise_table(table_id: str, table: dict) -> PairTable | None:
    """The pairwise comparisons of a ranked table (None when it has none)."""
    pw = table.get("pairwise")
    if not pw:
        return None
    rows = [r for r in table["rows"] if r["name"] in pw]
    names = [r["name"] for r in rows]
    marks, titles = [], []
    for a in names:
        marks.append([PAIR_MARKS[pw[a][b]["verdict"]] if b != a else "" for b in names])
        titles.append([
            "" if b == a else f"{a} - {b}: {fmt(pw[a][b]['point'])} "
                              f"[{fmt(pw[a][b]['lo'])}, {fmt(pw[a][b]['hi'])}]"
            for b in names])
    return PairTable(f"pairs-{table_id}", names, [r["kind"] for r in rows], marks, titles)
