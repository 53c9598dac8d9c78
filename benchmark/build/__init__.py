"""The release builder.

Presets, model + tokenizer, task + planted behavior, SFT, GRPO with per-rollout capture, targets,
generation draws, behavior-rate curve, gates and manifest.

``bt-bench build --preset tiny --seeds 0 1 2 --out releases/tiny`` builds every seed (resumable:
rerunning the same command continues from the finished stages) and writes ``manifest.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from benchmark.build.presets import PRESETS, BuildConfig, get_preset
from benchmark.errors import BuildError

__all__ = ["BuildConfig", "add_build_arguments", "build_command", "build_release", "get_preset"]


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``build`` subcommand's arguments to ``parser``."""
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                        help="build preset (default tiny)")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--seed", type=int, help="build one seed")
    g.add_argument("--seeds", type=int, nargs="+", help="build several seeds (default: 0)")
    parser.add_argument("--out", required=True, help="release folder to write (created)")
    parser.add_argument("--release-id", default=None,
                        help="release id in the manifest (default: the preset name)")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep the .work folder (build state) after a successful build")
    parser.add_argument("--no-progress", action="store_true", help="hide tqdm progress bars")


def build_release(preset: str, seeds: list[int], out: str | Path, release_id: str | None = None,
                  progress: bool = True, keep_work: bool = False,
                  overrides: dict | None = None) -> dict:
    """Build ``seeds`` of ``preset`` into ``out`` and write its manifest; return the manifest.

    ``overrides`` replaces config fields (tests swap the model of a large preset this way).
    Raises BuildError when a gate fails (the finished stages stay recorded for a rerun).
    """
    from benchmark.build.pipeline import SeedBuild
    from benchmark.release import atomic_write_json, write_manifest

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summaries = {}
    configs = {}
    for seed in seeds:
        cfg = get_preset(preset, seed)
        for k, v in (overrides or {}).items():
            if not hasattr(cfg, k):
                raise BuildError(f"unknown config override {k!r}")
            setattr(cfg, k, v)
        cfg.validate()
        t0 = time.perf_counter()
        sb = SeedBuild(cfg, out, progress=progress)
        summary = sb.run()
        atomic_write_json(sb.dir / "config.json", cfg.to_dict())
        summary["build_seconds_this_run"] = round(time.perf_counter() - t0, 1)
        summaries[seed] = summary
        configs[seed] = cfg
    # seeds built earlier into the same folder keep their recorded summaries
    old = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() \
        else {"seeds": {}}
    for d in sorted(out.glob("seed*")):
        s = int(d.name[4:])
        state = out / ".work" / d.name / "state.json"
        if s in summaries:
            continue
        if state.exists():
            st = json.loads(state.read_text())
            summaries[s] = {k: st.get(k) for k in ("gates", "fidelity", "timings_s", "counts")}
        elif str(s) in old["seeds"]:
            summaries[s] = old["seeds"][str(s)]
    any_cfg = next(iter(configs.values()))
    build = {
        "preset": preset, "threads": any_cfg.threads,
        "config": {k: v for k, v in any_cfg.to_dict().items() if k != "seed"},
        "seeds": sorted(summaries),
    }
    manifest = write_manifest(out, release_id or preset, build, summaries)
    if not keep_work:
        shutil.rmtree(out / ".work", ignore_errors=True)
        manifest = write_manifest(out, release_id or preset, build, summaries)
    return manifest


def build_command(args: argparse.Namespace) -> int:
    """CLI entry of ``bt-bench build``; returns the exit code."""
    seeds = [args.seed] if args.seed is not None else (args.seeds or [0])
    manifest = build_release(args.preset, seeds, args.out, release_id=args.release_id,
                             progress=not args.no_progress, keep_work=args.keep_work)
    for s, summ in manifest["seeds"].items():
        g, f = summ.get("gates") or {}, summ.get("fidelity") or {}
        gp = (f.get("gas_step_precision_group_label") or {})
        print(f"seed {s}: trigger rate window-end {g.get('trigger_rate_window_end')} final "
              f"{g.get('trigger_rate_final')} control {g.get('control_rate_max')}; fidelity "
              f"pearson {f.get('per_rollout_dot_pearson')} precision diff {gp.get('abs_diff')}")
    print(f"wrote {Path(args.out) / 'manifest.json'} ({manifest['total_bytes'] / 2**20:.1f} MiB)")
    return 0
