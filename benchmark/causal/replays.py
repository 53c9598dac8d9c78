"""Replays on this machine for causal scores: a per-machine store and the executors that fill it.

The causal score of a removal set is a difference between two replays made on the same machine:
one with the set removed, one with nothing removed (the *baseline*). The baseline does not depend
on the estimator, so it is computed once per machine and release and kept in a store, together
with its parameter and optimizer states every :data:`STATE_EVERY` steps and every removal replay
already made. The store's key is the release manifest's sha256, the machine fingerprint (CPU,
instruction set, library versions; :mod:`benchmark.machine`), the thread count and
:data:`REPLAY_VERSION`, so a stored number is only ever reused where it would be recomputed bit
for bit.

Replays run in the stacked engine (:mod:`benchmark.build.stacked`): the jobs of one seed run
together as one batch, in lock step, each joining the baseline's trajectory at its first removed
step, so a batch costs about the sum of its replays' own steps with the per-step overheads
shared. A job's numbers do not depend on its batch (the engine's batch independence), so the
store keeps them by removal set whatever batch made them.

Executors (all give the same numbers):

* ``"local"`` (default): worker processes on this machine (``python -m benchmark.causal.replays``),
one
  thread each, as many as ``workers``; each runs a *lane* of batches;
* ``"ray"``: the same lanes as Ray tasks on a cluster (``pip install -e ".[cluster]"``; see
  :mod:`benchmark.causal.cluster`), for releases whose replays outgrow one machine.
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
from benchmark.io import cache_root

#: bump when the replay code changes the numbers it produces (invalidates every store)
REPLAY_VERSION = 3  # 3: the stacked engine (shared prompts, float64 coefficients, joins)
REPLAY_ENGINE = "stacked"
REPLAY_MODE = "batched"
REPLAY_PRECISION = "float64"
REPLAY_THREADS = 1
STATE_EVERY = 10
#: "reversed" adds each update's groups and rows in reverse order: another floating-point
#: summation order, standing in for another CPU's kernels (docs/causal.md measures with it)
ROW_ORDER_ENV = "BT_BENCH_REPLAY_ROW_ORDER"
#: how replays are executed: "local" worker processes (default) or a "ray" cluster
EXECUTOR_ENV = "BT_BENCH_EXECUTOR"
EXECUTORS = ("local", "ray")


def row_order() -> str:
    """``"forward"`` (default) or ``"reversed"`` (from ``$BT_BENCH_REPLAY_ROW_ORDER``)."""
    v = os.environ.get(ROW_ORDER_ENV, "forward")
    if v not in ("forward", "reversed"):
        raise ValueError(f"{ROW_ORDER_ENV}={v!r}; expected 'forward' or 'reversed'")
    return v


def executor_name(name: str | None = None) -> str:
    """The executor to use: ``name``, else ``$BT_BENCH_EXECUTOR``, else ``"local"``."""
    v = name or os.environ.get(EXECUTOR_ENV) or "local"
    if v not in EXECUTORS:
        raise BenchmarkError(f"replay executor {v!r} is unknown; choose one of {EXECUTORS} "
                             f"(--executor or ${EXECUTOR_ENV})")
    return v


def positions_hash(positions) -> str:
    """A short hash of a sorted tuple of rollout positions."""
    arr = np.asarray(sorted(int(p) for p in positions), dtype="<i8")
    return hashlib.sha256(arr.tobytes()).hexdigest()[:20]


@dataclass(frozen=True)
class Job:
    """One replay: remove ``positions`` from ``seed`` and measure ``task`` at ``stop``.

    ``task`` None with no positions is the seed's baseline (measured at every task's window end).
    ``bonus_off`` replays with ``task``'s bonus switched off (no positions): the denominator of
    that task's fractions.
    """

    seed: int
    task: str | None
    positions: tuple[int, ...]
    stop: int
    n_per_step: int
    bonus_off: bool = False

    @property
    def key(self) -> str:
        """The job's file stem in the store."""
        if self.task is None:
            return "baseline"
        if self.bonus_off:
            return f"{self.task}_bonus_off"
        return f"{self.task}_{positions_hash(self.positions)}"

    @property
    def first_step(self) -> int:
        """The first step with a removed rollout (``stop`` when none is removed)."""
        return min(self.positions) // self.n_per_step if self.positions else self.stop

    def to_dict(self) -> dict:
        """Plain-JSON form (a worker's spec)."""
        return {"seed": self.seed, "task": self.task, "positions": list(self.positions),
                "stop": self.stop, "n_per_step": self.n_per_step, "bonus_off": self.bonus_off}

    @classmethod
    def from_dict(cls, d: dict) -> Job:
        """Inverse of :meth:`to_dict`."""
        return cls(int(d["seed"]), d["task"], tuple(int(p) for p in d["positions"]),
                   int(d["stop"]), int(d["n_per_step"]), bool(d.get("bonus_off", False)))


