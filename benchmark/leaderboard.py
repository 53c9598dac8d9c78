"""``bt-bench leaderboard``: generate ``leaderboard/`` from ``submissions/``; never edit it by hand.

Outputs (byte-stable: the same submissions give the same bytes):

* ``README.md``: one ranked markdown table (tabulate, GitHub format) per release, the figures,
  and the paper's Qwen2.5-1.5B results as a separate, unranked reference table;
* ``leaderboard.json``: the same data as stable JSON, plus a sha256 of the data behind each figure;
* ``index.html``: a static page (inline CSS and JavaScript, figures referenced relatively, no
  network) whose tables sort on a header click (a second click reverses);
* ``figures/*.png``: per-seed step- and rollout-level precision against chance and ceiling, and
  residualized draw AUC with intervals per seed and draw, per release and per submission.

Ranking (per release): rows are ordered by mean window precision (group label, rollout
granularity; ``results["summary"]["precision_window_group"]``), highest first; a row whose 95%
interval overlaps the previous row's shares that row's rank and the whole group is marked tied
(``=2``). ``--check`` regenerates in memory and compares: markdown, JSON and HTML byte for byte;
PNGs by existence and by the data hash recorded in ``leaderboard.json`` (font rendering differs
across machines, the plotted numbers do not).
"""

from __future__ import annotations

import hashlib
import html
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.errors import BenchmarkError, InputFileError

__all__ = [
    "LEADERBOARD_SCHEMA_VERSION",
    "LeaderboardError",
    "build_rows",
    "check",
    "generate",
    "leaderboard_command",
    "leaderboard_data",
    "paper_reference",
    "rank_rows",
    "render_html",
    "render_markdown",
    "write_paper_reference",
]

LEADERBOARD_SCHEMA_VERSION = 1
REFERENCE_DIR = "_reference"
REFERENCE_FILE = "paper_rows.json"
REFERENCE_COLUMNS = ("seed", "table", "method", "value", "lo", "hi", "chance", "ceiling", "n")
FIGURE_DPI = 100
#: the text files ``--check`` compares byte for byte
TEXT_FILES = ("README.md", "leaderboard.json", "index.html")
#: checklist items shown as columns: (number, key); 8 and 9 are diagnostics (results.json only)
GATED_ITEMS = ((1, "magnitude"), (2, "fluency"), (3, "headroom"), (4, "timing"), (5, "seeds"),
               (6, "draws"), (7, "precision_of_estimate"), (10, "causal"))
GATED_KEYS = tuple(k for _, k in GATED_ITEMS)
SHORT_VERDICT = {"pass": "pass", "fail": "FAIL", "inconclusive": "inc.", "reported": "rep.",
                 "not_run": "-"}
REGENERATE = "bt-bench leaderboard"


class LeaderboardError(BenchmarkError):
    """The submissions or the reference file cannot be turned into a leaderboard."""


# ----------------------------------------------------------------------------------------------
# rows


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(vals) / len(vals) if vals else None


def _interval(d: Any) -> dict[str, float | None] | None:
    if not isinstance(d, dict) or d.get("point") is None:
        return None
    return {"point": d["point"], "lo": d.get("lo"), "hi": d.get("hi")}


def _window(training: Any, gran: str) -> dict | None:
    return _get(training, gran, "group", "window")


def _seed_entry(results: dict, seed: str, name: str) -> dict:
    data = results["seeds"][seed]
    tr = _get(data, "training", name)
    out: dict[str, Any] = {"seed": seed}
    for gran in ("rollout", "step"):
        w = _window(tr, gran)
        if w is None:
            out[gran] = None
            continue
        iv = w.get("interval") or [None, None]
        out[gran] = {"precision": w.get("precision"), "lo": iv[0], "hi": iv[1],
                     "chance": w.get("chance"), "ceiling": w.get("ceiling"), "lift": w.get("lift")}
    draws = {}
    for did, m in sorted((_get(data, "draws", name) or {}).items()):
        draws[did] = {k: _interval(m.get(k)) for k in ("raw", "residualized")}
    out["draws"] = draws
    return out


def build_row(meta: dict, results: dict) -> dict:
    """One leaderboard row from a submission's metadata and results (unranked).

    Args:
        meta: the validated ``submission.yaml`` (name, authors, track, kind, link, description).
        results: the submission's ``results.json`` as a dict.

    Returns:
        A JSON-able dict: identity, release, the key metrics (mean over seeds with ground truth in
        the learning window), checklist verdicts and per-seed numbers for the figures.
    """
    est = results["estimator"]["name"]
    summary = results.get("summary", {})
    seeds = [_seed_entry(results, s, est) for s in sorted(results.get("seeds", {}), key=_seed_key)]
    roll = [s["rollout"] for s in seeds if s["rollout"]]
    step = [s["step"] for s in seeds if s["step"]]
    precision = _interval(_get(summary, "precision_window_group", est))
    chance = _mean([s["chance"] for s in roll])
    lift = (precision["point"] / chance if precision and chance else None)
    verdicts = {c["key"]: c["verdict"] for c in results.get("checklist", [])}
    rel = results.get("release", {})
    return {
        "name": meta["name"],
        "kind": meta.get("kind", "estimator"),
        "track": meta["track"],
        "authors": list(meta["authors"]),
        "link": meta.get("link"),
        "description": meta.get("description"),
        "estimator": {"name": est, "class": results["estimator"].get("class"),
                      "sha256": results["estimator"].get("sha256"),
                      "config": results["estimator"].get("config")},
        "release": {"id": rel.get("id"), "version": rel.get("version"),
                    "manifest_sha256": rel.get("manifest_sha256")},
        "precision": precision,
        "chance": chance,
        "lift": lift,
        "step_precision": _mean([s["precision"] for s in step]),
        "step_ceiling": _mean([s["ceiling"] for s in step]),
        "margin": _interval(summary.get("margin_over_strongest_control")),
        "strongest_control": summary.get("strongest_control"),
        "draw_auc": _get(summary, "draw_auc_residualized_mean", est),
        "checklist": {k: verdicts.get(k) for k in GATED_KEYS},
        "verdict": results.get("verdict"),
        "seeds": seeds,
        "controls": {c: [_seed_entry(results, s, c)["draws"]
                         for s in sorted(results.get("seeds", {}), key=_seed_key)]
                     for c in results.get("controls", []) if c != est},
        "figure": f"figures/submissions/{meta['name']}.png",
    }


