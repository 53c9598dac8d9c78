"""The per-machine replay store (jobs, keys, stored baselines and removals) and the lane runner."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmark.errors import UnsafeFileError
from benchmark.io import cache_root, load_npy, load_plain

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


def row_order() -> str:
    """``"forward"`` (default) or ``"reversed"`` (from ``$BT_BENCH_REPLAY_ROW_ORDER``)."""
    v = os.environ.get(ROW_ORDER_ENV, "forward")
    if v not in ("forward", "reversed"):
        raise ValueError(f"{ROW_ORDER_ENV}={v!r}; expected 'forward' or 'reversed'")
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
    that task's fractions. ``fixed`` replays on the recorded responses instead of sampling
    (the fixed-data replays of the on-policy share, docs/causal.md); with no positions it is
    the fixed-data baseline of ``task``.
    """

    seed: int
    task: str | None
    positions: tuple[int, ...]
    stop: int
    n_per_step: int
    bonus_off: bool = False
    fixed: bool = False

    @property
    def key(self) -> str:
        """The job's file stem in the store."""
        if self.task is None:
            return "baseline"
        if self.bonus_off:
            return f"{self.task}_bonus_off"
        if self.fixed:
            return f"{self.task}_fixed_{positions_hash(self.positions)}"
        return f"{self.task}_{positions_hash(self.positions)}"

    @property
    def first_step(self) -> int:
        """The first step with a removed rollout (``stop`` when none is removed)."""
        return min(self.positions) // self.n_per_step if self.positions else self.stop

    def to_dict(self) -> dict:
        """Plain-JSON form (a worker's spec)."""
        return {"seed": self.seed, "task": self.task, "positions": list(self.positions),
                "stop": self.stop, "n_per_step": self.n_per_step, "bonus_off": self.bonus_off,
                "fixed": self.fixed}

    @classmethod
    def from_dict(cls, d: dict) -> Job:
        """Inverse of :meth:`to_dict`."""
        return cls(int(d["seed"]), d["task"], tuple(int(p) for p in d["positions"]),
                   int(d["stop"]), int(d["n_per_step"]), bool(d.get("bonus_off", False)),
                   bool(d.get("fixed", False)))


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

    The store is a cache another party could have written to: every file is **sealed** when
    written (an HMAC under this machine's key, :mod:`benchmark.seal`, over the file's bytes and
    its place in the store) and read only when its seal holds, without pickle
    (:func:`benchmark.io.load_plain`, :func:`benchmark.io.load_npy`) and checked for its form;
    :meth:`has` drops an entry that fails (it is then rebuilt), the readers refuse it with
    :class:`~benchmark.errors.UnsafeFileError`. An entry edited in place, or brought from another
    machine's store (a restored CI cache), fails its seal and is rebuilt, never used.
    """

    #: what a refused entry's message tells the user
    FIX = "delete it: bt-bench rebuilds a replay-store entry on the next run"

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
            "row_order": row_order(), "sealed": 1}, sort_keys=True).encode()).hexdigest()
        self.root = Path(root) if root is not None else cache_root()
        self.dir = self.root / "replays" / key[:24]
        self.machine = fp
        self._checked: set[tuple[str, int, int]] = set()  # entries that loaded as they should

    def _identity(self, path: Path) -> str:
        """What a stored file's seal binds besides its bytes: this store and the file's place."""
        return f"bt-bench replay store {self.dir.name}/{Path(path).relative_to(self.dir)}"

    def put(self, path: Path, write) -> None:
        """Write a store file by ``write(tmp)`` and a rename, then seal it (benchmark.seal)."""
        from benchmark.seal import seal_file

        write_atomically(path, write)
        seal_file(path, self._identity(path))

    def adopt(self, other: ReplayStore) -> None:
        """Move ``other``'s entries (of the same run, under another manifest) into this store.

        Each entry is moved only when its seal holds in ``other`` and is sealed anew for its
        place here (a seal binds the store it was written in); a bad one is left behind.
        """
        from benchmark.seal import SEAL_SUFFIX, check_file, seal_file

        for f in sorted(other.dir.rglob("*")):
            if not f.is_file() or f.name.endswith(SEAL_SUFFIX) or f.name.startswith("."):
                continue
            if not check_file(f, other._identity(f)):
                continue
            dst = self.dir / f.relative_to(other.dir)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dst)
            seal_file(dst, self._identity(dst))
        shutil.rmtree(other.dir, ignore_errors=True)

    def _check_seal(self, path: Path) -> None:
        """Raise :class:`UnsafeFileError` unless ``path`` is sealed under this machine's key."""
        from benchmark.seal import check_file

        if not check_file(path, self._identity(path)):
            raise UnsafeFileError(
                f"{path}: its seal is missing or does not match (the entry was edited, or written "
                f"under another machine's key: a copied or restored cache); {self.FIX}")

    def path(self, job: Job) -> Path:
        """Where a job's result lives."""
        ext = ".pt" if job.task is None else ".npy"
        return self.dir / f"seed{job.seed}" / f"{job.key}{ext}"

    def state_path(self, seed: int, step: int) -> Path:
        """Where the baseline's state before ``step``'s update lives."""
        return self.dir / f"seed{seed}" / f"state_{step:04d}.pt"

    def has(self, job: Job) -> bool:
        """Whether the job's result is stored and loads as one.

        A bad entry is deleted, with a note on stderr, so that it is rebuilt.
        """
        p = self.path(job)
        if not p.exists():
            return False
        st = p.stat()
        mark = (str(p), st.st_mtime_ns, st.st_size)
        if mark in self._checked:
            return True
        try:
            self.baseline(job.seed) if job.task is None else self.result(job)
        except UnsafeFileError as exc:
            print(f"bt-bench: {exc}; deleted, it is rebuilt", file=sys.stderr)
            p.unlink(missing_ok=True)
            p.with_name(p.name + ".seal").unlink(missing_ok=True)
            return False
        self._checked.add(mark)
        return True

    def baseline(self, seed: int) -> dict:
        """``{"measures": {task: (P,) probs}, "stops": {task: step}, "first_divergent_step"}``.

        Raises:
            UnsafeFileError: the file holds a pickled object or is not of this form.
        """
        path = self.path(baseline_job(seed))
        self._check_seal(path)
        d = load_plain(path, self.FIX)
        ok = (isinstance(d, dict) and isinstance(d.get("measures"), dict)
              and isinstance(d.get("stops"), dict)
              and all(isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind == "f"
                      for v in d["measures"].values())
              and all(isinstance(v, int) for v in d["stops"].values())
              and isinstance(d.get("first_divergent_step"), int | None))
        if not ok:
            raise UnsafeFileError(f"{path}: not a replay baseline (expected measures: "
                                  "{task: (P,) float array}, stops: {task: int}, "
                                  f"first_divergent_step: int or None); {self.FIX}")
        return {"measures": d["measures"], "stops": d["stops"],
                "first_divergent_step": d.get("first_divergent_step")}

    def state(self, seed: int, step: int) -> dict:
        """The baseline's stored state before ``step``'s update.

        ``{"step", "params", "exp_avg", "exp_avg_sq"}``, each but the step a dict
        name -> float64 tensor of that parameter's shape.

        Raises:
            UnsafeFileError: the file holds a pickled object or is not of this form.
        """
        import torch

        path = self.state_path(seed, step)
        self._check_seal(path)
        d = load_plain(path, self.FIX)
        keys = ("params", "exp_avg", "exp_avg_sq")
        ok = (isinstance(d, dict) and d.get("step") == step
              and all(isinstance(d.get(k), dict) and d[k] for k in keys)
              and all(isinstance(v, torch.Tensor) and v.dtype.is_floating_point
                      for k in keys for v in d[k].values())
              and all(d[k].keys() == d["params"].keys()
                      and all(d[k][n].shape == d["params"][n].shape for n in d["params"])
                      for k in keys))
        if not ok:
            raise UnsafeFileError(f"{path}: not a replay state of step {step} (expected step, "
                                  "params, exp_avg, exp_avg_sq: {name: tensor} of matching "
                                  f"shapes); {self.FIX}")
        return d

    def discard_baseline(self, seed: int) -> None:
        """Delete a seed's baseline and stored states (a bad one was found: rebuilt next)."""
        d = self.dir / f"seed{seed}"
        for p in [self.path(baseline_job(seed)), *d.glob("state_*.pt")]:
            p.unlink(missing_ok=True)
            p.with_name(p.name + ".seal").unlink(missing_ok=True)

    def result(self, job: Job) -> np.ndarray:
        """The stored ``(P,)`` float64 per-prompt probabilities of a removal (or bonus-off) job.

        Raises:
            UnsafeFileError: a pickle, or not a 1-D float64 array.
        """
        self._check_seal(self.path(job))
        return load_npy(self.path(job), self.FIX, dtype="float64", ndim=1)


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


