"""Fixed-data replays and the on-policy share (benchmark.causal.onpolicy, docs/causal.md)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmark.causal.stats import on_policy_share


def test_share_of_one_cell_by_hand():
    out = on_policy_share([(0.5, np.array([0.4, 0.6]))], [(0.2, np.array([0.1, 0.3]))], 0.95)
    assert out["share"]["point"] == pytest.approx(1 - 0.2 / 0.5)
    # replicates 1 - 0.1/0.4 = 0.75 and 1 - 0.3/0.6 = 0.5; percentiles 2.5 and 97.5 of the two
    assert out["share"]["lo"] == pytest.approx(0.5 + 0.025 * 0.25)
    assert out["share"]["hi"] == pytest.approx(0.5 + 0.975 * 0.25)
    assert out["on_policy_score"]["point"] == 0.5
    assert out["fixed_data_score"]["point"] == 0.2


def test_share_pools_cells_as_a_ratio_of_means():
    on = [(0.2, np.array([0.2, 0.2])), (0.6, np.array([0.6, 0.6]))]
    fix = [(0.3, np.array([0.3, 0.3])), (0.1, np.array([0.1, 0.1]))]
    out = on_policy_share(on, fix)
    assert out["share"]["point"] == pytest.approx(1 - 0.2 / 0.4)  # not the mean of -0.5, 0.83
    assert out["share"]["lo"] == pytest.approx(0.5) and out["share"]["hi"] == pytest.approx(0.5)


def test_share_without_an_on_policy_effect_is_null():
    out = on_policy_share([(0.0, np.zeros(3))], [(0.1, np.full(3, 0.1))])
    assert out["share"] == {"point": None, "lo": None, "hi": None}
    with pytest.raises(ValueError, match="one fixed-data score per on-policy score"):
        on_policy_share([(0.1, np.zeros(2))], [])


def test_fixed_jobs_have_their_own_keys():
    from benchmark.causal.store import Job

    on = Job(0, "qzxbt", (3, 5), 2, 16)
    fixed = Job(0, "qzxbt", (3, 5), 2, 16, fixed=True)
    assert fixed.key != on.key and fixed.key.startswith("qzxbt_fixed_")
    assert Job.from_dict(fixed.to_dict()) == fixed
    assert Job.from_dict({k: v for k, v in on.to_dict().items() if k != "fixed"}) == on


@pytest.fixture(scope="module")
def engine(micro_release):
    from benchmark.build import stacked as S
    from benchmark.build.replay import ReplaySeed, recorded_responses

    seed_dir = micro_release / "seed0"
    sr = S.StackedReplay.of_seed(ReplaySeed(seed_dir, precision="float64"))
    return S, sr, recorded_responses(seed_dir)


def test_fixed_data_baseline_is_the_on_policy_baseline_where_it_follows_the_record(engine):
    """Where the on-policy baseline samples the recorded tokens, both modes are the same bits."""
    S, sr, rec = engine
    tasks = tuple(b.id for b in sr.cfg.behaviors)
    stop = sr.cfg.steps
    on = S.run_batch(sr, [], measure_base={stop: tasks}, reference=rec)
    fixed = S.run_batch(sr, [], measure_base={stop: tasks}, fixed=rec)
    assert on["first_divergent_step"] is None
    for t in tasks:
        assert np.array_equal(on["base"][stop][t], fixed["base"][stop][t])


def test_fixed_data_removal_trains_on_the_recorded_tokens(engine):
    """A fixed-data removal is the step-by-step update on the recorded responses, bit for bit,
    and differs from the on-policy removal of the same set (its later rollouts are resampled)."""
    import torch

    S, sr, rec = engine
    task = sr.cfg.behaviors[0].id
    stop = sr.cfg.steps
    nps = sr.cfg.prompts_per_step * sr.cfg.group_size
    remove = {0: {i for i in range(nps) if i % 3 == 0}}
    fixed = S.Member("f", remove, stop, join=0, measure_tasks=(task,))
    on = S.Member("o", remove, stop, join=0, measure_tasks=(task,))
    S.run_batch(sr, [fixed], fixed=rec)
    S.run_batch(sr, [on])
    stack = S.Stack.of([sr.start])
    for t in range(stop):
        sr.update(stack, t, [rec[t]], [sr.advantages(t, rec[t], frozenset(), remove.get(t))])
    by_hand = sr.behavior_probs(stack, task)[0]
    assert np.array_equal(fixed.result[task], by_hand)
    assert not np.array_equal(fixed.result[task], on.result[task])
    assert torch.is_tensor(stack.params[next(iter(stack.params))])


def test_on_policy_results_on_a_micro_release(micro_causal):
    """Every task gets the oracle's and the estimator's shares; the fixed-data baseline is the
    on-policy one; the fixed-data effects are what the store holds."""
    from benchmark.causal.onpolicy import on_policy_results
    from benchmark.causal.replays import open_store
    from benchmark.causal.stats import decode_array
    from benchmark.causal.store import Job
    from benchmark.releases.release import load_release

    rel = load_release(micro_causal)
    n = 64
    scores = {(s, t): {"mine": np.cos(np.arange(n) * (1 + s))} for s in rel.seeds
              for t in rel.tasks}
    blocks, _ = on_policy_results(rel, scores, "mine", workers=2)
    store = open_store(rel.path, rel.manifest_sha256)
    assert sorted(blocks) == sorted(rel.tasks)
    for block in blocks.values():
        assert set(block["methods"]) == {"oracle", "mine"}
        for m in block["methods"].values():
            assert set(m) >= {"share", "fixed_data_score", "on_policy_score", "per_seed"}
            for s, cell in m["per_seed"].items():
                if store.baseline(int(s))["first_divergent_step"] is None:
                    assert cell["baseline_max_abs_diff"] == 0.0
                fix = decode_array(cell["fixed_prompt_deltas"])[:, 0, :]
                assert fix.shape[0] == len(cell["per_k"])
                for k, row in enumerate(cell["per_k"]):
                    assert row["fixed_data_effect"] == pytest.approx(fix[k].mean(), abs=1e-8)
    # the fixed-data replays are kept in the store like every replay (a rerun replays nothing)
    ref = blocks[rel.tasks[0]]["methods"]["oracle"]["per_seed"]["0"]
    assert ref["per_k"] and store.has(Job(0, rel.tasks[0], (), rel.seed(0).behavior(
        rel.tasks[0])["window_end"], n // rel.seed(0).config["steps"], fixed=True))
    _, timing = on_policy_results(rel, scores, "mine", workers=2)
    assert timing["replayed"] == 0
