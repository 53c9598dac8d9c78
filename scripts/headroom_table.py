"""Headroom and spread per task: best entry vs best control vs oracle (for docs and notes).

``python scripts/headroom_table.py SUBMISSIONS [SUBMISSIONS ...] [--labels 2.0 3.0]``

For each submissions folder (e.g. the one of release 2.0 from git history and the current one)
and each task and track, from every ``results.json``:

* **causal**: the best estimator's and the best control's causal score (mean over seeds, 95%
  interval) and the oracle's; *spread* = best estimator - best control; the causal score has no
  computable ceiling (a method that orders the ground truth beats the oracle), so the oracle is
  shown as a reference, not as headroom;
* **precision** (rollout level, group label, learning window, mean over seeds): the ceiling, the
  best estimator and the best control; *headroom* = ceiling - best estimator, *spread* = best
  estimator - best control;
* **step P** (step granularity, mean over seeds): GAS, norm-only and fluency, and each control's
  gap to GAS (the paper's finding is a control within 0.05 of GAS);
* **curves** (gradient track, per task): the oracle, the two best estimators and the strongest
  control, the fraction of the bonus-off effect removed at each k of the grid (mean over seeds),
  the causal score (log-k area) and the plain mean of the points (docs/causal.md).

Every number is read from the results files; nothing is recomputed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from tabulate import tabulate

from benchmark.submissions import load_submission


def _f(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.3f}"


def _iv(d: dict | None) -> str:
    return "-" if not d else f"{_f(d['point'])} [{_f(d['lo'])}, {_f(d['hi'])}]"


def _load(folder: Path) -> dict[str, dict]:
    """``name -> results`` of every submission folder under ``folder`` (schema >= 3)."""
    out = {}
    for p in sorted(folder.glob("*/results.json")):
        r = json.loads(p.read_text())
        if r.get("schema_version", 0) >= 3:
            out[p.parent.name] = r
    return out


TASK_ORDER = ("qzxbt", "vkwjp", "kwex", "zorp")


def _kind(folder: Path, name: str) -> str:
    return load_submission(folder / name).meta["kind"]


def _tasks(results: list[dict]) -> list[str]:
    """Every task of ``results``, tiny's order first, then by name."""
    tasks = {t for r in results for t in r["tasks"]}
    return sorted(tasks, key=lambda t: (TASK_ORDER.index(t) if t in TASK_ORDER else 9, t))


def _step_p(r: dict, task: str, method: str) -> float | None:
    vals = []
    for s in r["tasks"][task]["seeds"].values():
        tr = s.get("training", {}).get(method)
        if not tr:
            return None
        vals.append(tr["step"]["group"]["window"]["precision"])
    return float(np.mean(vals)) if vals else None


def task_rows(folder: Path, label: str) -> list[list[str]]:
    """One row per (task, track) of the submissions in ``folder``."""
    res = _load(folder)
    rows = []
    for task in _tasks(list(res.values())):
        for track in ("gradient", "open"):
            cands = {n: r for n, r in res.items() if task in r["tasks"]
                     and (r["estimator"]["track"] == track or track == "open")
                     and n != "memorizer"}
            causal, prec = {}, {}
            for n, r in cands.items():
                s = r["tasks"][task]["summary"]
                est = r["estimator"]["name"]
                if s.get("causal_score", {}).get(est):
                    causal[n] = s["causal_score"][est]
                if s.get("precision_window_group", {}).get(est):
                    prec[n] = s["precision_window_group"][est]
            ests = [n for n in causal if _kind(folder, n) == "estimator"]
            ctrls = [n for n in causal if _kind(folder, n) == "control"]
            if not ests or not ctrls:
                continue
            be = max(ests, key=lambda n: causal[n]["point"])
            bc = max(ctrls, key=lambda n: causal[n]["point"])
            pe = max((n for n in ests if n in prec), key=lambda n: prec[n]["point"])
            pc = max((n for n in ctrls if n in prec), key=lambda n: prec[n]["point"])
            any_r = res[be]
            oracle = any_r["tasks"][task]["summary"]["causal_score"].get("oracle")
            ceil = float(np.mean([s["training"][any_r["estimator"]["name"]]["rollout"]["group"]
                                  ["window"]["ceiling"]
                                  for s in any_r["tasks"][task]["seeds"].values()]))
            rows.append([
                label, task, track, f"{be} {_iv(causal[be])}", f"{bc} {_iv(causal[bc])}",
                _iv(oracle), _f(causal[be]["point"] - causal[bc]["point"]),
                _f(ceil), f"{pe} {_f(prec[pe]['point'])}", f"{pc} {_f(prec[pc]['point'])}",
                _f(ceil - prec[pe]["point"]), _f(prec[pe]["point"] - prec[pc]["point"]),
            ])
    return rows


