"""Leaderboard generation on schema-3 results: ranking by paired comparisons, ties, tracks, tasks,
reference rows, fallback marks, colours, stable output, --check, the paper's reference table.

The submissions are built from real results files (``tests/data/leaderboard/*.json``: one-seed
evaluations of the built-ins, two controls, the open-track text-only control and an open-track
entry that falls back to a sketch cosine on the step view), trimmed by :func:`trim_results` to
what the leaderboard reads. Regenerate them with
``python -m tests.test_leaderboard RESULTS.json ...`` (see tests/data/leaderboard/README.md).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from benchmark.cli import main
from benchmark.errors import InputFileError
from benchmark.leaderboard import (
    PALETTE,
    LeaderboardError,
    assign_colours,
    build_entry,
    check,
    generate,
    leaderboard_data,
    paper_reference,
    rank_rows,
    render_html,
    render_markdown,
    suite_row,
    task_reference,
    task_row,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "leaderboard"
TASKS = ["qzxbt", "vkwjp"]
GATED_KEYS = ["magnitude", "fluency", "headroom", "timing", "seeds", "draws",
              "precision_of_estimate", "causal"]
#: submission name -> (results file, track, kind, declared fallbacks)
STANDARD = {
    "gas": ("gas", "gradient", "estimator", None),
    "c1-dot": ("c1-dot", "gradient", "estimator", None),
    "random": ("random", "gradient", "control", None),
    "norm-only": ("norm-only", "gradient", "control", None),
    "text-only": ("text-only", "open", "control", None),
    "trigger-text": ("trigger-text", "open", "estimator", ["step"]),
}


# ----------------------------------------------------------------------------------------------
# test data: trimmed real results (also used by test_leaderboard_browser.py)


def _pick(d: dict, keys) -> dict:
    return {k: d[k] for k in keys if k in d}


def trim_results(res: dict) -> dict:
    """Keep what the leaderboard reads of a schema-3 results dict (the estimator's own training
    blocks, every method's draws, the causal curves, stored per-prompt curve and bands, the
    causal bootstrap settings, verdicts)."""
    est = res["estimator"]["name"]
    iv = ("point", "lo", "hi")
    out = _pick(res, ("schema_version", "controls", "verdict"))
    out["settings"] = _pick(res["settings"], ("n_boot_causal", "level", "boot_seed",
                                              "tie_completions"))
    out["estimator"] = _pick(res["estimator"], ("name", "class", "sha256", "track", "tasks",
                                                "config", "fallbacks"))
    out["release"] = _pick(res["release"], ("id", "version", "manifest_sha256", "tasks"))
    out["suite"] = _pick(res["suite"], ("causal_score", "random_band", "tasks", "verdicts"))
    out["tasks"] = {}
    for t, task in res["tasks"].items():
        sm = task["summary"]
        summary = _pick(sm, ("seeds", "causal_score", "random_band", "specificity_mean",
                             "draw_auc_residualized_mean"))
        if "precision_window_group" in sm:
            summary["precision_window_group"] = {m: _pick(v, iv) for m, v in
                                                 sm["precision_window_group"].items()}
        seeds = {}
        for s, block in task["seeds"].items():
            tr = block["training"][est]
            seeds[s] = {
                "training": {est: {g: {"group": _pick(tr[g]["group"], ("window",))}
                                   for g in ("rollout", "step")}},
                "specificity": {est: block["specificity"][est]},
                "draws": {m: {d: {"residualized": _pick(v["residualized"], iv)}
                              for d, v in draws.items()}
                          for m, draws in block["draws"].items()},
            }
        causal = _pick(task["causal"], ("verdict", "reason", "scores", "random_band"))
        if "per_seed" in task["causal"]:
            causal["per_seed"] = {
                s: dict(_pick(b, ("gt_size", "k_grid", "verdict", "checks", "comparisons",
                                  "k_fractions", "bonus_off_prompt_delta", "random_effects")),
                        methods={m: {"score": v["score"],
                                     "curve": [_pick(p, ("k", "fraction", "source"))
                                               for p in v["curve"]],
                                     **_pick(v, ("prompt_deltas",))}
                                 for m, v in b["methods"].items()},
                        random_band=_pick(b["random_band"], ("lo", "hi", "curve")))
                for s, b in task["causal"]["per_seed"].items()}
        out["tasks"][t] = {
            "behavior": task["behavior"], "summary": summary, "seeds": seeds, "causal": causal,
            "checklist": [_pick(c, ("item", "key", "verdict", "gated"))
                          for c in task["checklist"]],
            "verdict": task["verdict"]}
    return out


def load_results(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def make_submission(root: Path, name: str, results: dict, kind: str = "estimator") -> Path:
    sub = root / name
    sub.mkdir(parents=True)
    (sub / "estimator.py").write_text("# test submission\n")
    meta = {"name": name, "authors": ["Test Author"], "track": results["estimator"]["track"],
            "kind": kind, "description": f"test entry {name}"}
    (sub / "submission.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    (sub / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    return sub


def standard_results() -> dict[str, tuple[dict, str]]:
    """Name -> (results, kind) of the six standard submissions."""
    out = {}
    for name, (file, _track, kind, fallbacks) in STANDARD.items():
        res = load_results(file)
        if fallbacks is not None:
            res["estimator"]["fallbacks"] = fallbacks
        out[name] = (res, kind)
    return out


def standard_submissions(root: Path) -> Path:
    """Gradient: gas, c1-dot and the random and norm-only controls; open: the text-only control
    and trigger-text (declares a step-view fallback)."""
    for name, (res, kind) in standard_results().items():
        make_submission(root, name, res, kind)
    return root


def set_causal(res: dict, task: str, point: float, lo: float, hi: float) -> dict:
    """Set the estimator's causal score on ``task`` (and the suite's, as the mean over tasks)."""
    est = res["estimator"]["name"]
    res["tasks"][task]["summary"]["causal_score"][est] = {"point": point, "lo": lo, "hi": hi}
    pts = [res["tasks"][t]["summary"]["causal_score"][est] for t in res["tasks"]]
    res["suite"]["causal_score"][est] = {k: sum(p[k] for p in pts) / len(pts)
                                         for k in ("point", "lo", "hi")}
    return res


REFERENCE_ROWS = [
    {"seed": "0", "table": "overall", "method": "C1-dot", "value": 0.4042, "lo": None,
     "hi": None, "chance": 0.0943, "ceiling": 0.5815, "n": 16000, "source": "recomputed"},
    {"seed": "1", "table": "overall", "method": "C1-dot", "value": 0.3825, "lo": None,
     "hi": None, "chance": 0.0936, "ceiling": 0.5721, "n": 16000, "source": "paper_csv"},
]


def _meta(name: str, res: dict, kind: str = "estimator") -> dict:
    return {"name": name, "authors": ["A"], "track": res["estimator"]["track"], "kind": kind}


# ----------------------------------------------------------------------------------------------
# ranking


def _row(name: str, point: float | None, lo: float = 0.0, hi: float = 0.0) -> dict:
    return {"name": name, "causal_score": None if point is None else
            {"point": point, "lo": lo, "hi": hi}}


def _better(*pairs: str):
    """``better(a, b)`` from pairs written ``"a>b"`` (a significantly better than b)."""
    wins = {tuple(p.split(">")) for p in pairs}
    return lambda a, b: (a, b) in wins


def test_rank_is_one_plus_the_number_significantly_better():
    rows = [_row("c", 0.5, 0.45, 0.55), _row("a", 0.8, 0.7, 0.9), _row("none", None),
            _row("b", 0.75, 0.68, 0.85), _row("d", 0.2, 0.1, 0.3)]
    # a and b are not separated; both beat c and d; c beats d
    ranked = rank_rows(rows, better=_better("a>c", "a>d", "b>c", "b>d", "c>d"))
    assert [r["name"] for r in ranked] == ["a", "b", "c", "d", "none"]
    assert [r["rank_label"] for r in ranked] == ["=1", "=1", "3", "4", "-"]
    assert [r["tied"] for r in ranked] == [True, True, False, False, False]
    assert [r["position"] for r in ranked] == [1, 2, 3, 4, 5]


def test_ties_are_never_chained_through_a_neighbour():
    # a ~ b and b ~ c (not separated), but a beats c: a and b rank 1 (nobody beats them), c
    # ranks 2 (only a beats it), not 1 as chained overlaps would make it
    rows = [_row("a", 0.8, 0.75, 0.85), _row("b", 0.72, 0.6, 0.8), _row("c", 0.62, 0.55, 0.66)]
    ranked = rank_rows(rows, better=_better("a>c"))
    assert [(r["name"], r["rank_label"]) for r in ranked] == [("a", "=1"), ("b", "=1"),
                                                              ("c", "2")]
    # a > b and b > c significantly, but a vs c not (a paired interval may be wider than the
    # two steps): the ranks count who beats whom, a 1, b 2, c 2
    ranked = rank_rows(rows, better=_better("a>b", "b>c"))
    assert [(r["name"], r["rank_label"]) for r in ranked] == [("a", "1"), ("b", "=2"),
                                                              ("c", "=2")]
    # ranks skip: two entries beat d, so d is 3rd even if they share rank 1
    rows.append(_row("d", 0.1, 0.0, 0.2))
    ranked = rank_rows(rows, better=_better("a>d", "b>d", "c>d"))
    assert [r["rank_label"] for r in ranked] == ["=1", "=1", "=1", "4"]


def test_rows_are_ordered_by_rank_then_score_then_name():
    # a wide interval that nobody beats (y) ranks 1; a row with a higher point that one entry
    # beats (x) ranks 2, below y
    rows = [_row("x", 0.48, 0.46, 0.5), _row("y", 0.3, -0.5, 1.0), _row("a", 0.5, 0.49, 0.51)]
    ranked = rank_rows(rows, better=_better("a>x"))
    assert [(r["name"], r["rank_label"]) for r in ranked] == [("a", "=1"), ("y", "=1"),
                                                              ("x", "2")]
    # equal points and ranks are ordered by name, so the order never depends on input order
    again = rank_rows(list(reversed([_row("f", 0.3, 0.25, 0.35), _row("e", 0.3, 0.25, 0.35)])))
    assert [r["name"] for r in again] == ["e", "f"]


def test_without_pairs_an_entry_is_better_when_its_interval_lies_wholly_above():
    # touching intervals are not separated; disjoint ones are; never chained
    assert rank_rows([_row("a", 0.6, 0.5, 0.7), _row("b", 0.4, 0.3, 0.5)])[1]["rank_label"] == "=1"
    assert rank_rows([_row("a", 0.6, 0.51, 0.7), _row("b", 0.4, 0.3, 0.5)])[1]["rank_label"] == "2"
    ranked = rank_rows([_row("a", 0.8, 0.75, 0.85), _row("b", 0.72, 0.65, 0.76),
                        _row("c", 0.62, 0.55, 0.66)])
    assert [r["rank_label"] for r in ranked] == ["=1", "=1", "2"]


def test_rank_key_is_a_parameter():
    rows = [{"name": "a", "precision": {"point": 0.2, "lo": 0.1, "hi": 0.3}, "causal_score": None},
            {"name": "b", "precision": {"point": 0.9, "lo": 0.8, "hi": 1.0}, "causal_score": None}]
    assert [r["name"] for r in rank_rows(rows, "precision")] == ["b", "a"]
    assert [r["rank_label"] for r in rank_rows(rows, "precision")] == ["1", "2"]
    assert [r["rank_label"] for r in rank_rows(rows)] == ["-", "-"]


def test_pairwise_table_is_every_ordered_pair_of_paired_differences():
    import numpy as np

    from benchmark.causal import score as C
    from benchmark.leaderboard.paired import pairwise

    rng = np.random.default_rng(0)
    base = rng.normal(0, 0.02, 500)  # a shared resample component: pairing removes it
    reps = {"a": (0.5, 0.5 + base + rng.normal(0, 0.005, 500)),
            "b": (0.45, 0.45 + base + rng.normal(0, 0.005, 500)),
            "c": (0.44, 0.44 + base + rng.normal(0, 0.005, 500))}
    pw = pairwise(reps, 0.95)
    assert sorted(pw) == ["a", "b", "c"] and all(sorted(v) == sorted(set(pw) - {k})
                                                 for k, v in pw.items())
    for x in pw:
        for y in pw[x]:
            assert pw[x][y] == C.paired_difference(reps[x], reps[y], 0.95)
            assert pw[x][y]["point"] == pytest.approx(-pw[y][x]["point"])
    # 0.05 apart with a paired noise of sd 0.007: significant; 0.01 apart: not beyond the
    # cross-machine tolerance. Unpaired (sd 0.02 each) a and b would overlap.
    assert pw["a"]["b"]["verdict"] == "better" and pw["b"]["a"]["verdict"] == "worse"
    assert pw["b"]["c"]["verdict"] == "tie" and pw["c"]["b"]["verdict"] == "tie"
    assert np.quantile(reps["a"][1], 0.025) < np.quantile(reps["b"][1], 0.975)


# ----------------------------------------------------------------------------------------------
# reading schema-3 results


def test_task_row_reads_the_summary_of_its_task():
    res = load_results("gas")
    sm = res["tasks"]["vkwjp"]["summary"]
    row = task_row(_meta("gas", res), res, "vkwjp")
    assert row["causal_score"] == sm["causal_score"]["GAS"]
    assert row["precision"] == {k: sm["precision_window_group"]["GAS"][k]
                                for k in ("point", "lo", "hi")}
    win = res["tasks"]["vkwjp"]["seeds"]["0"]["training"]["GAS"]
    assert row["chance"] == win["rollout"]["group"]["window"]["chance"]
    assert row["lift"] == pytest.approx(row["precision"]["point"] / row["chance"])
    assert row["step_precision"] == win["step"]["group"]["window"]["precision"]
    assert row["step_ceiling"] == win["step"]["group"]["window"]["ceiling"]
    assert row["specificity"] == sm["specificity_mean"]["GAS"]
    assert row["draw_auc"] == sm["draw_auc_residualized_mean"]["GAS"]
    items = {c["key"]: c["verdict"] for c in res["tasks"]["vkwjp"]["checklist"]}
    assert row["checklist"] == {k: items[k] for k in GATED_KEYS}
    assert row["verdict"] == res["tasks"]["vkwjp"]["verdict"]
    assert row["fallbacks"] == []


def test_reference_rows_come_from_the_results():
    res = load_results("c1-dot")
    sm = res["tasks"]["qzxbt"]["summary"]
    ref = task_reference(res, "qzxbt")
    assert ref["oracle"]["causal_score"] == sm["causal_score"]["oracle"]
    assert ref["provenance"]["causal_score"] == sm["causal_score"]["provenance"]
    assert ref["random"]["band"] == sm["random_band"]
    win = res["tasks"]["qzxbt"]["seeds"]["0"]["training"]["C1-dot"]
    assert ref["oracle"]["precision"] == 1.0
    assert ref["oracle"]["step_precision"] == win["step"]["group"]["window"]["ceiling"]
    assert ref["random"]["precision"] == win["rollout"]["group"]["window"]["chance"]
    spec = res["tasks"]["qzxbt"]["seeds"]["0"]["specificity"]["C1-dot"]["vkwjp"]
    assert ref["random"]["specificity"] == spec["chance"]
    # the reference rows do not depend on the estimator
    assert task_reference(load_results("random"), "qzxbt") == ref


def test_suite_row_and_band():
    res = load_results("gas")
    row = suite_row(_meta("gas", res), res, TASKS)
    assert row["causal_score"] == res["suite"]["causal_score"]["GAS"]
    assert row["tasks"] == {t: res["tasks"][t]["summary"]["causal_score"]["GAS"] for t in TASKS}
    assert row["task_verdicts"] == {t: res["tasks"][t]["verdict"] for t in TASKS}
    from benchmark.leaderboard.rows import suite_reference

    ref = suite_reference(res, TASKS)
    bands = [res["tasks"][t]["summary"]["random_band"] for t in TASKS]
    assert ref["random"]["band"] == pytest.approx(
        {k: sum(b[k] for b in bands) / 2 for k in ("lo", "hi")})
    assert ref["oracle"]["causal_score"] == res["suite"]["causal_score"]["oracle"]
    res["suite"]["random_band"] = {"lo": -0.5, "hi": 0.5}  # recorded by the evaluator: used
    assert suite_reference(res, TASKS)["random"]["band"] == {"lo": -0.5, "hi": 0.5}


def test_checks_column_in_markdown_json_and_html(tmp_path):
    root = tmp_path / "submissions"
    gas = load_results("gas")
    gas["checklist_counts"] = {"10": {"key": "causal", "pass": 9, "fail": 1, "inconclusive": 1,
                                      "not_counted": 1, "measurable": 11, "verdict": "fail"}}
    make_submission(root, "gas", gas)
    make_submission(root, "c1-dot", load_results("c1-dot"))
    generate(root, tmp_path / "lb")
    md = (tmp_path / "lb" / "README.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| rank")
                  and "suite causal score" in line)
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[3] == "suite causal score [95% CI]" and "live [95% CI] (draws)" not in cols
    assert cols[-2:] == ["checks (pass/measurable)", "verdict"]
    rows = {r[1].split("]")[0].strip("*["): r
            for r in _tables(md)["Suite: mean over tasks and seeds / Gradient track"]}
    # the checks column: per item, pass / measurable places; its tooltip says it in words
    assert rows["gas"][-2] == "10: 9/11"
    html = (tmp_path / "lb" / "index.html").read_text()
    table = html.split('id="suite-tiny-gradient"')[1].split("</table>")[0]
    row = table.split('<tr data-name="gas">')[1].split("</tr>")[0]
    assert "item 10 (causal): 9 of 11 measurable places pass, 1 fail, 1 inconclusive (1 not " \
        "counted)" in row
    assert "No season panel yet" in md  # without a panel: development scores only


def _season_files(root: Path, names: list[str], ranked: list[str]) -> dict:
    """A season panel of three draws whose results are each entry's public results (so its
    panel score is its public score), with ``ranked`` frozen before the panel."""
    from benchmark.contract import file_sha256
    from benchmark.io import atomic_write_text, dumps_json
    from benchmark.submissions.panel import PANEL_SCHEMA, panel_summary

    season = "2026-12-07-abc123"
    cells = {"0/a": {"measurable": True}, "0/b": {"measurable": True}}
    draws = [{"draw_id": d, "redraw": 0, "sft_sha256": "c" * 64,
              "trajectory_sha256": f"{d:064x}", "reference": {"x": 0.0}, "cells": cells}
             for d in (11, 12, 13)]
    panel = {"schema_version": PANEL_SCHEMA, "season": season,
             "created_utc": "2026-12-07T06:00:00Z", "family_version": "2.0",
             "scale": "micro-family", "draws": draws, "season_seed": "abc123" + "0" * 26,
             "screen": {"rule": "test"}, "min_cells": 6, "power": {}, "bindings": {},
             "candidates": [{"index": 0, "draw_id": 10, "accepted": False,
                             "reason": "2 of 2 cells not measurable"}]
             + [{"index": i + 1, "draw_id": d["draw_id"], "accepted": True, "reason": "ok"}
                for i, d in enumerate(draws)],
             "entries": {n: {"estimator_sha256": json.loads((root / n / "results.json")
                                                            .read_text())["estimator"]["sha256"],
                             "frozen_utc": "2026-12-07T05:00:00Z"} for n in ranked}}
    atomic_write_text(root / "_panel" / "panel.json", dumps_json(panel))
    for n in names:
        res = json.loads((root / n / "results.json").read_text())
        recs = [{"draw_id": d["draw_id"], "trajectory_sha256": d["trajectory_sha256"],
                 "results": res} for d in draws]
        doc = {"schema_version": PANEL_SCHEMA, "season": season, "draws": recs,
               "estimator_sha256": file_sha256(root / n / "estimator.py"),
               "summary": panel_summary(res, recs, season)}
        (root / n / "panel.json").write_text(json.dumps(doc))
    return panel


def test_the_season_table_ranks_by_the_panel_and_marks_provisional_entries(tmp_path):
    root = tmp_path / "submissions"
    for name in ("gas", "c1-dot", "norm-only"):
        make_submission(root, name, load_results(name))
    _season_files(root, ["gas", "c1-dot", "norm-only"], ranked=["gas", "c1-dot"])
    generate(root, tmp_path / "lb")
    data = json.loads((tmp_path / "lb" / "leaderboard.json").read_text())
    season = data["season"]
    assert season["season"] == "2026-12-07-abc123"
    assert [d["draw_id"] for d in season["draws"]] == [11, 12, 13]
    (table,) = season["tracks"]
    rows = {r["name"]: r for r in table["rows"]}
    assert rows["norm-only"]["status"] == "provisional" and rows["gas"]["status"] == "ranked"
    # every draw holds the public results: the panel score is the public score; with the draws
    # fixed its interval is the public one's (three copies of one draw's replicates), and the
    # family interval (draws resampled) is the same here, since every draw is the same
    for r in rows.values():
        assert r["panel_score"]["point"] == pytest.approx(r["public"]["point"], abs=1e-9)
        assert r["panel_score"]["lo"] == pytest.approx(r["public"]["lo"], abs=1e-9)
        assert r["family"]["lo"] == pytest.approx(r["public"]["lo"], abs=1e-9)
        assert set(r["per_draw"]) == {"11", "12", "13"}
        assert set(r["items"]) == {"1", "2", "3", "4", "10"} and r["verdict"] in (
            "pass", "fail", "inconclusive")
    assert season["screen"]["rejected"] == [{"draw_id": 10,
                                             "reason": "2 of 2 cells not measurable"}]
    # ranks come from the ranked entries only; the provisional one shows the rank it would get
    ranked = [r["name"] for r in table["rows"] if r["status"] == "ranked"]
    assert ranked == sorted(ranked, key=lambda n: rows[n]["rank"])
    assert table["rows"][-1]["name"] == "norm-only"  # provisional rows come last
    md = (tmp_path / "lb" / "README.md").read_text()
    assert "## Season `2026-12-07-abc123`: the ranking" in md
    line = next(x for x in md.splitlines() if x.startswith("| (") and "norm-only" in x)
    assert "provisional" in line
    assert "Ranks from the public release to the panel" in md
    assert "4 candidate draws screened in the season seed's sequence, 3 accepted" in md
    assert "family [95%]" in md and "panel checks (pass/sig. fail/measurable)" in md
    assert (tmp_path / "lb" / "figures" / "season" / "gradient.png").read_bytes()[:4] == \
        b"\x89PNG"
    html = (tmp_path / "lb" / "index.html").read_text()
    assert 'id="season-gradient"' in html and "provisional" in html
    # a panel.json of another season is refused, naming the fix
    doc = json.loads((root / "gas" / "panel.json").read_text())
    doc["season"] = "2026-11-01-ffffff"
    (root / "gas" / "panel.json").write_text(json.dumps(doc))
    with pytest.raises(LeaderboardError, match="bt-bench panel score gas"):
        generate(root, tmp_path / "lb2")


def test_fallbacks_default_to_none_and_are_validated():
    res = load_results("trigger-text")
    assert res["estimator"]["fallbacks"] == ["step"]  # recorded from the class attribute
    assert build_entry(_meta("t", res), res)["fallbacks"] == ["step"]
    del res["estimator"]["fallbacks"]  # a results file without the key: none
    assert build_entry(_meta("t", res), res)["fallbacks"] == []
    res["estimator"]["fallbacks"] = ["draws", "step"]
    assert build_entry(_meta("t", res), res)["fallbacks"] == ["step", "draws"]
    res["estimator"]["fallbacks"] = ["steps"]
    with pytest.raises(LeaderboardError, match=r"estimator.fallbacks is \['steps'\]; expected a "
                                               r"list drawn from \['step', 'draws'\]"):
        build_entry(_meta("t", res), res)


def test_schema_1_results_are_refused(tmp_path):
    res = load_results("gas")
    res["schema_version"] = 1
    make_submission(tmp_path / "submissions", "old", res)
    with pytest.raises(LeaderboardError, match=r"'old': results.json has schema_version 1; the "
                                               r"leaderboard reads schema 3 .* --force"):
        generate(tmp_path / "submissions", tmp_path / "lb")


# ----------------------------------------------------------------------------------------------
# colours


def _lab(hex_colour: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB hex colour."""
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    xyz = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_palette_colours_are_distinct():
    # CIE76 distance: ~2.3 is a just-noticeable difference; 25+ reads as a different colour
    for a, b in itertools.combinations(PALETTE, 2):
        assert math.dist(_lab(a), _lab(b)) >= 25, (a, b)


