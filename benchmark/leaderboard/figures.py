"""Which figures the leaderboard draws, from which numbers, in which colours.

Per release, task and track:

* ``figures/curves_<release>_<task>_<track>.png``: the removal curve of every entry (fraction of
  the bonus-off effect removed vs k, the number of top rollouts removed, as a share of |GT|), one
  panel per entry in rank order, each with the oracle, provenance and the random band;
* ``figures/precision_<release>_<task>_<track>.png``: per seed, step- and rollout-level window
  precision (group label) with intervals against chance and the granularity ceiling;
* ``figures/draw_auc_<release>_<task>_<track>.png``: per seed, the residualized within-group draw
  AUC with its interval, one marker per draw (only when an entry scores draws).

Per submission, ``figures/submissions/<name>.png``: one row per task with its removal curve next
to the controls it is compared with, its per-seed precision and its draw AUCs next to the
controls of the same evaluation.

A figure's *data* is everything it plots; its sha256 is recorded in ``leaderboard.json``, so a PNG
is redrawn only when its data changes and ``--check`` compares data, not pixels.
"""

from __future__ import annotations

from typing import Any

from benchmark.leaderboard import rows as R
from benchmark.leaderboard._common import get, round_floats, seed_key, slug

__all__ = ["CONTROL_COLOUR", "MARKERS", "PALETTE", "assign_colours", "figure_path",
           "figure_specs"]

#: entry colours: hue-distinct (tab10 without its grey), pairwise CIE76 distance >= 27
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#bcbd22", "#17becf")
#: every control is grey with hollow markers, told apart by marker and label
CONTROL_COLOUR = "#8c959f"
#: markers: the second cycle of the palette gets the next marker, so (colour, marker) stays unique
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
ORACLE_COLOUR = "#000000"
PROVENANCE_COLOUR = "#57606a"
BAND_COLOUR = "#d0d7de"
CHANCE_COLOUR = "#cf222e"
CEILING_COLOUR = "#1a7f37"
KINDS = ("curves", "precision", "draw_auc")


