"""Print the window precisions of every method in a ``results.json`` (docs/task_family.md).

    python scripts/precision_table.py results.json [--tasks kwex zorp]

Per task and seed: step-level precision (the step view's scores broadcast to the step's rollouts,
group label, learning window; the leaderboard's "step P") with its chance and ceiling, and the
rollout-level precision, for the estimator and every control the evaluator ran. The last column
is the step-level gap to the estimator (``method - estimator``), the number the confound is
meant to close (issue 21: a control within 0.05 of GAS).
"""

from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--tasks", nargs="+", default=None)
    a = ap.parse_args(argv)
    r = json.loads(open(a.results).read())
    est = r["estimator"]["name"]
    for task, t in r["tasks"].items():
        if a.tasks and task not in a.tasks:
            continue
        for seed, s in t["seeds"].items():
            tr = s["training"]
            ref = tr[est]["step"]["group"]["window"]["precision"]
            w = tr[est]["step"]["group"]["window"]
            print(f"task {task} seed {seed}: step-level chance {w['chance']:.3f}, "
                  f"ceiling {w['ceiling']:.3f}")
            print(f"  {'method':15s} {'step P':>7s} {'rollout P':>9s} {'step gap':>8s}")
            for m, d in tr.items():
                st = d["step"]["group"]["window"]["precision"]
                ro = d["rollout"]["group"]["window"]["precision"]
                print(f"  {m:15s} {st:7.3f} {ro:9.3f} {st - ref:+8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
