"""Replays on this machine for causal scores: a per-machine store and the executors that fill it.

The causal score of a removal set is a difference between two replays made on the same machine:
one with the set removed, one with nothing removed (the *baseline*). The baseline does not depend
on the estimator, so it is computed once per machine and release and kept in a store
(:mod:`benchmark.causal.store`), together with its parameter and optimizer states every
:data:`~benchmark.causal.store.STATE_EVERY` steps and every removal replay already made. The
store's key is the release manifest's sha256, the machine fingerprint (CPU, instruction set,
library versions; :mod:`benchmark.machine`), the thread count and
:data:`~benchmark.causal.store.REPLAY_VERSION`, so a stored number is only ever reused where it
would be recomputed bit for bit.

Replays run in the stacked engine (:mod:`benchmark.build.stacked`): the jobs of one seed run
together as one batch, in lock step, each joining the baseline's trajectory at its first removed
step, so a batch costs about the sum of its replays' own steps with the per-step overheads
shared. A job's numbers do not depend on its batch (the engine's batch independence), so the
store keeps them by removal set whatever batch made them.

Executors (all give the same numbers; both run lanes with
:func:`benchmark.causal.store.run_lane`):

* ``"local"`` (default): worker processes on this machine (``python -m benchmark.causal.replays``),
one
  thread each, as many as ``workers``; each runs a *lane* of batches;
* ``"ray"``: the same lanes as Ray tasks on a cluster (``pip install -e ".[cluster]"``; see
  :mod:`benchmark.causal.cluster`), for releases whose replays outgrow one machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmark.causal.store import (
    REPLAY_THREADS,
    Job,
    ReplayStore,
    baseline_job,
    run_lane,
    seed_context,
)
from benchmark.errors import BenchmarkError

#: how replays are executed: "local" worker processes (default) or a "ray" cluster
EXECUTOR_ENV = "BT_BENCH_EXECUTOR"
EXECUTORS = ("local", "ray")


def executor_name(name: str | None = None) -> str:
    """The executor to use: ``name``, else ``$BT_BENCH_EXECUTOR``, else ``"local"``."""
    v = name or os.environ.get(EXECUTOR_ENV) or "local"
    if v not in EXECUTORS:
        raise BenchmarkError(f"replay executor {v!r} is unknown; choose one of {EXECUTORS} "
                             f"(--executor or ${EXECUTOR_ENV})")
    return v


def open_store(release_path: Path, manifest_sha256: str, executor: str | None = None
               ) -> ReplayStore:
    """The store replays of ``executor`` go to (keyed by the machine that makes them)."""
    if executor_name(executor) == "ray":
        from benchmark.causal.cluster import cluster_fingerprint

        return ReplayStore(release_path, manifest_sha256, machine=cluster_fingerprint())
    return ReplayStore(release_path, manifest_sha256)


def plan_lanes(store: ReplayStore, jobs: list[Job], workers: int
               ) -> list[list[tuple[int, list[Job]]]]:
    """Split jobs into at most ``workers`` lanes of per-seed batches, balancing their cost.

    A job's cost is the steps it replays (from its first removed step to its stop); a seed's
    baseline, when it is not stored yet, costs its longest window and joins the lane of the
    seed's first job. Longest job first onto the least loaded lane, then each lane groups its
    jobs by seed.
    """
    removal = [j for j in dict.fromkeys(jobs) if j.task is not None and not store.has(j)]
    base_seeds = sorted({j.seed for j in jobs if j.task is None and not store.has(j)}
                        | {j.seed for j in removal if not store.has(baseline_job(j.seed))})
    n = max(1, min(workers, len(removal) + len(base_seeds)))
    lanes: list[dict[int, list[Job]]] = [{} for _ in range(n)]
    load = [0.0] * n
    placed: dict[int, int] = {}
    for s in base_seeds:  # a missing baseline is computed by one lane per seed
        i = int(np.argmin(load))
        lanes[i].setdefault(s, [])
        load[i] += 100.0
        placed[s] = i
    for job in sorted(removal, key=lambda j: (-(j.stop - j.first_step), j.seed, j.key)):
        i = placed.get(job.seed, int(np.argmin(load)))
        lanes[i].setdefault(job.seed, []).append(job)
        load[i] += job.stop - job.first_step + 5
    return [sorted(lane.items()) for lane in lanes if lane]


# ----------------------------------------------------------------------------------------------
# the local executor: worker processes


def _warm(store: ReplayStore, seeds: list[int], contexts: dict) -> None:
    """Worker side: load each seed's context (tokenizer, model, measure prompts)."""
    for seed in seeds:
        seed_context(store, seed, contexts)