def assign_colours(entries: list[dict]) -> dict[str, dict[str, str]]:
    """Name -> ``{"colour", "marker"}``, fixed by the sorted names of the whole leaderboard.

    Estimators take :data:`PALETTE` colours in name order (the first ``len(PALETTE)`` are all
    different; after that the marker changes with each cycle); controls are grey
    (:data:`CONTROL_COLOUR`) with markers in name order. An entry has the same colour in every
    figure and release.
    """
    out: dict[str, dict[str, str]] = {}
    est = sorted({e["name"] for e in entries if e["kind"] != "control"})
    ctl = sorted({e["name"] for e in entries if e["kind"] == "control"})
    for i, name in enumerate(est):
        out[name] = {"colour": PALETTE[i % len(PALETTE)],
                     "marker": MARKERS[(i // len(PALETTE)) % len(MARKERS)]}
    for i, name in enumerate(ctl):
        out[name] = {"colour": CONTROL_COLOUR, "marker": MARKERS[i % len(MARKERS)]}
    return out


def figure_path(kind: str, release: str, task: str, track: str) -> str:
    """Path (relative to ``leaderboard/``) of a per-table figure of ``kind``."""
    return f"figures/{kind}_{slug(release)}_{slug(task)}_{slug(track)}.png"


def _behavior_text(b: dict | None) -> str:
    if not b:
        return ""
    return (f"{b.get('strength', '')}: {b.get('trigger_word', '?')} -> "
            f"{b.get('behavior_token', '?')}")


def _style_of(entry: dict) -> dict:
    return {"name": entry["name"], "kind": entry["kind"], "colour": entry["colour"],
            "marker": entry["marker"]}


def _reference_curves(board: Any, rel: dict, task: str) -> dict:
    """Oracle, provenance and random-band curves of ``task`` from the first submission with them."""
    for name in sorted(rel["entries"]):
        res = board.results[name]
        if R.curve_series(res, task, "oracle"):
            return {"oracle": R.curve_series(res, task, "oracle"),
                    "provenance": R.curve_series(res, task, "provenance"),
                    "random": R.random_band_series(res, task)}
    return {"oracle": {}, "provenance": {}, "random": {}}


def _table_specs(board: Any, rel: dict, task: dict, table: dict) -> dict[str, dict]:
    rid, tid, track = rel["id"], task["id"], table["track"]
    where = f"release {rid}, task {tid} ({_behavior_text(task['behavior'])}), {track} track"
    head = {"release": rid, "task": tid, "track": track,
            "behavior": _behavior_text(task["behavior"])}
    entries = [rel["entries"][r["name"]] for r in table["rows"]]

    def est(e: dict) -> str:
        return e["estimator"]["name"]

    specs: dict[str, dict] = {}
    if table["ranked_by"] == "causal_score":
        refc = _reference_curves(board, rel, tid)
        ref = task["reference"]
        data = dict(head, rows=[
            dict(_style_of(e), causal_score=r["causal_score"],
                 seeds=R.curve_series(board.results[e["name"]], tid, est(e)))
            for e, r in zip(entries, table["rows"], strict=True)],
            oracle={"causal_score": ref["oracle"]["causal_score"], "seeds": refc["oracle"]},
            provenance={"causal_score": ref["provenance"]["causal_score"],
                        "seeds": refc["provenance"]},
            random={"band": ref["random"]["band"], "seeds": refc["random"]})
        specs[figure_path("curves", rid, tid, track)] = {
            "kind": "curves", "data": round_floats(data),
            "what": f"removal curves (fraction of the bonus-off effect vs k) of every entry with "
                    f"the oracle, provenance and the random band; {where}"}
    prec_rows = [dict(_style_of(e), fallback_step="step" in e["fallbacks"],
                      seeds=R.precision_series(board.results[e["name"]], tid, est(e)))
                 for e in entries]
    seeds = sorted({s for r in prec_rows for s in r["seeds"]}, key=seed_key)
    if any(v for r in prec_rows for v in r["seeds"].values()):
        specs[figure_path("precision", rid, tid, track)] = {
            "kind": "precision", "data": round_floats(dict(head, seeds=seeds, rows=prec_rows)),
            "what": f"per-seed window precision (group label), step and rollout level, against "
                    f"chance and ceiling; {where}"}
    auc_rows = [dict(_style_of(e), fallback_draws="draws" in e["fallbacks"],
                     seeds=R.draw_series(board.results[e["name"]], tid, est(e)))
                for e in entries]
    auc_rows = [r for r in auc_rows if any(r["seeds"].values())]
    if auc_rows:
        specs[figure_path("draw_auc", rid, tid, track)] = {
            "kind": "draw_auc", "data": round_floats(dict(head, seeds=seeds, rows=auc_rows)),
            "what": f"residualized within-group draw AUC with 95% intervals per seed and draw; "
                    f"{where}"}
    return specs


def _submission_spec(board: Any, rel: dict, entry: dict) -> dict:
    res = board.results[entry["name"]]
    est = entry["estimator"]["name"]
    tasks = []
    for task in rel["tasks"]:
        tid = task["id"]
        compared = []
        for block in (get(res, "tasks", tid, "causal", "per_seed") or {}).values():
            compared += [c for c in block.get("comparisons", {}) if c != "random_band"]
        controls = sorted(set(compared) - {est})
        refc = _reference_curves(board, rel, tid)
        draw_methods = [est] + [c for c in res.get("controls", []) if c != est]
        tasks.append({
            "task": tid, "behavior": _behavior_text(task["behavior"]),
            "causal_score": R.interval(get(res, "tasks", tid, "summary", "causal_score", est)),
            "curves": {"estimator": R.curve_series(res, tid, est),
                       "controls": {c: R.curve_series(res, tid, c) for c in controls},
                       "oracle": refc["oracle"], "random": refc["random"]},
            "precision": R.precision_series(res, tid, est),
            "draws": [{"name": m, "kind": "estimator" if m == est else "control",
                       "seeds": R.draw_series(res, tid, m)} for m in draw_methods
                      if any(R.draw_series(res, tid, m).values())],
        })
    return {"name": entry["name"], "kind": entry["kind"], "estimator": est,
            "colour": entry["colour"], "marker": entry["marker"],
            "fallbacks": entry["fallbacks"], "release": rel["id"], "tasks": tasks}


def figure_specs(board: Any) -> dict[str, dict]:
    """Figure path -> ``{"kind", "data", "what"}``; ``data`` is everything the figure plots."""
    specs: dict[str, dict] = {}
    for rel in board.releases:
        for task in rel["tasks"]:
            for table in task["tracks"]:
                specs.update(_table_specs(board, rel, task, table))
        for name in sorted(rel["entries"]):
            entry = rel["entries"][name]
            specs[entry["figure"]] = {
                "kind": "submission",
                "data": round_floats(_submission_spec(board, rel, entry)),
                "what": f"{name}: per task, its removal curve next to the controls it is "
                        "compared with, per-seed precision against chance and ceiling, and its "
                        "residualized draw AUC per seed and draw next to the controls"}
    return specs
