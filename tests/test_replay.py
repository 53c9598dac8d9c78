"""Exact replay (benchmark.build.replay): bit-exactness, removal semantics, clear errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from benchmark.build.replay import (
    ReplaySeed,
    params_equal,
    recorded_responses,
    removal_positions,
    replay,
)
from benchmark.errors import BuildError
from benchmark.release import resolve_release

TINY0 = resolve_release("tiny") / "seed0"


@pytest.fixture(scope="module")
def tiny0() -> ReplaySeed:
    return ReplaySeed(TINY0)


def test_empty_removal_reproduces_shipped_checkpoint_bit_for_bit(tiny0):
    """The build's update path from step0000 gives the shipped step0030 exactly (torch.equal)."""
    ref = recorded_responses(TINY0, upto=30)
    r = replay(TINY0, stop_at=30, mode="exact", snapshot_at=(30,), measure_at=(30,),
               sampled=False, reference_responses=ref, context=tiny0)
    check = params_equal(r.snapshots[30], TINY0 / "checkpoints" / "step0030")
    assert check["equal"], check
    assert r.first_divergent_step is None
    curve = pd.read_parquet(TINY0 / "behavior_curve.parquet").set_index("step")
    assert r.measures[30]["behavior_prob"] == curve.loc[30, "trigger_behavior_prob"]


def test_batched_path_is_deterministic_and_resumes_bit_identically(tiny0):
    """Two batched replays agree exactly; resuming from a saved state equals the full replay."""
    rem = [(3, 0), (3, 5), (4, 17)]
    base = replay(TINY0, stop_at=6, mode="batched", save_states=True, snapshot_at=(6,),
                  measure_at=(6,), sampled=False, context=tiny0)
    again = replay(TINY0, stop_at=6, mode="batched", snapshot_at=(6,), measure_at=(6,),
                   sampled=False, context=tiny0)
    assert all(torch.equal(base.snapshots[6][k], again.snapshots[6][k]) for k in base.snapshots[6])
    full = replay(TINY0, remove=rem, stop_at=6, mode="batched", snapshot_at=(6,),
                  measure_at=(6,), sampled=False, context=tiny0)
    resumed = replay(TINY0, remove=rem, stop_at=6, mode="batched", snapshot_at=(6,),
                     measure_at=(6,), sampled=False, context=tiny0,
                     start_state=(3, base.states[3]))
    assert all(torch.equal(full.snapshots[6][k], resumed.snapshots[6][k])
               for k in full.snapshots[6])
    assert full.measures[6] == resumed.measures[6]
    # the removal changed the run (advantage 0 for three rollouts with nonzero advantage)
    assert full.measures[6] != base.measures[6]
    with pytest.raises(BuildError, match="cannot serve"):
        replay(TINY0, remove=[(1, 0)], stop_at=6, mode="batched", context=tiny0,
               start_state=(3, base.states[3]))


def test_removing_everything_in_the_window_moves_like_bonus_off(tiny0):
    """Remove every rollout of steps < 10: the behavior falls, like switching the bonus off."""
    stop = 10
    n = tiny0.n_per_step
    kw = {"stop_at": stop, "mode": "batched", "sampled": False, "context": tiny0}
    base = replay(TINY0, **kw).measures[stop]["behavior_prob"]
    off = replay(TINY0, bonus_off=True, **kw).measures[stop]["behavior_prob"]
    mask = np.zeros(tiny0.n_rollouts, bool)
    mask[: stop * n] = True
    gone = replay(TINY0, remove=mask, **kw).measures[stop]["behavior_prob"]
    assert off < base and gone < base
    # with every rollout removed nothing is learnt: the post-SFT value
    start = replay(TINY0, stop_at=0, mode="batched", sampled=False, context=tiny0)
    assert gone == pytest.approx(start.measures[0]["behavior_prob"], abs=1e-6)


def test_bad_removal_masks_are_clear_errors():
    with pytest.raises(BuildError, match=r"shape \(5,\).*expected a bool mask of shape \(9600,\)"):
        removal_positions(np.zeros(5, bool), 300, 32)
    with pytest.raises(BuildError, match=r"shape \(300, 16\)"):
        removal_positions(np.zeros((300, 16), bool), 300, 32)
    with pytest.raises(BuildError, match=r"\(step=300, index=0\) is out of range.*0 <= step < 300"):
        removal_positions([(300, 0)], 300, 32)
    with pytest.raises(BuildError, match=r"\(step=2, index=32\) is out of range"):
        removal_positions({2: [32]}, 300, 32)
    with pytest.raises(BuildError, match=r"\(step=-1, index=3\) is out of range"):
        removal_positions([(-1, 3)], 300, 32)
    with pytest.raises(BuildError, match="not a \\(step, index\\) pair"):
        removal_positions([5], 300, 32)
    with pytest.raises(BuildError, match="use a bool mask, not indices"):
        removal_positions(np.array([1, 2, 3]), 300, 32)
    assert removal_positions(None, 300, 32) == {}
    m = np.zeros((300, 32), bool)
    m[2, 5] = m[0, 31] = True
    assert removal_positions(m, 300, 32) == {0: {31}, 2: {5}}
    assert removal_positions(m.reshape(-1), 300, 32) == {0: {31}, 2: {5}}


def test_bad_replay_arguments_are_clear_errors(tiny0):
    with pytest.raises(BuildError, match="stop_at=301 out of range"):
        replay(TINY0, stop_at=301, context=tiny0)
    with pytest.raises(BuildError, match="replay mode 'fast'"):
        replay(TINY0, stop_at=1, mode="fast", context=tiny0)
    with pytest.raises(BuildError, match="config.json"):
        ReplaySeed(TINY0.parent)


def test_lean_forward_is_bit_identical_to_the_model(tiny0):
    from benchmark.build.pipeline import load_checkpoint
    from benchmark.build.replay import LeanForward

    model = load_checkpoint(TINY0 / "checkpoints" / "step0060")
    model.eval()
    lean = LeanForward(model)
    assert lean.ok and lean.check(n_inputs=32)
