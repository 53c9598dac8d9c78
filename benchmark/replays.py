"""Replays on this machine for causal scores: a per-machine store and a small worker pool.

The causal score of a removal set is a difference between two replays made on the same machine:
one with the set removed, one with nothing removed (the *baseline*). The baseline does not depend
on the estimator, so it is computed once per machine and release and kept in a store, together
with the parameter and optimizer states every :data:`STATE_EVERY` steps (a removal replay resumes
from the last state before its first removed step) and every removal replay already made. The
store's key is the release manifest's sha256, the machine fingerprint (CPU, instruction set,
library versions; :mod:`benchmark.machine`), the thread count and :data:`REPLAY_VERSION`, so a
stored number is only ever reused where it would be recomputed bit for bit.

Replays run in worker processes (``python -m benchmark.replays``), one thread each, as many as
``workers`` at once; a replay job returns the per-prompt behavior probabilities at the end of its
task's bonus window.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: bump when the replay code changes the numbers it produces (invalidates every store)
REPLAY_VERSION = 1
REPLAY_MODE = "batched"
REPLAY_PRECISION = "float64"
REPLAY_THREADS = 1
STATE_EVERY = 10
#: "reversed" stacks each batched update's rows in reverse order: another floating-point
#: summation order, standing in for another CPU's kernels (docs/causal.md measures with it)
ROW_ORDER_ENV = "BT_BENCH_REPLAY_ROW_ORDER"


def row_order() -> str:
    """``"forward"`` (default) or ``"reversed"`` (from ``$BT_BENCH_REPLAY_ROW_ORDER``)."""
    v = os.environ.get(ROW_ORDER_ENV, "forward")
    if v not in ("forward", "reversed"):
        raise ValueError(f"{ROW_ORDER_ENV}={v!r}; expected 'forward' or 'reversed'")
    return v


def cache_root() -> Path:
    """``$BT_BENCH_CACHE`` or ``~/.cache/bt-bench``."""
    env = os.environ.get("BT_BENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "bt-bench"


def positions_hash(positions) -> str:
    """A short hash of a sorted tuple of rollout positions."""
    arr = np.asarray(sorted(int(p) for p in positions), dtype="<i8")
    return hashlib.sha256(arr.tobytes()).hexdigest()[:20]


@dataclass(frozen=True)
class Job:
    """One replay: remove ``positions`` from ``seed`` and measure ``task`` at ``stop``.

    ``task`` None with no positions is the seed's baseline (measured at every task's window end).
    """

    seed: int
    task: str | None
    positions: tuple[int, ...]
    stop: int
    n_per_step: int

    @property
    def key(self) -> str:
        """The job's file stem in the store."""
        return "baseline" if self.task is None else f"{self.task}_{positions_hash(self.positions)}"

    @property
    def first_step(self) -> int:
        """The first step with a removed rollout (``stop`` when none is removed)."""
        return min(self.positions) // self.n_per_step if self.positions else self.stop

    @property
    def cost(self) -> int:
        """Steps to replay (from the last stored state before the first removal)."""
        return self.stop - (self.first_step // STATE_EVERY) * STATE_EVERY


class ReplayStore:
    """The replays of one release on this machine: ``<cache>/replays/<key>/seed<S>/``."""

    def __init__(self, release_path: Path, manifest_sha256: str, root: Path | None = None) -> None:
        from benchmark.machine import fingerprint

        self.release_path = Path(release_path)
        fp = fingerprint()
        key = hashlib.sha256(json.dumps({
            "manifest": manifest_sha256, "machine": fp["key"], "version": REPLAY_VERSION,
            "mode": REPLAY_MODE, "precision": REPLAY_PRECISION, "threads": REPLAY_THREADS,
            "row_order": row_order()}, sort_keys=True).encode()).hexdigest()
        self.dir = (root or cache_root()) / "replays" / key[:24]
        self.machine = fp

    def path(self, job: Job) -> Path:
        """Where a job's result lives."""
        ext = ".pt" if job.task is None else ".npy"
        return self.dir / f"seed{job.seed}" / f"{job.key}{ext}"

    def has(self, job: Job) -> bool:
        """Whether the job's result is stored."""
        return self.path(job).exists()

    def baseline(self, seed: int) -> dict:
        """``{"measures": {task: (P,) probs}, "stops": {task: step}}`` of a stored baseline."""
        import torch

        d = torch.load(self.path(Job(seed, None, (), 0, 1)), weights_only=False)
        return {"measures": d["measures"], "stops": d["stops"],
                "first_divergent_step": d.get("first_divergent_step")}

    def result(self, job: Job) -> np.ndarray:
        """The stored per-prompt probabilities of a removal job."""
        return np.load(self.path(job))


def _atomic(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _run_job(store: ReplayStore, job: Job, contexts: dict) -> None:
    """Worker side: run one job and store its result."""
    import torch

    from benchmark.build.replay import ReplaySeed, recorded_responses, replay

    seed_dir = store.release_path / f"seed{job.seed}"
    if job.seed not in contexts:
        contexts[job.seed] = ReplaySeed(seed_dir, precision=REPLAY_PRECISION,
                                        reverse_rows=row_order() == "reversed")
    ctx = contexts[job.seed]
    cfg = ctx.cfg
    nps = ctx.n_per_step
    if job.task is None:
        stops = {b.id: b.window_end for b in cfg.behaviors}
        stop = max(stops.values())
        r = replay(seed_dir, stop_at=stop, mode=REPLAY_MODE, threads=REPLAY_THREADS,
                   measure_at=sorted(set(stops.values())), sampled=False, save_states=True,
                   context=ctx, reference_responses=recorded_responses(seed_dir, upto=stop))
        keep = {s: st for s, st in r.states.items() if s % STATE_EVERY == 0}
        out = {"measures": {t: r.measures[w]["prompt_probs"][t] for t, w in stops.items()},
               "stops": stops, "states": keep,
               "first_divergent_step": r.first_divergent_step, "decoder": r.decoder}
        _atomic(store.path(job), lambda p: torch.save(out, p))
        return
    base = torch.load(store.path(Job(job.seed, None, (), 0, 1)), weights_only=False)
    pos = [p for p in job.positions if p < job.stop * nps]
    pairs = [(p // nps, p % nps) for p in pos]
    start = (job.first_step // STATE_EVERY) * STATE_EVERY
    state = base["states"].get(start)
    r = replay(seed_dir, remove=pairs, stop_at=job.stop, mode=REPLAY_MODE,
               threads=REPLAY_THREADS, measure_at=(job.stop,), sampled=False, context=ctx,
               start_state=(start, state) if state is not None else None)
    probs = np.asarray(r.measures[job.stop]["prompt_probs"][job.task], np.float64)
    def write(p: Path) -> None:
        with open(p, "wb") as f:
            np.save(f, probs)

    _atomic(store.path(job), write)


def _worker_main(spec_path: str) -> int:  # pragma: no cover - runs in a worker process
    import torch

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(REPLAY_THREADS)
    store = ReplayStore(Path(spec["release"]), spec["manifest_sha256"], Path(spec["root"]))
    contexts: dict = {}
    for j in spec["jobs"]:
        job = Job(j["seed"], j["task"], tuple(j["positions"]), j["stop"], j["n_per_step"])
        if not store.has(job):
            _run_job(store, job, contexts)
        print(json.dumps({"done": job.key, "seed": job.seed}), flush=True)
    return 0


def _schedule(jobs: list[Job], workers: int) -> list[list[Job]]:
    """Longest-processing-time-first assignment of jobs to workers."""
    lanes: list[list[Job]] = [[] for _ in range(workers)]
    load = [0] * workers
    for job in sorted(jobs, key=lambda j: (-j.cost, j.seed, j.key)):
        i = int(np.argmin(load))
        lanes[i].append(job)
        load[i] += job.cost + 5
    return [sorted(lane, key=lambda j: (j.seed, j.key)) for lane in lanes if lane]


class ReplayError(RuntimeError):
    """A replay worker failed."""


def run_jobs(store: ReplayStore, manifest_sha256: str, jobs: list[Job], workers: int = 2,
             progress: bool = False) -> dict:
    """Run every job not yet in the store (baselines first); return timing facts.

    Raises:
        ReplayError: a worker exited with an error (its output tail is in the message).
    """
    from tqdm import tqdm

    t0 = time.perf_counter()
    todo = [j for j in dict.fromkeys(jobs) if not store.has(j)]
    seeds_needing_base = sorted({j.seed for j in todo if j.task is not None}
                                | {j.seed for j in todo if j.task is None})
    base_jobs = [Job(s, None, (), 0, 1) for s in seeds_needing_base
                 if not store.has(Job(s, None, (), 0, 1))]
    removal = [j for j in todo if j.task is not None]
    bar = tqdm(total=len(base_jobs) + len(removal), desc="causal replays", disable=not progress,
               leave=False)
    for phase in (base_jobs, removal):
        if phase:
            _run_phase(store, manifest_sha256, phase, workers, bar)
    bar.close()
    return {"replayed": len(base_jobs) + len(removal), "baselines": len(base_jobs),
            "seconds": round(time.perf_counter() - t0, 2)}


def _run_phase(store: ReplayStore, manifest_sha256: str, jobs: list[Job], workers: int,
               bar) -> None:
    import tempfile

    lanes = _schedule(jobs, max(1, min(workers, len(jobs))))
    env = dict(os.environ, OMP_NUM_THREADS=str(REPLAY_THREADS),
               MKL_NUM_THREADS=str(REPLAY_THREADS), PYTHONUNBUFFERED="1")
    procs = []
    with tempfile.TemporaryDirectory(prefix="bt-bench-replays-") as tmp:
        for i, lane in enumerate(lanes):
            spec = {"release": str(store.release_path), "manifest_sha256": manifest_sha256,
                    "root": str(store.dir.parent.parent),
                    "jobs": [{"seed": j.seed, "task": j.task, "positions": list(j.positions),
                              "stop": j.stop, "n_per_step": j.n_per_step} for j in lane]}
            path = Path(tmp) / f"lane{i}.json"
            path.write_text(json.dumps(spec))
            with open(Path(tmp) / f"lane{i}.err", "w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "benchmark.replays", str(path)], env=env,
                    stdout=subprocess.PIPE, stderr=err, text=True))
        errors = []
        for i, p in enumerate(procs):
            for line in p.stdout:
                if line.startswith("{"):
                    bar.update(1)
            if p.wait() != 0:
                errors.append((Path(tmp) / f"lane{i}.err").read_text()[-2000:])
        if errors:
            raise ReplayError("a causal replay worker failed:\n" + "\n".join(errors))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_worker_main(sys.argv[1]))
