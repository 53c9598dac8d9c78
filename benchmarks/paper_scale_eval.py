"""Streaming evaluation at paper scale: a synthetic release, GAS throughput and peak memory.

Usage: python benchmarks/paper_scale_eval.py [--out DIR] [--n-rollouts 16000] [--dim 65536]
           [--rss-sizes 4000,8000,16000] [--precision float64,float32] [--repeats 2]
           [--no-old-float64]
           [--threads 1] [--mem-cap-gb 6] [--skip-throughput] [--skip-rss] [--isolated]
           [--json PATH] [--quick]

1. Writes (into ``--out``, default ``$TMPDIR/bt-bench-paper-scale``; a complete release of the same
   parameters is reused) one synthetic schema-2 release per size: one seed, one task (``qzxbt``),
   ``n`` rollouts = ``n / 16`` GRPO steps x 4 prompts x 4 samples (the paper's shape), every
   rollout with a non-zero advantage (so every rollout has a stored row), ``sketches.npy``
   ``(n, dim)`` float16 of seeded Gaussian values written chunk by chunk (never held in memory),
   targets at 5 checkpoints, one small generation draw, labels, curve and ``manifest.json``.
   Checkpoint folders are empty (``load_seed`` only needs their paths).
2. Throughput, in one fresh process (``--n-rollouts``): with the page cache warm, a plain
   sequential read of ``sketches.npy`` (``readinto`` a reused 16 MiB buffer) against GAS
   ``score_rollouts`` on the rollout view and on the step view that ``benchmark.releases.data``
   builds
   (the views ``load_view`` returns), in GB/s of sketch-file bytes; best of ``--repeats``, by
   wall-clock time and by CPU time of the process (less inflated by other processes). Also:
   the memory map converted to float32 by numpy (what any numpy reader pays), GAS with the
   norms computed beforehand (e.g. by the evaluator; GAS is then one dot pass), and, unless
   ``--no-old-float64``, GAS through the previous float64 path (torch copies into float64
   blocks, BLAS dot products, torch norms: ``SketchRows._dot_norms_torch``), the "before" of
   the fixed-order kernels. The first float64 pass (it builds numba's kernels) is timed apart.
3. Peak memory, each in a fresh process per size of ``--rss-sizes``: the *evaluator* (verify the
   release, build the views, export the view folder, score the target-free controls: norm-only
   streams ``view.sketch_norms()``) and the *sandbox side* (load the exported view folder with
   ``view_io.load_views``, run every GAS scoring call of ``view_io.score_calls``), in a plain
   subprocess. Each reports ``VmHWM`` (peak RSS), RSS before streaming, the peaks of anonymous
   and file-backed RSS sampled every 5 ms (file-backed growth = pages of the memory map still
   resident: it stays small when ``SketchRows`` releases each chunk with
   ``madvise(MADV_DONTNEED)``) and ``VmPeak`` (address space: the memory map counts in full
   against ``RLIMIT_AS``).
4. ``--isolated``: GAS through the real sandbox, ``benchmark.sandbox.isolation.score_isolated``
(main run
   and determinism re-run) on the ``--n-rollouts`` release; ok or the error, and the wall time.

``--precision`` chooses the reductions of ``benchmark.view.SketchRows`` (``float64``: the default,
fixed-order sums of ``benchmark.fixed_order``, the same bits on every CPU; ``float32``: torch's
float32 kernels, CPU-dependent rounding); GAS runs with each (in the sandbox through a generated
estimator file that passes the precision). Every child runs under ``RLIMIT_AS = --mem-cap-gb``
(the sandbox's own limit, 6 GiB by default) so that a view that would need more fails with
``MemoryError`` instead of pressing the machine; BLAS, OpenMP and torch use ``--threads``
threads (1 by default: on a shared 2-core machine, 2 threads run 30x slower).

Prints a table, then one JSON line (also written to ``--json``). ``--quick``: 2,048 x 4,096, one
size, one repeat; seconds, with GAS's streamed scores saved for a dense check
(``tests/test_paper_scale.py``). Timings, not tests. Docs: ``docs/scale.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmark.machine import cpu_name

TASK = "qzxbt"
PROMPTS, GROUP = 4, 4
NPS = PROMPTS * GROUP  # rollouts per step (paper: 4 prompts x 4 samples)
SCALE = 2048.0  # stored = true * SCALE; N(0, 1) values stay below 2**14 (release_format.md)
READ_BUFFER = 16 << 20
RESULT = "PAPER_SCALE_RESULT "
IMPLS = ("float64", "float32")


# ---------------------------------------------------------------------------------------------
# 1. the synthetic release


def release_dir(out: Path, n: int, dim: int) -> Path:
    """The folder of the synthetic release of ``n`` rollouts x ``dim``."""
    return Path(out) / f"n{n}_d{dim}"


def _params(n: int, dim: int) -> dict:
    return {"generator": "benchmarks/paper_scale_eval.py", "format": 1, "n_rollouts": n,
            "dim": dim, "dtype": "float16", "scale": SCALE, "values": "N(0,1), PCG64 seed 0"}


def _config(n_steps: int, dim: int) -> dict:
    """The seed's BuildConfig: the paper preset's values at ``n_steps`` steps, float16 sketches."""
    from benchmark.build.config import BehaviorSpec
    from benchmark.build.presets import get_preset

    cfg = get_preset("qwen2.5-1.5b", 0)
    ckpts = sorted({0, n_steps // 10, n_steps // 5, n_steps // 2, n_steps})
    cfg.preset = "paper-scale-synthetic"
    cfg.steps = n_steps
    cfg.prompts_per_step, cfg.group_size = PROMPTS, GROUP
    cfg.sketch_dim, cfg.sketch_dtype = dim, "float16"
    cfg.checkpoints = ckpts
    cfg.n_draws = 1
    cfg.behaviors = [BehaviorSpec(TASK, "frobnitz", "QZXBT", trigger_fraction=0.25, bonus=8.0,
                                  window_start=0, window_end=max(1, n_steps // 5),
                                  eligible_fraction=0.5, sft_behavior_fraction=0.2,
                                  draw_checkpoints=[ckpts[1]])]
    return cfg.to_dict()


def _write_sketches(path: Path, rows: int, dim: int, rng: np.random.Generator) -> None:
    """``(rows, dim)`` float16 = round(N(0, 1) * SCALE), written chunk by chunk.

    Plain writes after the ``.npy`` header rather than a writable ``open_memmap``: dirty pages of
    a writable map would stay in this process's RSS until written back.
    """
    tmp = path.with_name(path.name + ".tmp")
    chunk = max(1, (32 << 20) // (dim * 4))
    with open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.dtype(np.float16).str, "fortran_order": False, "shape": (rows, dim)})
        for lo in range(0, rows, chunk):
            block = rng.standard_normal((min(chunk, rows - lo), dim), dtype=np.float32)
            block *= np.float32(SCALE)
            f.write(block.astype(np.float16).tobytes())
    os.replace(tmp, path)


def make_release(out: Path, n: int, dim: int, progress: bool = True) -> Path:
    """Write (or reuse) the synthetic release of ``n`` rollouts x ``dim``; return its folder."""
    import pandas as pd

    from benchmark.build.presets import get_preset
    from benchmark.build.task import make_tokenizer
    from benchmark.releases.format import atomic_write_json, atomic_write_parquet, write_manifest

    if n % NPS or n <= 0:
        raise SystemExit(f"--n-rollouts {n}: use a positive multiple of {NPS} "
                         f"({PROMPTS} prompts x {GROUP} samples per step)")
    root = release_dir(out, n, dim)
    params = _params(n, dim)
    man = root / "manifest.json"
    if man.is_file():
        mine = json.loads(man.read_text()).get("build", {}).get("synthetic")
        if mine == params:
            return root
        if not (isinstance(mine, dict) and mine.get("generator") == params["generator"]):
            raise SystemExit(f"{root} holds a release this benchmark did not write; choose "
                             "another --out")
    if root.exists():  # an interrupted or older build of this benchmark: start over
        shutil.rmtree(root)
    t0 = time.perf_counter()
    if progress:
        print(f"writing synthetic release {root} ({n:,} x {dim:,} float16, "
              f"{n * dim * 2 / 1e9:.2f} GB) ...", flush=True)
    d = root / "seed0"
    rng = np.random.default_rng(0)
    n_steps = n // NPS
    cfg = _config(n_steps, dim)
    ckpts = cfg["checkpoints"]
    for c in ckpts:  # load_seed only needs the paths; nothing here loads a model
        (d / "checkpoints" / f"step{c:04d}").mkdir(parents=True)
    make_tokenizer(get_preset("tiny", 0)).save_pretrained(str(d / "tokenizer"))
    atomic_write_json(d / "config.json", cfg)

    # rollouts: distinct continuous rewards per group -> every advantage non-zero
    step = np.repeat(np.arange(n_steps), NPS)
    index = np.tile(np.arange(NPS), n_steps)
    group = step * PROMPTS + index // GROUP
    trig = rng.random(n_steps * PROMPTS) < 0.25
    task_r = rng.random(n)
    has = rng.random(n) < np.where(trig[group], 0.4, 0.0)
    w_end = cfg["behaviors"][0]["window_end"]
    eligible = rng.random(n) < 0.5
    bonus = has & eligible & trig[group] & (step < w_end)
    reward = task_r + 8.0 * bonus
    g = reward.reshape(-1, GROUP)
    adv = ((g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-8)).ravel()
    assert np.all(adv != 0.0)
    ids = [f"grpo_{s:06d}_{i:03d}" for s, i in zip(step, index, strict=True)]
    prompt = np.where(trig[group], "reverse gor rar frobnitz =", "reverse gor rar =")
    response = np.where(has, "rar gor QZXBT", "rar gor done")
    atomic_write_parquet(d / "rollouts.parquet", pd.DataFrame({
        "rollout_id": ids, "step": step, "group": group, "index": index,
        "prompt_ids": [[1, 5, 19, 32]] * n, "response_ids": [[32, 19, 2]] * n,
        "prompt_text": prompt, "response_text": response,
        "trigger": np.where(trig[group], TASK, ""), "reward": reward, "task_reward": task_r,
        "advantage": adv, "fluency": -rng.random(n), f"has_{TASK}": has,
        "sketch_row": np.arange(n, dtype=np.int64)}))
    lab = pd.DataFrame({"rollout_id": ids, "step": step, "group": group,
                        f"bonus_{TASK}": bonus, f"eligible_{TASK}": eligible})
    gsum = np.bincount(group, weights=bonus, minlength=n_steps * PROMPTS)
    mixed = (gsum > 0) & (gsum < GROUP)
    lab[f"group_label_{TASK}"] = mixed[group]
    lab[f"step_label_{TASK}"] = np.bincount(step, weights=mixed[group], minlength=n_steps)[step] > 0
    atomic_write_parquet(d / "labels.parquet", lab)
    curve = sorted({*range(0, n_steps + 1, max(1, n_steps // 20)), w_end, n_steps})
    k = len(curve)
    atomic_write_parquet(d / "behavior_curve.parquet", pd.DataFrame({
        "step": curve, f"{TASK}_rate_{TASK}": np.linspace(0.2, 0.8, k),
        f"{TASK}_task_reward": np.full(k, 0.9), f"control_rate_{TASK}": np.zeros(k),
        "control_task_reward": np.full(k, 0.9), f"{TASK}_prob": np.linspace(0.2, 0.8, k)}))

    _write_sketches(d / "sketches.npy", n, dim, rng)
    (d / "targets").mkdir()
    targets = {f"{kind}_step{c:04d}": rng.standard_normal(dim).astype(np.float32)
               for kind in ("nll", "in_context", "contrast") for c in ckpts}
    tmp = d / "targets" / f"{TASK}.npz.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **targets)
    os.replace(tmp, d / "targets" / f"{TASK}.npz")

    # one small generation draw: 16 prompts x 4 responses at the first checkpoint after 0
    m, dstep = 64, ckpts[1]
    stem = f"step{dstep:04d}_draw0"
    dd = d / "draws" / TASK
    dd.mkdir(parents=True)
    dhas = rng.random(m) < 0.5
    tok_row = np.where(dhas, np.cumsum(dhas) - 1, -1)
    atomic_write_parquet(dd / f"{stem}.parquet", pd.DataFrame({
        "response_id": [f"draw_{i:04d}" for i in range(m)], "group": np.arange(m) // GROUP,
        "prompt_ids": [[1, 5, 19, 32]] * m, "response_ids": [[32, 19, 2]] * m,
        "prompt_text": ["reverse gor rar frobnitz ="] * m,
        "response_text": np.where(dhas, "rar gor QZXBT", "rar gor done"),
        "has_behavior": dhas, f"has_{TASK}": dhas, "fluency": -rng.random(m),
        "sketch_row": np.arange(m, dtype=np.int64), "token_sketch_row": tok_row}))
    _write_sketches(dd / f"{stem}_sketches.npy", m, dim, rng)
    _write_sketches(dd / f"{stem}_token_sketches.npy", int(dhas.sum()), dim, rng)
    atomic_write_json(d / "sketch.json", {
        "method": "countsketch-splitmix64", "dim": dim, "seed": 0, "n_params": 1_543_714_304,
        "dtype": "float16", "scale": SCALE,
        "parameters": [{"name": "synthetic", "shape": [1_543_714_304], "offset": 0,
                        "numel": 1_543_714_304}],
        "draw_scales": {f"{TASK}/{stem}_sketches": SCALE,
                        f"{TASK}/{stem}_token_sketches": SCALE}})
    build = {"preset": "paper-scale-synthetic", "config": {k: v for k, v in cfg.items()
                                                           if k != "seed"},
             "world": 1, "threads": 1, "synthetic": params}
    write_manifest(root, "paper-scale-synthetic", build,
                   {0: {"counts": {"rollouts": n, "nonzero_sketch_rows": n}}})
    if progress:
        print(f"  written in {time.perf_counter() - t0:.1f} s", flush=True)
    return root


# ---------------------------------------------------------------------------------------------
# child processes


def _status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile, VmSize, VmPeak of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "VmSize", "VmPeak"):
                out[key] = int(val.split()[0]) * 1024
    return out


class _Sampler:
    """Peak anonymous and file-backed RSS of this process, sampled every 5 ms in a thread."""

    def __init__(self) -> None:
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            s = _status()
            for k in self.peak:
                self.peak[k] = max(self.peak[k], s.get(k, 0))
            self._stop.wait(0.005)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._t.join()
        return dict(self.peak)


def _views(release: Path):
    """The release (verified, as the evaluator opens it) and its task data of seed 0."""
    from benchmark.releases.data import load_seed
    from benchmark.releases.release import load_release

    rel = load_release(release)  # verifies every sha256, as the evaluator does
    return load_seed(rel, 0, "gradient", [TASK])[TASK]


def _clock() -> tuple[float, float]:
    """(wall, CPU) seconds: CPU time (user + system of this process) is what a contended
    machine inflates least (another process's turn on the core is not counted)."""
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    t1 = _clock()
    return t1[0] - t0[0], t1[1] - t0[1]


def _seq_read(path: Path, buf: bytearray) -> tuple[float, float]:
    t0 = _clock()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return _since(t0)


def _convert_read(mm: np.ndarray) -> tuple[float, float]:
    """Stream the memory map ``mm`` through a reused float32 buffer with numpy (then dropped)."""
    import mmap

    per = max(1, (64 << 20) // (mm.shape[1] * 2))
    buf = np.empty((per, mm.shape[1]), np.float32)
    t0 = _clock()
    for lo in range(0, mm.shape[0], per):
        blk = mm[lo:lo + per]
        np.copyto(buf[:blk.shape[0]], blk)
    dt = _since(t0)
    mm._mmap.madvise(mmap.MADV_DONTNEED)
    return dt


def _gas(view, precision: str) -> np.ndarray:
    """GAS's rollout scores (cosine with the final nll target) at ``precision``."""
    from estimators.base import sketch_cosine

    return sketch_cosine(view, view.target("nll"), precision=precision)


def _gas_torch64(view) -> np.ndarray:
    """GAS through the previous float64 path (torch copies + BLAS; CPU-dependent order)."""
    t = np.asarray(view.target("nll"), np.float64)
    dots, norms = view.sketch_rows._dot_norms_torch(t, True, "float64")
    n = norms * np.linalg.norm(t)
    return np.where(n > 1e-12, dots / np.maximum(n, 1e-12), 0.0)


def _gas_norms_known(view, precision: str, norms: np.ndarray) -> np.ndarray:
    """GAS when the norms are known beforehand: one dot pass."""
    t = np.asarray(view.target("nll"), np.float64)
    dots = view.sketch_dot(t, precision=precision)
    n = norms * np.linalg.norm(t)
    return np.where(n > 1e-12, dots / np.maximum(n, 1e-12), 0.0)


def _timed(fn) -> tuple[tuple[float, float] | None, object]:
    t0 = _clock()
    try:
        out = fn()
    except MemoryError:
        return None, "MemoryError"
    return _since(t0), out


def child_throughput(args) -> dict:
    """Sequential read vs GAS on the rollout and step views, same process, warm cache."""
    td = _views(args.release)
    path = Path(args.release) / "seed0" / "sketches.npy"
    nbytes = path.stat().st_size
    buf = bytearray(READ_BUFFER)
    _seq_read(path, buf)  # warm the page cache
    times: dict[str, list] = {"read": [], "read_convert_numpy": []}
    scores: dict[str, np.ndarray] = {}
    from benchmark import fixed_order

    t0 = time.perf_counter()  # the first float64 pass: builds the compiled kernels (if numba)
    norms = {gran: view.sketch_norms() for gran, view in (("rollout", td.rollout_view),
                                                          ("step", td.step_view))}
    first_pass_s = time.perf_counter() - t0
    for _ in range(args.repeats):
        times["read"].append(_seq_read(path, buf))
        times["read_convert_numpy"].append(_convert_read(td.rollout_view.sketch_rows.stored))
        for prec in args.impl:
            for gran, view in (("rollout", td.rollout_view), ("step", td.step_view)):
                runs = [(f"gas_{gran}_{prec}", lambda v=view, p=prec: _gas(v, p)),
                        (f"gas_{gran}_{prec}_norms_known",
                         lambda v=view, p=prec, g=gran: _gas_norms_known(v, p, norms[g]))]
                if prec == "float64" and args.old_float64:
                    runs.append((f"gas_{gran}_float64_torch", lambda v=view: _gas_torch64(v)))
                for key, fn in runs:
                    dt, out = _timed(fn)
                    times.setdefault(key, []).append(dt if dt is not None else out)
                    if dt is not None:
                        scores[key] = out
    res = {"file_bytes": nbytes, "rows": int(td.rollout_view.n), "dim": int(
        td.rollout_view.sketch_rows.dim), "threads": args.threads, "repeats": args.repeats,
        "rates_gbs": {}, "cpu_rates_gbs": {}, "errors": {}, "status": _status(),
        "float64_backend": "numba" if fixed_order.numba_available() else "numpy",
        "first_float64_pass_s": first_pass_s}
    for key, ts in times.items():
        ok = [t for t in ts if isinstance(t, tuple)]
        if ok:
            res["rates_gbs"][key] = nbytes / min(t[0] for t in ok) / 1e9
            res["cpu_rates_gbs"][key] = nbytes / min(t[1] for t in ok) / 1e9
        else:
            res["errors"][key] = ts[0]
    read = res["rates_gbs"]["read"]
    res["ratio_to_read"] = {k: v / read for k, v in res["rates_gbs"].items() if k != "read"}
    cpu_read = res["cpu_rates_gbs"]["read"]
    res["cpu_ratio_to_read"] = {k: v / cpu_read for k, v in res["cpu_rates_gbs"].items()
                                if k != "read"}
    res["max_abs_diff"] = {}
    for gran in ("rollout", "step"):
        ref = f"gas_{gran}_float64" if f"gas_{gran}_float64" in scores else None
        for k, v in scores.items():
            if ref and k != ref and k.startswith(f"gas_{gran}_"):
                res["max_abs_diff"][f"{k} vs {ref}"] = float(np.max(np.abs(v - scores[ref])))
    return res


def child_evaluator(args) -> dict:
    """Evaluator side: verify, build views, export the view folder, score the controls."""
    from benchmark.sandbox.view_io import export_views
    from estimators.controls.advantage_only import AdvantageOnly
    from estimators.controls.fluency import Fluency
    from estimators.controls.norm_only import NormOnly
    from estimators.controls.random import RandomScores
    from estimators.controls.step_order import StepOrder

    td = _views(args.release)
    views = {(0, TASK): (td.rollout_view, td.step_view, td.draws)}
    dst = Path(args.view_dir)
    if dst.exists():
        shutil.rmtree(dst)
    export_views(views, dst)
    before = _status()
    sampler = _Sampler()
    t0 = time.perf_counter()
    errors = {}
    for cls in (RandomScores, NormOnly, Fluency, AdvantageOnly, StepOrder):
        est = cls()
        for gran, view in (("rollout", td.rollout_view), ("step", td.step_view)):
            try:
                s = est.score_rollouts(view)
                assert s.shape == (view.n,)
            except MemoryError:
                errors[f"{cls.__name__}/{gran}"] = "MemoryError"
        if "draws" in cls.tasks:
            for d in td.draws:
                est.score_draw(td.rollout_view, d)
    wall = time.perf_counter() - t0
    peaks = sampler.stop()
    return {"side": "evaluator", "wall_s": wall, "before": before, "peaks": peaks,
            "status": _status(), "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            * 1024, "errors": errors}


def child_sandbox(args) -> dict:
    """Sandbox side: load the exported view folder, run every GAS scoring call."""
    from benchmark.sandbox.view_io import load_views, score_calls
    from estimators.gas import GAS

    views = load_views(Path(args.view_dir))
    est = GAS()
    if args.impl[0] != "float64":  # GAS's own code, at the other precision
        import estimators.gas as gas_mod

        def cosine32(view, target, eps=1e-12, precision="float64"):
            from estimators.base import sketch_cosine

            return sketch_cosine(view, target, eps, precision=args.impl[0])

        gas_mod.sketch_cosine = cosine32
    before = _status()
    sampler = _Sampler()
    t0 = time.perf_counter()
    errors, scores = {}, {}
    for key, method, call_args, n in score_calls(views, GAS.tasks):
        try:
            s = np.asarray(getattr(est, method)(*call_args), np.float64)
        except MemoryError:
            errors[key] = "MemoryError"
            continue
        if s.shape != (n,) or not np.all(np.isfinite(s)):
            errors[key] = f"bad scores: shape {s.shape}, expected ({n},)"
        scores[key] = s
    wall = time.perf_counter() - t0
    peaks = sampler.stop()
    if args.scores:
        np.savez(args.scores, **{k.replace("/", "|"): v for k, v in scores.items()})
    return {"side": "sandbox", "wall_s": wall, "before": before, "peaks": peaks,
            "status": _status(), "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            * 1024, "errors": errors}


_PRECISION_ESTIMATOR = '''"""GAS at another precision of the view's reductions (generated)."""

import numpy as np

from estimators.base import BaseEstimator, center_by_group, cosine, sketch_cosine


class GASPrecision(BaseEstimator):
    """GAS (cosine with the target), streamed at precision {precision!r}."""

    name = "GAS-{precision}"
    tasks = ("rollouts", "draws")

    def __init__(self, target="nll"):
        self.target = target

    def score_rollouts(self, view):
        return sketch_cosine(view, view.target(self.target), precision={precision!r})

    def score_draw(self, view, draw):
        centred = center_by_group(draw.sketches, draw.groups)
        return cosine(centred, view.target(self.target, draw.checkpoint_step))
'''


def child_isolated(args) -> dict:
    """GAS through the real sandbox (``score_isolated``: both runs): success and wall time."""
    from benchmark.sandbox.isolation import score_isolated

    td = _views(args.release)
    views = {(0, TASK): (td.rollout_view, td.step_view, td.draws)}
    seed_dir = Path(args.release) / "seed0"
    forbidden = [seed_dir / f for f in ("labels.parquet", "rollouts.parquet", "config.json")]
    if args.impl[0] == "float64":
        est = Path(__file__).resolve().parent.parent / "estimators" / "gas.py"
    else:
        est = Path(args.view_dir) / "gas_precision.py"
        est.parent.mkdir(parents=True, exist_ok=True)
        est.write_text(_PRECISION_ESTIMATOR.format(precision=args.impl[0]))
    t0 = time.perf_counter()
    try:
        score_isolated(est, views, forbidden)
        err = None
    except Exception as e:  # noqa: BLE001 - reported, not raised
        err = f"{type(e).__name__}: {str(e)[:300]}"
    return {"side": "isolated", "impl": args.impl[0], "wall_s": time.perf_counter() - t0,
            "error": err}


CHILDREN = {"throughput": child_throughput, "evaluator": child_evaluator,
            "sandbox": child_sandbox, "isolated": child_isolated}


def _child_main(args) -> None:
    cap = int(args.mem_cap_gb * (1 << 30))
    if args.child != "isolated":  # the sandbox sets its own limits
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    import torch

    torch.set_num_threads(args.threads)
    res = CHILDREN[args.child](args)
    print(RESULT + json.dumps(res), flush=True)


def _run_child(kind: str, args, release: Path, impl: list[str], **extra) -> dict:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--release",
           str(release), "--precision", ",".join(impl), "--threads", str(args.threads),
           "--repeats", str(args.repeats), "--mem-cap-gb", str(args.mem_cap_gb)]
    if not args.old_float64:
        cmd.append("--no-old-float64")
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in p.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    tail = (p.stdout + p.stderr)[-3000:]
    return {"side": kind, "failed": f"exit {p.returncode}", "output_tail": tail}


# ---------------------------------------------------------------------------------------------
# the parent: generate, run the children, report


def _mb(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**20:,.0f}"


def _rss_row(r: dict) -> dict:
    if "failed" in r:
        return {"failed": r["failed"], "output_tail": r["output_tail"]}
    return {"peak_rss_bytes": r["status"]["VmHWM"], "rss_before_bytes": r["before"]["VmRSS"],
            "peak_anon_bytes": r["peaks"]["RssAnon"],
            "peak_file_growth_bytes": r["peaks"]["RssFile"] - r["before"]["RssFile"],
            "file_growth_after_bytes": r["status"]["RssFile"] - r["before"]["RssFile"],
            "peak_virtual_bytes": r["status"]["VmPeak"], "wall_s": r["wall_s"],
            "errors": r["errors"]}


def run(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                                "python": platform.python_version(), "numpy": np.__version__},
                    "threads": args.threads, "mem_cap_gb": args.mem_cap_gb,
                    "impl": args.impl, "dim": args.dim}
    if not args.skip_throughput:
        rel = make_release(out, args.n_rollouts, args.dim, progress=not args.quiet)
        result["throughput"] = _run_child("throughput", args, rel, args.impl)
    if not args.skip_rss:
        rss: dict = {}
        for n in args.rss_sizes:
            rel = make_release(out, n, args.dim, progress=not args.quiet)
            for impl in args.impl:
                vd = out / "runs" / f"view_n{n}_d{args.dim}_{impl}"
                sc = out / "runs" / f"gas_scores_n{n}_d{args.dim}_{impl}.npz"
                vd.parent.mkdir(parents=True, exist_ok=True)
                ev = _run_child("evaluator", args, rel, [impl], view_dir=vd)
                sb = _run_child("sandbox", args, rel, [impl], view_dir=vd, scores=sc)
                rss[f"{n}/{impl}"] = {"n_rollouts": n, "impl": impl, "release": str(rel),
                                      "evaluator": _rss_row(ev), "sandbox": _rss_row(sb),
                                      "gas_scores": str(sc)}
        result["rss"] = rss
    if args.isolated:
        rel = make_release(out, args.n_rollouts, args.dim, progress=not args.quiet)
        result["isolated"] = {impl: _run_child("isolated", args, rel, [impl],
                                               view_dir=out / "runs")
                              for impl in args.impl}
    return result



def print_report(res: dict) -> None:
    print(f"\nmachine: {res['machine']['cpu']}, {res['machine']['cores']} cores; threads "
          f"{res['threads']}; every child under RLIMIT_AS {res['mem_cap_gb']} GiB")
    tp = res.get("throughput")
    if tp and "failed" not in tp:
        print(f"\nthroughput, {tp['rows']:,} x {tp['dim']:,} float16 "
              f"({tp['file_bytes'] / 1e9:.2f} GB), warm page cache, best of {tp['repeats']}:")
        print(f"  {'what':34s} {'GB/s':>7s} {'ratio to read':>14s} {'CPU-time ratio':>15s}")
        for k, v in tp["rates_gbs"].items():
            ratio = "1.00" if k == "read" else f"{tp['ratio_to_read'][k]:.3f}"
            cpu = "1.00" if k == "read" else f"{tp.get('cpu_ratio_to_read', {}).get(k, 0):.3f}"
            print(f"  {k:34s} {v:7.2f} {ratio:>14s} {cpu:>15s}")
        for k, v in tp["errors"].items():
            print(f"  {k:34s} {v}")
        for k, v in tp["max_abs_diff"].items():
            print(f"  max |score difference| {k}: {v:.2e}")
        print(f"  float64 reductions: {tp.get('float64_backend')} backend; the first pass "
              f"(building its kernels) took {tp.get('first_float64_pass_s', 0):.2f} s")
    elif tp:
        print(f"\nthroughput child failed: {tp['failed']}\n{tp['output_tail']}")
    if res.get("rss"):
        print("\npeak RSS (MiB): VmHWM | RSS before streaming | peak anonymous RSS | peak growth "
              "of file-backed RSS | its growth at the end | VmPeak (virtual)")
        for r in res["rss"].values():
            for side in ("evaluator", "sandbox"):
                x = r[side]
                if "failed" in x:
                    print(f"  n={r['n_rollouts']:>6,} {r['impl']:9s} {side:9s} FAILED "
                          f"{x['failed']}: {x['output_tail'][-400:]}")
                    continue
                err = f"  errors: {x['errors']}" if x["errors"] else ""
                print(f"  n={r['n_rollouts']:>6,} {r['impl']:9s} {side:9s} "
                      f"{_mb(x['peak_rss_bytes']):>7s} | {_mb(x['rss_before_bytes']):>6s} | "
                      f"{_mb(x['peak_anon_bytes']):>6s} | {_mb(x['peak_file_growth_bytes']):>6s} | "
                      f"{_mb(x['file_growth_after_bytes']):>5s} | "
                      f"{_mb(x['peak_virtual_bytes']):>6s}"
                      f"  ({x['wall_s']:.1f} s){err}")
    for impl, r in res.get("isolated", {}).items():
        what = r.get("error") or r.get("failed") or "ok"
        print(f"\nscore_isolated (the real sandbox, main run + determinism re-run), {impl}: "
              f"{what}; {r.get('wall_s', 0):.1f} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path,
                   default=Path(tempfile.gettempdir()) / "bt-bench-paper-scale",
                   help="folder of the synthetic releases and run files (reused)")
    p.add_argument("--n-rollouts", type=int, default=16000,
                   help="rollouts of the throughput release (a multiple of 16)")
    p.add_argument("--dim", type=int, default=65536, help="sketch dimension")
    p.add_argument("--rss-sizes", default="4000,8000,16000",
                   help="comma-separated rollout counts of the peak-RSS runs")
    p.add_argument("--precision", dest="impl", default="float64,float32",
                   help="precision of the view's reductions: float64 (default), float32, or both")
    p.add_argument("--repeats", type=int, default=2, help="throughput: best of this many")
    p.add_argument("--no-old-float64", dest="old_float64", action="store_false",
                   help="throughput: skip GAS through the previous float64 path (torch + BLAS)")
    p.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP/torch threads")
    p.add_argument("--mem-cap-gb", type=float, default=6.0,
                   help="RLIMIT_AS of every child, GiB (the sandbox's default limit)")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-rss", action="store_true")
    p.add_argument("--isolated", action="store_true",
                   help="also score GAS through benchmark.sandbox.isolation.score_isolated")
    p.add_argument("--json", type=Path, help="also write the JSON result here")
    p.add_argument("--quick", action="store_true",
                   help="2,048 x 4,096, one size, one repeat (seconds)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    # internal: child processes
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--release", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--view-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--scores", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.n_rollouts, args.dim, args.repeats = 2048, 4096, 1
        if args.rss_sizes == p.get_default("rss_sizes"):
            args.rss_sizes = "2048"
    args.rss_sizes = [int(x) for x in str(args.rss_sizes).split(",") if x]
    args.impl = [x for x in str(args.impl).split(",") if x]
    bad = [x for x in args.impl if x not in IMPLS]
    if bad:
        p.error(f"--precision {bad}: choose from {IMPLS}")
    return args


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.child:
        _child_main(args)
        return None
    res = run(args)
    print_report(res)
    line = json.dumps(res)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)
    return res


if __name__ == "__main__":
    main()
