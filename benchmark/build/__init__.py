"""The release builder.

Presets, model + tokenizer, task + planted behaviors, SFT, GRPO with per-rollout capture, targets,
generation draws, behavior-rate curve, gates and manifest.

``bt-bench build --preset tiny --seeds 0 1 2 --out releases/tiny`` builds every seed (resumable:
rerunning the same command continues from the finished stages, and inside GRPO from the last saved
step) and writes ``manifest.json``. ``--jobs J`` builds J seeds at a time in separate processes;
``--nproc N`` builds each seed with N torch.distributed ranks (``torchrun``; gloo on CPU, NCCL on
GPU), which split the prompts of every GRPO step.

``bt-bench build --draw ID --out DIR`` builds one run drawn from the task family
(:mod:`benchmark.build.family`) at the ``family`` scale (``--preset micro-family`` for the
seconds-fast test scale); the manifest records the family version, the draw id and the redraws.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmark.build.config import BehaviorSpec, BuildConfig
from benchmark.build.presets import PRESETS, get_preset
from benchmark.build.seeds import build_config, write_release_manifest
from benchmark.errors import BuildError

__all__ = ["BehaviorSpec", "BuildConfig", "add_build_arguments", "build_command",
           "build_config", "build_release", "get_preset"]


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``build`` subcommand's arguments to ``parser``."""
    from benchmark.build.family import SCALES

    parser.add_argument("--preset", default=None, choices=sorted(set(PRESETS) | set(SCALES)),
                        help="build preset (default tiny); with --draw, the run scale "
                             f"({' or '.join(sorted(SCALES))}; default family)")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--seed", type=int, help="build one seed")
    g.add_argument("--seeds", type=int, nargs="+", help="build several seeds (default: 0)")
    g.add_argument("--draw", type=int, metavar="ID",
                   help="build the run drawn from the task family with this id (its seed and "
                        "tasks come from the id; a draw failing its gates is redrawn, recorded "
                        "in the manifest)")
    parser.add_argument("--max-redraws", type=int, default=4,
                        help="with --draw: redraws allowed after failed gates (default 4)")
    parser.add_argument("--out", required=True, help="release folder to write (created)")
    parser.add_argument("--release-id", default=None,
                        help="release id in the manifest (default: the preset name)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds built at the same time, one process each (default 1)")
    parser.add_argument("--nproc", type=int, default=1,
                        help="torch.distributed ranks per seed (torchrun; default 1)")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep the .work folder (build state) after a successful build")
    parser.add_argument("--no-progress", action="store_true", help="hide tqdm progress bars")


def _configs(preset: str, seeds: list[int], overrides: dict | None) -> dict[int, BuildConfig]:
    out = {}
    for seed in seeds:
        cfg = get_preset(preset, seed)
        for k, v in (overrides or {}).items():
            if not hasattr(cfg, k):
                raise BuildError(f"unknown config override {k!r}")
            setattr(cfg, k, BuildConfig.from_dict({k: v}).__dict__[k]
                    if k == "behaviors" else v)
        cfg.validate()
        out[seed] = cfg
    return out


def build_seeds(preset: str, seeds: list[int], out: str | Path, progress: bool = True,
                overrides: dict | None = None) -> dict[int, dict]:
    """Build ``seeds`` in this process (one rank of a distributed build, or the only process).

    Returns the per-seed summaries; writes no manifest.
    """
    from benchmark.build import dist as D
    from benchmark.build.pipeline import SeedBuild
    from benchmark.releases.format import atomic_write_json

    d = D.init()
    try:
        summaries = {}
        for seed, cfg in _configs(preset, seeds, overrides).items():
            t0 = time.perf_counter()
            sb = SeedBuild(cfg, Path(out), progress=progress, dist=d)
            summary = sb.run()
            if d.is_main:
                atomic_write_json(sb.dir / "config.json", cfg.to_dict())
            summary["build_seconds_this_run"] = round(time.perf_counter() - t0, 1)
            summaries[seed] = summary
        return summaries
    finally:
        D.shutdown(d)


def _worker_cmd(preset: str, seeds: list[int], out: Path, progress: bool,
                overrides: dict | None, nproc: int) -> list[str]:
    args = ["-m", "benchmark.build", "--preset", preset, "--seeds", *map(str, seeds),
            "--out", str(out)]
    if not progress:
        args.append("--no-progress")
    if overrides:
        args += ["--overrides", json.dumps(overrides)]
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", *args]
    return [sys.executable, *args]


def _resume_hint(out: Path, seeds: list[int]) -> str:
    steps = []
    for s in seeds:
        p = out / ".work" / f"seed{s}" / "grpo" / "resume.pt"
        if p.exists():
            from benchmark.errors import UnsafeFileError
            from benchmark.io import load_plain

            try:
                steps.append(f"seed {s} from GRPO step {int(load_plain(p, '')['step'])}")
            except (UnsafeFileError, TypeError, KeyError, ValueError):
                steps.append(f"seed {s}: its {p} is refused (delete {p.parent.parent} to "
                             "start that seed over)")
    where = "; ".join(steps) if steps else "from its last finished stage"
    return f"rerun the same command to resume ({where})"


