"""Causal scores: the statistics by hand, the verdict rule, and replays end to end on micro."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmark.causal import score as C


def test_k_grid_and_removal_sets():
    assert C.k_grid(344) == [22, 43, 86, 172, 344]  # 1/16 .. 1 of |GT|, rounded up
    assert C.k_grid(344, C.LEGACY_K_FRACTIONS) == [86, 172, 344]
    assert C.k_grid(3) == [1, 1, 1, 2, 3]
    assert C.k_grid(1) == [1, 1, 1, 1, 1]
    s = np.array([0.5, 2.0, 2.0, np.nan, -1.0, 2.0])
    assert C.top_k_positions(s, 2).tolist() == [1, 2]  # tiebreak None: the earlier rollouts first
    assert C.top_k_positions(s, 4).tolist() == [0, 1, 2, 5]  # NaN last
    assert C.top_k_positions(s, 2, tiebreak=[0, 9, 1, 0, 0, 0]).tolist() == [2, 5]
    assert C.in_window([3, 64, 65, 200], window_end=2, n_per_step=32) == (3,)
    pos = [0, 5, 17, 99]
    assert C.unpack_positions(C.pack_positions(pos, 100), 100).tolist() == pos


def test_k_weights_are_the_log_k_trapezoid():
    np.testing.assert_allclose(C.k_weights(C.K_FRACTIONS), [1 / 8, 1 / 4, 1 / 4, 1 / 4, 1 / 8])
    np.testing.assert_allclose(C.k_weights(C.LEGACY_K_FRACTIONS), [1 / 4, 1 / 2, 1 / 4])
    # uneven grid 1/8, 1/4, 1: log2 = -3, -2, 0; half-widths 1/2, 3/2, 1 over a range of 3
    np.testing.assert_allclose(C.k_weights([0.125, 0.25, 1.0]), [1 / 6, 1 / 2, 1 / 3])
    # the curve 0, 0, 1 there: area 0 on [-3, -2] plus (0 + 1) / 2 * 2 on [-2, 0], over 3
    assert C.area([0.0, 0.0, 1.0], [0.125, 0.25, 1.0]) == pytest.approx(1 / 3)
    # a flat curve has its own height as the score; one point weighs 1
    assert C.area([0.7] * 5, C.K_FRACTIONS) == pytest.approx(0.7)
    assert C.k_weights([1.0]).tolist() == [1.0]
    # a saturating curve (0.2 at |GT|/16, then 1.0) scores far below its plain mean at the 2.0 grid
    sat = [0.2, 0.6, 1.0, 1.0, 1.0]
    assert C.area(sat, C.K_FRACTIONS) == pytest.approx(0.2 / 8 + 0.6 / 4 + 1 / 4 + 1 / 4 + 1 / 8)
    with pytest.raises(C.CausalDataError, match=r"k fractions \[0.5, 0.25\]: expected positive, "
                                                r"strictly increasing"):
        C.k_weights([0.5, 0.25])


def test_an_all_ties_scores_vector_removes_a_uniform_random_subset():
    n, k, draws = 20, 5, 2000
    flat = np.zeros(n)
    sets = [C.top_k_positions(flat, k, C.tie_order(n, 0, "qzxbt", r)) for r in range(draws)]
    assert all(len(x) == k for x in sets)
    # each rollout is in a uniform k-subset with probability k/n = 0.25; over 2000 independent
    # draws the frequency has sd sqrt(0.25 * 0.75 / 2000) = 0.0097: 5 sd = 0.048
    freq = np.bincount(np.concatenate(sets), minlength=n) / draws
    np.testing.assert_allclose(freq, k / n, atol=0.048)
    # and a pair with probability k(k-1) / (n(n-1)) = 20/380 = 0.0526 (sd 0.0050: 5 sd = 0.025)
    pair = np.mean([{0, 1} <= set(x.tolist()) for x in sets])
    assert pair == pytest.approx(20 / 380, abs=0.025)
    # deterministic: the same (seed, task, draw) gives the same order, another draw another
    np.testing.assert_array_equal(C.tie_order(n, 0, "qzxbt", 3), C.tie_order(n, 0, "qzxbt", 3))
    assert not np.array_equal(C.tie_order(n, 0, "qzxbt", 3), C.tie_order(n, 0, "qzxbt", 4))
    assert not np.array_equal(C.tie_order(n, 0, "qzxbt", 3), C.tie_order(n, 1, "qzxbt", 3))


def test_a_tie_at_the_boundary_is_completed_at_random_and_sets_nest():
    s = np.array([3.0, 2.0, 2.0, 2.0, 1.0, 5.0])
    assert C.cuts_tie(s, 3) and not C.cuts_tie(s, 2) and not C.cuts_tie(s, 5)
    assert C.cuts_tie(np.zeros(4), 2) and not C.cuts_tie(np.zeros(4), 4)
    (comps,), cut = C.removal_sets(s, [3], 7, "vkwjp", window_end=10, n_per_step=1,
                                   completions=600)
    assert cut == [True] and len(comps) == 600
    picks = []
    for three in comps:  # everything above the tie (positions 5, 0) plus one tied rollout
        assert {0, 5} <= set(three) and 4 not in three and len(three) == 3
        picks.append(next(p for p in three if p not in (0, 5)))
    # one of the three tied rollouts, each with probability 1/3 (sd 0.019 over 600: 5 sd 0.096)
    np.testing.assert_allclose(np.bincount(picks, minlength=4)[1:4] / 600, 1 / 3, atol=0.096)
    sets, cut = C.removal_sets(s, [1, 2, 3, 4], 7, "vkwjp", window_end=10, n_per_step=1,
                               completions=3)
    assert cut == [False, False, True, True]
    assert all(len(set(comps)) == 1 for comps in sets[:2])  # no tie cut: one set
    for r in range(3):  # one tie order per draw serves every k: the sets are nested
        assert set(sets[2][r]) <= set(sets[3][r])
    # only the rollouts before the window end are kept (positions 0..2 here)
    sets, _ = C.removal_sets(s, [6], 7, "vkwjp", window_end=3, n_per_step=1)
    assert sets == [[(0, 1, 2)]]


def test_encoded_arrays_round_trip_on_the_unit_grid():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (3, 2, 5))
    enc = C.encode_array(x)
    assert enc["encoding"] == "int32-le-base64" and enc["shape"] == [3, 2, 5]
    y = C.decode_array(enc)
    # rounding to the unit (1e-9) moves a value by at most half a unit (plus float64 rounding)
    np.testing.assert_allclose(y, x, rtol=0, atol=0.5e-9 + 1e-15)
    np.testing.assert_array_equal(C.decode_array(C.encode_array(y)), y)  # a fixed point
    assert len(enc["data"]) == math.ceil(30 * 4 / 3) * 4  # 4 bytes a value; base64: 4 per 3
    with pytest.raises(C.CausalDataError, match=r"expected finite values within \+-2.15"):
        C.encode_array([0.5, 4.0])
    with pytest.raises(C.CausalDataError, match="expected an encoded array"):
        C.decode_array({"shape": [2], "data": "AAAA"})
    with pytest.raises(C.CausalDataError, match=r"of shape \[3\] cannot be decoded"):
        C.decode_array(dict(C.encode_array([1.0, 2.0]), shape=[3]))


def _inputs(off, effects, fractions=C.LEGACY_K_FRACTIONS):
    return {"k_fractions": list(fractions), "bonus_off_prompt_delta": C.encode_array(off),
            "random_effects": C.encode_array(effects)}


def test_replicates_by_hand_with_one_prompt():
    # one prompt: every resample is that prompt; off -0.4; fractions 0.25, 0.5, 1 at 1/4, 1/2, 1;
    # the log-k weights 1/4, 1/2, 1/4 give 0.0625 + 0.25 + 0.25
    d = C.encode_array(np.array([-0.1, -0.2, -0.4]).reshape(3, 1, 1))
    settings = C.CausalSettings(n_boot=400)
    point, smp = C.replicates(d, _inputs([-0.4], np.zeros((3, 1))), 0, "qzxbt", "m", settings)
    assert point == pytest.approx(0.5625) and smp.shape == (400,)
    np.testing.assert_allclose(smp, 0.5625)
    # training noise: the random sets' effects at k = |GT|/4 are +-0.04 (centred); a replicate
    # adds w_0 * eps / off = 0.25 * (+-0.04) / -0.4 = -+0.025
    noisy = _inputs([-0.4], np.array([[0.04, -0.04], [0.1, 0.1], [0.0, 0.0]]))
    point, smp = C.replicates(d, noisy, 0, "qzxbt", "m", settings)
    assert point == pytest.approx(0.5625)
    assert set(np.round(smp, 12)) == {round(0.5625 - 0.025, 12), round(0.5625 + 0.025, 12)}
    # another method draws its own noise (same numbers, another name): other replicates
    _, other = C.replicates(d, noisy, 0, "qzxbt", "n", settings)
    assert not np.array_equal(smp, other)
    # two tie completions at |GT|/4 (-0.1 and -0.3): the point takes their mean (fraction 0.5);
    # a replicate resamples the pair: fraction 0.25, 0.5 or 0.75 w.p. 1/4, 1/2, 1/4
    two = C.encode_array(np.array([[[-0.1], [-0.3]], [[-0.2], [-0.2]], [[-0.4], [-0.4]]]))
    point, smp = C.replicates(two, _inputs([-0.4], np.zeros((3, 1))), 0, "qzxbt", "m",
                              C.CausalSettings(n_boot=2000))
    assert point == pytest.approx(0.625)
    vals, counts = np.unique(np.round(smp, 12), return_counts=True)
    np.testing.assert_allclose(vals, [0.5625, 0.625, 0.6875])
    # frequencies 1/4, 1/2, 1/4 over 2000 replicates: sd <= 0.0112, 5 sd = 0.056
    np.testing.assert_allclose(counts / 2000, [0.25, 0.5, 0.25], atol=0.056)
    with pytest.raises(C.CausalDataError, match=r"prompt deltas of shape \[2, 1, 1\] .* expected "
                                                r"\(3, R, 1\)"):
        C.replicates(C.encode_array(np.zeros((2, 1, 1))), _inputs([-0.4], np.zeros((3, 1))),
                     0, "qzxbt", "m", settings)


def test_replicates_are_the_ratio_over_the_shared_prompt_resample():
    """An independent implementation: loop over replicates with the public prompt resample."""
    rng = np.random.default_rng(1)
    P, B = 6, 50
    off = C.quantize(rng.uniform(-0.6, -0.2, P))
    d = C.quantize(rng.uniform(-0.5, 0.1, (5, 1, P)))
    settings = C.CausalSettings(n_boot=B, boot_seed=3)
    inputs = _inputs(off, np.zeros((5, 1)), C.K_FRACTIONS)
    point, smp = C.replicates(C.encode_array(d), inputs, 2, "vkwjp", "m", settings)
    w = [1 / 8, 1 / 4, 1 / 4, 1 / 4, 1 / 8]
    assert point == pytest.approx(sum(w[k] * d[k, 0].mean() for k in range(5)) / off.mean())
    idx = C.prompt_resample(3, 2, "vkwjp", B, P)
    want = [sum(w[k] * d[k, 0, idx[b]].mean() for k in range(5)) / off[idx[b]].mean()
            for b in range(B)]
    # float64 means of <= 6 values and a ratio, in two orders: <= ~20 * 2**-53 relative (derived)
    np.testing.assert_allclose(smp, want, rtol=1e-12)
    # paired: a method whose changes are twice as large has twice the replicates, and the
    # difference of the two is the first method's replicates (the same resample for both)
    _, twice = C.replicates(C.encode_array(2 * d), inputs, 2, "vkwjp", "other", settings)
    np.testing.assert_allclose(twice - smp, smp, rtol=1e-9)
    diff = C.paired_difference((2 * point, twice), (point, smp))
    assert diff["point"] == pytest.approx(point)
    assert diff["verdict"] == ("better" if diff["lo"] > 0.01 else
                               "worse" if diff["hi"] < -0.01 else "tie")


@pytest.mark.parametrize(("lo", "hi", "want"), [
    (0.02, 0.3, "better"), (0.01, 0.3, "tie"), (-0.3, -0.011, "worse"), (-0.3, -0.01, "tie"),
    (-0.2, 0.2, "tie"), (math.nan, 0.2, "tie"),
])
def test_significance_needs_the_cross_machine_tolerance(lo, hi, want):
    assert C.significance(lo, hi) == want


@pytest.mark.parametrize(("hi", "want"), [
    (-0.05, C.FAIL),          # the whole interval lies below the band's top
    (-0.005, C.INCONCLUSIVE),  # the upper end within the tolerance of the top
    (0.01, C.INCONCLUSIVE),
    (0.02, C.PASS),           # not capped
    (math.nan, C.INCONCLUSIVE),
])
def test_above_band_gate(hi, want):
    assert C.above_band_gate({"point": -0.1, "lo": -0.3, "hi": hi}) == want


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


def _curve(ref, fractions):
    return [[C.Removal((1,) * (i + 1), ref.base - 0.5 * f, ref.base)] for i, f in
            enumerate(fractions)]


def test_task_seed_block_ranks_and_decides_item_10():
    ref = _reference()
    weak = [[r] for r in (ref.random[0][0], ref.random[1][0], ref.random[2][0])]
    curves = {"good": _curve(ref, [0.4, 0.6, 0.9]), "norm-only": weak,
              "step-order": [[r] for r in (ref.random[0][1], ref.random[1][1], ref.random[2][1])],
              "advantage-only": _curve(ref, [0.1, 0.1, 0.2])}
    controls = ("norm-only", "step-order", "advantage-only")
    block, samples = C.evaluate_task_seed(ref, curves, "good", C.CausalSettings(n_boot=500),
                                          track_controls=controls)
    assert set(block["methods"]) == {"oracle", "provenance", "good", *controls}
    g = block["methods"]["good"]["score"]
    # fractions about 0.4, 0.6, 0.9 (the bonus-off change is about -0.5) with weights 1/4, 1/2,
    # 1/4: about 0.625
    assert g["lo"] <= g["point"] <= g["hi"] and g["point"] == pytest.approx(0.625, abs=0.05)
    assert block["checks"] == {"random_band": C.PASS, "norm-only": C.PASS, "step-order": C.PASS,
                               "strongest_control": C.PASS}
    assert block["comparisons"]["strongest_control"]["control"] == "advantage-only"
    assert block["verdict"] == C.PASS
    assert block["random_band"]["lo"] <= block["random_band"]["hi"] < g["lo"]
    assert [c["k"] for c in block["methods"]["good"]["curve"]] == [2, 4, 8]
    # only the estimator's curve is stored, and it gives back its own interval (the
    # leaderboard's path: the stored block alone)
    stored = [m for m, v in block["methods"].items() if "prompt_deltas" in v]
    assert stored == ["good"]
    point, smp = C.replicates(block["methods"]["good"]["prompt_deltas"], block, 0, "qzxbt",
                              "good", C.CausalSettings(n_boot=500))
    assert C.interval(point, smp) == g
    # a control as strong as the estimator is the strongest: the estimator does not beat it
    strong = dict(curves, **{"advantage-only": _curve(ref, [0.4, 0.6, 0.9])})
    block3, _ = C.evaluate_task_seed(ref, strong, "good", C.CausalSettings(n_boot=500),
                                     track_controls=controls)
    assert block3["comparisons"]["strongest_control"]["control"] == "advantage-only"
    assert block3["checks"]["strongest_control"] != C.PASS and block3["verdict"] != C.PASS
    # a control evaluated as the estimator is compared with itself: never a pass
    block2, _ = C.evaluate_task_seed(ref, curves, "norm-only", C.CausalSettings(n_boot=200))
    assert block2["checks"]["norm-only"] == C.FAIL and block2["verdict"] == C.FAIL
    # the same inputs give the same numbers (seeded bootstrap)
    again, _ = C.evaluate_task_seed(ref, curves, "good", C.CausalSettings(n_boot=500),
                                    track_controls=controls)
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
    from benchmark.causal.replays import ReplayStore
    from benchmark.releases.release import load_release

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
    # two tie completions: an all-ties method's removals are two random sets per k, replayed;
    # its point is the mean of the two, its stored curve keeps both
    flat = {(0, "qzxbt"): {"flat": np.zeros(n)}}
    two, _ = C.causal_results(rel, flat, "flat", controls=(),
                              settings=C.CausalSettings(n_boot=200, tie_completions=2))
    block = two["tasks"]["qzxbt"]["per_seed"]["0"]
    m = block["methods"]["flat"]
    off = C.decode_array(block["bonus_off_prompt_delta"])
    assert m["prompt_deltas"]["shape"] == [5, 2, off.size]
    d = C.decode_array(m["prompt_deltas"])
    for i, c in enumerate(m["curve"]):
        assert c["tie_cut"] and len(c["completions"]) == 2
        assert c["effect"] == pytest.approx(d[i].mean())
        assert [x["effect"] for x in c["completions"]] == pytest.approx(d[i].mean(axis=1))
    assert m["score"]["point"] == pytest.approx(
        C.area([c["effect"] for c in m["curve"]], C.K_FRACTIONS) / off.mean())
    with pytest.raises(ValueError, match="tie_completions=0: expected n_boot >= 1"):
        C.CausalSettings(tie_completions=0)
    assert ReplayStore(rel.path, rel.manifest_sha256).dir.is_dir()


def test_another_summation_order_changes_no_causal_number(micro_causal, tmp_path, monkeypatch):
    """Emulate another CPU: the batched updates sum in another order; float64 replays agree."""
    from benchmark.releases.release import load_release

    rel = load_release(micro_causal)
    n = C.load_reference(micro_causal, 1)["n_rollouts"]
    # one method (no controls: only its own replays matter here, and each costs two replays)
    scores = {(1, t): {"mine": np.random.default_rng(1).random(n)} for t in rel.tasks}
    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "a"))
    here, _ = C.causal_results(rel, scores, "mine", controls=(),
                               settings=C.CausalSettings(n_boot=200))
    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "b"))
    monkeypatch.setenv("BT_BENCH_REPLAY_ROW_ORDER", "reversed")
    there, _ = C.causal_results(rel, scores, "mine", controls=(),
                                settings=C.CausalSettings(n_boot=200))
    for t in rel.tasks:
        a = here["tasks"][t]["per_seed"]["1"]
        b = there["tasks"][t]["per_seed"]["1"]
        assert a["verdict"] == b["verdict"] and a["checks"] == b["checks"]
        for ca, cb in zip(a["methods"]["mine"]["curve"], b["methods"]["mine"]["curve"],
                          strict=True):
            # float64 replays in two summation orders differ by ~1e-15 in a probability
            # (docs/causal.md: at most 3e-15); stored deltas are rounded to C.ARRAY_UNIT, so a
            # value within that of a rounding boundary moves by one unit, and a k's effect (a
            # mean over prompts) by at most one unit: a fraction by ARRAY_UNIT / |bonus-off
            # effect|, plus float64 rounding of the mean and the division (1e-12)
            tol = 1e-12 + C.ARRAY_UNIT / abs(a["bonus_off_effect"])
            assert ca["fraction"] == pytest.approx(cb["fraction"], abs=tol)


def test_a_failed_replay_worker_is_a_clear_error_that_keeps_the_finished_replays(
        micro_causal, tmp_path, monkeypatch):
    """One lane fails (its seed is not in the release), the other finishes: the error says
    what failed and that the finished replays are kept; a rerun finds them stored."""
    from benchmark.causal.replays import Job, ReplayError, ReplayStore, run_jobs
    from benchmark.errors import BenchmarkError
    from benchmark.releases.release import load_release

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
