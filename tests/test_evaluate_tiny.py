"""The evaluator on the shipped ``tiny`` release: confound-copying estimators fail their items."""

from __future__ import annotations

import textwrap

import pytest

from benchmark.evaluate import EvalSettings, evaluate

SETTINGS = EvalSettings(n_boot_precision=300, n_boot_auc=300, seeds=(0,), causal=False)


def item(results, key):
    return next(c for c in results["checklist"] if c["key"] == key)


def write(tmp_path, body):
    p = tmp_path / "copycat.py"
    p.write_text("import numpy as np\nfrom estimators.base import BaseEstimator\n"
                 + textwrap.dedent(body))
    return p


@pytest.fixture(scope="module")
def gas_tiny():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with_causal = EvalSettings(n_boot_precision=300, n_boot_auc=300, seeds=(0,))
    return evaluate(root / "estimators" / "gas.py", "tiny", with_causal, progress=False)


def test_norm_only_copy_fails_magnitude(tmp_path):
    p = write(tmp_path, """
    class NormCopy(BaseEstimator):
        name = "norm-copy"
        tasks = ("rollouts", "draws")
        def score_rollouts(self, view):
            return np.linalg.norm(np.asarray(view.sketches, float), axis=1)
        def score_draw(self, view, draw):
            return np.linalg.norm(np.asarray(draw.sketches, float), axis=1)
    """)
    res = evaluate(p, "tiny", SETTINGS, progress=False)
    mag = item(res, "magnitude")
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
    res = evaluate(p, "tiny", SETTINGS, progress=False)
    flu = item(res, "fluency")
    assert flu["verdict"] == "fail"
    for v in flu["per"].values():
        assert v["numbers"]["raw_minus_fluency"]["point"] == 0.0
    assert res["verdict"] == "fail"


def test_gas_on_tiny_has_every_task(gas_tiny):
    s0 = gas_tiny["seeds"]["0"]
    win = s0["training"]["GAS"]["rollout"]["group"]["window"]
    assert 0 < win["chance"] < 1 and win["k"] > 0 and win["ceiling"] == 1.0
    step = s0["training"]["GAS"]["step"]["group"]["window"]
    assert step["chance"] <= step["ceiling"] <= 1.0
    assert len(s0["draws"]["GAS"]) >= 4  # >= 2 draws at each of two checkpoints
    assert all(e["n"] > 0 for e in s0["token_level"].values())


def test_causal_item_is_scored_by_replay(gas_tiny):
    causal = item(gas_tiny, "causal")
    seed0 = causal["per"]["0"]
    assert causal["verdict"] in ("pass", "fail") and seed0["verdict"] == causal["verdict"]
    methods = seed0["numbers"]["methods"]
    assert set(methods) == {"GAS", "norm-only", "step-order"}
    k = seed0["numbers"]["k"]
    assert all(m["removed"] == k for m in methods.values())
    floor = seed0["numbers"]["random_floor"]["max_abs_fraction"]
    gas = methods["GAS"]["fraction"]
    beats = gas > floor and all(gas > methods[c]["fraction"] for c in ("norm-only", "step-order"))
    assert (seed0["verdict"] == "pass") == beats
    assert "seconds" not in gas_tiny["causal"]  # results stay byte-identical


def test_no_causal_flag_skips_item_10(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = evaluate(root / "estimators" / "controls" / "random.py", "tiny", SETTINGS,
                   progress=False)
    assert item(res, "causal")["verdict"] == "not_run"
    assert "skipped" in res["causal"]["reason"]