def _run_workers(cmds: dict[tuple, list[str]], jobs: int, out: Path) -> None:
    """Run the worker commands, at most ``jobs`` at once; stop all at the first failure.

    After a failure the temp files and folders (``*.tmp``) that killed workers left in the
    seeds' folders are removed: they were never renamed into place, and a rerun rewrites them.
    """
    pending = list(cmds.items())
    running: dict[tuple, subprocess.Popen] = {}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    failed = False
    try:
        while pending or running:
            while pending and len(running) < jobs:
                key, cmd = pending.pop(0)
                running[key] = subprocess.Popen(cmd, env=env)
            time.sleep(0.2)
            for key, proc in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del running[key]
                if rc != 0:
                    how = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
                    raise BuildError(
                        f"the build of seed(s) {list(key)} {how} (a rank of a distributed build "
                        f"failing stops every rank); {_resume_hint(out, list(key))}")
    except BaseException:
        failed = True
        raise
    finally:
        for proc in running.values():
            proc.kill()
            proc.wait()
        if failed:
            _sweep_temp(out, sorted({s for key in cmds for s in key}))


def _sweep_temp(out: Path, seeds: list[int]) -> None:
    """Remove ``*.tmp`` files and folders under the seeds' release and work folders."""
    for s in seeds:
        for root in (out / f"seed{s}", out / ".work" / f"seed{s}"):
            for p in sorted(root.rglob("*.tmp"), reverse=True):  # empty for a missing root
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)


def build_release(preset: str, seeds: list[int], out: str | Path, release_id: str | None = None,
                  progress: bool = True, keep_work: bool = False,
                  overrides: dict | None = None, jobs: int = 1, nproc: int = 1) -> dict:
    """Build ``seeds`` of ``preset`` into ``out`` and write its manifest; return the manifest.

    ``overrides`` replaces config fields (tests shorten runs this way). ``jobs`` > 1 builds seeds
    in parallel processes; ``nproc`` > 1 builds each seed with that many torch.distributed ranks.
    Raises BuildError when a gate fails or a process dies (finished work stays for a rerun).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    configs = _configs(preset, seeds, overrides)
    if jobs <= 1 and nproc <= 1:
        build_seeds(preset, seeds, out, progress, overrides)
    else:
        groups = [(s,) for s in seeds] if jobs > 1 else [tuple(seeds)]
        cmds = {g: _worker_cmd(preset, list(g), out, progress, overrides, nproc) for g in groups}
        _run_workers(cmds, max(jobs, 1), out)
    manifest = write_release_manifest(out, preset, configs, release_id, nproc)
    if not keep_work:
        shutil.rmtree(out / ".work", ignore_errors=True)
    return manifest


def build_command(args: argparse.Namespace) -> int:
    """CLI entry of ``bt-bench build``; returns the exit code."""
    from benchmark.build.family import SCALES, build_draw

    t0 = time.perf_counter()
    if args.draw is not None:
        scale = args.preset or "family"
        if scale not in SCALES:
            raise BuildError(f"--draw builds at a family scale, not preset {scale!r}; use "
                             f"--preset {' or '.join(sorted(SCALES))}")
        if args.jobs > 1 or args.nproc > 1:
            raise BuildError("--draw builds one seed in one process; drop --jobs/--nproc")
        manifest = build_draw(args.draw, args.out, scale=scale, max_redraws=args.max_redraws,
                              progress=not args.no_progress, keep_work=args.keep_work,
                              release_id=args.release_id)
        fam = manifest["build"]["family"]
        print(f"draw {fam['draw_id']} (family {fam['version']}): {fam['redraws']} redraw(s)")
    else:
        preset = args.preset or "tiny"
        if preset not in PRESETS:
            raise BuildError(f"{preset!r} is a family scale: build a draw of it with --draw ID, "
                             f"or choose a preset of {sorted(PRESETS)}")
        seeds = [args.seed] if args.seed is not None else (args.seeds or [0])
        manifest = build_release(preset, seeds, args.out, release_id=args.release_id,
                                 progress=not args.no_progress, keep_work=args.keep_work,
                                 jobs=args.jobs, nproc=args.nproc)
    for s, summ in manifest["seeds"].items():
        gates = summ.get("gates") or {}
        for bid, g in gates.items():
            if isinstance(g, dict) and "trigger_rate_window_end" in g:
                print(f"seed {s} {bid}: trigger rate window-end {g['trigger_rate_window_end']:.3f}"
                      f" final {g['trigger_rate_final']:.3f} control {g['control_rate_max']:.3f}")
    print(f"wrote {Path(args.out) / 'manifest.json'} ({manifest['total_bytes'] / 2**20:.1f} MiB) "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0