def _seed_key(s: str) -> tuple[int, str]:
    return (int(s), s) if s.isdigit() else (10**9, s)


def _overlap(a: dict | None, b: dict | None) -> bool:
    if not a or not b or None in (a.get("lo"), a.get("hi"), b.get("lo"), b.get("hi")):
        return False
    return a["lo"] <= b["hi"] and b["lo"] <= a["hi"]


def rank_rows(rows: list[dict]) -> list[dict]:
    """Order rows by mean precision and assign ranks with ties.

    Rows are sorted by precision point, highest first (name breaks exact ties so the order is
    stable); rows without a precision go last with rank ``"-"``. A row whose interval overlaps
    the previous row's interval takes the previous row's rank (competition ranking: 1, =2, =2, 4);
    every row of such a group gets ``tied = True`` and a rank label with ``=``.

    Returns:
        New dicts with ``position``, ``rank`` (int or None), ``rank_label`` and ``tied`` added.
    """
    def key(r: dict) -> tuple:
        p = (r.get("precision") or {}).get("point")
        return (p is None, -(p or 0.0), r["name"])

    ordered = [dict(r) for r in sorted(rows, key=key)]
    ranks: list[int | None] = []
    for i, r in enumerate(ordered):
        if (r.get("precision") or {}).get("point") is None:
            ranks.append(None)
        elif i > 0 and ranks[i - 1] is not None and _overlap(ordered[i - 1]["precision"],
                                                             r["precision"]):
            ranks.append(ranks[i - 1])
        else:
            ranks.append(i + 1)
    for i, r in enumerate(ordered):
        rank = ranks[i]
        tied = rank is not None and ranks.count(rank) > 1
        r["position"] = i + 1
        r["rank"] = rank
        r["tied"] = tied
        r["rank_label"] = "-" if rank is None else (f"={rank}" if tied else str(rank))
    return ordered


def build_rows(submissions: list[tuple[dict, dict]]) -> list[dict]:
    """Rows of ``(meta, results)`` pairs, unranked (see :func:`rank_rows`)."""
    return [build_row(meta, results) for meta, results in submissions]


def _group_by_release(rows: list[dict]) -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(str(r["release"]["id"]), []).append(r)
    out = []
    for rid in sorted(groups):
        members = groups[rid]
        shas = sorted({str(r["release"]["manifest_sha256"]) for r in members})
        if len(shas) > 1:
            which = ", ".join(f"{r['name']} ({str(r['release']['manifest_sha256'])[:12]})"
                              for r in sorted(members, key=lambda r: r["name"]))
            raise LeaderboardError(
                f"submissions scored on release {rid!r} disagree on its manifest sha256: {which}; "
                "they were scored on different builds, so they cannot be ranked together. "
                "Re-score the stale ones with bt-bench submit FILE --name NAME --force."
            )
        versions = sorted({str(r["release"]["version"]) for r in members})
        out.append({"id": rid, "version": versions[0], "manifest_sha256": shas[0],
                    "rows": rank_rows(members)})
    return out


# ----------------------------------------------------------------------------------------------
# the paper's reference rows


def paper_reference(runs: str | Path, expected: str | Path, n_boot: int = 5000) -> list[dict]:
    """The paper's Qwen2.5-1.5B table rows for the leaderboard's reference table.

    Rows recomputed from the paper's released per-seed files (``bt-bench paper reproduce``) get
    ``source = "recomputed"``; rows of the paper's ``results_table.csv`` that those files cannot
    recompute (they need files the paper did not release) are added with ``source =
    "paper_csv"``. Columns: ``seed, table, method, value, lo, hi, chance, ceiling, n, source``.
    Rows are ordered by table (the CSV's order, then tables only bt-bench computes), then seed,
    then the order in which :func:`benchmark.paper.reproduce` or the CSV lists them.
    """
    from dataclasses import asdict

    from benchmark.paper import read_expected, reproduce

    rows = [dict(asdict(r), source="recomputed") for r in reproduce(runs, n_boot=n_boot)]
    have = {(r["seed"], r["table"], r["method"]) for r in rows}
    paper = read_expected(expected)
    for key, r in paper.items():
        if key not in have:
            rows.append(dict(asdict(r), source="paper_csv"))
    tables: dict[str, int] = {}
    for table in [k[1] for k in paper] + [r["table"] for r in rows]:
        tables.setdefault(table, len(tables))
    order = {id(r): i for i, r in enumerate(rows)}
    return sorted(rows, key=lambda r: (tables[r["table"]], r["seed"], order[id(r)]))


def write_paper_reference(
    runs: str | Path, expected: str | Path,
    out: str | Path = f"submissions/{REFERENCE_DIR}/{REFERENCE_FILE}",
) -> Path:
    """Write :func:`paper_reference` as stable JSON (atomically) and return the path."""
    from benchmark.io import atomic_write_text, dumps_json

    atomic_write_text(out, dumps_json(paper_reference(runs, expected)))
    return Path(out)


