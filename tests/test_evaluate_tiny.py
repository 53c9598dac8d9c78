"""The evaluator on the shipped ``tiny`` release: confound copies fail, the causal score runs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from benchmark.evaluate import EvalSettings, evaluate

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = EvalSettings(n_boot_precision=300, n_boot_auc=300, seeds=(0,), causal=False)


def item(task_results, key):
    return next(c for c in task_results["checklist"] if c["key"] == key)


def write(tmp_path, body):
    p = tmp_path / "copycat.py"
    p.write_text("import numpy as np\nfrom estimators.base import BaseEstimator\n"
                 + textwrap.dedent(body))
    return p


def test_norm_only_copy_fails_magnitude(tmp_path):
    p = write(tmp_path, """
    class NormCopy(BaseEstimator):
        name = "norm-copy"
        tasks = ("rollouts", "draws")
        def score_rollouts(self, view):
            return view.sketch_norms()
        def score_draw(self, view, draw):
            return draw.sketch_norms()
    """)
    res = evaluate(p, "tiny", SETTINGS, progress=False, isolation=None)
    for t in res["tasks"].values():
        mag = item(t, "magnitude")
        assert mag["verdict"] == "fail"
        assert mag["per"]["0"]["numbers"]["norm-only"]["point"] == 0.0
    assert res["verdict"] == "fail"


def test_fluency_copy_fails_fluency(tmp_path):
    p = write(tmp_path, """
    class FluencyCopy(BaseEstimator):
        name = "fluency-copy"
        tasks = ("rollouts", "draws")
        def score_rollouts(self, view):
            return np.asarray(view.fluency, float).copy()
        def score_draw(self, view, draw):
            return np.asarray(draw.fluency, float).copy()
    """)
    res = evaluate(p, "tiny", SETTINGS, progress=False, isolation=None)
    for t in res["tasks"].values():
        flu = item(t, "fluency")
        assert flu["verdict"] in ("fail", "inconclusive")
        for v in flu["per"].values():
            assert v["numbers"]["raw_minus_fluency"]["point"] == 0.0
    assert res["verdict"] == "fail"


@pytest.fixture(scope="module")
def gas_tiny():
    settings = EvalSettings(n_boot_precision=300, n_boot_auc=300, n_boot_causal=300,
                            seeds=(0,), tasks=("vkwjp",))
    return evaluate(ROOT / "estimators" / "gas.py", "tiny", settings, progress=False,
                    isolation=None)


def test_gas_on_tiny_has_every_metric(gas_tiny):
    s0 = gas_tiny["tasks"]["vkwjp"]["seeds"]["0"]
    win = s0["training"]["GAS"]["rollout"]["group"]["window"]
    assert 0 < win["chance"] < 1 and win["k"] > 0 and win["ceiling"] == 1.0
    step = s0["training"]["GAS"]["step"]["group"]["window"]
    assert step["chance"] <= step["ceiling"] <= 1.0
    assert len(s0["draws"]["GAS"]) == 2
    for m in s0["draws"]["GAS"].values():  # draws large enough for the 0.15 rule to be met
        assert m["raw"]["n"] >= 300
    assert all(e["n"] > 0 for e in s0["token_level"].values())
    spec = s0["specificity"]
    assert spec["GAS"]["qzxbt"]["chance"] > 0
    # a target-free control cannot tell the tasks apart: norm-only's top-|GT| for vkwjp is full
    # of the confounded task's ground truth (kwex's one-word prompts give the largest
    # gradients), above chance; GAS's holds none of it
    kwex = {m: spec[m]["kwex"] for m in ("GAS", "norm-only")}
    assert kwex["norm-only"]["share"] > kwex["norm-only"]["chance"] > kwex["GAS"]["share"]


def test_causal_item_is_scored_by_replay(gas_tiny):
    t = gas_tiny["tasks"]["vkwjp"]
    causal = item(t, "causal")
    seed0 = t["causal"]["per_seed"]["0"]
    assert causal["verdict"] == seed0["verdict"]
    assert set(seed0["methods"]) >= {"GAS", "norm-only", "step-order", "oracle", "provenance"}
    # the release's own numbers, not replayed here; only where a control's top-k boundary cuts
    # a tie (a schema-2 reference broke those by rollout order, an evaluation breaks them at
    # random) is its set replayed
    sources = {c["source"] for m in ("norm-only", "step-order", "oracle", "provenance")
               for c in seed0["methods"][m]["curve"] if not c.get("tie_cut")}
    assert sources <= {"shipped", "empty"}
    assert {c["source"] for c in seed0["methods"]["GAS"]["curve"]} <= {"replayed", "shipped"}
    oracle = t["summary"]["causal_score"]["oracle"]["point"]
    band = seed0["random_band"]
    assert band["lo"] <= band["hi"] < oracle


def test_no_causal_flag_skips_item_10():
    res = evaluate(ROOT / "estimators" / "controls" / "random.py", "tiny", SETTINGS,
                   progress=False, isolation=None)
    for t in res["tasks"].values():
        assert item(t, "causal")["verdict"] == "not_run"
        assert "skipped" in t["causal"]["reason"]


def test_an_all_ties_entry_lands_in_the_random_band():
    """Ties at the top-k boundary are completed at random, not by rollout order: an entry whose
    scores are all equal removes random rollouts and scores like them (before, it removed the
    earliest rollouts, step-order's sets, and scored above the band on qzxbt)."""
    from benchmark.causal import score as C
    from benchmark.releases.release import load_release

    rel = load_release("tiny")
    n = C.load_reference(rel.path, 0)["n_rollouts"]
    out, _ = C.causal_results(rel, {(0, "qzxbt"): {"all-ties": np.zeros(n)}}, "all-ties",
                              controls=(), settings=C.CausalSettings(n_boot=500))
    block = out["tasks"]["qzxbt"]["per_seed"]["0"]
    curve = block["methods"]["all-ties"]["curve"]
    assert all(c["tie_cut"] and c["source"] == "replayed" for c in curve)
    # the set at k is a random k of all rollouts, of which those before the window end count
    ref = C.task_reference(C.load_reference(rel.path, 0), "qzxbt")
    in_window = ref.window_end * ref.n_per_step
    for c in curve:  # hypergeometric: mean k * W/N, sd < sqrt(k)/2; 5 sd either side
        mean = c["k"] * in_window / n
        assert abs(c["removed_in_window"] - mean) < 2.5 * np.sqrt(c["k"])
    score, band = block["methods"]["all-ties"]["score"], block["random_band"]
    assert block["checks"]["random_band"] in (C.FAIL, C.INCONCLUSIVE)  # not above the band
    assert score["lo"] <= band["hi"] and band["lo"] <= score["hi"]  # the intervals meet


def test_reversed_gas_keeps_its_precision_lift_but_fails_the_causal_item(tmp_path):
    """Reversed GAS ranks first the rollouts that pushed the behavior down; on vkwjp its group
    label precision still shows a lift over chance (the siblings of labelled groups are labelled
    too), but removing its top rollouts does no better than removing at random: item 10 fails
    and so does the task. Against the band's top (the largest of 8 random sets, +0.261 here) its
    causal score used to lie significantly below the bar, which also capped items 3 and 4;
    against the random reference (their mean, +0.088) it is indistinguishable from random
    removal, so the precision items stand as measured (docs/evaluation.md, "The random
    reference")."""
    p = write(tmp_path, """
    from estimators.base import sketch_cosine
    class ReversedGAS(BaseEstimator):
        name = "reversed-GAS"
        tasks = ("rollouts",)
        def score_rollouts(self, view):
            return -sketch_cosine(view, view.target("nll"))
    """)
    settings = EvalSettings(n_boot_precision=300, n_boot_auc=300, n_boot_causal=300,
                            seeds=(0,), tasks=("vkwjp",))
    res = evaluate(p, "tiny", settings, progress=False, isolation=None)
    t = res["tasks"]["vkwjp"]
    margin = t["causal"]["per_seed"]["0"]["comparisons"]["random_band"]
    assert margin["lo"] < -0.01 and margin["point"] < 0  # not above the random reference
    assert item(t, "causal")["per"]["0"]["verdict"] == "fail"
    # precision alone shows a lift over chance (tiny 3.0 seed 0: 0.305 [0.216, 0.402] against
    # chance 0.229, lift 1.33)
    head = item(t, "headroom")["per"]["0"]["numbers"]
    assert head["point"] > head["chance"]
    assert t["verdict"] == "fail"