def write_atomically(path: Path, write) -> None:
    """Write ``path`` by ``write(tmp)`` and a rename: the store never holds a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _save_npy(store: ReplayStore, path: Path, arr: np.ndarray) -> None:
    def write(p: Path) -> None:
        with open(p, "wb") as f:
            np.save(f, np.asarray(arr, np.float64))

    store.put(path, write)


# ----------------------------------------------------------------------------------------------
# a lane of batches (what one worker runs, under either executor)


def seed_context(store: ReplayStore, seed: int, contexts: dict):
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
    Fixed-data jobs run after the others, as a batch of their own (:func:`run_fixed_jobs`).
    """
    from benchmark.build.replay import recorded_responses
    from benchmark.build.stacked import Member

    fixed = [j for j in dict.fromkeys(jobs) if j.fixed]
    if fixed:
        facts = run_batch_jobs(store, seed, [j for j in jobs if not j.fixed]
                               or [baseline_job(seed)], contexts, report)
        more = run_fixed_jobs(store, seed, fixed, contexts, report)
        return {**facts, "jobs": facts["jobs"] + more["jobs"],
                "slice_steps": facts["slice_steps"] + more["slice_steps"],
                "seconds": round(facts["seconds"] + more["seconds"], 2)}
    t0 = time.perf_counter()
    sr = seed_context(store, seed, contexts)
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
        _save_npy(store, store.path(job), m.result[job.task])
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
            store.put(store.state_path(seed, step),
                      lambda p, state=state: __import__("torch").save(state, p))
        measures = {t: res["base"][s][t] for t, s in stops.items()}
        out = {"measures": measures, "stops": stops,
               "first_divergent_step": res["first_divergent_step"]}
        store.put(store.path(base_job), lambda p: __import__("torch").save(out, p))
        start = 0
    else:
        start = batch_start(store.release_path, seed, todo)
        if not members:
            return {"seed": seed, "jobs": 0, "start": start, "slice_steps": 0,
                    "seconds": time.perf_counter() - t0}
        try:
            state = store.state(seed, start)
        except UnsafeFileError as exc:  # a bad stored state: rebuild the seed's baseline
            print(f"bt-bench: {exc}; deleted, the baseline is rebuilt", file=sys.stderr)
            store.discard_baseline(seed)
            return run_batch_jobs(store, seed, jobs, contexts, report)
        res = _run(sr, members, (start, state), (), {}, None, finished)
    return {"seed": seed, "jobs": len(members), "start": start,
            "slice_steps": res["slice_steps"], "seconds": round(time.perf_counter() - t0, 2)}


