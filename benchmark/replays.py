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

from benchmark.errors import BenchmarkError

#: bump when the replay code changes the numbers it produces (invalidates every store)
REPLAY_VERSION = 2  # 2: groups of equal prompt length decoded in one batch
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


def _context(store: ReplayStore, seed: int, contexts: dict):
    """Worker side: the seed's :class:`~benchmark.build.replay.ReplaySeed`, loaded once."""
    from benchmark.build.replay import ReplaySeed

    if seed not in contexts:
        contexts[seed] = ReplaySeed(store.release_path / f"seed{seed}",
                                    precision=REPLAY_PRECISION,
                                    reverse_rows=row_order() == "reversed")
    return contexts[seed]


def _run_job(store: ReplayStore, job: Job, contexts: dict) -> None:
    """Worker side: run one job and store its result."""
    import torch

    from benchmark.build.replay import recorded_responses, replay

    seed_dir = store.release_path / f"seed{job.seed}"
    ctx = _context(store, job.seed, contexts)
    cfg = ctx.cfg
    nps = ctx.n_per_step
    if job.task is None:
        stops = {b.id: b.window_end for b in cfg.behaviors}
        stop = max(stops.values())
        r = replay(seed_dir, stop_at=stop, mode=REPLAY_MODE, threads=REPLAY_THREADS,
                   measure_at=sorted(set(stops.values())), sampled=False,
                   save_states=range(0, stop, STATE_EVERY), context=ctx,
                   reference_responses=recorded_responses(seed_dir, upto=stop))
        keep = r.states
        out = {"measures": {t: r.measures[w]["prompt_probs"][t] for t, w in stops.items()},
               "stops": stops, "states": keep,
               "first_divergent_step": r.first_divergent_step, "decoder": r.decoder}
        _atomic(store.path(job), lambda p: torch.save(out, p))
        return
    key = ("baseline", job.seed)
    if key not in contexts:  # one load per seed and worker
        contexts[key] = torch.load(store.path(Job(job.seed, None, (), 0, 1)), weights_only=False)
    base = contexts[key]
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


def _warm(store: ReplayStore, seeds: list[int], contexts: dict) -> None:
    """Worker side: load each seed's context and model, and its stored baseline."""
    import torch

    for seed in seeds:
        _context(store, seed, contexts).fresh_model()
        base = Job(seed, None, (), 0, 1)
        if store.has(base) and ("baseline", seed) not in contexts:
            contexts[("baseline", seed)] = torch.load(store.path(base), weights_only=False)


def _worker_main(argv: list[str]) -> int:  # pragma: no cover - runs in a worker process
    """``SPEC`` (run its jobs) or ``--pool WARM`` (warm up, then read a spec path on stdin)."""
    import torch

    import benchmark.build.replay  # noqa: F401  (the model code: imported once, timed as start-up)

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
    print(json.dumps({"started": time.perf_counter() - float(spec["t0"])}), flush=True)
    for j in spec["jobs"]:
        job = Job(j["seed"], j["task"], tuple(j["positions"]), j["stop"], j["n_per_step"])
        t = time.perf_counter()
        if not store.has(job):
            _run_job(store, job, contexts)
        print(json.dumps({"done": job.key, "seed": job.seed,
                          "seconds": time.perf_counter() - t,
                          "at": time.perf_counter() - float(spec["t0"])}), flush=True)
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


class ReplayError(BenchmarkError):
    """A replay worker failed (the replays it and the others finished stay in the store)."""


def _worker_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(REPLAY_THREADS),
                MKL_NUM_THREADS=str(REPLAY_THREADS), PYTHONUNBUFFERED="1")


class WorkerPool:
    """Replay workers started ahead of their jobs.

    A worker's start-up (importing torch and the model code, loading each seed's post-SFT model
    and stored baseline: about 3 s) does not depend on the jobs, so the evaluator starts the pool
    before it scores the estimator and the start-up runs meanwhile; :func:`run_jobs` then hands
    each worker a job list on its stdin. A worker left unused exits when :meth:`close` closes
    its stdin (or when this process dies: its stdin reaches end of file). Use as a context
    manager, or call :meth:`close`.
    """

    def __init__(self, store: ReplayStore, manifest_sha256: str, seeds: list[int],
                 workers: int = 2) -> None:
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(prefix="bt-bench-replay-pool-")
        warm = json.dumps({"release": str(store.release_path), "manifest_sha256": manifest_sha256,
                           "root": str(store.dir.parent.parent), "seeds": sorted(seeds)})
        self._idle: list[tuple[subprocess.Popen, Path]] = []
        for i in range(workers):
            err = Path(self._tmp.name) / f"pool{i}.err"
            with open(err, "w") as fh:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "benchmark.replays", "--pool", warm],
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
             progress: bool = False, pool: WorkerPool | None = None) -> dict:
    """Run every job not yet in the store (baselines first); return timing facts.

    ``pool``: pre-started workers to use first (:class:`WorkerPool`).

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
    lanes: dict[str, list[dict]] = {}
    for name, phase in (("baselines", base_jobs), ("removals", removal)):
        if phase:
            lanes[name] = _run_phase(store, manifest_sha256, phase, workers, bar, pool)
    bar.close()
    return {"replayed": len(base_jobs) + len(removal), "baselines": len(base_jobs),
            "seconds": round(time.perf_counter() - t0, 2), "lanes": lanes}


def _run_phase(store: ReplayStore, manifest_sha256: str, jobs: list[Job], workers: int,
               bar, pool: WorkerPool | None = None) -> list[dict]:
    """Run ``jobs`` in worker processes (pre-started ones from ``pool`` first).

    Returns per worker ``{"start", "jobs": [seconds], "end"}``: seconds since the phase began
    when its start-up was done, each job's time, when its last job was done.
    """
    import tempfile

    lanes = _schedule(jobs, max(1, min(workers, len(jobs))))
    env = _worker_env()
    procs = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bt-bench-replays-") as tmp:
        for i, lane in enumerate(lanes):
            spec = {"t0": t0, "release": str(store.release_path),
                    "manifest_sha256": manifest_sha256,
                    "root": str(store.dir.parent.parent),
                    "jobs": [{"seed": j.seed, "task": j.task, "positions": list(j.positions),
                              "stop": j.stop, "n_per_step": j.n_per_step} for j in lane]}
            path = Path(tmp) / f"lane{i}.json"
            path.write_text(json.dumps(spec))
            taken = pool.take(path) if pool is not None else None
            if taken is None:
                err_path = Path(tmp) / f"lane{i}.err"
                with open(err_path, "w") as err:
                    taken = (subprocess.Popen(
                        [sys.executable, "-m", "benchmark.replays", str(path)], env=env,
                        stdout=subprocess.PIPE, stderr=err, text=True), err_path)
            procs.append(taken)
        errors, facts = [], []
        for p, err_path in procs:
            fact: dict = {"start": None, "jobs": [], "end": None}
            for line in p.stdout:
                if not line.startswith("{"):
                    continue
                msg = json.loads(line)
                if "started" in msg:
                    fact["start"] = round(msg["started"], 2)
                else:
                    fact["jobs"].append(round(msg["seconds"], 2))
                    fact["end"] = round(msg["at"], 2)
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
