"""Measurable cells and checklist counts of committed results, under the random reference.

Reads the committed ``submissions/*/results.json`` of a release (no replay, no estimator code)
and the release's shipped causal reference (``releases/<id>/seed<S>/causal.json``: the oracle's
and provenance's per-prompt removals), and applies the rules of docs/evaluation.md
("The random reference", "Measurable cells"):

* per (seed, task): the bonus-off effect, the stronger reference removal's margin over the
  random reference (the mean of the random sets), and whether the cell is measurable;
* per entry: the checklist counts and the overall verdict before (as recorded) and after (item
  10's random check and the precision caps against the random reference, unmeasurable cells not
  counted; everything else as recorded).

Usage: ``python scripts/measurable_cells.py [--release releases/tiny] [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmark import checklist as K
from benchmark.causal import score as C
from benchmark.causal import stats as S

ROOT = Path(__file__).resolve().parents[1]


def reference_rows(release: Path, seed: int, task: str, settings: S.CausalSettings) -> dict:
    """The oracle's and provenance's ``(point, replicates)`` from the shipped reference."""
    ref = C.task_reference(C.load_reference(release, seed), task)
    inputs = C.reference_inputs(ref)
    out = {}
    for m in C.REFERENCE_ROWS:
        if m in ref.methods:
            enc = S.encode_array(np.stack([np.stack([r.probs - r.base]) for r in ref.methods[m]]))
            out[m] = S.replicates(enc, inputs, seed, task, m, settings)
    return out


def cell(block: dict, rows: dict, seed: int, task: str, settings: S.CausalSettings) -> dict:
    """The measurability of one (seed, task) from a stored causal block and the reference rows."""
    rp, rr = S.random_reference(block, seed, task, settings)
    margins = {m: S.interval(p - rp, r - rr, settings.level) for m, (p, r) in rows.items()}
    m = S.measurability(S.bonus_off_interval(block, seed, task, settings), margins)
    return m | {"reference_point": rp, "reference_replicates": rr,
                "band_top": block["random_band"]["hi"]}


def _verdicts(per: dict) -> dict:
    return {k: K.Verdict(v["verdict"], dict(v.get("numbers") or {}), v.get("reason", ""))
            for k, v in (per or {}).items()}


def rescore_task(res: dict, t: str, cells: dict, settings: S.CausalSettings) -> tuple[list, str]:
    """One task's checklist under the new rules, from the recorded per-place numbers."""
    est = res["estimator"]["name"]
    task = res["tasks"][t]
    items = {it["item"]: it for it in task["checklist"]}
    v = {i: {} for i in K.ITEMS}
    for i in (1, 2, 8, 9):
        v[i] = _verdicts(items[i].get("per"))
    seeds_blocks = task["seeds"]
    for s, blk in seeds_blocks.items():
        p3 = (items[3].get("per") or {}).get(s)
        if p3 is not None and p3["numbers"].get("chance") is not None:
            n = {k: x for k, x in p3["numbers"].items() if k != "causal_gate"}
            v[3][s] = K.headroom(n)
        elif p3 is not None:
            v[3][s] = K.Verdict(p3["verdict"], {}, p3.get("reason", ""))
        p4 = (items[4].get("per") or {}).get(s)
        if p4 is not None and "lo" in p4["numbers"]:
            n = {k: x for k, x in p4["numbers"].items() if k != "causal_gate"}
            ctrl = blk["training"]["step-order"]["rollout"]["group"]["window"]["precision"]
            v[4][s] = K.timing(n, ctrl)
        elif p4 is not None:
            v[4][s] = K.Verdict(p4["verdict"], {}, p4.get("reason", ""))
        win = blk["training"][est]["rollout"]["group"].get("window")
        if win is not None:
            v[7][f"{s}/precision"] = K.Verdict(K.REPORTED, {"width": win["interval"][1]
                                                            - win["interval"][0]})
        for did, d in (blk["draws"].get(est) or {}).items():
            r = d["residualized"]
            v[7][f"{s}/{did}/auc"] = K.Verdict(K.REPORTED, {"width": r["hi"] - r["lo"]})
    causal = json.loads(json.dumps(task["causal"]))
    for s, b in (causal.get("per_seed") or {}).items():
        if not b.get("methods"):
            b["measurable"], b["measurable_reason"] = False, C.NO_BONUS
            continue
        c = cells[(t, int(s))]
        b["measurable"], b["measurable_reason"] = c["measurable"], c["measurable_reason"]
        p, r = S.replicates(b["methods"][est]["prompt_deltas"], b, int(s), t, est, settings)
        margin = S.interval(p - c["reference_point"], r - c["reference_replicates"],
                            settings.level)
        b["comparisons"]["random_band"] = margin
        b["checks"]["random_band"] = S.beats(margin["lo"], margin["hi"])
        b["verdict"] = K.combine(b["checks"].values())
    seeds = [int(s) for s in res["settings"]["seeds"]]
    return K.task_checklist(v, seeds, seeds, causal)


