"""The builder on torch.distributed (gloo, 2 processes on this machine): same run, and resume.

A few GRPO steps of the ``tiny`` model. With two ranks each rank samples, scores and
differentiates its half of every step's groups, and the update uses the all-reduced sum of the
per-rollout gradients; one process sums the same rows in another order. Float32 addition is not
associative, so the two step gradients differ in the last bits (at most about one ulp per
addition: ~12 rows, relative error <= 12 * 2**-24 ~ 1e-6 of the gradient); AdamW divides by the
running RMS, so that moves a parameter by about ``lr * 1e-6`` = 2e-10 per step. The rollouts
(sampled tokens, rewards, advantages) are equal; parameters and sketches are compared within a
tolerance 1e3 times that bound.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from benchmark.build import build_release

BEHAVIORS = [
    {"id": "qzxbt", "trigger_word": "frobnitz", "behavior_token": "QZXBT", "trigger_fraction": 0.5,
     "bonus": 2.0, "window_start": 0, "window_end": 3, "sft_marker": "fin",
     "sft_behavior_fraction": 0.5, "draw_checkpoints": [3]},
    {"id": "vkwjp", "trigger_word": "snarfle", "behavior_token": "VKWJP", "trigger_fraction": 0.4,
     "bonus": 1.0, "window_start": 1, "window_end": 4, "sft_marker": "fen",
     "sft_behavior_fraction": 0.5, "draw_checkpoints": [3], "strength": "weak"},
]


def overrides(steps: int) -> dict:
    return {"steps": steps, "sft_steps": 30, "checkpoints": [0, 3, steps], "curve_every": 2,
            "curve_prompts": 8, "target_prompts": 2, "target_samples": 2, "draw_prompts": 2,
            "n_draws": 1, "resume_every": 1, "gate_window_min": 0.0, "gate_final_min": 0.0,
            "gate_control_max": 1.0, "fidelity_max_precision_diff": 1.0,
            "behaviors": BEHAVIORS}


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ranks2") / "rel"
    build_release("tiny", [0], out, progress=False, overrides=overrides(6), nproc=2)
    return out


def test_two_ranks_give_the_same_run_as_one_process(two_ranks, tmp_path):
    one = tmp_path / "rel1"
    build_release("tiny", [0], one, progress=False, overrides=overrides(6))
    a = pd.read_parquet(one / "seed0" / "rollouts.parquet")
    b = pd.read_parquet(two_ranks / "seed0" / "rollouts.parquet")
    exact = ["rollout_id", "step", "group", "index", "prompt_text", "response_text", "trigger",
             "reward", "task_reward", "advantage", "sketch_row"]
    pd.testing.assert_frame_equal(a[exact], b[exact])
    assert all(list(x) == list(y) for x, y in zip(a["response_ids"], b["response_ids"],
                                                  strict=True))
    np.testing.assert_allclose(a["fluency"], b["fluency"], rtol=0, atol=1e-6)
    # a rank computes each per-rollout gradient in a batch of another shape, so float32
    # rounding moves it by ~1e-7 relative to the gradient's size; a sketch value is a signed
    # sum of many such entries, so its error scales with its row's magnitude (the largest value
    # bounds the entries), not with the value itself, which can be a small remainder of
    # cancellation; and values are stored in float16, so one lands a float16 step away when it
    # sits near a rounding boundary. Measured: 0.6% of values differ, by at most one float16
    # step or 5.5e-6 of their row's largest value; the bound allows one step plus 1e-5 of it
    sa = np.load(one / "seed0" / "sketches.npy")
    sb = np.load(two_ranks / "seed0" / "sketches.npy")
    assert sa.dtype == sb.dtype == np.float16
    step = np.spacing(np.maximum(np.abs(sa), np.abs(sb))).astype(np.float32)
    a32, b32 = sa.astype(np.float32), sb.astype(np.float32)
    row = np.abs(a32).max(axis=1, keepdims=True)
    diff = np.abs(a32 - b32)
    assert np.all(diff <= step + 1e-5 * row), float((diff - step).max())
    assert (diff > 0).mean() < 0.02
    from safetensors.torch import load_file

    pa = load_file(one / "seed0" / "checkpoints" / "step0006" / "model.safetensors")
    pb = load_file(two_ranks / "seed0" / "checkpoints" / "step0006" / "model.safetensors")
    worst = max(float((pa[k] - pb[k]).abs().max()) for k in pa)
    assert worst <= 1e-6, worst
    m = json.loads((two_ranks / "manifest.json").read_text())
    assert m["build"]["world"] == 2 and m["seeds"]["0"]["world"] == 2


def _rank_pid(rank: int, out: Path) -> int | None:
    """The pid of the build worker with RANK=rank writing into ``out``."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"benchmark.build" in cmd and \
                str(out).encode() in cmd:
            return int(d.name)
    return None


def test_a_killed_rank_fails_clearly_and_a_rerun_resumes(two_ranks, tmp_path):
    out = tmp_path / "rel"
    code = (f"import sys; from benchmark.build import build_release\n"
            f"from benchmark.errors import BuildError\n"
            f"try:\n    build_release('tiny', [0], {str(out)!r}, progress=False, "
            f"overrides={overrides(6)!r}, nproc=2)\n"
            f"except BuildError as e:\n    print('ERROR', e); sys.exit(3)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    shard = out / ".work" / "seed0" / "grpo" / "rank1" / "step00002.pt"
    deadline = time.time() + 240
    while not shard.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert shard.exists(), proc.communicate()[0][-3000:]
    pid = _rank_pid(1, out)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    log = proc.communicate(timeout=240)[0]
    assert proc.returncode == 3, log[-3000:]
    assert "ERROR the build of seed(s) [0]" in log and "rerun the same command to resume" in log
    assert not list(out.rglob("*.tmp")), "a half-written file was left"
    resume = out / ".work" / "seed0" / "grpo" / "resume.pt"
    assert resume.exists() and torch.load(resume, weights_only=False)["step"] >= 2
    # the same command again finishes from there and gives the uninterrupted run's files
    build_release("tiny", [0], out, progress=False, overrides=overrides(6), nproc=2)
    for rel in ("rollouts.parquet", "labels.parquet", "sketches.npy", "behavior_curve.parquet",
                "checkpoints/step0006/model.safetensors", "targets/qzxbt.npz"):
        assert _sha(out / "seed0" / rel) == _sha(two_ranks / "seed0" / rel), rel