def _worker_main(argv: list[str]) -> int:  # pragma: no cover - runs in a worker process
    """``SPEC`` (run its lane) or ``--pool WARM`` (warm up, then read a spec path on stdin)."""
    import torch

    import benchmark.build.stacked  # noqa: F401  (the model code: imported once, as start-up)

    torch.set_num_threads(REPLAY_THREADS)
    contexts: dict = {}
    if argv[0] == "--pool":
        warm = json.loads(argv[1])
        _warm(ReplayStore(Path(warm["release"]), warm["manifest_sha256"], Path(warm["root"])),
              warm["seeds"], contexts)
        spec_path = sys.stdin.readline().strip()
        if not spec_path:  # the pool was closed unused
            return 0
    else:
        spec_path = argv[0]
    spec = json.loads(Path(spec_path).read_text())
    store = ReplayStore(Path(spec["release"]), spec["manifest_sha256"], Path(spec["root"]))
    t0 = float(spec["t0"])
    print(json.dumps({"started": time.perf_counter() - t0}), flush=True)

    def report(job: Job, _seconds: float) -> None:
        print(json.dumps({"done": job.key, "seed": job.seed,
                          "at": time.perf_counter() - t0}), flush=True)

    lane = [(int(s), [Job.from_dict(j) for j in jobs]) for s, jobs in spec["lane"]]
    facts = run_lane(store, lane, contexts, report)
    print(json.dumps({"batches": facts}), flush=True)
    return 0


class ReplayError(BenchmarkError):
    """A replay worker failed (the replays it and the others finished stay in the store)."""


def _worker_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(REPLAY_THREADS),
                MKL_NUM_THREADS=str(REPLAY_THREADS), PYTHONUNBUFFERED="1")


class WorkerPool:
    """Replay workers started ahead of their jobs.

    A worker's start-up (importing torch and the model code, loading each seed's post-SFT model
    and measure prompts: a few seconds) does not depend on the jobs, so the evaluator starts the
    pool before it scores the estimator and the start-up runs meanwhile; :func:`run_jobs` then
    hands each worker a lane on its stdin. A worker left unused exits when :meth:`close` closes
    its stdin (or when this process dies: its stdin reaches end of file). Use as a context
    manager, or call :meth:`close`.
    """

    def __init__(self, store: ReplayStore, manifest_sha256: str, seeds: list[int],
                 workers: int = 2) -> None:
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(prefix="bt-bench-replay-pool-")
        warm = json.dumps({"release": str(store.release_path), "manifest_sha256": manifest_sha256,
                           "root": str(store.root), "seeds": sorted(seeds)})
        self._idle: list[tuple[subprocess.Popen, Path]] = []
        for i in range(workers):
            err = Path(self._tmp.name) / f"pool{i}.err"
            with open(err, "w") as fh:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "benchmark.causal.replays", "--pool", warm],
                    env=_worker_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=fh, text=True)
            self._idle.append((proc, err))

    def take(self, spec_path: Path) -> tuple[subprocess.Popen, Path] | None:
        """An idle worker given ``spec_path`` to run, or None when none is left."""
        while self._idle:
            proc, err = self._idle.pop(0)
            if proc.poll() is not None:  # died while warming up: let a fresh one do the work
                continue
            try:
                proc.stdin.write(f"{spec_path}\n")
                proc.stdin.close()
            except BrokenPipeError:
                continue
            return proc, err
        return None

    def close(self) -> None:
        """End the workers not taken; remove the pool's temp folder."""
        for proc, _ in self._idle:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
        self._idle = []
        self._tmp.cleanup()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_jobs(store: ReplayStore, manifest_sha256: str, jobs: list[Job], workers: int = 2,
             progress: bool = False, pool: WorkerPool | None = None,
             executor: str | None = None) -> dict:
    """Run every job not yet in the store (missing baselines first); return timing facts.

    With more than one worker, missing baselines are computed first (one lane per seed,
    ``baseline_lanes`` in the facts), so that the removal jobs then spread over every lane.

    Args:
        store: the replay store.
        manifest_sha256: the release's manifest hash (part of the store's key).
        jobs: removal, bonus-off and baseline jobs (stored ones are skipped).
        workers: lanes run at once (worker processes, or Ray tasks).
        progress: show a progress bar.
        pool: pre-started local workers to use first (:class:`WorkerPool`).
        executor: ``"local"`` or ``"ray"`` (default: ``$BT_BENCH_EXECUTOR`` or local).

    Raises:
        ReplayError: a worker exited with an error (its output tail is in the message).
    """
    from tqdm import tqdm

    t0 = time.perf_counter()
    first: dict | None = None
    missing = sorted({j.seed for j in jobs if not store.has(baseline_job(j.seed))})
    if workers > 1 and missing and any(j.task is not None and not store.has(j) for j in jobs):
        # a seed's missing baseline ties its removal jobs to the lane that computes it: compute
        # the baselines first (a lane per seed), then spread the removals over every lane
        first = run_jobs(store, manifest_sha256, [baseline_job(s) for s in missing], workers,
                         progress, pool, executor)
    lanes = plan_lanes(store, jobs, workers)
    n_jobs = sum(len(js) for lane in lanes for _, js in lane)
    n_base = sum(1 for lane in lanes for s, _ in lane if not store.has(baseline_job(s)))
    if not lanes:
        return {"replayed": 0, "baselines": 0, "seconds": 0.0, "lanes": []}
    bar = tqdm(total=n_jobs, desc="causal replays", disable=not progress, leave=False)
    name = executor_name(executor)
    if name == "ray":
        from benchmark.causal.cluster import run_lanes_ray

        facts = run_lanes_ray(store, lanes, bar)
    else:
        facts = _run_lanes_local(store, manifest_sha256, lanes, bar, pool)
    bar.close()
    out = {"replayed": n_jobs + n_base, "baselines": n_base, "executor": name,
           "seconds": round(time.perf_counter() - t0, 2), "lanes": facts}
    if first:
        out["replayed"] += first["baselines"]
        out["baselines"] += first["baselines"]
        out["baseline_lanes"] = first["lanes"]
    return out


