"""``leaderboard/index.html``: a static page (inline CSS and JavaScript, no network).

Every table sorts on a header click (a second click reverses; empty cells stay last). Only the
ranked rows move: the oracle and provenance rows stay on top and the random band at the bottom.
The page is laid out to fit its widest table in a 1,400 px window without horizontal scrolling
(intervals sit under their point, headers wrap); ``tests/test_leaderboard_browser.py`` checks it.

Every string from a submission is escaped here for where it lands (text and attribute values:
HTML escaping with control and format characters shown as escapes; class names: reduced to
``[A-Za-z0-9_-]``; link targets: percent-encoded), whatever ``verify`` refused before.
"""

from __future__ import annotations

import html
from typing import Any

from benchmark.leaderboard._common import css_token, url_path
from benchmark.leaderboard.columns import (
    PAIR_CAPTION,
    Cell,
    Row,
    Table,
    pairwise_table,
    suite_table,
    task_table,
)
from benchmark.leaderboard.markdown import LEGEND, NOT_RUNNING_TEXT, RANKING_TEXT
from benchmark.leaderboard.reference import REF_SOURCES, REFERENCE_DIR, REFERENCE_FILE
from benchmark.untrusted import visible

__all__ = ["render_html"]

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:1.5em auto;
max-width:1340px;padding:0 1em;color:#1f2328;line-height:1.4}
h1{font-size:1.7em}h2{font-size:1.35em;margin-top:2em;border-bottom:1px solid #d0d7de}
h3{font-size:1.15em;margin-top:1.6em}h4{font-size:1em;margin:1.2em 0 .3em}
table{border-collapse:collapse;font-size:.8em;margin:.4em 0 1em}
th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa;cursor:pointer;user-select:none;max-width:9em}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td .ci{display:block;font-size:.85em;color:#57606a}
td.name{white-space:nowrap}
tr.control td{color:#57606a;background:#fafbfc;font-style:italic}
tr.reference td{background:#f6f8fa;color:#24292f}
tr.reference td.name{font-weight:600}
td.v-pass{color:#1a7f37;font-weight:600}td.v-fail{color:#cf222e;font-weight:600}
td.v-inconclusive{color:#9a6700}
td.fallback{color:#8c959f;font-style:italic}
.legend,.note{font-size:.85em;color:#57606a;max-width:100em}
img{max-width:100%;border:1px solid #d0d7de;margin:.5em 0;display:block}
.figs a{margin-right:.8em}
.scroll{overflow-x:auto;max-width:100%}
table.pairwise th{cursor:default;text-align:center}
table.pairwise td{text-align:center;min-width:1.4em}
table.pairwise td.p-better{color:#1a7f37}table.pairwise td.p-worse{color:#cf222e}
table.pairwise td.p-tie{color:#8c959f}
"""

_JS = """
(function(){
  function key(td){var v=td.getAttribute('data-sort');return v===null?td.textContent:v;}
  document.querySelectorAll('table.sortable').forEach(function(table){
    var heads=table.tHead.rows[0].cells;
    var body=table.querySelector('tbody.ranked');
    Array.prototype.forEach.call(body.rows,function(r,i){r.setAttribute('data-pos',i);});
    Array.prototype.forEach.call(heads,function(th,col){
      th.addEventListener('click',function(){
        var cur=th.getAttribute('aria-sort');
        var first=th.getAttribute('data-first')==='desc'?'descending':'ascending';
        var dir=cur===null?first:(cur==='ascending'?'descending':'ascending');
        Array.prototype.forEach.call(heads,function(h){h.removeAttribute('aria-sort');});
        th.setAttribute('aria-sort',dir);
        var numeric=th.getAttribute('data-type')==='num';
        var sign=dir==='ascending'?1:-1;
        var rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){
          var x=key(a.cells[col]),y=key(b.cells[col]);
          var ex=(x===''),ey=(y===''),c=0;
          if(ex||ey){c=ex&&ey?0:(ex?1:-1);}
          else if(numeric){c=sign*(parseFloat(x)-parseFloat(y));}
          else{c=sign*(x<y?-1:(x>y?1:0));}
          if(c===0){c=parseInt(a.getAttribute('data-pos'))-parseInt(b.getAttribute('data-pos'));}
          return c;
        });
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
})();
"""


def _e(text: object) -> str:
    """Text or an attribute value: escaped, control and format characters shown as escapes."""
    return html.escape(visible(str(text)), quote=True)


def _behavior(b: dict | None) -> str:
    """``strong: trigger <code>frobnitz</code> -&gt; <code>QZXBT</code>`` for a task's behavior."""
    if not b:
        return ""
    return (f"{_e(b.get('strength', '?'))}: trigger <code>{_e(b.get('trigger_word', '?'))}</code>"
            f" -&gt; <code>{_e(b.get('behavior_token', '?'))}</code>")


def _sort_attr(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(round(v, 10))
    return str(v)


def _md(text: str) -> str:
    """Escape, then turn ``**bold**`` and `code` of bt-bench's own texts into HTML."""
    import re

    out = _e(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def _td(key: str, numeric: bool, cell: Cell, row: Row) -> str:
    classes = (["num"] if numeric else []) + list(cell.css) + (["name"] if key == "name" else [])
    attr = f' class="{" ".join(css_token(c) for c in classes)}"' if classes else ""
    title = f' title="{_e(cell.title)}"' if cell.title else ""
    if key == "name" and row.kind != "reference":
        body = (f'<a href="../submissions/{_e(url_path(row.name))}/" '
                f'title="{_e(row.description)}">{_e(row.label)}</a>')
    elif key == "name":
        body = _e(row.label)
    else:
        body = _e(cell.text)
    if cell.ci:
        body += f'<span class="ci">{_e(cell.ci)}</span>'
    return f'<td{attr}{title} data-sort="{_e(_sort_attr(cell.sort))}">{body}</td>'


def _table(t: Table) -> list[str]:
    out = [f'<div class="scroll"><table class="sortable" id="{_e(t.id)}"><thead><tr>']
    for c in t.columns:
        title = f' title="{_e(c.title)}"' if c.title else ""
        out.append(f'<th data-key="{_e(c.key)}" data-type="{"num" if c.numeric else "text"}" '
                   f'data-first="{_e(c.first)}"{title}>{_e(c.header)}</th>')
    out.append("</tr></thead>")
    for cls, rows in (("ref ref-top", t.top), ("ranked", t.ranked), ("ref ref-bottom", t.bottom)):
        out.append(f'<tbody class="{cls}">')
        for r in rows:
            rcls = f' class="{r.kind}"' if r.kind in ("control", "reference") else ""
            out.append(f'<tr data-name="{_e(r.name)}"{rcls}>')
            out += [_td(c.key, c.numeric, r.cells[c.key], r) for c in t.columns]
            out.append("</tr>")
        out.append("</tbody>")
    out.append("</table></div>")
    return out


def _pairwise(table_id: str, table: dict) -> list[str]:
    """A ranked table's pairwise comparisons as a small matrix (tooltips: the differences)."""
    pt = pairwise_table(table_id, table)
    if pt is None:
        return []
    css = {"\u25b2": "p-better", "\u25bc": "p-worse", "\u00b7": "p-tie", "": ""}
    out = [f'<details open><summary class="note">Pairwise comparisons ({len(pt.names)} entries)'
           f'</summary><p class="note">{_e(PAIR_CAPTION)}</p>',
           f'<div class="scroll"><table class="pairwise" id="{_e(pt.id)}"><thead><tr>'
           '<th>#</th><th>submission</th>'
           + "".join(f"<th>{j + 1}</th>" for j in range(len(pt.names))) + "</tr></thead><tbody>"]
    for i, a in enumerate(pt.names):
        rcls = ' class="control"' if pt.kinds[i] == "control" else ""
        cells = "".join(f'<td class="{css[m]}" title="{_e(t)}">{_e(m)}</td>' if m else "<td></td>"
                        for m, t in zip(pt.marks[i], pt.titles[i], strict=True))
        out.append(f'<tr data-name="{_e(a)}"{rcls}><td>{i + 1}</td><td class="name">{_e(a)}'
                   f"</td>{cells}</tr>")
    out.append("</tbody></table></div></details>")
    return out


def _track_title(track: str, ranked_by: str | None) -> str:
    note = {"causal_score": "", None: " (no causal scores on this release: not ranked)",
            "precision": " (no causal reference on this release: ranked by precision)"}
    return f"<h4>{_e(track.capitalize())} track{_e(note.get(ranked_by, ''))}</h4>"


def render_html(data: dict) -> str:
    """``index.html`` of the leaderboard: static, inline CSS/JS, figures linked relatively."""
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           "<title>bt-bench leaderboard</title>",
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<style>{_CSS}</style>", "</head>", "<body>", "<h1>bt-bench leaderboard</h1>",
           '<p class="note">Generated by <code>bt-bench leaderboard</code> from '
           "<code>submissions/</code>; do not edit by hand. Every row is re-scored from its "
           "submitted code in CI (<code>bt-bench verify</code>). Click a column header to sort "
           "the ranked rows; click again to reverse.</p>"]
    if not data["releases"]:
        out.append("<p>No submissions yet.</p>")
    out += _season(data.get("season"))
    for rel in data["releases"]:
        out.append(f"<h2>Release <code>{_e(rel['id'])}</code> (v{_e(rel['version'])}, manifest "
                   f"<code>{_e(rel['manifest_sha256'][:12])}</code>)</h2>")
        out.append('<p class="note">Tasks: ' + "; ".join(
            f"<code>{_e(t['id'])}</code> ({_behavior(t['behavior'])})"
            for t in rel["tasks"]) + f". {_md(RANKING_TEXT)}</p>")
        out.append("<h3>Suite: mean over tasks and seeds</h3>")
        for table in rel["suite"]["tracks"]:
            out.append(_track_title(table["track"], table["ranked_by"]))
            t = suite_table(rel, table)
            out += _table(t) + _pairwise(t.id, table)
        for task in rel["tasks"]:
            out.append(f"<h3>Task <code>{_e(task['id'])}</code> "
                       f"({_behavior(task['behavior'])})</h3>")
            for table in task["tracks"]:
                out.append(_track_title(table["track"], table["ranked_by"]))
                t = task_table(rel, task, table)
                out += _table(t) + _pairwise(t.id, table)
                for kind, alt in (("curves", "removal curves"),
                                  ("precision", "per-seed precision"),
                                  ("draw_auc", "draw AUC per seed and draw")):
                    path = table["figures"].get(kind)
                    if path:
                        out.append(f'<img src="{_e(url_path(path))}" alt="{_e(alt)}, task '
                                   f'{_e(task["id"])}, {_e(table["track"])} track" '
                                   '>')
        out.append(f'<p class="legend">{_md(LEGEND)}</p>')
        out.append('<p class="figs">Per submission: ' + " ".join(
            f'<a href="{_e(url_path(e["figure"]))}">{_e(name)}</a>'
            for name, e in sorted(rel["entries"].items())) + "</p>")
    out += _not_running(data.get("not_running") or [])
    out += _reference(data.get("reference"))
    out += [f"<script>{_JS}</script>", "</body>", "</html>", ""]
    return "\n".join(out)


def _season(season: dict | None) -> list[str]:
    from benchmark.leaderboard.season import (
        SEASON_TEXT,
        failure_notes,
        rank_moves_text,
        season_header,
        season_table,
    )

    if season is None:
        return ["<h2>Season panel</h2>", "<p>No season panel yet: entries are shown on the "
                "public release only (development scores).</p>"]
    out = [f"<h2>Season <code>{_e(season['season'])}</code>: the ranking</h2>",
           f'<p class="note">Panel created {_e(season["created_utc"])}; task family '
           f"{_e(season['family_version'])} ({_e(season['scale'])} scale); draws "
           + ", ".join(f"<code>{_e(d['draw_id'])}</code> (trajectory "
                       f"<code>{_e(d['trajectory_sha256'][:12])}</code>)"
                       for d in season["draws"])
           + f". Rotation: {_e(season['rotation'])}. {_md(SEASON_TEXT)}</p>"]
    out += [f'<p class="note">{_e(line)}</p>' for line in season_header(season)]
    for table in season["tracks"]:
        headers, rows = season_table(season, table)
        out.append(f"<h4>{_e(table['track'].capitalize())} track</h4>")
        out.append(f'<div class="scroll"><table class="sortable" id="season-'
                   f'{_e(table["track"])}"><thead><tr>'
                   + "".join(f'<th data-type="text" data-first="asc">{_e(h)}</th>'
                             for h in headers) + '</tr></thead><tbody class="ranked">')
        for raw, r in zip(table["rows"], rows, strict=True):
            cls = ' class="control"' if raw["kind"] == "control" else ""
            out.append(f'<tr data-name="{_e(raw["name"])}"{cls}>'
                       + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>")
        out.append("</tbody></table></div>")
        out.append(f'<p class="note">{_e(rank_moves_text(table))}</p>')
        notes = failure_notes(table)
        if notes:
            out.append('<p class="note">Where estimators fail a panel item (every panel cell '
                       "passed the screen, so a failure there is the method's, not the "
                       "draw's):</p><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes)
                       + "</ul>")
        out.append(f'<img src="figures/season/{_e(url_path(table["track"]))}.png" '
                   f'alt="season panel, {_e(table["track"])} track">')
    return out


def _not_running(rows: list[dict]) -> list[str]:
    """The entries that declare ``status: does-not-run-here``, with their reasons."""
    if not rows:
        return []
    out = ["<h2>Entries that do not run here</h2>", f'<p class="note">{_md(NOT_RUNNING_TEXT)}</p>',
           '<div class="scroll"><table id="not-running"><thead><tr><th>entry</th><th>track</th>'
           "<th>tried</th><th>reason</th></tr></thead><tbody>"]
    for r in rows:
        tried = ", ".join(f"<code>{_e(p)}</code>" for p in r["requirements"]) or "-"
        out.append(f'<tr><td class="name"><a href="../submissions/{_e(url_path(r["name"]))}/">'
                   f'{_e(r["name"])}</a></td><td>{_e(r["track"])}</td><td>{tried}</td>'
                   f"<td>{_e(r['reason'])}</td></tr>")
    out.append("</tbody></table></div>")
    return out


def _reference(ref: dict | None) -> list[str]:
    from benchmark.leaderboard.reference import reference_table

    out = ["<h2>Reference: the paper's Qwen2.5-1.5B results (not ranked)</h2>"]
    if ref is None:
        return out + [f"<p>Not available: <code>submissions/{REFERENCE_DIR}/{REFERENCE_FILE}"
                      "</code> is absent.</p>"]
    out.append('<p class="note">GRPO fine-tuning of Qwen2.5-1.5B-Instruct (the paper\'s '
               "runs): a different model, scale and release than the tables above, shown "
               "for context and not ranked. Sources: " + "; ".join(
                   f"<code>{_e(k)}</code> = {_md(v)}" for k, v in REF_SOURCES.items()) + ".</p>")
    headers, rows = reference_table(ref["rows"])
    out.append('<div class="scroll"><table class="sortable" id="reference"><thead><tr>')
    numeric = {"value [95% CI]", "chance", "ceiling", "n"}
    for h in headers:
        out.append(f'<th data-type="{"num" if h in numeric else "text"}" '
                   f'data-first="asc">{_e(h)}</th>')
    out.append('</tr></thead><tbody class="ranked">')
    for raw, row in zip(ref["rows"], rows, strict=True):
        out.append(f'<tr class="ref-{css_token(raw["source"])}">')
        for h, text in zip(headers, row, strict=True):
            sort = {"value [95% CI]": raw["value"], "chance": raw["chance"],
                    "ceiling": raw["ceiling"], "n": raw["n"]}.get(h, text)
            cls = ' class="num"' if h in numeric else ""
            out.append(f'<td{cls} data-sort="{_e(_sort_attr(sort))}">{_e(text)}</td>')
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return out
