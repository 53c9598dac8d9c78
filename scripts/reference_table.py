"""Print the shipped causal reference of a release as a Markdown table (docs/causal.md).

    python scripts/reference_table.py [tiny]

Per seed and task: the ground-truth size, the window, the bonus-off effect (the denominator),
the fraction of it removed at each k by the oracle and provenance, each shipped control's causal
score, and the random sets' causal scores (min .. max over the families: set i of every k). A
causal score is the log-k area of the curve on the reference's own grid
(``benchmark.causal.score.area``).
"""
from __future__ import annotations

import sys

import numpy as np
from tabulate import tabulate

from benchmark.causal.score import area, load_reference, task_reference
from benchmark.releases.release import load_release


def _curve(ref, name: str) -> str:
    return " / ".join(f"{r.effect / ref.off_effect:.2f}" for r in ref.methods[name])


def _score(ref, name: str) -> str:
    if name not in ref.methods:  # a control added after the release was built
        return "-"
    fractions = [r.effect / ref.off_effect for r in ref.methods[name]]
    return f"{area(fractions, ref.k_fractions):.3f}"


def rows(release: str) -> list[list]:
    rel = load_release(release, verify=False)
    out = []
    for seed in rel.seeds:
        raw = load_reference(rel.path, seed)
        for task in rel.tasks:
            ref = task_reference(raw, task)
            e = ref.off_effect
            fam = np.array([[r.effect / e for r in level] for level in ref.random])  # (K, n)
            rand = np.array([area(fam[:, i], ref.k_fractions) for i in range(fam.shape[1])])
            out.append([seed, task, ref.gt_size, ref.window_end, f"{e:.3f}",
                        _curve(ref, "oracle"), _curve(ref, "provenance"),
                        *(_score(ref, m) for m in ("norm-only", "step-order", "advantage-only",
                                                    "fluency", "text-only", "text-advantage")),
                        f"{rand.min():.3f} .. {rand.max():.3f}"])
    return out


def main() -> None:
    release = sys.argv[1] if len(sys.argv) > 1 else "tiny"
    headers = ["seed", "task", "|GT|", "replayed to step", "bonus-off effect",
               "oracle (fractions at each k of the grid)", "provenance", "norm-only", "step-order",
               "advantage-only", "fluency", "text-only", "text-advantage", "random sets"]
    print(tabulate(rows(release), headers, tablefmt="github"))


if __name__ == "__main__":
    main()
