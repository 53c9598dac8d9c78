"""How much causal fractions move when the summation order changes (another CPU, emulated).

Usage: python benchmarks/replay_tolerance.py [--release tiny] [--seeds 0 1] [--out FILE]

For each (seed, task), GAS's removal sets at every k are replayed to the end of the bonus window
with the batched update's rows in build order and reversed, in float64 (what evaluations use)
and float32, each against its own empty replay; prints the largest difference of a fraction
(removal effect / shipped bonus-off effect) per precision. The cross-machine tolerance
(``benchmark.causal.score.CROSS_MACHINE_TOLERANCE``) must stay well above these. Measurements, not
tests: about 4 minutes per (seed, task) on one core.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmark.build.replay import ReplaySeed, replay
from benchmark.causal.score import in_window, load_reference, task_reference, top_k_positions
from benchmark.releases.data import load_seed
from benchmark.releases.release import load_release
from estimators.gas import GAS


def fractions(seed_dir, task: str, sets, window_end: int, nps: int, e_off: float,
              precision: str, reverse: bool) -> list[float]:
    """Fraction of the bonus-off effect removed by each set, one replay each plus a baseline."""
    ctx = ReplaySeed(seed_dir, precision=precision, reverse_rows=reverse)

    def measure(pos) -> float:
        r = replay(seed_dir, remove=[(p // nps, p % nps) for p in pos], stop_at=window_end,
                   mode="batched", measure_at=(window_end,), sampled=False, context=ctx)
        return r.measures[window_end]["behavior_prob"][task]

    base = measure(())
    return [(measure(pos) - base) / e_off for pos in sets]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", default="tiny")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", default=None, help="also write the fractions as JSON here")
    args = ap.parse_args()
    rel = load_release(args.release)
    out = {}
    for seed in args.seeds:
        raw = load_reference(rel.path, seed)
        views = load_seed(rel, seed, "gradient")
        for task in rel.tasks:
            ref = task_reference(raw, task)
            scores = GAS().score_rollouts(views[task].rollout_view)
            sets = [in_window(top_k_positions(scores, k), ref.window_end, ref.n_per_step)
                    for k in ref.ks]
            row = {}
            for prec in ("float64", "float32"):
                fw, rv = (fractions(rel.path / f"seed{seed}", task, sets, ref.window_end,
                                    ref.n_per_step, ref.off_effect, prec, rev)
                          for rev in (False, True))
                row[prec] = {"forward": fw, "reversed": rv,
                             "max_abs_diff": float(np.max(np.abs(np.subtract(fw, rv))))}
            out[f"{seed}/{task}"] = row
            print(f"seed {seed} {task}: max |fraction difference| "
                  + ", ".join(f"{p} {row[p]['max_abs_diff']:.2e}" for p in row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