def before_counts(res: dict) -> dict:
    """Per counted item, the recorded places' verdict counts (every cell counted)."""
    return K.results_counts({t: {"checklist": [
        it | {"counts": K.count_places(it["per"])} for it in task["checklist"] if "per" in it]}
        for t, task in res["tasks"].items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", default=str(ROOT / "releases" / "tiny"))
    ap.add_argument("--submissions", default=str(ROOT / "submissions"))
    args = ap.parse_args()
    files = sorted(Path(args.submissions).glob("*/results.json"))
    results = {f.parent.name: json.loads(f.read_text()) for f in files}
    first = results["tracincp"] if "tracincp" in results else next(iter(results.values()))
    settings = S.settings_of(first["settings"])
    cells = {}
    for t in first["release"]["tasks"]:
        for s, b in sorted(first["tasks"][t]["causal"]["per_seed"].items()):
            if b.get("methods"):
                rows = reference_rows(Path(args.release), int(s), t, settings)
                cells[(t, int(s))] = cell(b, rows, int(s), t, settings)
    print(f"## Measurable cells of {first['release']['id']} {first['release']['version']}\n")
    print("| task | seed | bonus-off effect [95%] | random reference (mean) | old band top | "
          "stronger reference: margin over the random reference [95%] | measurable |")
    print("|---|---|---|---|---|---|---|")
    for (t, s), c in cells.items():
        bo, m = c["bonus_off"], c["reference_margin"]
        print(f"| {t} | {s} | {bo['point']:+.3f} [{bo['lo']:+.3f}, {bo['hi']:+.3f}] | "
              f"{c['reference_point']:+.3f} | {c['band_top']:+.3f} | {c['reference']}: "
              f"{m['point']:+.3f} [{m['lo']:+.3f}, {m['hi']:+.3f}] | "
              f"{'yes' if c['measurable'] else 'no'} |")
    print("\n## Checklist counts (pass/fail/inconclusive places) and overall verdict, "
          "before -> after\n")
    items = ("1", "2", "3", "4", "10")
    print("| entry | " + " | ".join(f"item {i}" for i in items) + " | overall |")
    print("|---|" + "---|" * (len(items) + 1))
    for res in results.values():
        before = before_counts(res)
        tasks = {}
        for t in res["tasks"]:
            its, verdict = rescore_task(res, t, cells, settings)
            tasks[t] = {"checklist": its, "verdict": verdict}
        after = K.results_counts(tasks)
        live = (res.get("live") or {}).get("item")
        overall = K.combine([x["verdict"] for x in tasks.values()]
                            + ([live["verdict"]] if live else []))

        def cnt(c: dict | None) -> str:
            return "-" if not c else f"{c['pass']}/{c['fail']}/{c['inconclusive']}"
        print(f"| {res['estimator']['name']} | " + " | ".join(
            f"{cnt(before.get(i))} -> {cnt(after.get(i))}" for i in items)
            + f" | {res['verdict']} -> {overall} |")


if __name__ == "__main__":
    main()
