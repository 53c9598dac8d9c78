"""Causal scores: the statistics by hand, the verdict rule, and replays end to end on micro."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmark import causal as C


def test_k_grid_and_removal_sets():
    assert C.k_grid(344) == [86, 172, 344]
    assert C.k_grid(3) == [1, 2, 3]
    assert C.k_grid(1) == [1, 1, 1]
    s = np.array([0.5, 2.0, 2.0, np.nan, -1.0, 2.0])
    assert C.top_k_positions(s, 2).tolist() == [1, 2]  # ties: the earlier rollouts first
    assert C.top_k_positions(s, 4).tolist() == [0, 1, 2, 5]  # NaN last
    assert C.in_window([3, 64, 65, 200], window_end=2, n_per_step=32) == (3,)
    pos = [0, 5, 17, 99]
    assert C.unpack_positions(C.pack_positions(pos, 100), 100).tolist() == pos


def _rem(effects_per_prompt, base=None):
    d = np.asarray(effects_per_prompt, float)
    b = np.zeros_like(d) if base is None else np.asarray(base, float)
    return C.Removal(tuple(range(3)), b + d, b)


def test_causal_score_is_the_mean_fraction_over_the_grid():
    off, base = np.array([-0.5, -0.3]), np.zeros(2)  # bonus-off effect -0.4
    rems = [_rem([-0.1, -0.1]), _rem([-0.2, -0.2]), _rem([-0.4, -0.4])]
    assert C.causal_score(rems, off, base) == pytest.approx((0.25 + 0.5 + 1.0) / 3)
    # without resampling and without training noise every replicate equals the point
    idx = np.tile(np.arange(2), (5, 1))
    nidx = np.zeros((5, 3), int)
    smp = C.score_samples(rems, off, base, [np.zeros(1)] * 3, idx, nidx)
    np.testing.assert_allclose(smp, C.causal_score(rems, off, base))
    # training noise adds (noise / bonus-off effect) / |grid| to a replicate
    noise = [np.array([0.04]), np.zeros(1), np.zeros(1)]
    smp = C.score_samples(rems, off, base, noise, idx, nidx)
    np.testing.assert_allclose(smp, C.causal_score(rems, off, base) + (0.04 / -0.4) / 3)
    # numerator and denominator resample the same prompts (a ratio estimator)
    one = np.zeros((1, 2), int)  # resample = prompt 0 twice
    smp = C.score_samples(rems, off, base, [np.zeros(1)] * 3, one, np.zeros((1, 3), int))
    assert smp[0] == pytest.approx((0.1 + 0.2 + 0.4) / 0.5 / 3)


@pytest.mark.parametrize(("lo", "hi", "want"), [
    (0.05, 0.30, C.PASS),            # above the tolerance
    (0.005, 0.30, C.INCONCLUSIVE),   # decided by less than the cross-machine tolerance
    (-0.30, -0.05, C.FAIL),          # below
    (-0.30, -0.005, C.INCONCLUSIVE),  # an end within the tolerance of 0
    (-0.05, 0.05, C.FAIL),           # straddles, narrow
    (-0.10, 0.20, C.INCONCLUSIVE),   # straddles, too wide to tell
    (-0.07, 0.08, C.INCONCLUSIVE),   # width within the tolerance of the 0.15 rule
    (math.nan, 0.1, C.INCONCLUSIVE),
])
def test_beats_rule_with_the_cross_machine_tolerance(lo, hi, want):
    assert C.beats(lo, hi, tol=0.01, max_width=0.15) == want


def _reference(seed=0, P=16, rng=None):
    rng = rng or np.random.default_rng(0)
    base = rng.uniform(0.6, 0.9, P)
    off = base - 0.5 + rng.normal(0, 0.02, P)
    ks = [2, 4, 8]

    def rem(frac, jitter=0.01):
        return C.Removal(tuple(range(3)), base - 0.5 * frac + rng.normal(0, jitter, P), base)

    random = [[rem(f) for f in rng.normal(0.0, 0.02, 6)] for _ in ks]
    methods = {"oracle": [rem(0.5), rem(0.8), rem(1.0)],
               "provenance": [rem(0.1), rem(0.1), rem(0.2)]}
    return C.TaskReference(seed, "qzxbt", 60, 8, ks, 3840, 32, base, off, random, methods)


def test_task_seed_block_ranks_and_decides_item_10():
    ref = _reference()
    curves = {"good": [C.Removal((1,), ref.base - 0.2, ref.base),
                       C.Removal((1, 2), ref.base - 0.3, ref.base),
                       C.Removal((1, 2, 3), ref.base - 0.45, ref.base)],
              "norm-only": ref.random[0][:1] * 3, "step-order": ref.random[1][:1] * 3}
    block, samples = C.evaluate_task_seed(ref, curves, "good",
                                          C.CausalSettings(n_boot=500))
    assert set(block["methods"]) == {"oracle", "provenance", "good", "norm-only", "step-order"}
    g = block["methods"]["good"]["score"]
    assert g["lo"] <= g["point"] <= g["hi"] and g["point"] == pytest.approx(
        (0.4 + 0.6 + 0.9) / 3, abs=0.05)
    assert block["checks"] == {"random_band": C.PASS, "norm-only": C.PASS,
                               "step-order": C.PASS}
    assert block["verdict"] == C.PASS
    assert block["random_band"]["lo"] <= block["random_band"]["hi"] < g["lo"]
    assert [c["k"] for c in block["methods"]["good"]["curve"]] == [2, 4, 8]
    # a control evaluated as the estimator is compared with itself: never a pass
    block2, _ = C.evaluate_task_seed(ref, curves, "norm-only", C.CausalSettings(n_boot=200))
    assert block2["checks"]["norm-only"] == C.FAIL and block2["verdict"] == C.FAIL
    # the same inputs give the same numbers (seeded bootstrap)
    again, _ = C.evaluate_task_seed(ref, curves, "good", C.CausalSettings(n_boot=500))
    assert again == block
    mean = C.mean_over_seeds([1.0, 2.0], [np.full(3, 1.0), np.full(3, 2.0)])
    assert mean == {"point": 1.5, "lo": 1.5, "hi": 1.5}


def test_permuting_a_methods_scores_permutes_its_removal_sets():
    rng = np.random.default_rng(3)
    s = rng.random(50)
    perm = rng.permutation(50)
    a = set(C.top_k_positions(s, 10).tolist())
    b = set(perm[C.top_k_positions(s[perm], 10)].tolist())
    assert a == b
    # a monotone rescaling leaves every removal set unchanged
    assert C.top_k_positions(np.exp(3 * s) - 7, 10).tolist() == C.top_k_positions(s, 10).tolist()


def test_causal_results_on_micro_replay_shipped_and_new_sets(micro_causal, tmp_path,
                                                             monkeypatch):
    from benchmark.release import load_release
    from benchmark.replays import ReplayStore

    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "cache"))
    rel = load_release(micro_causal)
    raw = C.load_reference(micro_causal, 0)
    n = raw["n_rollouts"]
    assert raw["schema"] == C.CAUSAL_SCHEMA and raw["exact_replay"]["all_equal"] in (True, False)
    rng = np.random.default_rng(0)
    scores = {(0, t): {"mine": rng.random(n), "norm-only": np.zeros(n),
                       "step-order": -np.arange(n, dtype=float)} for t in rel.tasks}
    out, timing = C.causal_results(rel, scores, "mine", settings=C.CausalSettings(n_boot=200))
    assert timing["replayed"] >= 1
    for t in rel.tasks:
        block = out["tasks"][t]["per_seed"]["0"]
        assert {"oracle", "provenance", "mine"} <= set(block["methods"])
        assert block["verdict"] in (C.PASS, C.FAIL, C.INCONCLUSIVE)
        assert all(c["source"] in ("shipped", "replayed", "empty")
                   for c in block["methods"]["mine"]["curve"])
    # a second evaluation on this machine replays nothing (the store) and gives the same numbers
    again, timing2 = C.causal_results(rel, scores, "mine", settings=C.CausalSettings(n_boot=200))
    assert timing2["replayed"] == 0 and again == out
    assert ReplayStore(rel.path, rel.manifest_sha256).dir.is_dir()


def test_another_summation_order_changes_no_causal_number(micro_causal, tmp_path, monkeypatch):
    """Emulate another CPU: the batched updates sum in another order; float64 replays agree."""
    from benchmark.release import load_release

    rel = load_release(micro_causal)
    n = C.load_reference(micro_causal, 1)["n_rollouts"]
    scores = {(1, t): {"mine": np.random.default_rng(1).random(n), "norm-only": np.zeros(n),
                       "step-order": -np.arange(n, dtype=float)} for t in rel.tasks}
    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "a"))
    here, _ = C.causal_results(rel, scores, "mine", settings=C.CausalSettings(n_boot=200))
    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "b"))
    monkeypatch.setenv("BT_BENCH_REPLAY_ROW_ORDER", "reversed")
    there, _ = C.causal_results(rel, scores, "mine", settings=C.CausalSettings(n_boot=200))
    for t in rel.tasks:
        a = here["tasks"][t]["per_seed"]["1"]
        b = there["tasks"][t]["per_seed"]["1"]
        assert a["verdict"] == b["verdict"] and a["checks"] == b["checks"]
        for ca, cb in zip(a["methods"]["mine"]["curve"], b["methods"]["mine"]["curve"],
                          strict=True):
            assert ca["fraction"] == pytest.approx(cb["fraction"], abs=1e-9)


def test_a_failed_replay_worker_is_a_clear_error_that_keeps_the_finished_replays(
        micro_causal, tmp_path, monkeypatch):
    """One lane fails (its seed is not in the release), the other finishes: the error says
    what failed and that the finished replays are kept; a rerun finds them stored."""
    from benchmark.errors import BenchmarkError
    from benchmark.release import load_release
    from benchmark.replays import Job, ReplayError, ReplayStore, run_jobs

    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "cache"))
    rel = load_release(micro_causal)
    store = ReplayStore(rel.path, rel.manifest_sha256)
    good, bad = Job(0, None, (), 0, 1), Job(9, None, (), 0, 1)
    with pytest.raises(ReplayError, match=r"(?s)worker failed; the replays already made are "
                       r"kept in .*a rerun continues.*seed9") as info:
        run_jobs(store, rel.manifest_sha256, [good, bad], workers=2)
    assert isinstance(info.value, BenchmarkError)  # the CLI prints it without a trace
    assert store.has(good) and not store.has(bad)
    assert run_jobs(store, rel.manifest_sha256, [good], workers=2)["replayed"] == 0
