"""The arithmetic floor of causal replays on this machine (issue 22's targets, in FLOPs).

A replay step of the stacked engine is a few small float64 matrix products per token (decoding)
and one forward and backward over the step's groups (training). This script measures, in one
process and one thread:

* **work**: the FLOPs of one replay step (matrix products and attention, forward and backward,
  counted by ``torch.utils.flop_counter.FlopCounterMode`` over real steps of ``tiny`` seed 0);
* **engine rate**: the stacked engine's replay steps per second at ``K`` replays per batch, as
  FLOP/s;
* **machine rate**: ``torch.mm`` in float64 on the engine's largest shape, run in the same
  process (the ceiling a replay could reach if it were nothing but matrix products), measured
  again right before each timing: on a shared or virtual machine the rate drifts by tens of
  percent within a minute, and a share is only meaningful against the rate beside it;

* **products alone**: every matrix product the engine called in those steps (``mm``, ``bmm``,
  ``addmm``, ``baddbmm``, forward and backward, recorded with their shapes and strides by a
  ``TorchDispatchMode``), run again back to back on fresh operands of the same layout: the
  time of the engine's arithmetic with nothing else around it. Its rate is the ceiling of any
  engine that computes each replay's products with these calls;

and prints the engine's share of the machine rate, and the time a replay workload needs at best
(all cores at the machine rate) next to the engine's time: a new estimator's removal replays on
``tiny`` (``--slice-steps``, from ``bt-bench evaluate``'s facts) and the issue's targets.

Usage: ``python benchmarks/replay_floor.py [--k 1 4 16] [--steps 4] [--slice-steps 3377]``.
Timings, not tests.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _step(sr, stack, step: int) -> None:
    """One replay step of every replay in ``stack`` (nothing removed)."""
    resp = sr.sample_step(stack, step)
    advs = [sr.advantages(step, r, frozenset(), None) for r in resp]
    sr.update(stack, step, resp, advs)


def state_at(sr, first: int, stack_cls) -> dict:
    """The baseline's state after ``first`` steps from the start (``stack_cls``: the Stack)."""
    warm = stack_cls.of([sr.start])
    for step in range(first):
        _step(sr, warm, step)
    return warm.state(0, first)


_PRODUCTS = ("mm", "bmm", "addmm", "baddbmm")


def record_products(run) -> list[tuple]:
    """Run ``run()`` and return its matrix products: ``(op, [(shape, stride) | value, ...])``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[tuple] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in _PRODUCTS:
                calls.append((name, [(tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor)
                                     else a for a in args], dict(kwargs or {})))
            return func(*args, **(kwargs or {}))

    with _Record():
        run()
    return calls


def products_seconds(calls: list[tuple], repeat: int = 3) -> tuple[float, float]:
    """(best seconds of running ``calls`` back to back on fresh float64 operands, their FLOPs)."""
    import torch

    g = torch.Generator().manual_seed(0)
    ops, flops = [], 0
    for name, args, kwargs in calls:
        tens = []
        for a in args:
            if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], tuple):
                shape, stride = a
                t = torch.empty_strided(shape, stride, dtype=torch.float64)
                t.copy_(torch.rand(shape, dtype=torch.float64, generator=g))
                tens.append(t)
            else:
                tens.append(a)
        ops.append((getattr(torch.ops.aten, name).default, tens, kwargs))
        a, b = (tens[0], tens[1]) if name in ("mm", "bmm") else (tens[1], tens[2])
        batch = a.shape[0] if a.dim() == 3 else 1
        flops += 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for fn, tens, kwargs in ops:
            fn(*tens, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, flops


def mm_rate(seconds: float = 2.0) -> float:
    """float64 ``torch.mm`` FLOP/s at the engine's widest product (rows x 128 @ 128 x 384)."""
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.rand(512, 128, dtype=torch.float64, generator=g)
    b = torch.rand(128, 384, dtype=torch.float64, generator=g)
    torch.mm(a, b)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, b)
        n += 1
    return n * 2 * 512 * 128 * 384 / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    import torch
    from tabulate import tabulate
    from torch.utils.flop_counter import FlopCounterMode

    from benchmark.build import stacked as S
    from benchmark.build.replay import ReplaySeed
    from benchmark.machine import cpu_name
    from benchmark.releases.release import load_release

    ap = argparse.ArgumentParser()
    ap.add_argument("--release", default="tiny")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--steps", type=int, default=4, help="timed steps per K")
    ap.add_argument("--slice-steps", type=int, default=3377,
                    help="replay steps of the workload (a new estimator on tiny 3.0: 3377)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rel = load_release(a.release)
    sr = S.StackedReplay.of_seed(ReplaySeed(rel.path / f"seed{rel.seeds[0]}",
                                            precision="float64"))
    first = 20  # a step inside the first bonus window (responses of a trained policy)
    state = state_at(sr, first, S.Stack)
    counter = FlopCounterMode(display=False)
    with counter:
        stack = S.Stack.of([state])
        for step in range(first, first + a.steps):
            _step(sr, stack, step)
    flops = counter.get_total_flops() / a.steps
    machine = mm_rate()
    rows = []
    for k in a.k:
        stack = S.Stack.of([state] * k)
        _step(sr, stack, first)  # shape checks and caches outside the timing
        stack = S.Stack.of([state] * k)
        mm_engine = mm_rate(0.5)  # the machine's rate right beside each timing (a VM's drifts)
        t0 = time.perf_counter()
        for step in range(first, first + a.steps):
            _step(sr, stack, step)
        per = (time.perf_counter() - t0) / (a.steps * k)
        stack = S.Stack.of([state] * k)
        calls = record_products(lambda: [_step(sr, stack, st)  # noqa: B023 (run at once)
                                         for st in range(first, first + a.steps)])
        mm_products = mm_rate(0.5)
        p_sec, p_flops = products_seconds(calls)
        p_per = p_sec / (a.steps * k)
        rows.append({"K": k, "s per replay step": round(per, 4),
                     "GFLOP/s": round(flops / per / 1e9, 2),
                     "mm GFLOP/s beside it": round(mm_engine / 1e9, 1),
                     "share of mm rate": round(flops / per / mm_engine, 3),
                     "products alone: s per replay step": round(p_per, 4),
                     "products' share of the time": round(p_per / per, 2),
                     "products alone: share of mm rate (mm beside it)":
                         f"{flops / p_per / mm_products:.3f} ({mm_products / 1e9:.1f})",
                     "workload s (engine)": round(a.slice_steps * per / a.workers, 1)})
        if k == a.k[-1]:
            print(f"products recorded at K = {k}: {len(calls)} calls, "
                  f"{p_flops / (a.steps * k) / 1e9:.3f} GFLOP per replay step")
    floor = a.slice_steps * flops / (machine * a.workers)
    print(f"{cpu_name()}; one thread per worker, {a.workers} workers; release {rel.release_id}")
    print(f"work: {flops / 1e9:.3f} GFLOP per replay step (matrix products and attention, "
          f"forward and backward, steps {first}-{first + a.steps - 1})")
    print(f"machine: float64 torch.mm {machine / 1e9:.1f} GFLOP/s per thread (2 s, before the "
          "rows; each share below is against the mm rate measured just before its own timing)")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    print(f"workload: {a.slice_steps} replay steps = {a.slice_steps * flops / 1e12:.2f} TFLOP; "
          f"floor at the mm rate on {a.workers} workers: {floor:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
