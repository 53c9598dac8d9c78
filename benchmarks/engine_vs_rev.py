"""The replay engine of the working tree against the engine of a git revision, in one process.

Loads ``benchmark/build/stacked.py`` as it was at ``--rev`` (with the rest of the package as it is
now) beside the current engine, runs the same replay steps of ``tiny`` seed 0 with both,
alternating, and prints the ratio of their times per replay step (best of ``--rounds``) and
whether their parameters after the steps are bit-identical. Both run in this process and
thread, so a ratio is not the machine's mood of the moment.

Usage: ``python benchmarks/engine_vs_rev.py [--rev b659e54] [--k 8] [--steps 6]``.
Timings, not tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from replay_floor import _step, state_at  # noqa: E402  (the same step and warm-up)


def engine_at(rev: str):
    """``benchmark.build.stacked`` as it was at ``rev`` (a module named ``stacked_<rev>``)."""
    src = subprocess.run(["git", "show", f"{rev}:benchmark/build/stacked.py"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"stacked_{rev}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"stacked_{rev}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    import torch
    from tabulate import tabulate

    from benchmark.build import stacked as now
    from benchmark.build.replay import ReplaySeed
    from benchmark.machine import cpu_name
    from benchmark.releases.release import load_release

    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="b659e54")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--first", type=int, default=20, help="first timed step")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    old = engine_at(a.rev)
    ctx = ReplaySeed(load_release("tiny").path / "seed0", precision="float64")
    engines = {a.rev: old.StackedReplay.of_seed(ctx),
               "working tree": now.StackedReplay.of_seed(ctx)}
    mods = {a.rev: old, "working tree": now}

    def steps(name, state):
        sr, mod = engines[name], mods[name]
        stack = mod.Stack.of([state] * a.k)
        t0 = time.perf_counter()
        for step in range(a.first, a.first + a.steps):
            _step(sr, stack, step)
        return time.perf_counter() - t0, stack

    state = state_at(engines["working tree"], a.first, now.Stack)
    best, stacks = {}, {}
    for r in range(a.rounds + 1):  # round 0 fills the shape caches; not counted
        for name in engines:
            sec, stacks[name] = steps(name, state)
            if r:
                best[name] = min(best.get(name, float("inf")), sec)
    per = {n: best[n] / (a.steps * a.k) for n in engines}
    same = all(torch.equal(stacks[a.rev].params[n], stacks["working tree"].params[n])
               for n in stacks[a.rev].params)
    print(f"{cpu_name()}; one thread; K = {a.k}; steps {a.first}-{a.first + a.steps - 1} of "
          f"tiny seed 0; best of {a.rounds}")
    print(tabulate([{"engine": n, "ms per replay step": round(1e3 * per[n], 2)} for n in engines],
                   headers="keys", tablefmt="github"))
    print(f"ratio (working tree / {a.rev}): {per['working tree'] / per[a.rev]:.3f}; "
          f"parameters after the steps bit-identical: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