def _run(sr, members, start, save, measure_base, reference, on_finish, fixed=None) -> dict:
    from benchmark.build.stacked import run_batch

    return run_batch(sr, members, start=start, save_states=save, measure_base=measure_base,
                     reference=reference, on_finish=on_finish, fixed=fixed)


def run_fixed_jobs(store: ReplayStore, seed: int, jobs: list[Job], contexts: dict,
                   report=None) -> dict:
    """Run one seed's fixed-data jobs as one stacked batch on the recorded responses.

    The batch's baseline is the fixed-data baseline; it starts from the on-policy baseline's
    stored state where the two are still the same run: at or before the on-policy baseline's
    first step whose sampled responses differ from the release's (before it, both trained on
    the same tokens, so their states are the same bits). The on-policy baseline must be stored.

    Returns timing facts as :func:`run_batch_jobs`.
    """
    from benchmark.build.replay import recorded_responses
    from benchmark.build.stacked import Member

    t0 = time.perf_counter()
    sr = seed_context(store, seed, contexts)
    nps = sr.cfg.prompts_per_step * sr.cfg.group_size
    todo = [j for j in dict.fromkeys(jobs) if j.fixed and not store.has(j)]
    if not todo:
        return {"seed": seed, "jobs": 0, "start": 0, "slice_steps": 0, "seconds": 0.0}
    start = batch_start(store.release_path, seed, todo)
    div = store.baseline(seed)["first_divergent_step"]
    if div is not None:
        start = min(start, (div // STATE_EVERY) * STATE_EVERY)
    members = []
    for j in todo:
        rem: dict[int, set[int]] = {}
        for p in (p for p in j.positions if p < j.stop * nps):
            rem.setdefault(p // nps, set()).add(p % nps)
        members.append(Member(j.key, rem, j.stop, frozenset(), min(rem) if rem else j.stop,
                              (j.task,)))
    by_key = {m.key: j for m, j in zip(members, todo, strict=True)}

    def finished(m: Member) -> None:
        job = by_key[m.key]
        _save_npy(store, store.path(job), m.result[job.task])
        if report is not None:
            report(job, time.perf_counter() - t0)

    state = (start, store.state(seed, start)) if start > 0 else None
    recorded = recorded_responses(store.release_path / f"seed{seed}",
                                  upto=max(j.stop for j in todo))
    res = _run(sr, members, state, (), {}, None, finished, fixed=recorded)
    return {"seed": seed, "jobs": len(members), "start": start,
            "slice_steps": res["slice_steps"], "seconds": round(time.perf_counter() - t0, 2)}


def run_lane(store: ReplayStore, lane: list[tuple[int, list[Job]]], contexts: dict,
             report=None) -> list[dict]:
    """Run a lane's batches in order (one seed each); see :func:`run_batch_jobs`."""
    return [run_batch_jobs(store, seed, jobs, contexts, report) for seed, jobs in lane]