def test_colours_are_fixed_per_name_and_distinct_per_entry():
    names = [f"e{i:02d}" for i in range(12)]
    entries = [{"name": n, "kind": "estimator"} for n in names] + [
        {"name": "random", "kind": "control"}, {"name": "norm-only", "kind": "control"}]
    colours = assign_colours(entries)
    assert assign_colours(list(reversed(entries))) == colours  # input order does not matter
    first = [colours[n]["colour"] for n in names[:len(PALETTE)]]
    assert len(set(first)) == len(PALETTE)
    pairs = [(colours[n]["colour"], colours[n]["marker"]) for n in names]
    assert len(set(pairs)) == len(names)  # past the palette, the marker tells them apart
    assert colours["random"]["colour"] == colours["norm-only"]["colour"] != first[0]
    assert colours["random"]["marker"] != colours["norm-only"]["marker"]


# ----------------------------------------------------------------------------------------------
# generation


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> tuple[Path, Path]:
    root = standard_submissions(tmp_path_factory.mktemp("lb") / "submissions")
    (root / "_reference").mkdir()
    (root / "_reference" / "paper_rows.json").write_text(json.dumps(REFERENCE_ROWS))
    out = root.parent / "leaderboard"
    generate(root, out)
    return root, out


def _tables(md: str) -> dict[str, list[list[str]]]:
    """Markdown tables by the heading and track line above them: title -> rows of cells."""
    out: dict[str, list[list[str]]] = {}
    heading = track = ""
    for line in md.split("## Reference:")[0].splitlines():
        if line.startswith("### "):
            heading = line[4:]
        elif line.startswith("**") and "track**" in line:
            track = line.split("**")[1]
        elif line.startswith("| ") and not line.startswith("| rank"):
            out.setdefault(f"{heading} / {track}", []).append(
                [c.strip() for c in line.strip("|").split("|")])
    return out


