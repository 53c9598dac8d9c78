"""Stacked replays against one replay per process, in the same run (issue 22).

The *old path* is the executor bt-bench had before the stacked engine: each removal replay
runs alone in a worker process (``benchmark.build.replay.replay``, batched float64 update),
resuming from the baseline's state at the last multiple of 10 steps before its first removal;
two workers, longest job first. The *new path* is ``benchmark.causal.replays.run_jobs``: one stacked
batch per seed and lane, joins at the first removed step, two workers. Both start from a warm
store (baselines and their states computed before timing) and from processes started before
timing, so the table compares replay work only; then the same with the baselines computed.

The removal sets are real ones: the built-in estimators' top-k sets on the release (1/4, 1/2
and 1 x |GT| of each task and seed), 18 per estimator on tiny 2.0.

Usage: ``python benchmarks/replay_batch.py [--release tiny] [--counts 6 18 36] [--out FILE]``
(prints a table; ``--out`` writes it as JSON).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ESTIMATORS = ("gas", "tracincp", "trak", "c1_dot")


def removal_jobs(release, estimator: str) -> list:
    """The estimator's removal sets on every (seed, task) as replay jobs."""
    from benchmark.causal import score as C
    from benchmark.causal.replays import Job
    from benchmark.contract import load_estimator_file
    from benchmark.releases.data import load_seed

    est = load_estimator_file(ROOT / "estimators" / f"{estimator}.py").instantiate()
    jobs = []
    for s in release.seeds:
        raw = C.load_reference(release.path, s)
        for t, td in load_seed(release, s, "gradient").items():
            ref = C.task_reference(raw, t)
            scores = np.asarray(est.score_rollouts(td.rollout_view), np.float64)
            for k in ref.ks:
                pos = C.in_window(C.top_k_positions(scores, k), ref.window_end, ref.n_per_step)
                if pos:
                    jobs.append(Job(s, t, pos, ref.window_end, ref.n_per_step))
    return jobs


# ----------------------------------------------------------------------------------------------
# the old path (one replay per process)


def _old_worker(args) -> float:
    release_dir, jobs, states_dir = args
    import torch

    from benchmark.build.replay import ReplaySeed, replay

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ctxs, bases = {}, {}
    for job in jobs:
        seed_dir = Path(release_dir) / f"seed{job.seed}"
        if job.seed not in ctxs:
            ctxs[job.seed] = ReplaySeed(seed_dir, precision="float64")
            bases[job.seed] = torch.load(Path(states_dir) / f"seed{job.seed}.pt",
                                         weights_only=False)
        nps = job.n_per_step
        pairs = [(p // nps, p % nps) for p in job.positions if p < job.stop * nps]
        start = (job.first_step // 10) * 10
        state = bases[job.seed].get(start)
        replay(seed_dir, remove=pairs, stop_at=job.stop, mode="batched", threads=1,
               measure_at=(job.stop,), sampled=False, context=ctxs[job.seed],
               start_state=(start, state) if state is not None else None)
    return time.perf_counter() - t0


def old_baselines(release, states_dir: Path) -> None:
    """The old path's stored baselines: states every 10 steps to the last window end."""
    from benchmark.build.replay import ReplaySeed, replay

    for s in release.seeds:
        path = states_dir / f"seed{s}.pt"
        if path.exists():
            continue
        seed_dir = release.path / f"seed{s}"
        ctx = ReplaySeed(seed_dir, precision="float64")
        stop = ctx.cfg.last_window_end
        r = replay(seed_dir, stop_at=stop, mode="batched", threads=1, measure_at=(stop,),
                   sampled=False, context=ctx, save_states=range(0, stop, 10))
        import torch

        torch.save(r.states, path)


def old_path(release, jobs: list, states_dir: Path, workers: int = 2) -> float:
    """Wall seconds of the old path on ``jobs`` (workers started before timing)."""
    lanes: list[list] = [[] for _ in range(workers)]
    load = [0] * workers
    for job in sorted(jobs, key=lambda j: -(j.stop - (j.first_step // 10) * 10)):
        i = int(np.argmin(load))
        lanes[i].append(job)
        load[i] += job.stop - (job.first_step // 10) * 10 + 5
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        pool.map(time.sleep, [0.5] * workers)  # workers up (imports happen on first task)
        t0 = time.perf_counter()
        pool.map(_old_worker, [(str(release.path), lane, str(states_dir)) for lane in lanes
                               if lane])
        return time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------
# the new path


def new_path(release, jobs: list, cache: Path, warm: bool, workers: int = 2) -> tuple[float,
                                                                                     dict]:
    """Wall seconds of ``run_jobs`` on ``jobs`` with the baselines stored (``warm``) or not."""
    from benchmark.causal.replays import ReplayStore, WorkerPool, baseline_job, run_jobs

    os.environ["BT_BENCH_CACHE"] = str(cache)
    store = ReplayStore(release.path, release.manifest_sha256)
    for s in release.seeds:  # drop removal results (and the baselines unless warm)
        d = store.dir / f"seed{s}"
        if d.is_dir():
            for p in d.iterdir():
                if p.suffix == ".npy" or not warm:
                    p.unlink()
    if warm:
        run_jobs(store, release.manifest_sha256, [baseline_job(s) for s in release.seeds],
                 workers)
    with WorkerPool(store, release.manifest_sha256, release.seeds, workers) as pool:
        time.sleep(8)  # the pool's start-up (imports, models) happens before timing
        t0 = time.perf_counter()
        facts = run_jobs(store, release.manifest_sha256, jobs, workers, pool=pool)
        return time.perf_counter() - t0, facts


def main(argv: list[str] | None = None) -> int:
    from benchmark.machine import cpu_name
    from benchmark.releases.release import load_release

    ap = argparse.ArgumentParser()
    ap.add_argument("--release", default="tiny")
    ap.add_argument("--counts", type=int, nargs="+", default=[6, 18, 36])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rel = load_release(a.release)
    pool_jobs: list = []
    for e in ESTIMATORS:
        pool_jobs += [j for j in removal_jobs(rel, e) if j not in pool_jobs]
    work = Path(tempfile.mkdtemp(prefix="bt-bench-replay-batch-"))
    states = work / "old_states"
    states.mkdir()
    old_baselines(rel, states)
    rows = []
    try:
        for n in a.counts:
            jobs = pool_jobs[:n] if n > 6 else [j for j in pool_jobs if j.seed == rel.seeds[0]][:n]
            t_old = old_path(rel, jobs, states)
            t_new, facts = new_path(rel, jobs, work / "cache", warm=True)
            t_cold, _ = new_path(rel, jobs, work / "cold", warm=False)
            rows.append({"replays": len(jobs), "seeds": len({j.seed for j in jobs}),
                         "old_s": round(t_old, 1), "stacked_s": round(t_new, 1),
                         "ratio": round(t_old / t_new, 2),
                         "stacked_with_baselines_s": round(t_cold, 1),
                         "slice_steps": sum(b["slice_steps"] for lane in facts["lanes"]
                                            for b in lane["batches"])})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from tabulate import tabulate

    print(f"\n{cpu_name()}, 2 workers, one thread each; release {rel.release_id}")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    if a.out:
        Path(a.out).write_text(json.dumps({"cpu": cpu_name(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