BASELINE = "baseline"


def baseline_job(seed: int) -> Job:
    """The seed's baseline job (its identity in the store)."""
    return Job(seed, None, (), 0, 1)


class ReplayStore:
    """The replays of one release on this machine: ``<cache>/replays/<key>/seed<S>/``.

    Per seed: ``baseline.pt`` (the baseline's per-prompt measures at every task's window end
    and the first step whose sampled responses differ from the release's), ``state_<step>.pt``
    (the baseline's parameters and AdamW moments before that step's update, every
    :data:`STATE_EVERY` steps) and ``<task>_<hash>.npy`` per removal (per-prompt measure).
    """

    def __init__(self, release_path: Path, manifest_sha256: str, root: Path | None = None,
                 machine: dict | None = None) -> None:
        """Open the store of a release's replays made on ``machine``.

        ``machine`` is the fingerprint of the machine that makes the replays (default: this one;
        a cluster's for the Ray executor, :func:`benchmark.causal.cluster.cluster_fingerprint`).
        """
        from benchmark.machine import fingerprint

        self.release_path = Path(release_path)
        self.manifest_sha256 = manifest_sha256
        fp = machine or fingerprint()
        key = hashlib.sha256(json.dumps({
            "manifest": manifest_sha256, "machine": fp["key"], "version": REPLAY_VERSION,
            "mode": REPLAY_MODE, "precision": REPLAY_PRECISION, "threads": REPLAY_THREADS,
            "row_order": row_order()}, sort_keys=True).encode()).hexdigest()
        self.root = Path(root) if root is not None else cache_root()
        self.dir = self.root / "replays" / key[:24]
        self.machine = fp

    def path(self, job: Job) -> Path:
        """Where a job's result lives."""
        ext = ".pt" if job.task is None else ".npy"
        return self.dir / f"seed{job.seed}" / f"{job.key}{ext}"

    def state_path(self, seed: int, step: int) -> Path:
        """Where the baseline's state before ``step``'s update lives."""
        return self.dir / f"seed{seed}" / f"state_{step:04d}.pt"

    def has(self, job: Job) -> bool:
        """Whether the job's result is stored."""
        return self.path(job).exists()

    def baseline(self, seed: int) -> dict:
        """``{"measures": {task: (P,) probs}, "stops": {task: step}, "first_divergent_step"}``."""
        import torch

        d = torch.load(self.path(baseline_job(seed)), weights_only=False)
        return {"measures": d["measures"], "stops": d["stops"],
                "first_divergent_step": d.get("first_divergent_step")}

    def state(self, seed: int, step: int) -> dict:
        """The baseline's stored state before ``step``'s update."""
        import torch

        return torch.load(self.state_path(seed, step), weights_only=False)

    def result(self, job: Job) -> np.ndarray:
        """The stored per-prompt probabilities of a removal (or bonus-off) job."""
        return np.load(self.path(job))


def open_store(release_path: Path, manifest_sha256: str, executor: str | None = None
               ) -> ReplayStore:
    """The store replays of ``executor`` go to (keyed by the machine that makes them)."""
    if executor_name(executor) == "ray":
        from benchmark.causal.cluster import cluster_fingerprint

        return ReplayStore(release_path, manifest_sha256, machine=cluster_fingerprint())
    return ReplayStore(release_path, manifest_sha256)


