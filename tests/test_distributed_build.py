"""The builder on torch.distributed (gloo, 2 processes on this machine): same run, and resume.

A few GRPO steps of the ``tiny`` model. With two ranks each rank samples, scores and
differentiates its half of every step's groups, and the update uses the all-reduced sum of the
per-rollout gradients; one process sums the same rows in another order (and a rank's batches have
other shapes). Float32 addition is not associative, so the two runs differ in the last bits; the
rollouts (sampled tokens, rewards, advantages) are equal, and parameters, sketches and fluency are
compared within the bounds derived and measured below (docs/testing.md, "Tolerances").
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


#: Parameters after ``steps`` AdamW updates at learning rate ``lr``. Each run moves a parameter
#: by ``lr * m_hat / (sqrt(v_hat) + eps)`` per step, and |m_hat| / sqrt(v_hat) <= 1.02 over the
#: first 6 steps (Cauchy-Schwarz on Adam's bias-corrected weights, beta1 0.9, beta2 0.999): two
#: runs can never differ by more than 2 * 1.02 * lr * steps (2.4e-3 here) on any CPU, but that
#: ceiling is what a real defect (a rank's gradient missing from the sum, other groups on a rank)
#: produces, so it tests nothing. What rounding alone produces: where a coordinate's gradient is
#: well above its float32 rounding noise, the runs' updates differ by that relative noise,
#: ~n * 2**-24 = 2e-6 of lr (~4e-10 per step); where the exact gradient is near AdamW's eps =
#: 1e-8 or below its rounding noise nu, the update is lr * g / (|g| + eps) and the runs'
#: updates differ by up to lr * nu / (|g| + eps). The worst parameter is k_proj.bias: a softmax
#: ignores a shift shared by every key, and rotary positions share a bias's shift up to a slow
#: rotation, so its gradients are ~100x below the other projections' (float64 on tiny: median
#: 2.4e-6 against 2.2e-4 for q_proj.bias, smallest 5e-9). nu is float32 rounding (2**-24) of
#: the same sums on every CPU (the model and data fix the terms' sizes; a CPU changes which way
#: each rounds, not how much), so the measured fraction of ``lr * steps`` carries over with a
#: small factor (the three settings below span 3.7x).
#: Measured at step 6 (worst parameter, k_proj.bias): 1.14e-6 = 9.5e-4 lr*steps (AMD EPYC
#: family 25, AVX2), 3.9e-7 (ATEN_CPU_CAPABILITY=default), 1.44e-6 = 1.2e-3 lr*steps (AVX2, two
#: threads per rank); tiny 2.0's AVX-512 build machine passed the old bound 1e-6. The bound is
#: 1e-2 * lr * steps (1.2e-5 here): 8x the largest measured, 200x below the ceiling.
PARAM_FRACTION_OF_LR_STEPS = 1e-2
#: Sketch values: measured beyond one float16 step at most 4.7e-6 (AVX2), 4.7e-7 (default),
#: 8.8e-7 (AVX2, 2 threads), 5.5e-6 (AVX-512) of their row's largest value, 0 at step 0 (the
#: same parameters) and growing with the steps: they follow the parameters' divergence, which
#: the bound above lets be 8x the largest measured; 1e-4 is 18x the largest measured.
SKETCH_ROW_FRACTION = 1e-4
#: ... and the share of values that differ at all (a value differs when the perturbation
#: carries it across a float16 rounding boundary: the share grows with the perturbation):
#: measured 0.41% (AVX2), 0.29% (default), 0.33% (AVX2, 2 threads), 0.6% (AVX-512); a wrong
#: row or order changes nearly every value.
SKETCH_SHARE_DIFFERING = 0.1
#: Fluency (mean log-probability of a response's tokens, float32, |value| <= ~4 here): measured
#: up to 9.5e-7 (default; AVX2 with 2 threads), 3.4e-7 of the value (~3 float32 ulps): the old
#: atol 1e-6 left no room. It follows the parameters too (after step 0); rtol 1e-5 is 30x the
#: largest measured relative difference, atol 1e-6 covers values near 0.
FLUENCY_RTOL, FLUENCY_ATOL = 1e-5, 1e-6


def param_bound(steps: int, lr: float) -> float:
    """Largest allowed |difference| of a float32 parameter after ``steps`` updates at ``lr``."""
    return PARAM_FRACTION_OF_LR_STEPS * lr * steps


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
    np.testing.assert_allclose(a["fluency"], b["fluency"], rtol=FLUENCY_RTOL, atol=FLUENCY_ATOL)
    # a sketch value is a signed sum of many gradient entries, so its error scales with its
    # row's magnitude (the largest value bounds the entries), not with the value itself, which
    # can be a small remainder of cancellation; and values are stored in float16, so one lands
    # a float16 step away when it sits near a rounding boundary: one step plus
    # SKETCH_ROW_FRACTION of the row
    sa = np.load(one / "seed0" / "sketches.npy")
    sb = np.load(two_ranks / "seed0" / "sketches.npy")
    assert sa.dtype == sb.dtype == np.float16
    step = np.spacing(np.maximum(np.abs(sa), np.abs(sb))).astype(np.float32)
    a32, b32 = sa.astype(np.float32), sb.astype(np.float32)
    row = np.abs(a32).max(axis=1, keepdims=True)
    diff = np.abs(a32 - b32)
    assert np.all(diff <= step + SKETCH_ROW_FRACTION * row), float(((diff - step) / row).max())
    assert (diff > 0).mean() < SKETCH_SHARE_DIFFERING, float((diff > 0).mean())
    from safetensors.torch import load_file

    pa = load_file(one / "seed0" / "checkpoints" / "step0006" / "model.safetensors")
    pb = load_file(two_ranks / "seed0" / "checkpoints" / "step0006" / "model.safetensors")
    worst, where = max((float((pa[k] - pb[k]).abs().max()), k) for k in pa)
    lr = json.loads((one / "seed0" / "config.json").read_text())["lr"]
    assert worst <= param_bound(6, lr), (
        f"parameters after 6 steps differ by up to {worst:.3g} ({where}); expected <= "
        f"{param_bound(6, lr):.3g} = {PARAM_FRACTION_OF_LR_STEPS} * lr * steps (rounding alone; "
        f"see PARAM_FRACTION_OF_LR_STEPS)")
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