def test_one_table_per_track_and_task_ranked_by_causal_score(board):
    _, out = board
    data = json.loads((out / "leaderboard.json").read_text())
    (rel,) = data["releases"]
    assert rel["id"] == "tiny" and [t["id"] for t in rel["tasks"]] == TASKS
    results = {n: r for n, (r, _) in standard_results().items()}
    for task in rel["tasks"]:
        assert [t["track"] for t in task["tracks"]] == ["gradient", "open"]
        for table in task["tracks"]:
            assert table["ranked_by"] == "causal_score"
            names = [r["name"] for r in table["rows"]]
            assert {STANDARD[n][1] for n in names} == {table["track"]}
            ranks = [(r["rank"], -r["causal_score"]["point"]) for r in table["rows"]]
            assert ranks == sorted(ranks)  # by rank, then by score
            for r in table["rows"]:
                res = results[r["name"]]
                want = res["tasks"][task["id"]]["summary"]["causal_score"][
                    res["estimator"]["name"]]
                assert r["causal_score"] == pytest.approx(want)
    # vkwjp, gradient: c1-dot and gas are not separated from each other (paired), both beat
    # the controls, which are not separated either
    vk = rel["tasks"][1]["tracks"][0]
    assert [(r["name"], r["rank_label"]) for r in vk["rows"]] == [
        ("c1-dot", "=1"), ("gas", "=1"), ("norm-only", "=3"), ("random", "=3")]
    assert vk["pairwise"]["c1-dot"]["gas"]["verdict"] == "tie"
    # qzxbt, open: text-only beats trigger-text in the paired comparison
    qz = rel["tasks"][0]["tracks"][1]
    assert [(r["name"], r["rank_label"]) for r in qz["rows"]] == [("text-only", "1"),
                                                                  ("trigger-text", "2")]
    # the suite: mean over tasks and seeds, one table per track
    suite = {t["track"]: t for t in rel["suite"]["tracks"]}
    assert [(r["name"], r["rank_label"]) for r in suite["gradient"]["rows"]] == [
        ("c1-dot", "=1"), ("gas", "=1"), ("random", "=3"), ("norm-only", "=3")]
    assert suite["gradient"]["rows"][0]["causal_score"] == pytest.approx(
        results["c1-dot"]["suite"]["causal_score"]["C1-dot"])
    assert [r["name"] for r in suite["open"]["rows"]] == ["text-only", "trigger-text"]