def step_rows(folder: Path, label: str) -> list[list[str]]:
    """Step-level precision of GAS, norm-only and fluency per task (means over seeds)."""
    res = _load(folder)
    gas = res.get("gas")
    if gas is None:
        return []
    rows = []
    for task in gas["tasks"]:
        g = _step_p(gas, task, "GAS")
        n = _step_p(gas, task, "norm-only")
        f = _step_p(gas, task, "fluency")
        rows.append([label, task, _f(g), _f(n), _f(None if n is None else n - g), _f(f),
                     _f(None if f is None else f - g)])
    return rows


def curve_rows(folder: Path, label: str) -> list[list[str]]:
    """Removal curves of the oracle, the two best gradient estimators and the best control."""
    res = {n: r for n, r in _load(folder).items() if r["estimator"]["track"] == "gradient"
           and n != "memorizer"}
    rows = []
    for task in _tasks(list(res.values())):
        scored = {n: r for n, r in res.items() if task in r["tasks"]
                  and r["tasks"][task]["summary"]["causal_score"].get(r["estimator"]["name"])}
        if not scored:
            continue

        def point(n, task=task, scored=scored):
            r = scored[n]
            return r["tasks"][task]["summary"]["causal_score"][r["estimator"]["name"]]["point"]

        ests = sorted((n for n in scored if _kind(folder, n) == "estimator"), key=point,
                      reverse=True)[:2]
        ctrl = max((n for n in scored if _kind(folder, n) == "control"), key=point)
        any_r = scored[ests[0]]
        picks = [("oracle", any_r, "oracle")] + [
            (n, scored[n], scored[n]["estimator"]["name"]) for n in [*ests, ctrl]]
        for shown, r, m in picks:
            per = r["tasks"][task]["causal"]["per_seed"].values()
            curves = np.array([[c["fraction"] for c in s["methods"][m]["curve"]] for s in per])
            mean = curves.mean(axis=0)
            sc = r["tasks"][task]["summary"]["causal_score"][m]
            rows.append([label, task, shown, *[_f(x) for x in mean], _iv(sc), _f(mean.mean())])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--labels", nargs="*", default=None)
    a = ap.parse_args(argv)
    labels = a.labels or [str(f) for f in a.folders]
    rows, steps, curves = [], [], []
    for folder, label in zip(a.folders, labels, strict=True):
        rows += task_rows(folder, label)
        steps += step_rows(folder, label)
        curves += curve_rows(folder, label)
    print(tabulate(rows, ["release", "task", "track", "best entry (causal)", "best control",
                          "oracle", "spread", "P ceiling", "best entry P", "best control P",
                          "P headroom", "P spread"], "github", disable_numparse=True))
    print()
    print(tabulate(steps, ["release", "task", "GAS step P", "norm-only", "gap", "fluency",
                           "gap"], "github", disable_numparse=True))
    print()
    print(tabulate(curves, ["release", "task", "method", "k1", "k2", "k3", "k4", "k5",
                            "causal score (log-k area)", "plain mean"], "github",
                   disable_numparse=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