def batch_start(release_path: Path, seed: int, jobs: list[Job]) -> int:
    """The stored baseline state a seed's batch of ``jobs`` starts from.

    The last state (every :data:`STATE_EVERY` steps) at or before the first step at which a
    job leaves the baseline's trajectory: its first removed step, or its task's window start
    for a bonus-off job.
    """
    from benchmark.build.config import BuildConfig

    cfg = BuildConfig.from_dict(json.loads(
        (Path(release_path) / f"seed{seed}" / "config.json").read_text()))
    starts = {b.id: b.window_start for b in cfg.behaviors}
    joins = [min(starts[j.task], j.stop) if j.bonus_off else j.first_step
             for j in jobs if j.task is not None]
    return (min(joins, default=0) // STATE_EVERY) * STATE_EVERY


def _atomic(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _save_npy(path: Path, arr: np.ndarray) -> None:
    def write(p: Path) -> None:
        with open(p, "wb") as f:
            np.save(f, np.asarray(arr, np.float64))

    _atomic(path, write)


# ----------------------------------------------------------------------------------------------
# a lane of batches (what one worker runs)


def _context(store: ReplayStore, seed: int, contexts: dict):
    """Worker side: the seed's :class:`~benchmark.build.stacked.StackedReplay`, loaded once."""
    from benchmark.build.replay import ReplaySeed
    from benchmark.build.stacked import StackedReplay

    if seed not in contexts:
        ctx = ReplaySeed(store.release_path / f"seed{seed}", precision=REPLAY_PRECISION)
        contexts[seed] = StackedReplay.of_seed(ctx, reverse_rows=row_order() == "reversed")
    return contexts[seed]


def run_batch_jobs(store: ReplayStore, seed: int, jobs: list[Job], contexts: dict,
                   report=None) -> dict:
    """Run one seed's jobs as one stacked batch and store every result (the baseline too).

    The batch starts from the baseline's last stored state before its first join, or from
    the post-SFT start when the baseline is not stored yet (it is then computed, measured and
    stored on the way). ``report(job, seconds)`` is called as jobs finish.

    Returns timing facts: ``{"seed", "jobs", "start", "slice_steps", "seconds"}``.
    """
    from benchmark.build.replay import recorded_responses
    from benchmark.build.stacked import Member

    t0 = time.perf_counter()
    sr = _context(store, seed, contexts)
    cfg, nps = sr.cfg, sr.cfg.prompts_per_step * sr.cfg.group_size
    windows = {b.id: (b.window_start, b.window_end) for b in cfg.behaviors}
    base_job = baseline_job(seed)
    todo = [j for j in dict.fromkeys(jobs) if j.task is not None and not store.has(j)]
    members = []
    for j in todo:
        if j.bonus_off:
            members.append(Member(j.key, {}, j.stop, frozenset([j.task]),
                                  min(windows[j.task][0], j.stop), (j.task,)))
            continue
        pos = [p for p in j.positions if p < j.stop * nps]
        rem: dict[int, set[int]] = {}
        for p in pos:
            rem.setdefault(p // nps, set()).add(p % nps)
        members.append(Member(j.key, rem, j.stop, frozenset(),
                              min(rem) if rem else j.stop, (j.task,)))
    by_key = {m.key: j for m, j in zip(members, todo, strict=True)}

    def finished(m: Member) -> None:  # stored as soon as it is done: a crash keeps it
        job = by_key[m.key]
        _save_npy(store.path(job), m.result[job.task])
        if report is not None:
            report(job, time.perf_counter() - t0)

    need_base = not store.has(base_job)
    stops = {t: w[1] for t, w in windows.items()}
    if need_base:
        last = max(stops.values())
        res = _run(sr, members, None, range(0, last, STATE_EVERY),
                   {s: tuple(t for t in stops if stops[t] == s) for s in set(stops.values())},
                   recorded_responses(store.release_path / f"seed{seed}", upto=last), finished)
        for step, state in res["states"].items():
            _atomic(store.state_path(seed, step),
                    lambda p, state=state: __import__("torch").save(state, p))
        measures = {t: res["base"][s][t] for t, s in stops.items()}
        out = {"measures": measures, "stops": stops,
               "first_divergent_step": res["first_divergent_step"]}
        _atomic(store.path(base_job), lambda p: __import__("torch").save(out, p))
        start = 0
    else:
        start = batch_start(store.release_path, seed, todo)
        if not members:
            return {"seed": seed, "jobs": 0, "start": start, "slice_steps": 0,
                    "seconds": time.perf_counter() - t0}
        res = _run(sr, members, (start, store.state(seed, start)), (), {}, None, finished)
    return {"seed": seed, "jobs": len(members), "start": start,
            "slice_steps": res["slice_steps"], "seconds": round(time.perf_counter() - t0, 2)}


def _run(sr, members, start, save, measure_base, reference, on_finish) -> dict:
    from benchmark.build.stacked import run_batch

    return run_batch(sr, members, start=start, save_states=save, measure_base=measure_base,
                     reference=reference, on_finish=on_finish)


def run_lane(store: ReplayStore, lane: list[tuple[int, list[Job]]], contexts: dict,
             report=None) -> list[dict]:
    """Run a lane's batches in order (one seed each); see :func:`run_batch_jobs`."""
    return [run_batch_jobs(store, seed, jobs, contexts, report) for seed, jobs in lane]


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
        _context(store, seed, contexts)


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