def test_oracle_and_provenance_on_top_random_band_at_the_bottom(board):
    _, out = board
    md = (out / "README.md").read_text()
    tables = _tables(md)
    assert len(tables) == 2 + 2 * 2  # suite and two tasks, two tracks each
    for title, rows in tables.items():
        names = [r[1] for r in rows]
        assert names[0] == "**oracle (group labels)**", title
        assert names[1] == "**provenance (rollout labels)**", title
        assert names[-1].startswith("**random band"), title
        assert [r[0] for r in rows[:2]] == ["ref", "ref"] and rows[-1][0] == "ref"
    gas = load_results("gas")
    vk = tables["Task `vkwjp` (weak: trigger `snarfle` -> `VKWJP`) / Gradient track"]
    oracle = gas["tasks"]["vkwjp"]["summary"]["causal_score"]["oracle"]
    band = gas["tasks"]["vkwjp"]["summary"]["random_band"]
    assert vk[0][3] == f"{oracle['point']:.3f} [{oracle['lo']:.3f}, {oracle['hi']:.3f}]"
    assert vk[-1][3] == f"{band['lo']:.3f} .. {band['hi']:.3f}"
    assert vk[-1][4].endswith("(chance)") and vk[0][4] == "1.000 (ceiling)"
    html = (out / "index.html").read_text()
    table = html.split('id="task-tiny-vkwjp-gradient"')[1].split("</table>")[0]
    top, ranked, bottom = table.split("<tbody")[1:]
    assert 'data-name="oracle"' in top and 'data-name="provenance"' in top
    assert 'data-name="random"' in bottom and 'class="reference"' in bottom
    assert 'class="ranked"' in ranked and ranked.count("<tr ") == 4