def _read_reference(submissions_dir: Path) -> list[dict] | None:
    from benchmark.io import read_json

    p = submissions_dir / REFERENCE_DIR / REFERENCE_FILE
    if not p.is_file():
        return None
    rows = read_json(p)
    need = (*REFERENCE_COLUMNS, "source")
    if not isinstance(rows, list):
        raise InputFileError(f"{p}: expected a JSON list of rows, got {type(rows).__name__}.")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or set(r) != set(need):
            got = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise InputFileError(
                f"{p}: row {i} has keys {got}; expected exactly {list(need)}. Regenerate it with "
                "benchmark.leaderboard.write_paper_reference (see docs/leaderboard.md)."
            )
    return rows


# ----------------------------------------------------------------------------------------------
# data


def _round(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else round(obj, 10)
    if isinstance(obj, dict):
        return {str(k): _round(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_round(v) for v in obj]
    return obj


def _sha(obj: Any) -> str:
    from benchmark.io import dumps_json

    return hashlib.sha256(dumps_json(obj).encode()).hexdigest()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "release"


def _figure_specs(releases: list[dict]) -> dict[str, dict]:
    """Figure path -> {kind, data}; the data is everything the figure plots."""
    specs: dict[str, dict] = {}
    for rel in releases:
        slug = _slug(rel["id"])
        rows = rel["rows"]
        seeds = sorted({s["seed"] for r in rows for s in r["seeds"]}, key=_seed_key)
        prec = {"release": rel["id"], "seeds": seeds, "rows": [
            {"name": r["name"], "kind": r["kind"],
             "seeds": {s["seed"]: {"rollout": s["rollout"], "step": s["step"]} for s in r["seeds"]}}
            for r in rows]}
        specs[f"figures/precision_{slug}.png"] = {
            "kind": "precision", "data": _round(prec),
            "what": f"per-seed window precision (group label), step- and rollout-level, release "
                    f"{rel['id']}, against chance and ceiling"}
        auc = {"release": rel["id"], "seeds": seeds, "rows": [
            {"name": r["name"], "kind": r["kind"],
             "seeds": {s["seed"]: {d: v["residualized"] for d, v in s["draws"].items()}
                       for s in r["seeds"]}}
            for r in rows if any(s["draws"] for s in r["seeds"])]}
        specs[f"figures/draw_auc_{slug}.png"] = {
            "kind": "draw_auc", "data": _round(auc),
            "what": f"residualized within-group draw AUC with 95% intervals per seed and draw, "
                    f"release {rel['id']}"}
        for r in rows:
            sub_seeds = [s["seed"] for s in r["seeds"]]
            def resid(per_seed: list[dict]) -> list[dict]:
                return [{d: v["residualized"] for d, v in draws.items()} for draws in per_seed]

            methods = [{"name": r["estimator"]["name"], "kind": r["kind"],
                        "draws": resid([s["draws"] for s in r["seeds"]])}]
            methods += [{"name": c, "kind": "control", "draws": resid(d)}
                        for c, d in r["controls"].items()]
            data = {"name": r["name"], "kind": r["kind"], "estimator": r["estimator"]["name"],
                    "seeds": sub_seeds,
                    "precision": [{"seed": s["seed"], "rollout": s["rollout"], "step": s["step"]}
                                  for s in r["seeds"]],
                    "draw_auc": [m for m in methods if any(m["draws"])]}
            specs[r["figure"]] = {
                "kind": "submission", "data": _round(data),
                "what": f"{r['name']}: per-seed precision against chance and ceiling; "
                        "residualized draw AUC per seed and draw next to the controls"}
    return specs


def leaderboard_data(submissions: list[tuple[dict, dict]],
                     reference: list[dict] | None = None) -> dict:
    """The complete leaderboard (what ``leaderboard.json`` holds) from ``(meta, results)`` pairs."""
    releases = _group_by_release(build_rows(submissions))
    for rel in releases:
        for r in rel["rows"]:
            r.pop("controls")  # figure input only; the submission's results.json has it
    specs = _figure_specs(_group_by_release(build_rows(submissions)))
    return _round({
        "schema_version": LEADERBOARD_SCHEMA_VERSION,
        "generated_by": f"{REGENERATE} (do not edit; regenerate from submissions/)",
        "ranking": "mean window precision (group label, rollout granularity) over seeds; rows "
                   "whose 95% intervals overlap the previous row share its rank (tied, '=')",
        "releases": releases,
        "reference": None if reference is None else {
            "file": f"submissions/{REFERENCE_DIR}/{REFERENCE_FILE}",
            "model": "Qwen2.5-1.5B-Instruct (the paper's runs; not ranked with the submissions)",
            "rows": reference},
        "figures": {path: {"what": s["what"], "data_sha256": _sha(s["data"])}
                    for path, s in sorted(specs.items())},
    })


# ----------------------------------------------------------------------------------------------
# markdown


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _iv(d: dict | None, digits: int = 3, signed: bool = False) -> str:
    if not d:
        return "-"
    fmt = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
    lo = "-" if d.get("lo") is None else fmt.format(d["lo"])
    hi = "-" if d.get("hi") is None else fmt.format(d["hi"])
    return f"{fmt.format(d['point'])} [{lo}, {hi}]"


TABLE_COLUMNS = [
    # (key, header, markdown header, numeric, first-click order)
    ("rank", "rank", "rank", True, "asc"),
    ("name", "submission", "submission", False, "asc"),
    ("kind", "kind", "kind", False, "asc"),
    ("track", "track", "track", False, "asc"),
    ("precision", "precision [95% CI]", "precision [95% CI]", True, "desc"),
    ("lift", "lift", "lift", True, "desc"),
    ("step_precision", "step P", "step P", True, "desc"),
    ("margin", "margin over strongest control [95% CI]", "margin vs strongest control [95% CI]",
     True, "desc"),
    ("draw_auc", "draw AUC (resid.)", "draw AUC (resid.)", True, "desc"),
    *[(f"item{i}", f"{i} {k.replace('_', ' ')}", f"{i}", False, "asc")
      for i, k in GATED_ITEMS],
    ("verdict", "verdict", "verdict", False, "asc"),
]


def _cells(r: dict) -> dict[str, tuple[str, Any]]:
    """Column key -> (display text, sort key) for one ranked row."""
    margin = r["margin"]
    strongest = f" vs {r['strongest_control']}" if r.get("strongest_control") else ""
    out: dict[str, tuple[str, Any]] = {
        "rank": (r["rank_label"], r["rank"]),
        "name": (r["name"], r["name"]),
        "kind": (r["kind"], r["kind"]),
        "track": (r["track"], r["track"]),
        "precision": (_iv(r["precision"]), (r["precision"] or {}).get("point")),
        "lift": (_f(r["lift"], 2) + ("x" if r["lift"] is not None else ""), r["lift"]),
        "step_precision": (_f(r["step_precision"]), r["step_precision"]),
        "margin": (_iv(margin, signed=True) + (strongest if margin else ""),
                   (margin or {}).get("point")),
        "draw_auc": (_f(r["draw_auc"]), r["draw_auc"]),
        "verdict": ((r["verdict"] or "-").upper() if r["verdict"] == "pass" else
                    (r["verdict"] or "-"), r["verdict"]),
    }
    for i, k in GATED_ITEMS:
        v = r["checklist"].get(k)
        out[f"item{i}"] = (SHORT_VERDICT.get(v, "-") if v else "-", v)
    return out


def _ref_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    headers = ["table", "method", "seed", "value [95% CI]", "chance", "ceiling", "n", "source"]
    out = []
    for r in rows:
        value = _f(r["value"], 4)
        if r["lo"] is not None and r["hi"] is not None:
            value += f" [{r['lo']:.4f}, {r['hi']:.4f}]"
        out.append([r["table"], r["method"], str(r["seed"]), value, _f(r["chance"], 4),
                    _f(r["ceiling"], 4), str(r["n"]), r["source"]])
    return headers, out


REF_SOURCES = {
    "recomputed": "recomputed by bt-bench from the paper's released per-seed files "
                  "(`bt-bench paper reproduce`)",
    "paper_csv": "copied from the paper's `results_table.csv`: the per-seed files needed to "
                 "recompute it were not released",
}

LEGEND = (
    "Columns: **precision** = mean over seeds of tie-aware precision@|GT| on the learning window "
    "(group label, rollout granularity) with its 95% cluster-bootstrap interval; **lift** = that "
    "precision / mean chance; **step P** = the same at step granularity (one score per GRPO "
    "step); **margin** = precision minus the strongest control's, paired 95% interval; **draw "
    "AUC** = mean fluency-residualized within-group AUC over seeds and generation draws. Items "
    "1-7 and 10 are the gated checklist items (1 magnitude, 2 fluency, 3 headroom, 4 timing, "
    "5 seeds, 6 draws, 7 precision of the estimate, 10 causal: removing the top rollouts and "
    "replaying moves the behavior more than random removals, norm-only and step-order): pass / "
    "FAIL / inc. (inconclusive) / - (not measured). Items 8-9 (ties, token level) are reported in "
    "each results.json. Rows whose precision intervals overlap the previous row share its rank (`=`: tied, "
    "not ranked apart). Controls (kind `control`, names in italics) are the target-free "
    "baselines."
)


def render_markdown(data: dict) -> str:
    """``README.md`` of the leaderboard from :func:`leaderboard_data`'s output."""
    from tabulate import tabulate

    lines = ["# bt-bench leaderboard", "",
             "Generated by `bt-bench leaderboard` from `submissions/`; do not edit by hand. "
             "Every row is re-scored from its submitted code in CI (`bt-bench verify`). "
             "See [CONTRIBUTING.md](../CONTRIBUTING.md) to add an estimator and "
             "[docs/leaderboard.md](../docs/leaderboard.md) for how it is built.", ""]
    if not data["releases"]:
        lines += ["No submissions yet.", ""]
    for rel in data["releases"]:
        slug = _slug(rel["id"])
        lines += [f"## Release `{rel['id']}` (v{rel['version']}, manifest "
                  f"`{rel['manifest_sha256'][:12]}`)", ""]
        rows = []
        for r in rel["rows"]:
            c = _cells(r)
            name = f"[{r['name']}](../submissions/{r['name']}/)"
            if r["kind"] == "control":
                name = f"*{name}*"
            rows.append([c[k][0] if k != "name" else name for k, *_ in TABLE_COLUMNS])
        lines.append(tabulate(rows, headers=[h for _, _, h, _, _ in TABLE_COLUMNS],
                              tablefmt="github", disable_numparse=True))
        lines += ["", LEGEND, "",
                  f"![per-seed precision, release {rel['id']}](figures/precision_{slug}.png)", "",
                  f"![draw AUC per seed and draw, release {rel['id']}]"
                  f"(figures/draw_auc_{slug}.png)",
                  "", "Per submission: " + ", ".join(
                      f"[{r['name']}]({r['figure']})" for r in rel["rows"]), ""]
    ref = data.get("reference")
    lines += ["## Reference: the paper's Qwen2.5-1.5B results (not ranked)", ""]
    if ref is None:
        lines += [f"Not available: `submissions/{REFERENCE_DIR}/{REFERENCE_FILE}` is absent.", ""]
    else:
        lines += ["GRPO fine-tuning of Qwen2.5-1.5B-Instruct, three seeds, 1,000 steps x 16 "
                  "rollouts (the paper's runs). Different model, scale and release than the "
                  "table above: these numbers are context, not ranked. Tables: `overall` / "
                  "`early_nonzero` = step-level precision (all steps / inside the bonus window, "
                  "non-zero-gradient steps); `mp_*` = rollout-level within-group draw AUC; "
                  "`token_level_*` = trigger-token cosines. Sources:", ""]
        lines += [f"- `{k}`: {v}" for k, v in REF_SOURCES.items()] + [""]
        headers, rows = _ref_table(ref["rows"])
        lines.append(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
        lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# html

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1400px;padding:0 1em;color:#1f2328;line-height:1.45}
h1{font-size:1.7em}h2{font-size:1.3em;margin-top:2em;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;font-size:.85em;margin:1em 0}
th,td{border:1px solid #d0d7de;padding:4px 7px;text-align:left;vertical-align:top}
th{background:#f6f8fa;cursor:pointer;user-select:none;white-space:nowrap}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.control td{color:#57606a;background:#fafbfc;font-style:italic}
td.v-pass{color:#1a7f37;font-weight:600}td.v-fail{color:#cf222e;font-weight:600}
td.v-inconclusive{color:#9a6700}
.legend,.note{font-size:.85em;color:#57606a;max-width:100em}
img{max-width:100%;border:1px solid #d0d7de;margin:.5em 0}
.figs a{margin-right:.8em}
.scroll{overflow-x:auto;max-width:100%}
"""

_JS = """
(function(){
  function key(td){var v=td.getAttribute('data-sort');return v===null?td.textContent:v;}
  document.querySelectorAll('table.sortable').forEach(function(table){
    var heads=table.tHead.rows[0].cells;
    var body=table.tBodies[0];
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
    return html.escape(str(text), quote=True)


def _sort_attr(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(round(v, 10))
    return str(v)


def render_html(data: dict) -> str:
    """``index.html`` of the leaderboard: static, inline CSS/JS, figures linked relatively."""
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           "<title>bt-bench leaderboard</title>",
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<style>{_CSS}</style>", "</head>", "<body>", "<h1>bt-bench leaderboard</h1>",
           '<p class="note">Generated by <code>bt-bench leaderboard</code> from '
           "<code>submissions/</code>; do not edit by hand. Every row is re-scored from its "
           "submitted code in CI (<code>bt-bench verify</code>). Click a column header to sort; "
           "click again to reverse.</p>"]
    if not data["releases"]:
        out.append("<p>No submissions yet.</p>")
    for rel in data["releases"]:
        slug = _slug(rel["id"])
        out.append(f"<h2>Release <code>{_e(rel['id'])}</code> (v{_e(rel['version'])}, manifest "
                   f"<code>{_e(rel['manifest_sha256'][:12])}</code>)</h2>")
        out.append(f'<div class="scroll"><table class="sortable" id="leaderboard-{_e(slug)}">'
                   "<thead><tr>")
        for key, header, _, numeric, first in TABLE_COLUMNS:
            out.append(f'<th data-key="{key}" data-type="{"num" if numeric else "text"}" '
                       f'data-first="{first}">{_e(header)}</th>')
        out.append("</tr></thead><tbody>")
        for r in rel["rows"]:
            cells = _cells(r)
            cls = ' class="control"' if r["kind"] == "control" else ""
            out.append(f'<tr data-name="{_e(r["name"])}"{cls}>')
            for key, _, _, numeric, _ in TABLE_COLUMNS:
                text, sort = cells[key]
                classes = ["num"] if numeric else []
                if key.startswith("item") or key == "verdict":
                    classes.append(f"v-{sort}" if sort else "v-none")
                attr = f' class="{" ".join(classes)}"' if classes else ""
                if key == "name":
                    title = r.get("description") or ""
                    body = (f'<a href="../submissions/{_e(r["name"])}/" '
                            f'title="{_e(title)}">{_e(text)}</a>')
                else:
                    body = _e(text)
                out.append(f'<td{attr} data-sort="{_e(_sort_attr(sort))}">{body}</td>')
            out.append("</tr>")
        out.append("</tbody></table></div>")
        out.append(f'<p class="legend">{_e(LEGEND).replace("**", "")}</p>')
        out.append(f'<img src="figures/precision_{_e(slug)}.png" alt="per-seed precision, '
                   f'release {_e(rel["id"])}">')
        out.append(f'<img src="figures/draw_auc_{_e(slug)}.png" alt="draw AUC per seed and '
                   f'draw, release {_e(rel["id"])}">')
        out.append('<p class="figs">Per submission: ' + " ".join(
            f'<a href="{_e(r["figure"])}">{_e(r["name"])}</a>' for r in rel["rows"]) + "</p>")
    out.append("<h2>Reference: the paper's Qwen2.5-1.5B results (not ranked)</h2>")
    ref = data.get("reference")
    if ref is None:
        out.append(f"<p>Not available: <code>submissions/{REFERENCE_DIR}/{REFERENCE_FILE}</code> "
                   "is absent.</p>")
    else:
        out.append('<p class="note">GRPO fine-tuning of Qwen2.5-1.5B-Instruct (the paper\'s '
                   "runs): a different model, scale and release than the tables above, shown "
                   "for context and not ranked. Sources: " + "; ".join(
                       f"<code>{_e(k)}</code> = {_e(v.replace('`', ''))}"
                       for k, v in REF_SOURCES.items()) + ".</p>")
        headers, rows = _ref_table(ref["rows"])
        out.append('<div class="scroll"><table class="sortable" id="reference"><thead><tr>')
        numeric = {"value [95% CI]", "chance", "ceiling", "n"}
        for h in headers:
            out.append(f'<th data-type="{"num" if h in numeric else "text"}" '
                       f'data-first="asc">{_e(h)}</th>')
        out.append("</tr></thead><tbody>")
        for raw, row in zip(ref["rows"], rows, strict=True):
            out.append(f'<tr class="ref-{_e(raw["source"])}">')
            for h, text in zip(headers, row, strict=True):
                sort = {"value [95% CI]": raw["value"], "chance": raw["chance"],
                        "ceiling": raw["ceiling"], "n": raw["n"]}.get(h, text)
                cls = ' class="num"' if h in numeric else ""
                out.append(f'<td{cls} data-sort="{_e(_sort_attr(sort))}">{_e(text)}</td>')
            out.append("</tr>")
        out.append("</tbody></table></div>")
    out += [f"<script>{_JS}</script>", "</body>", "</html>", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# figures

_EST_COLORS = ("#0969da", "#bf3989", "#1a7f37", "#bc4c00", "#8250df", "#0550ae", "#953800",
               "#116329", "#a40e26", "#6639ba")
_CONTROL_COLOR = "#8c959f"
_DRAW_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _colors(rows: list[dict]) -> dict[str, str]:
    out, i = {}, 0
    for r in rows:
        if r["kind"] == "control":
            out[r["name"]] = _CONTROL_COLOR
        else:
            out[r["name"]] = _EST_COLORS[i % len(_EST_COLORS)]
            i += 1
    return out


def _style(ax: Any) -> None:
    ax.grid(axis="x", color="#d0d7de", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _point(ax: Any, y: float, v: dict | None, color: str, control: bool, marker: str = "o",
           key: str = "precision") -> None:
    if not v or v.get(key) is None:
        return
    x = v[key]
    lo, hi = v.get("lo"), v.get("hi")
    if lo is not None and hi is not None:
        ax.plot([lo, hi], [y, y], color=color, linewidth=1.6, solid_capstyle="butt")
    ax.plot([x], [y], marker=marker, markersize=6, color=color,
            markerfacecolor="white" if control else color, markeredgewidth=1.4, linestyle="none")


def _ref_lines(ax: Any, entry: dict | None) -> None:
    if not entry:
        return
    if entry.get("chance") is not None:
        ax.axvline(entry["chance"], color="#cf222e", linestyle="--", linewidth=1)
    if entry.get("ceiling") is not None:
        ax.axvline(entry["ceiling"], color="#1a7f37", linestyle=":", linewidth=1.4)


def _plot_precision(data: dict) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows, seeds = data["rows"], data["seeds"] or ["-"]
    colors = _colors(rows)
    n = max(len(rows), 1)
    fig, axes = plt.subplots(2, len(seeds), figsize=(2.2 + 3.0 * len(seeds), 1.6 + 0.55 * n),
                             squeeze=False, sharey=True)
    ys = list(range(len(rows)))[::-1]
    for j, seed in enumerate(seeds):
        for i, gran in enumerate(("step", "rollout")):
            ax = axes[i][j]
            _style(ax)
            entries = [r["seeds"].get(seed, {}).get(gran) for r in rows]
            first = next((e for e in entries if e), None)
            _ref_lines(ax, first)
            for y, r, e in zip(ys, rows, entries, strict=True):
                _point(ax, y, e, colors[r["name"]], r["kind"] == "control")
            if first is None:
                ax.text(0.5, 0.5, "no ground truth\nin the learning window", ha="center",
                        va="center", fontsize=8, color="#57606a", transform=ax.transAxes)
            ax.set_xlim(-0.02, 1.02)
            ax.set_title(f"seed {seed}, {gran}-level", fontsize=9)
            ax.tick_params(labelsize=8)
            if i == 1:
                ax.set_xlabel("precision@|GT| (window, group label)", fontsize=8)
    axes[0][0].set_yticks(ys, [r["name"] for r in rows] if rows else [])
    axes[0][0].set_ylim(-0.7, n - 0.3)
    handles = [Line2D([], [], color="#cf222e", linestyle="--", label="chance"),
               Line2D([], [], color="#1a7f37", linestyle=":", label="ceiling"),
               Line2D([], [], color=_EST_COLORS[0], marker="o", linestyle="-",
                      label="estimator (95% CI)"),
               Line2D([], [], color=_CONTROL_COLOR, marker="o", markerfacecolor="white",
                      linestyle="-", label="control")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"Per-seed precision, release {data['release']}", fontsize=10)
    fig.subplots_adjust(left=0.16 if len(seeds) > 1 else 0.3, right=0.98, top=1 - 0.5 /
                        (1.6 + 0.55 * n), bottom=0.75 / (1.6 + 0.55 * n), wspace=0.08,
                        hspace=0.35)
    return fig


def _all_draw_ids(per_seed: list[dict]) -> list[str]:
    return sorted({d for draws in per_seed for d in (draws or {})})


def _plot_auc_panel(ax: Any, methods: list[tuple[str, str, bool, dict]],
                    draw_ids: list[str]) -> None:
    """Methods (label, color, is_control, {draw_id: interval}) top to bottom; one marker per draw.

    ``draw_ids`` fixes each draw's marker and vertical offset, so a draw keeps its marker in
    every panel of a figure.
    """
    _style(ax)
    ax.axvline(0.5, color="#cf222e", linestyle="--", linewidth=1)
    ys = list(range(len(methods)))[::-1]
    k = max(len(draw_ids), 1)
    for y, (_, color, control, draws) in zip(ys, methods, strict=True):
        for t, did in enumerate(draw_ids):
            off = ((k - 1) / 2 - t) * (0.7 / k)
            _point(ax, y + off, draws.get(did), color, control,
                   _DRAW_MARKERS[t % len(_DRAW_MARKERS)], key="point")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.7, max(len(methods), 1) - 0.3)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("residualized within-group AUC", fontsize=8)


def _draw_legend(fig: Any, draw_ids: list[str], extra: list | None = None) -> None:
    from matplotlib.lines import Line2D

    handles = list(extra or [])
    handles.append(Line2D([], [], color="#cf222e", linestyle="--", label="AUC 0.5 (no signal)"))
    for t, did in enumerate(draw_ids):
        handles.append(Line2D([], [], color="#57606a", marker=_DRAW_MARKERS[t % 8],
                              linestyle="none", label=did))
    handles.append(Line2D([], [], color=_CONTROL_COLOR, marker="o", markerfacecolor="white",
                          linestyle="-", label="control (hollow)"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize=8,
               frameon=False)


def _plot_draw_auc(data: dict) -> Any:
    import matplotlib.pyplot as plt

    rows, seeds = data["rows"], data["seeds"] or ["-"]
    colors = _colors(rows)
    n = max(len(rows), 1)
    height = 1.5 + 0.5 * n
    fig, axes = plt.subplots(1, len(seeds), figsize=(2.2 + 3.0 * len(seeds), height),
                             squeeze=False, sharey=True)
    ids = _all_draw_ids([r["seeds"].get(s) for r in rows for s in seeds])
    for j, seed in enumerate(seeds):
        methods = [(r["name"], colors[r["name"]], r["kind"] == "control",
                    r["seeds"].get(seed, {})) for r in rows]
        ax = axes[0][j]
        _plot_auc_panel(ax, methods, ids)
        ax.set_title(f"seed {seed}", fontsize=9)
        if not rows:
            ax.text(0.5, 0.5, "no submission scores draws", ha="center", va="center",
                    fontsize=8, color="#57606a", transform=ax.transAxes)
    axes[0][0].set_yticks(list(range(len(rows)))[::-1], [r["name"] for r in rows])
    _draw_legend(fig, ids)
    fig.suptitle(f"Draw AUC (fluency-residualized, 95% CI) per seed and draw, release "
                 f"{data['release']}", fontsize=10)
    fig.subplots_adjust(left=0.16 if len(seeds) > 1 else 0.3, right=0.98, top=1 - 0.5 / height,
                        bottom=0.75 / height, wspace=0.08)
    return fig


def _plot_submission(data: dict) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    seeds = data["seeds"] or ["-"]
    methods = data["draw_auc"]
    n_auc = len(seeds) if methods else 1
    height = 2.0 + 0.5 * max(len(methods), 2 * len(seeds) / 1.5, 3)
    fig, axes = plt.subplots(1, 1 + n_auc, figsize=(4.0 + 2.8 * n_auc, height), squeeze=False,
                             gridspec_kw={"width_ratios": [1.3] + [1] * n_auc})
    ax = axes[0][0]
    _style(ax)
    labels = []
    prec = {p["seed"]: p for p in data["precision"]}
    own = _CONTROL_COLOR if data.get("kind") == "control" else _EST_COLORS[0]
    for y, (seed, gran) in enumerate((s, g) for s in seeds[::-1] for g in ("rollout", "step")):
        e = (prec.get(seed) or {}).get(gran)
        if e:
            for key, color in (("chance", "#cf222e"), ("ceiling", "#1a7f37")):
                if e.get(key) is not None:
                    ax.plot([e[key]], [y], marker="|", markersize=12, color=color)
            _point(ax, y, e, own, data.get("kind") == "control")
        else:
            ax.text(0.5, y, "no ground truth in window", fontsize=7, color="#57606a",
                    va="center", ha="center")
        labels.append(f"seed {seed} {gran}")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.7, len(labels) - 0.3)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("precision@|GT| (window, group label)", fontsize=8)
    ax.set_title("precision vs chance and ceiling", fontsize=9)
    marks = [Line2D([], [], color="#cf222e", marker="|", linestyle="none", markersize=10,
                    label="chance"),
             Line2D([], [], color="#1a7f37", marker="|", linestyle="none", markersize=10,
                    label="ceiling")]
    ids = _all_draw_ids([d for m in methods for d in m["draws"]])
    if methods:
        for j, seed in enumerate(seeds):
            ax2 = axes[0][1 + j]
            rows = [(m["name"], _CONTROL_COLOR if m["kind"] == "control" else own,
                     m["kind"] == "control", m["draws"][j] or {}) for m in methods]
            _plot_auc_panel(ax2, rows, ids)
            ax2.set_yticks(list(range(len(rows)))[::-1],
                           [r[0] for r in rows] if j == 0 else [""] * len(rows))
            ax2.set_title(f"draw AUC, seed {seed}", fontsize=9)
        _draw_legend(fig, ids, marks)
    else:
        ax2 = axes[0][1]
        _style(ax2)
        ax2.text(0.5, 0.5, "does not score generation draws", ha="center", va="center",
                 fontsize=8, color="#57606a", transform=ax2.transAxes)
        ax2.set_yticks([])
        ax2.set_xticks([])
        fig.legend(handles=marks, loc="lower center", ncol=2, fontsize=8, frameon=False)
    scores_draws = any(m["name"] == data["estimator"] for m in methods)
    note = "" if scores_draws else " (does not score generation draws; the controls are shown)"
    fig.suptitle(f"submission {data['name']}{note}", fontsize=10)
    fig.subplots_adjust(left=0.1, right=0.98, wspace=0.25, top=1 - 0.55 / height,
                        bottom=0.85 / height)
    return fig


_PLOTTERS = {"precision": _plot_precision, "draw_auc": _plot_draw_auc,
             "submission": _plot_submission}


def _render_png(kind: str, data: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.style.context("default"), matplotlib.rc_context({"font.family": "DejaVu Sans",
                                                              "svg.hashsalt": "bt-bench"}):
        fig = _PLOTTERS[kind](data)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=FIGURE_DPI, metadata={"Software": None})
        plt.close(fig)
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------
# generate and check


@dataclass
class Generated:
    """Everything ``bt-bench leaderboard`` writes: text files and figures (rendered lazily)."""

    text: dict[str, str]
    figures: dict[str, dict]  # path -> {"kind", "data", "what"}
    data: dict


def _load_inputs(submissions_dir: Path) -> tuple[list[tuple[dict, dict]], list[dict] | None]:
    from benchmark.submissions import find_submissions, load_submission

    subs = [load_submission(p) for p in find_submissions(submissions_dir)]
    return [(s.meta, s.results) for s in subs], _read_reference(submissions_dir)


def _generate(submissions_dir: Path) -> Generated:
    from benchmark.io import dumps_json

    pairs, reference = _load_inputs(submissions_dir)
    data = leaderboard_data(pairs, reference)
    specs = _figure_specs(_group_by_release(build_rows(pairs)))
    return Generated(
        text={"README.md": render_markdown(data), "leaderboard.json": dumps_json(data),
              "index.html": render_html(data)},
        figures=specs, data=data)


def _existing_pngs(out: Path) -> set[str]:
    fig_dir = out / "figures"
    if not fig_dir.is_dir():
        return set()
    return {p.relative_to(out).as_posix() for p in fig_dir.rglob("*.png")}


def _committed_hashes(out: Path) -> dict[str, str]:
    import json

    p = out / "leaderboard.json"
    try:
        figs = json.loads(p.read_text(encoding="utf-8")).get("figures", {})
        return {k: v.get("data_sha256") for k, v in figs.items() if isinstance(v, dict)}
    except (OSError, ValueError, AttributeError):
        return {}


def generate(submissions_dir: str | Path = "submissions", out: str | Path = "leaderboard") -> \
        list[Path]:
    """Write the leaderboard into ``out`` and return the files written or kept.

    A PNG whose plotted data is unchanged (same data hash as in the existing ``leaderboard.json``)
    and that exists is kept as it is, so regenerating on another machine does not churn figures;
    PNGs under ``out/figures`` that are no longer generated are deleted.
    """
    from benchmark.io import atomic_write_bytes, atomic_write_text

    out = Path(out)
    gen = _generate(Path(submissions_dir))
    old = _committed_hashes(out)
    written = []
    for path, spec in sorted(gen.figures.items()):
        target = out / path
        if not (target.is_file() and old.get(path) == gen.data["figures"][path]["data_sha256"]):
            atomic_write_bytes(target, _render_png(spec["kind"], spec["data"]))
        written.append(target)
    for stale in sorted(_existing_pngs(out) - set(gen.figures)):
        (out / stale).unlink()
    for name, text in gen.text.items():
        atomic_write_text(out / name, text)
        written.append(out / name)
    return written


def check(submissions_dir: str | Path = "submissions", out: str | Path = "leaderboard") -> \
        list[str]:
    """Compare ``out`` with what :func:`generate` would write; return the stale paths.

    Markdown, JSON and HTML must be byte-identical. A PNG is stale when it is missing, when it is
    not generated any more, or when the data it plots changed (its data hash in the regenerated
    ``leaderboard.json`` differs from the one in ``out``); PNG bytes are not compared, because
    font rendering differs across machines.
    """
    out = Path(out)
    gen = _generate(Path(submissions_dir))
    stale = []
    for name, text in gen.text.items():
        p = out / name
        if not p.is_file() or p.read_bytes() != text.encode("utf-8"):
            stale.append(p.as_posix())
    old = _committed_hashes(out)
    for path in sorted(gen.figures):
        if not (out / path).is_file() or old.get(path) != gen.data["figures"][path]["data_sha256"]:
            stale.append((out / path).as_posix())
    for extra in sorted(_existing_pngs(out) - set(gen.figures)):
        stale.append((out / extra).as_posix() + " (no longer generated)")
    return stale


def leaderboard_command(args: Any) -> int:
    """``bt-bench leaderboard [--check]``: write, or check, ``--out``; exit 1 when stale."""
    import time

    t0 = time.perf_counter()
    if args.check:
        stale = check(args.submissions_dir, args.out)
        if stale:
            print(f"{args.out}/ is not what {REGENERATE} generates from {args.submissions_dir}/; "
                  "stale files:")
            for s in stale:
                print(f"  {s}")
            print(f"fix: {REGENERATE} --submissions-dir {args.submissions_dir} --out {args.out} "
                  "and commit the result")
            return 1
        print(f"{args.out}/ is up to date with {args.submissions_dir}/ "
              f"({time.perf_counter() - t0:.1f}s)")
        return 0
    written = generate(args.submissions_dir, args.out)
    print(f"wrote {len(written)} files to {args.out}/ ({time.perf_counter() - t0:.1f}s)")
    return 0

