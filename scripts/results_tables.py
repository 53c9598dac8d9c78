"""Per-task, per-seed tables of every submission's results.json (for docs and closing notes).

``python scripts/results_tables.py [--submissions submissions] [--out docs/tiny_results.md]``
prints (and writes) per task: causal scores per seed and mean with intervals (with the oracle,
provenance and the random band), the removal curves, precision and specificity per seed, the
residualized draw AUCs, and the checklist verdicts; and the suite summary.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tabulate import tabulate


def _f(x: float | None, d: int = 3) -> str:
    return "-" if x is None or x != x else f"{x:.{d}f}"


def _iv(d: dict | None) -> str:
    return "-" if not d else f"{_f(d['point'])} [{_f(d['lo'])}, {_f(d['hi'])}]"


def _table(rows, headers) -> str:
    return tabulate(rows, headers, "github", disable_numparse=True)


def task_tables(task: str, results: dict[str, dict]) -> list[str]:
    """The markdown lines of one task."""
    any_r = next(iter(results.values()))
    t0 = any_r["tasks"][task]
    seeds = sorted(t0["seeds"], key=int)
    b = t0["behavior"]
    out = [f"## Task `{task}` ({b['strength']}: `{b['trigger_word']}` -> "
           f"`{b['behavior_token']}`)", ""]
    causal = t0.get("causal", {}).get("per_seed", {})
    if causal:
        c0 = next(iter(causal.values()))
        out += [f"Causal score: area under the curve of the fraction of the bonus-off effect "
                f"removed against log k, k in {c0['k_grid']} (seed {next(iter(causal))}; the grid "
                f"is {c0.get('k_fractions', [0.25, 0.5, 1.0])} x |GT| per seed). Bonus-off "
                "effect per seed: " + ", ".join(
                    f"seed {s}: {_f(v['bonus_off_effect'])}" for s, v in causal.items()) + ".", ""]
        rows = []
        for ref in ("oracle", "provenance"):
            rows.append([f"({ref})"] + [_iv(causal[s]["methods"].get(ref, {}).get("score"))
                                        for s in seeds]
                        + [_iv(t0["summary"]["causal_score"].get(ref))])
        for name, r in results.items():
            t = r["tasks"][task]
            rows.append([name] + [_iv(t["causal"]["per_seed"][s]["methods"][name]["score"])
                                  for s in seeds]
                        + [_iv(t["summary"]["causal_score"].get(name))])
        rows.append(["(random band)"] + [
            f"{_f(causal[s]['random_band']['lo'])} .. {_f(causal[s]['random_band']['hi'])}"
            for s in seeds] + [f"{_f(t0['summary']['random_band']['lo'])} .. "
                               f"{_f(t0['summary']['random_band']['hi'])}"])
        rows.sort(key=lambda r: 0 if r[0].startswith("(o") else 1 if r[0].startswith("(p")
                  else 3 if r[0].startswith("(r") else 2)
        out += ["### Causal score [95% CI]", "",
                _table(rows, ["method"] + [f"seed {s}" for s in seeds] + ["mean over seeds"]),
                "", "### Removal curves (fraction of the bonus-off effect at each k)", ""]
        rows = []
        for name in ["oracle", "provenance", *results]:
            r = results.get(name, any_r)
            cur = [r["tasks"][task]["causal"]["per_seed"][s]["methods"].get(name, {})
                   .get("curve", []) for s in seeds]
            rows.append([name] + [" / ".join(_f(c["fraction"], 2) for c in cv) for cv in cur])
        out += [_table(rows, ["method"] + [f"seed {s}" for s in seeds]), ""]
    rows = []
    for name, r in results.items():
        t = r["tasks"][task]
        row = [name]
        for s in seeds:
            tr = t["seeds"][s]["training"][name]
            rw = tr["rollout"]["group"].get("window")
            sw = tr["step"]["group"].get("window")
            sp = next(iter(t["seeds"][s]["specificity"][name].values()), {})
            row.append("-" if rw is None else
                       f"{_f(rw['precision'])} [{_f(rw['interval'][0])}, "
                       f"{_f(rw['interval'][1])}]; step {_f(sw['precision'])}; other "
                       f"{_f(sp.get('share'))}")
        rows.append(row)
    ch = {s: any_r["tasks"][task]["seeds"][s]["training"][any_r["estimator"]["name"]]
          ["rollout"]["group"].get("window", {}) for s in seeds}
    sp_ch = {s: next(iter(any_r["tasks"][task]["seeds"][s]["specificity"][
        any_r["estimator"]["name"]].values()), {}).get("chance") for s in seeds}
    out += ["### Precision (learning window, group label) [95% CI]; step-level precision; "
            "share of the top-|GT| in the other task's ground truth", "",
            "Chance per seed: " + ", ".join(
                f"seed {s}: precision {_f(ch[s].get('chance'))}, other-task share "
                f"{_f(sp_ch[s])}" for s in seeds) + ".", "",
            _table(rows, ["method"] + [f"seed {s}" for s in seeds]), ""]
    rows = []
    for name, r in results.items():
        t = r["tasks"][task]
        for s in seeds:
            for did, m in sorted(t["seeds"][s]["draws"][name].items()):
                res, raw = m["residualized"], m["raw"]
                rows.append([name, s, did, _f(raw["point"]), _iv(res), raw["n"]])
    if rows:
        out += ["### Generation draws: within-group AUC, raw and fluency-residualized [95% CI]",
                "", _table(rows, ["method", "seed", "draw", "raw AUC", "residualized AUC",
                                  "pairs"]), ""]
    rows = [[name] + [c["verdict"] for c in r["tasks"][task]["checklist"]]
            + [r["tasks"][task]["verdict"]] for name, r in results.items()]
    out += ["### Checklist verdicts", "",
            _table(rows, ["method"] + [f"{c['item']} {c['key']}" for c in t0["checklist"]]
                   + ["task verdict"]), ""]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--submissions", default="submissions")
    ap.add_argument("--out", default="docs/tiny_results.md")
    args = ap.parse_args()
    results = {}
    for p in sorted(Path(args.submissions).glob("[!_]*/results.json")):
        r = json.loads(p.read_text())
        results[r["estimator"]["name"]] = r
    any_r = next(iter(results.values()))
    lines = [f"# Built-in estimators and controls on `{any_r['release']['id']}` "
             f"{any_r['release']['version']}", "",
             "Generated by `python scripts/results_tables.py` from `submissions/*/results.json`.",
             ""]
    rows = [[name, _iv(r["suite"].get("causal_score", {}).get(name)), r["estimator"]["track"],
             r["verdict"]] for name, r in results.items()]
    rows.sort(key=lambda row: -float(row[1].split()[0]) if row[1] != "-" else 0)
    lines += ["## Suite: causal score, mean over tasks and seeds [95% CI]", "",
              _table(rows, ["method", "suite causal score", "track", "verdict"]), ""]
    for task in any_r["tasks"]:
        lines += task_tables(task, results)
    text = "\n".join(lines)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