def test_fallbacks_are_marked_where_their_numbers_show(board):
    _, out = board
    tables = _tables((out / "README.md").read_text())
    for task in ("`qzxbt` (strong: trigger `frobnitz` -> `QZXBT`)",
                 "`vkwjp` (weak: trigger `snarfle` -> `VKWJP`)"):
        rows = {r[1].split("]")[0].strip("*[") : r for r in tables[f"Task {task} / Open track"]}
        assert rows["trigger-text"][5].endswith(" \u2020")  # step P: a fallback
        assert "\u2020" not in rows["trigger-text"][4]  # precision: its own method
        assert "\u2020" not in rows["text-only"][5]
        gradient = tables[f"Task {task} / Gradient track"]
        assert not any("\u2020" in c for r in gradient for c in r)
    html = (out / "index.html").read_text()
    table = html.split('id="task-tiny-qzxbt-open"')[1].split("</table>")[0]
    row = table.split('<tr data-name="trigger-text">')[1].split("</tr>")[0]
    assert 'class="num fallback" title="falls back to a generic sketch method on the step view' \
        in row
    data = json.loads((out / "leaderboard.json").read_text())
    entries = data["releases"][0]["entries"]
    assert entries["trigger-text"]["fallbacks"] == ["step"]
    assert entries["gas"]["fallbacks"] == []


def test_specificity_of_builtins_and_controls(board):
    _, out = board
    tables = _tables((out / "README.md").read_text())
    results = {n: r for n, (r, _) in standard_results().items()}
    for task, title in (("qzxbt", "Task `qzxbt` (strong: trigger `frobnitz` -> `QZXBT`)"),
                        ("vkwjp", "Task `vkwjp` (weak: trigger `snarfle` -> `VKWJP`)")):
        rows = tables[f"{title} / Gradient track"] + tables[f"{title} / Open track"]
        shown = {r[1].split("]")[0].strip("*["): r[6] for r in rows}
        for name, res in results.items():
            want = res["tasks"][task]["summary"]["specificity_mean"][res["estimator"]["name"]]
            assert shown[name] == f"{want:.3f}"
        chance = res["tasks"][task]["seeds"]["0"]["specificity"][res["estimator"]["name"]]
        other = next(t for t in TASKS if t != task)
        assert shown["random band / chance"] == f"{chance[other]['chance']:.3f}"


def test_figures_are_drawn_listed_and_linked(board):
    _, out = board
    data = json.loads((out / "leaderboard.json").read_text())
    md = (out / "README.md").read_text()
    html = (out / "index.html").read_text()
    rel = data["releases"][0]
    expected = set()
    for task in rel["tasks"]:
        for table in task["tracks"]:
            kinds = {"curves", "precision"} | ({"draw_auc"} if table["track"] == "gradient"
                                               else set())  # no open entry scores draws
            assert set(table["figures"]) == kinds
            for path in table["figures"].values():
                expected.add(path)
                assert f"]({path})" in md and f'src="{path}"' in html
    expected |= {f"figures/submissions/{n}.png" for n in STANDARD}
    assert set(data["figures"]) == expected
    for path in expected:
        assert (out / path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data["figures"][path]["data_sha256"]) == 64
    assert "http://" not in html and "https://" not in html  # nothing fetched from the network


def test_reference_table_is_separate_and_labelled(board):
    _, out = board
    md = (out / "README.md").read_text()
    head, ref = md.split("## Reference: the paper's Qwen2.5-1.5B results (not ranked)")
    assert "C1-dot" not in head and "0.4042" in ref and "paper_csv" in ref and "recomputed" in ref
    data = json.loads((out / "leaderboard.json").read_text())
    assert data["reference"]["rows"] == REFERENCE_ROWS
    assert 'id="reference"' in (out / "index.html").read_text()


def test_same_inputs_give_byte_identical_output(board, tmp_path):
    root, out = board
    again = tmp_path / "again"
    generate(root, again)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again).as_posix() for p in again.rglob("*")
                           if p.is_file())
    assert len(files) == 3 + 10 + len(STANDARD)
    for f in files:
        assert (out / f).read_bytes() == (again / f).read_bytes(), f
    assert check(root, again) == []


def test_check_detects_stale_files(board, tmp_path, capsys):
    root, out = board
    lb = tmp_path / "leaderboard"
    shutil.copytree(out, lb)
    assert main(["leaderboard", "--submissions-dir", str(root), "--out", str(lb),
                 "--check"]) == 0
    (lb / "README.md").write_text((lb / "README.md").read_text() + "hand edit\n")
    (lb / "figures" / "submissions" / "gas.png").unlink()
    (lb / "figures" / "submissions" / "old.png").write_bytes(b"x")
    rc = main(["leaderboard", "--submissions-dir", str(root), "--out", str(lb), "--check"])
    out_text = capsys.readouterr().out
    assert rc == 1
    assert f"{lb}/README.md" in out_text
    assert f"{lb}/figures/submissions/gas.png" in out_text
    assert f"{lb}/figures/submissions/old.png (no longer generated)" in out_text
    assert "leaderboard.json" not in out_text.split("stale files:")[1].split("fix:")[0]
    assert f"fix: bt-bench leaderboard --submissions-dir {root} --out {lb}" in out_text
    # regenerating fixes it: the missing figure is drawn, the stale one removed
    generate(root, lb)
    assert check(root, lb) == []
    assert not (lb / "figures" / "submissions" / "old.png").exists()


def test_figures_are_redrawn_only_when_their_data_changes(board, tmp_path):
    root, out = board
    subs, lb = tmp_path / "submissions", tmp_path / "leaderboard"
    shutil.copytree(root, subs)
    shutil.copytree(out, lb)
    kept = lb / "figures" / "curves_tiny_qzxbt_gradient.png"
    kept.write_bytes(b"\x89PNG\r\n\x1a\n-- drawn on another machine --")
    res = json.loads((subs / "trigger-text" / "results.json").read_text())
    res["tasks"]["qzxbt"]["seeds"]["0"]["training"]["trigger-text"]["step"]["group"]["window"][
        "precision"] = 0.1
    (subs / "trigger-text" / "results.json").write_text(json.dumps(res))
    stale = check(subs, lb)
    assert stale == [f"{lb}/README.md", f"{lb}/leaderboard.json", f"{lb}/index.html",
                     f"{lb}/figures/precision_tiny_qzxbt_open.png",
                     f"{lb}/figures/submissions/trigger-text.png"]
    generate(subs, lb)
    assert check(subs, lb) == []
    assert kept.read_bytes().endswith(b"-- drawn on another machine --")  # data unchanged: kept
    changed = lb / "figures" / "precision_tiny_qzxbt_open.png"
    assert changed.read_bytes() != (out / "figures" / "precision_tiny_qzxbt_open.png").read_bytes()


