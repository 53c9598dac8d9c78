"""Where the time of ``bt-bench evaluate`` goes: a phase breakdown, cold and warm replay store.

Usage: python benchmarks/evaluate_phases.py [FILE] [--release tiny] [--no-causal] [--warm-only]

Runs the evaluation the quickstart runs (sandboxed, all seeds and tasks) three times: with an
empty replay store (a new machine: the empty replay of every seed is computed once and cached);
with only the baselines kept (a new estimator on a machine that evaluated before: its own removal
sets are replayed); and with the store warm (the same estimator again). Prints the wall time of
each phase. Timings, not tests.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmark.evaluate import EvalSettings, evaluate

ROOT = Path(__file__).resolve().parents[1]


def run(est: Path, release: str, causal: bool) -> dict:
    timings: dict = {}
    t0 = time.perf_counter()
    evaluate(est, release, EvalSettings(causal=causal), progress=False, timings=timings)
    timings["total"] = time.perf_counter() - t0
    lanes = timings.pop("replay workers", [])
    if lanes:  # one fact per worker: its start-up, its batches (benchmark.causal.replays.run_jobs)
        batches = [b for w in lanes for b in w["batches"]]
        timings["  replay workers: start-up (max)"] = max(w["start"] or 0.0 for w in lanes)
        timings["  replay workers: batches"] = len(batches)
        timings["  replay workers: replay steps"] = sum(b["slice_steps"] for b in batches)
        timings["  replay workers: batch seconds (sum)"] = sum(b["seconds"] for b in batches)
    return timings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("estimator", nargs="?",
                    default=str(ROOT / "estimators" / "examples" / "my_estimator.py"))
    ap.add_argument("--release", default="tiny")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--warm-only", action="store_true",
                    help="use the machine's replay store as it is (skip the cold run)")
    a = ap.parse_args()
    runs = {}
    if not a.warm_only and not a.no_causal:
        with tempfile.TemporaryDirectory() as cache:
            old = os.environ.get("BT_BENCH_CACHE")
            os.environ["BT_BENCH_CACHE"] = cache
            runs["cold store"] = run(Path(a.estimator), a.release, True)
            for f in Path(cache).rglob("*.npy"):  # keep the baselines (.pt), drop the removals
                f.unlink()
            runs["new estimator"] = run(Path(a.estimator), a.release, True)
            runs["warm store"] = run(Path(a.estimator), a.release, True)
            if old is None:
                del os.environ["BT_BENCH_CACHE"]
            else:
                os.environ["BT_BENCH_CACHE"] = old
    else:
        runs["this machine" if not a.no_causal else "--no-causal"] = run(
            Path(a.estimator), a.release, not a.no_causal)
    phases = list(dict.fromkeys(k for r in runs.values() for k in r))
    width = max(len(p) for p in phases)
    print(f"{'phase':<{width}}  " + "  ".join(f"{k:>12}" for k in runs))
    for p in phases:
        cells = []
        for r in runs.values():
            v = r.get(p)
            cells.append(f"{v:12.2f}" if isinstance(v, float) else f"{v!s:>12}")
        print(f"{p:<{width}}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