def _run_lanes_local(store: ReplayStore, manifest_sha256: str, lanes: list, bar,
                     pool: WorkerPool | None = None) -> list[dict]:
    """Run lanes in worker processes (pre-started ones from ``pool`` first).

    Returns per worker ``{"start", "done": [seconds], "batches": [...]}``: when its start-up
    was done and each job finished (seconds since this call began), and its batches' facts.
    """
    import tempfile

    env = _worker_env()
    procs = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bt-bench-replays-") as tmp:
        for i, lane in enumerate(lanes):
            spec = {"t0": t0, "release": str(store.release_path),
                    "manifest_sha256": manifest_sha256, "root": str(store.root),
                    "lane": [[s, [j.to_dict() for j in js]] for s, js in lane]}
            path = Path(tmp) / f"lane{i}.json"
            path.write_text(json.dumps(spec))
            taken = pool.take(path) if pool is not None else None
            if taken is None:
                err_path = Path(tmp) / f"lane{i}.err"
                with open(err_path, "w") as err:
                    taken = (subprocess.Popen(
                        [sys.executable, "-m", "benchmark.causal.replays", str(path)], env=env,
                        stdout=subprocess.PIPE, stderr=err, text=True), err_path)
            procs.append(taken)
        errors, facts = [], []
        for p, err_path in procs:
            fact: dict = {"start": None, "done": [], "batches": []}
            for line in p.stdout:
                if not line.startswith("{"):
                    continue
                msg = json.loads(line)
                if "started" in msg:
                    fact["start"] = round(msg["started"], 2)
                elif "batches" in msg:
                    fact["batches"] = msg["batches"]
                else:
                    fact["done"].append(round(msg["at"], 2))
                    bar.update(1)
            facts.append(fact)
            p.stdout.close()
            if p.wait() != 0:
                errors.append(err_path.read_text()[-2000:])
        if errors:
            raise ReplayError(
                f"a causal replay worker failed; the replays already made are kept in "
                f"{store.dir} and a rerun continues from them (nothing else of this "
                f"evaluation was written):\n" + "\n".join(errors))
    return facts


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_worker_main(sys.argv[1:]))