def test_releases_are_ranked_apart_and_must_agree_on_the_build(tmp_path):
    root = tmp_path / "submissions"
    gas, c1 = load_results("gas"), load_results("c1-dot")
    c1["release"]["id"] = "small"
    make_submission(root, "gas", gas)
    make_submission(root, "c1-dot", c1)
    generate(root, tmp_path / "lb")
    data = json.loads((tmp_path / "lb" / "leaderboard.json").read_text())
    assert [(r["id"], list(r["entries"])) for r in data["releases"]] == [
        ("small", ["c1-dot"]), ("tiny", ["gas"])]
    other = load_results("random")
    other["release"]["manifest_sha256"] = "b" * 64
    make_submission(root, "random", other, kind="control")
    with pytest.raises(LeaderboardError, match=r"disagree on its manifest sha256: gas \(49925afc"):
        generate(root, tmp_path / "lb2")


def test_reference_rows_must_agree_within_a_release(tmp_path):
    root = tmp_path / "submissions"
    make_submission(root, "gas", load_results("gas"))
    c1 = load_results("c1-dot")
    c1["tasks"]["vkwjp"]["summary"]["causal_score"]["oracle"]["point"] = 0.5
    make_submission(root, "c1-dot", c1)
    with pytest.raises(LeaderboardError, match=r"release 'tiny': suite reference rows\.oracle\."
                                               r"tasks\.vkwjp\.point differs between "
                                               r"submissions 'c1-dot' \(0\.5\) and 'gas'"):
        generate(root, tmp_path / "lb")


def test_an_entry_must_cover_every_task(tmp_path):
    root = tmp_path / "submissions"
    make_submission(root, "gas", load_results("gas"))
    c1 = load_results("c1-dot")
    del c1["tasks"]["vkwjp"]
    c1["release"]["tasks"] = ["qzxbt"]
    make_submission(root, "c1-dot", c1)
    with pytest.raises(LeaderboardError, match=r"'c1-dot' on release 'tiny' has no results for "
                                               r"task\(s\) vkwjp"):
        generate(root, tmp_path / "lb")


def test_without_causal_scores_task_tables_rank_by_precision(tmp_path):
    root = tmp_path / "submissions"
    for name in ("gas", "c1-dot"):
        res = load_results(name)
        res["suite"].pop("causal_score")
        for task in res["tasks"].values():
            task["summary"].pop("causal_score")
            task["summary"].pop("random_band")
            task["causal"] = {"verdict": "not_run", "reason": "skipped (--no-causal)"}
        make_submission(root, name, res)
    generate(root, tmp_path / "lb")
    data = json.loads((tmp_path / "lb" / "leaderboard.json").read_text())
    rel = data["releases"][0]
    assert rel["suite"]["tracks"][0]["ranked_by"] is None
    assert [r["rank_label"] for r in rel["suite"]["tracks"][0]["rows"]] == ["-", "-"]
    table = rel["tasks"][0]["tracks"][0]
    assert table["ranked_by"] == "precision" and set(table["figures"]) == {"precision",
                                                                           "draw_auc"}
    assert [r["name"] for r in table["rows"]] == ["gas", "c1-dot"]  # 0.980 > 0.860 on qzxbt
    md = (tmp_path / "lb" / "README.md").read_text()
    assert "**Gradient track** (no causal reference on this release: ranked by precision)" in md


def test_ranks_and_pairwise_table_follow_from_the_stored_curves(board):
    import numpy as np

    from benchmark.leaderboard.paired import entry_replicates

    _, out = board
    data = json.loads((out / "leaderboard.json").read_text())
    (rel,) = data["releases"]
    results = {n: r for n, (r, _) in standard_results().items()}
    reps = {n: entry_replicates(n, r, TASKS) for n, r in results.items()}
    tables = [("suite", t) for t in rel["suite"]["tracks"]] + [
        (task["id"], t) for task in rel["tasks"] for t in task["tracks"]]
    for scope, table in tables:
        pw = table["pairwise"]
        names = [r["name"] for r in table["rows"]]
        assert sorted(pw) == sorted(names)
        for a in names:
            for b in names:
                if a == b:
                    continue
                d = reps[a][scope][1] - reps[b][scope][1]
                lo, hi = np.quantile(d, [0.025, 0.975])
                want = "better" if lo > 0.01 else "worse" if hi < -0.01 else "tie"
                assert pw[a][b]["verdict"] == want, (scope, a, b)
                # the board writes numbers rounded to 10 decimals (<= 5e-11 each; derived)
                assert [pw[a][b]["lo"], pw[a][b]["hi"]] == pytest.approx([lo, hi], abs=1e-9)
        for r in table["rows"]:
            beaten_by = sum(pw[o][r["name"]]["verdict"] == "better" for o in names
                            if o != r["name"])
            assert r["rank"] == 1 + beaten_by
            assert r["better_than"] == [o for o in names if o != r["name"]
                                        and pw[r["name"]][o]["verdict"] == "better"]
        ranks = [r["rank"] for r in table["rows"]]
        assert ranks == sorted(ranks)
    md = (out / "README.md").read_text()
    assert md.count("Significantly better than") == len(tables)
    html = (out / "index.html").read_text()
    assert html.count('<table class="pairwise"') == len(tables)
    assert 'id="pairs-task-tiny-vkwjp-gradient"' in html


def test_a_results_file_whose_curve_does_not_give_its_scores_is_refused(tmp_path):
    from benchmark.causal.score import decode_array, encode_array

    root = tmp_path / "submissions"
    res = load_results("gas")
    block = res["tasks"]["vkwjp"]["causal"]["per_seed"]["0"]
    d = decode_array(block["methods"]["GAS"]["prompt_deltas"])
    block["methods"]["GAS"]["prompt_deltas"] = encode_array(d * 0.5)
    make_submission(root, "gas", res)
    with pytest.raises(LeaderboardError, match=r"'gas': its causal score on task vkwjp \(point "
                                               r".*\) does not follow from its stored removal "
                                               r"curve .* --force"):
        generate(root, tmp_path / "lb")
    res = load_results("gas")
    del res["tasks"]["qzxbt"]["causal"]["per_seed"]["0"]["methods"]["GAS"]["prompt_deltas"]
    make_submission(tmp_path / "s2", "gas", res)
    with pytest.raises(LeaderboardError, match=r"'gas': results.json has no stored removal curve "
                                               r"\(tasks.qzxbt.causal.per_seed.0.methods.GAS."
                                               r"prompt_deltas\)"):
        generate(tmp_path / "s2", tmp_path / "lb")


def _same_name(res: dict) -> dict:
    return load_results("gas")  # a second submission of the same estimator


def _other_boot_seed(res: dict) -> dict:
    res["settings"]["boot_seed"] = 1
    return res


def _no_score_on_vkwjp(res: dict) -> dict:
    res["tasks"]["vkwjp"]["causal"]["per_seed"]["0"]["methods"] = {}  # as if no bonus were paid
    return res


