"""How far a two-rank build lands from a one-process build (the distributed-build test's bounds).

Usage: [ATEN_CPU_CAPABILITY=avx2|default] [OMP_NUM_THREADS=n] python benchmarks/dist_tolerance.py
       [--steps 6] [--out FILE]

Builds seed 0 of ``tiny`` with the overrides of ``tests/test_distributed_build.py`` once in one
process and once on two gloo ranks, and prints (as JSON) what the test bounds: the largest
parameter difference at every saved checkpoint (absolute, in float32 ulps of the parameter, and
against the test's derived bound), the sketches' differences beyond one float16 step relative to
their row's largest value, and the fluency difference. Run it under every kernel width the
machine offers (``ATEN_CPU_CAPABILITY``) and another thread count; docs/testing.md records the
numbers. A measurement, not a test: about 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file

from benchmark.build import build_release
from tests.test_distributed_build import overrides, param_bound


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per build process (the preset's: 1)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    ov = overrides(args.steps)
    if args.threads:
        ov["threads"] = args.threads
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        one, two = Path(tmp) / "one", Path(tmp) / "two"
        build_release("tiny", [0], one, progress=False, overrides=ov)
        build_release("tiny", [0], two, progress=False, overrides=ov, nproc=2)
        lr = json.loads((one / "seed0" / "config.json").read_text())["lr"]
        a = pd.read_parquet(one / "seed0" / "rollouts.parquet")
        b = pd.read_parquet(two / "seed0" / "rollouts.parquet")
        out: dict = {
            "capability": torch.backends.cpu.get_cpu_capability(),
            "env": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")},
            "build_threads": ov.get("threads", 1),
            "same_responses": bool(all(list(x) == list(y) for x, y in
                                       zip(a["response_ids"], b["response_ids"], strict=True))),
            "same_advantages": bool(np.array_equal(a["advantage"], b["advantage"])),
            "fluency_max_abs_diff": float(np.abs(a["fluency"] - b["fluency"]).max()),
            "params": {},
        }
        for ck in sorted((one / "seed0" / "checkpoints").iterdir()):
            pa, pb = load_file(ck / "model.safetensors"), load_file(two / "seed0" / "checkpoints"
                                                                    / ck.name / "model.safetensors")
            worst, where, ulps, vs_bound, per = 0.0, "", 0.0, 0.0, {}
            step = int(ck.name[4:])
            for k in pa:
                x, y = pa[k].double(), pb[k].double()
                d = (x - y).abs()
                spacing = np.spacing(np.maximum(pa[k].abs().numpy(), pb[k].abs().numpy()))
                ulps = max(ulps, float((d.numpy() / spacing).max()))
                if step:
                    vs_bound = max(vs_bound, float(d.max()) / param_bound(step, lr))
                per[k] = float(d.max())
                if float(d.max()) > worst:
                    worst, where = float(d.max()), k
            out["params"][ck.name] = {"max_abs_diff": worst, "tensor": where,
                                      "fraction_of_lr_steps": worst / (lr * max(step, 1)),
                                      "max_ulps": ulps, "max_diff_over_bound": vs_bound,
                                      "largest_tensors": dict(sorted(per.items(),
                                                                     key=lambda kv: -kv[1])[:6])}
        sa = np.load(one / "seed0" / "sketches.npy").astype(np.float32)
        sb = np.load(two / "seed0" / "sketches.npy").astype(np.float32)
        f16 = np.spacing(np.maximum(np.abs(sa), np.abs(sb)).astype(np.float16)).astype(np.float32)
        row = np.abs(sa).max(axis=1, keepdims=True)
        diff = np.abs(sa - sb)
        beyond = ((diff - f16) / row).max(axis=1)
        has = a[a["sketch_row"] >= 0]
        per_step = {int(s): float(beyond[g["sketch_row"].to_numpy()].max())
                    for s, g in has.groupby("step")}
        out["sketch"] = {"max_beyond_one_f16_step_over_row": float(beyond.max()),
                         "per_step": per_step, "fraction_differing": float((diff > 0).mean())}
        rel = np.abs(a["fluency"] - b["fluency"]) / np.maximum(np.abs(a["fluency"]), 1e-30)
        out["fluency_max_rel_diff"] = float(rel.max())
        out["fluency_max_abs"] = float(np.abs(a["fluency"]).max())
        f32 = np.maximum(np.abs(a["fluency"]), np.abs(b["fluency"])).astype(np.float32)
        out["fluency_max_ulps"] = float((np.abs(a["fluency"] - b["fluency"])
                                         / np.spacing(f32)).max())
    out["seconds"] = round(time.time() - t0, 1)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
