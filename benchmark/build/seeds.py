"""Building one seed from an explicit config; the release manifest from the seeds' build states."""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmark.build.config import BuildConfig


def build_config(cfg: BuildConfig, out: str | Path, progress: bool = True,
                 sft_checkpoint: Path | None = None) -> dict:
    """Build one seed from an explicit config into ``out`` (one process); return its summary.

    Writes ``seed<S>/config.json``, no manifest (:func:`write_release_manifest` does).
    ``sft_checkpoint``: start GRPO from this post-SFT checkpoint folder instead of training SFT
    (:class:`benchmark.build.pipeline.SeedBuild`).
    """
    from benchmark.build.pipeline import SeedBuild
    from benchmark.releases.format import atomic_write_json

    cfg.validate()
    t0 = time.perf_counter()
    sb = SeedBuild(cfg, Path(out), progress=progress, sft_checkpoint=sft_checkpoint)
    summary = sb.run()
    atomic_write_json(sb.dir / "config.json", cfg.to_dict())
    summary["build_seconds_this_run"] = round(time.perf_counter() - t0, 1)
    return summary


def write_release_manifest(out: Path, preset: str, configs: dict[int, BuildConfig],
                           release_id: str | None, nproc: int, family: dict | None = None) -> dict:
    """Write ``manifest.json`` from the seeds' build states (seeds built earlier keep theirs).

    ``family``: a drawn run's record (version, draw id, redraws), kept as ``build.family``.
    """
    from benchmark.machine import fingerprint
    from benchmark.releases.format import write_manifest

    old = (json.loads((out / "manifest.json").read_text())
           if (out / "manifest.json").exists() else {"seeds": {}})
    summaries = {}
    for d in sorted(out.glob("seed*")):
        s = int(d.name[4:])
        state = out / ".work" / d.name / "state.json"
        if state.exists():
            st = json.loads(state.read_text())
            summaries[s] = {k: st.get(k) for k in ("gates", "fidelity", "timings_s", "counts",
                                                    "decoder", "world")}
        elif str(s) in old["seeds"]:
            summaries[s] = old["seeds"][str(s)]
    any_cfg = next(iter(configs.values()))
    build = {
        "preset": preset, "threads": any_cfg.threads, "world": nproc,
        "config": {k: v for k, v in any_cfg.to_dict().items() if k != "seed"},
        "seeds": sorted(summaries), "machine": fingerprint(),
    }
    if family is not None:
        build["family"] = family
    return write_manifest(out, release_id or preset, build, summaries)