@pytest.mark.parametrize(("edit", "message"), [
    (_other_boot_seed, r"causal bootstrap settings\.boot_seed differs between submissions "
                       r"'c1-dot' \(1\) and 'gas'"),
    (_same_name, r"submissions 'c1-dot' and 'gas' both name their estimator 'GAS' in the "
                 r"gradient track"),
    (_no_score_on_vkwjp, r"causal scores on different \(task, seed\) sets \(c1-dot: qzxbt/0; "
                         r"gas: qzxbt/0, vkwjp/0\)"),
])
def test_entries_must_be_comparable_pairwise(tmp_path, edit, message):
    root = tmp_path / "submissions"
    make_submission(root, "gas", load_results("gas"))
    make_submission(root, "c1-dot", edit(load_results("c1-dot")))
    with pytest.raises(LeaderboardError, match=message):
        generate(root, tmp_path / "lb")


def test_malformed_reference_file_is_an_error(tmp_path):
    root = tmp_path / "submissions"
    make_submission(root, "gas", load_results("gas"))
    (root / "_reference").mkdir()
    (root / "_reference" / "paper_rows.json").write_text(json.dumps([{"seed": "0"}]))
    with pytest.raises(InputFileError, match=r"row 0 has keys \['seed'\]; expected exactly"):
        generate(root, tmp_path / "lb")


def test_empty_submissions_give_an_empty_board(tmp_path):
    (tmp_path / "submissions").mkdir()
    generate(tmp_path / "submissions", tmp_path / "lb")
    assert "No submissions yet." in (tmp_path / "lb" / "README.md").read_text()
    assert "Not available" in (tmp_path / "lb" / "index.html").read_text()


def _rescore_causal(res: dict) -> dict:
    """Recompute a results dict's causal scores (per task and the suite) from its stored curves
    with ``benchmark.causal.score.replicates``: the mean over seeds of the per-seed replicates."""
    import numpy as np

    from benchmark.causal import score as C

    est = res["estimator"]["name"]
    settings = C.settings_of(res["settings"])
    every = []
    for t, task in res["tasks"].items():
        xs = [C.replicates(b["methods"][est]["prompt_deltas"], b, int(s), t, est, settings)
              for s, b in task["causal"]["per_seed"].items()]
        every += xs
        task["summary"]["causal_score"][est] = C.interval(
            float(np.mean([p for p, _ in xs])), np.mean([r for _, r in xs], axis=0))
    res["suite"]["causal_score"][est] = C.interval(
        float(np.mean([p for p, _ in every])), np.mean([r for _, r in every], axis=0))
    return res


def test_multi_seed_results_plot_every_seed(tmp_path):
    """Two seeds (the second a shifted copy of the first): rows average, figures draw both."""
    res = load_results("gas")
    for task in res["tasks"].values():
        for block in ("seeds",):
            task[block]["1"] = copy.deepcopy(task[block]["0"])
        task["causal"]["per_seed"]["1"] = copy.deepcopy(task["causal"]["per_seed"]["0"])
        win = task["seeds"]["1"]["training"]["GAS"]["step"]["group"]["window"]
        win["precision"] = win["precision"] / 2
    make_submission(tmp_path / "submissions", "gas", _rescore_causal(res))
    generate(tmp_path / "submissions", tmp_path / "lb")
    data = json.loads((tmp_path / "lb" / "leaderboard.json").read_text())
    row = data["releases"][0]["tasks"][0]["tracks"][0]["rows"][0]
    step0 = res["tasks"]["qzxbt"]["seeds"]["0"]["training"]["GAS"]["step"]["group"]["window"]
    assert row["step_precision"] == pytest.approx(0.75 * step0["precision"])
    assert (tmp_path / "lb" / "figures" / "precision_tiny_qzxbt_gradient.png").is_file()


# ----------------------------------------------------------------------------------------------
# the paper's reference rows


def test_paper_reference_rows(paper_runs):
    rows = paper_reference(paper_runs, paper_runs / "results_table.csv", n_boot=200)
    keys = [(r["seed"], r["table"], r["method"]) for r in rows]
    assert len(keys) == len(set(keys))
    by_source = {s: [r for r in rows if r["source"] == s] for s in ("recomputed", "paper_csv")}
    assert len(by_source["recomputed"]) + len(by_source["paper_csv"]) == len(rows)
    recomputed = {(r["seed"], r["table"], r["method"]) for r in by_source["recomputed"]}
    assert ("0", "overall", "C1-dot") in recomputed
    # seeds 1 and 2 of the step-level tables need files the paper did not release
    assert ("1", "overall", "C1-dot") in {(r["seed"], r["table"], r["method"])
                                         for r in by_source["paper_csv"]}
    import csv

    with (paper_runs / "results_table.csv").open() as fh:
        csv_keys = {(r["seed"], r["table"], r["method"]) for r in csv.DictReader(fh)}
    assert csv_keys <= set(keys)
    assert set(rows[0]) == {"seed", "table", "method", "value", "lo", "hi", "chance", "ceiling",
                            "n", "source"}


# ----------------------------------------------------------------------------------------------
# end to end on a real release: submit a new estimator, the row appears everywhere


NEW_ESTIMATOR = '''"""A new estimator for the test: in-context cosine minus a step penalty."""

import numpy as np

from estimators.base import BaseEstimator, sketch_cosine


class EarlyCosine(BaseEstimator):
    name = "early-cosine"
    track = "gradient"
    tasks = ("rollouts",)

    def __init__(self, weight: float = 0.1) -> None:
        self.weight = weight

    def score_rollouts(self, view):
        return sketch_cosine(view, view.target("in_context")) - self.weight * view.steps
'''


# ----------------------------------------------------------------------------------------------
# text from a pull request: the generator escapes every string itself (verify refuses such text
# today, but the renderers do not rely on it)

HOSTILE = "x|y\n| 1 | fake | row |\u202e<script>alert(1)</script>`](https://evil.example)&amp;"


def _hostile_board() -> dict:
    """The standard submissions with hostile text in every string the renderers show."""
    pairs = []
    for i, (name, (res, kind)) in enumerate(sorted(standard_results().items())):
        res = copy.deepcopy(res)
        res["release"]["id"] = "tiny`|" + HOSTILE
        for t in res["tasks"].values():
            t["behavior"] = {**t["behavior"], "trigger_word": "a``b|" + HOSTILE,
                             "strength": HOSTILE}
            t["verdict"] = f'fail" onmouseover="alert({i})'
            for c in t["checklist"]:
                c["verdict"] = "<b>pass</b>\n|"
        res["verdict"] = HOSTILE
        meta = {**_meta(name, res, kind), "description": HOSTILE}
        if i == 0:
            meta["name"] = name + HOSTILE
        pairs.append((meta, res))
    reference = [{**r, "method": HOSTILE, "source": 'x" onclick="alert(1)'}
                 for r in REFERENCE_ROWS]
    return leaderboard_data(pairs, reference)


class _Tags:
    """Start tags and the cell count of every table row of an HTML text (stdlib parser)."""

    def __init__(self, text: str) -> None:
        from html.parser import HTMLParser

        self.tags: list[tuple[str, dict]] = []
        self.rows: list[int] = []  # cells per <tr>, in order
        self.tables = 0
        outer = self

        class P(HTMLParser):
            def handle_starttag(self, tag, attrs):
                outer.tags.append((tag, dict(attrs)))
                if tag == "table":
                    outer.tables += 1
                elif tag == "tr":
                    outer.rows.append(0)
                elif tag in ("td", "th"):
                    outer.rows[-1] += 1

        P().feed(text)


def test_markdown_cells_stay_cells_and_text_stays_text():
    """Rendered by an independent CommonMark parser with GitHub's tables (markdown-it-py): every
    row keeps its cells, no tag or link of the submissions' text survives, and the bidi override
    is shown as an escape."""
    from markdown_it import MarkdownIt

    clean = standard_results()
    md = render_markdown(_hostile_board())
    assert "\u202e" not in md
    page = _Tags(MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md))
    base = _Tags(MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(
        render_markdown(leaderboard_data([(_meta(n, r, k), r) for n, (r, k) in clean.items()],
                                         REFERENCE_ROWS))))
    assert page.tables == base.tables and page.rows == base.rows  # no row split, no cell added
    tags = [t for t, _ in page.tags]
    assert "script" not in tags and "b" not in tags
    hrefs = [a.get("href", "") for t, a in page.tags if t == "a"]
    assert all("://" not in h and ":" not in h.split("/")[0] for h in hrefs), hrefs  # relative
    assert "\\u202e" in md and "&lt;script&gt;" in MarkdownIt("commonmark").render(md)


def test_html_text_attributes_and_classes_are_escaped():
    clean = standard_results()
    text = render_html(_hostile_board())
    page = _Tags(text)
    base = _Tags(render_html(leaderboard_data(
        [(_meta(n, r, k), r) for n, (r, k) in clean.items()], REFERENCE_ROWS)))
    assert page.tables == base.tables and page.rows == base.rows
    assert [t for t, _ in page.tags].count("script") == 1  # the page's own sorting script
    assert [t for t, _ in page.tags].count("b") == [t for t, _ in base.tags].count("b")
    assert not [a for _, attrs in page.tags for a in attrs if a.startswith("on")]
    classes = [a["class"] for _, a in page.tags if "class" in a]
    assert all(re.fullmatch(r"[A-Za-z0-9_ -]*", c) for c in classes), classes
    assert "\u202e" not in text and "\\u202e" in text
    hrefs = [a["href"] for t, a in page.tags if t == "a"]
    assert all(re.fullmatch(r"[A-Za-z0-9_./%-]*", h) for h in hrefs), hrefs


def test_figures_draw_names_as_written_not_as_mathtext():
    """A "$...$" in a name is text: matplotlib does not parse it (a malformed one used to stop
    the rendering of the whole leaderboard)."""
    from benchmark.leaderboard.board import build_board
    from benchmark.leaderboard.figures import figure_specs
    from benchmark.leaderboard.plots import render_png

    pairs = [(_meta(n, r, k), r) for n, (r, k) in sorted(standard_results().items())]
    pairs[0][0]["name"] = "x$\\notacommand{$"
    specs = figure_specs(build_board(pairs))
    data = next(v["data"] for v in specs.values()
                if v["kind"] == "submission" and v["data"]["name"] == "x$\\notacommand{$")
    assert render_png("submission", data)[:4] == b"\x89PNG"


def test_new_submission_appears_in_markdown_json_html_and_figures(micro_release, tmp_path):
    from benchmark.submissions import submit

    est = tmp_path / "early_cosine.py"
    est.write_text(NEW_ESTIMATOR)
    subs = tmp_path / "submissions"
    submit(ROOT / "estimators" / "gas.py", "gas", ["bt-bench"], release=micro_release,
           submissions_dir=subs, progress=False, panel=False)
    rc = main(["submit", str(est), "--name", "early-cosine", "--authors", "New Person",
               "--release", str(micro_release), "--submissions-dir", str(subs), "--no-progress",
               "--no-panel"])
    assert rc == 0
    out = tmp_path / "leaderboard"
    assert main(["leaderboard", "--submissions-dir", str(subs), "--out", str(out)]) == 0
    data = json.loads((out / "leaderboard.json").read_text())
    (rel,) = data["releases"]
    assert rel["entries"]["early-cosine"]["estimator"]["name"] == "early-cosine"
    for task in rel["tasks"]:
        (table,) = task["tracks"]
        assert {r["name"] for r in table["rows"]} == {"gas", "early-cosine"}
        assert table["figures"]["precision"] in data["figures"]
    assert "[early-cosine](../submissions/early-cosine/)" in (out / "README.md").read_text()
    assert 'data-name="early-cosine"' in (out / "index.html").read_text()
    assert (out / "figures" / "submissions" / "early-cosine.png").is_file()
    assert main(["leaderboard", "--submissions-dir", str(subs), "--out", str(out),
                 "--check"]) == 0


if __name__ == "__main__":
    # python -m tests.test_leaderboard RESULTS.json ...: write trimmed copies into DATA
    DATA.mkdir(parents=True, exist_ok=True)
    for arg in sys.argv[1:]:
        trimmed = trim_results(json.loads(Path(arg).read_text()))
        text = json.dumps(trimmed, sort_keys=True, separators=(",", ":"))
        (DATA / Path(arg).name).write_text(text + "\n")
        print(f"wrote {DATA / Path(arg).name}")


def test_open_track_label_metrics_are_shown_as_not_measurable():
    """The open track's view gives the labels away: its precision and AUC cells are
    marked "(n/m)" with the reason in the tooltip; the gradient track's are plain numbers."""
    from benchmark.checklist import OPEN_TRACK_LABELS
    from benchmark.leaderboard.columns import _task_cells
    from benchmark.leaderboard.rows import task_row

    opened = load_results("text-only")
    assert opened["estimator"]["track"] == "open"
    task = next(iter(opened["tasks"]))
    row = task_row(_meta("text-only", opened), opened, task) | {"rank_label": "1", "rank": 1}
    assert row["label_metrics"] == {"measurable": False, "reason": OPEN_TRACK_LABELS}
    cells = _task_cells(row)
    for key in ("precision", "step_precision", "draw_auc"):
        assert cells[key].text.endswith("(n/m)") and "gives the bonus" in cells[key].title
    assert cells["causal_score"].text not in ("n/m", "-")
    grad = load_results("gas")
    row = task_row(_meta("gas", grad), grad, task) | {"rank_label": "1", "rank": 1}
    assert row["label_metrics"] == {"measurable": True}
    assert "n/m" not in _task_cells(row)["precision"].text


def test_the_time_column_shows_the_recorded_cost_of_the_release_it_was_measured_on():
    from benchmark.leaderboard.columns import suite_columns, time_cell
    from benchmark.leaderboard.rows import entry_time

    cost = {"release": "tiny", "score_rollouts_s": 212.4, "env_build_s": 47.6,
            "machine": "AMD EPYC, 2 cores (AVX512)"}
    res = {"release": {"id": "tiny"}}
    t = entry_time({"cost": cost}, res)
    assert t == {"score_rollouts_s": 212.4, "env_build_s": 47.6,
                 "machine": "AMD EPYC, 2 cores (AVX512)"}
    cell = time_cell(t)
    assert (cell.text, cell.sort) == ("212 (+48 env)", 212.4)
    assert "measured on AMD EPYC, 2 cores (AVX512)" in cell.title
    assert time_cell({**t, "env_build_s": None}).text == "212"
    # a cost measured on another release, or none, shows nothing
    assert entry_time({"cost": {**cost, "release": "micro"}}, res) is None
    assert entry_time({}, res) is None and time_cell(None).text == "-"
    keys = [c.key for c in suite_columns({"tasks": []})]
    assert keys.index("time") == keys.index("checks") - 1
