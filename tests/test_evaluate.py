"""The evaluator end to end on a small real release: results, determinism, atomicity, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark.cli import main
from benchmark.contract import EstimatorContractError
from benchmark.evaluate import EvalSettings, evaluate, format_summary, write_results

ROOT = Path(__file__).resolve().parents[1]
FAST = EvalSettings(n_boot_precision=200, n_boot_auc=200, n_boot_causal=200)
NO_CAUSAL = EvalSettings(n_boot_precision=200, n_boot_auc=200, causal=False)
CONTROLS = {"random", "norm-only", "fluency", "advantage-only", "step-order"}


@pytest.fixture(scope="module")
def gas_micro(micro_causal):
    return evaluate(ROOT / "estimators" / "gas.py", micro_causal, FAST, progress=False,
                    isolation=None)


def test_results_schema_per_task_with_causal_scores(gas_micro):
    res = gas_micro
    assert res["schema_version"] == 3
    assert res["release"]["id"] == "micro" and len(res["release"]["manifest_sha256"]) == 64
    assert res["release"]["tasks"] == ["qzxbt", "vkwjp"]
    est = res["estimator"]
    assert est["name"] == "GAS" and est["config"] == {"target": "nll"}
    assert est["fallbacks"] == [] and res["requirements"] == []
    assert set(res["tasks"]) == {"qzxbt", "vkwjp"}
    for task, t in res["tasks"].items():
        assert t["behavior"]["id"] == task
        assert set(t["seeds"]) == {"0", "1", "2"}
        s0 = t["seeds"]["0"]
        assert set(s0["training"]) == {"GAS"} | CONTROLS
        assert set(s0["training"]["GAS"]) == {"rollout", "step", "within_step_auc"}
        assert set(s0["draws"]["GAS"]) == {f"{task}/step0002_draw0", f"{task}/step0002_draw1"}
        assert s0["draws"]["advantage-only"] == {}
        other = "vkwjp" if task == "qzxbt" else "qzxbt"
        assert set(s0["specificity"]["GAS"]) == {other}
        assert [c["item"] for c in t["checklist"]] == list(range(1, 11))
        for c in t["checklist"]:
            assert c["verdict"] in ("pass", "fail", "inconclusive", "reported", "not_run")
        assert t["verdict"] in ("pass", "fail", "inconclusive")
        cs = t["summary"]["causal_score"]
        assert {"GAS", "oracle", "provenance", "norm-only", "step-order"} <= set(cs)
        assert all(v["lo"] <= v["point"] <= v["hi"] for v in cs.values())
        causal = t["causal"]["per_seed"]["0"]
        assert [c["k"] for c in causal["methods"]["GAS"]["curve"]] == causal["k_grid"]
        assert causal["k_fractions"] == [1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0]  # the reference's
        assert set(causal["checks"]) == {"random_band", "norm-only", "step-order",
                                         "strongest_control"}
        assert causal["comparisons"]["strongest_control"]["control"] in CONTROLS
        # only the estimator's per-prompt curve is stored (K sizes, 1 tie completion, P prompts)
        deltas = causal["methods"]["GAS"]["prompt_deltas"]
        assert deltas["shape"] == [5, 1, 8] and deltas["encoding"] == "int32-le-base64"
        assert not any("prompt_deltas" in m for n, m in causal["methods"].items() if n != "GAS")
        assert {c["tie_cut"] for c in causal["methods"]["step-order"]["curve"]} <= {True, False}
    assert "GAS" in res["suite"]["causal_score"]
    assert res["verdict"] in ("pass", "fail", "inconclusive")
    text = format_summary(res)
    assert "overall verdict for GAS" in text and "causal score" in text and "(oracle)" in text


def test_cells_carry_measurability_and_the_summary_counts_them(gas_micro):
    """Every per-seed causal block says whether its cell is measurable and why; the random
    reference (the sets' mean) sits beside the band; counts are per item and summed over tasks;
    the summary prints them and says what the overall verdict means."""
    from benchmark import checklist as C

    res = gas_micro
    for t in res["tasks"].values():
        for block in t["causal"]["per_seed"].values():
            assert isinstance(block["measurable"], bool) and block["measurable_reason"]
            if block["methods"]:
                ref = block["random_band"]["reference"]
                assert ref["n_sets"] == block["random_band"]["n_families"]
                assert ref["point"] == pytest.approx(block["random_band"]["mean"], abs=1e-9)
                assert set(block["measurability"]) == {"bonus_off", "reference",
                                                       "reference_margin"}
        items = {c["item"]: c for c in t["checklist"]}
        for i in C.COUNTED_ITEMS:
            assert set(items[i]["counts"]) == {"pass", "fail", "inconclusive", "not_counted"}
        assert t["summary"]["label_metrics"] == {"measurable": True}
    counts = res["checklist_counts"]
    assert list(counts) == ["1", "2", "3", "4", "10"]
    assert counts["10"]["measurable"] + counts["10"]["not_counted"] == 6  # 3 seeds x 2 tasks
    text = format_summary(res)
    assert C.counts_line("10", counts["10"]) in text
    assert C.verdict_sentence(res["verdict"]) in text
    assert "every gated item of every task, on every seed and draw)" not in text


def test_same_inputs_give_byte_identical_results(gas_micro, micro_causal, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_results(gas_micro, a)
    write_results(evaluate(ROOT / "estimators" / "gas.py", micro_causal, FAST, progress=False,
                           isolation=None), b)
    assert a.read_bytes() == b.read_bytes()
    assert "NaN" not in a.read_text() and "Infinity" not in a.read_text()
    assert (a.stat().st_mode & 0o777) == 0o644
    json.loads(a.read_text())


def test_estimator_without_draws_is_inconclusive_where_draws_decide(micro_release):
    res = evaluate(ROOT / "estimators" / "tracincp.py", micro_release, NO_CAUSAL,
                   progress=False, isolation=None)
    for t in res["tasks"].values():
        items = {c["key"]: c for c in t["checklist"]}
        assert items["fluency"]["verdict"] == "inconclusive"
        assert all("does not score generation draws" in v["reason"]
                   for v in items["fluency"]["per"].values())
        assert items["magnitude"]["verdict"] in ("inconclusive", "fail")
        assert items["draws"]["verdict"] == "inconclusive"
        assert items["causal"]["verdict"] == "not_run"
    assert res["verdict"] != "pass"


def test_contract_failure_writes_nothing(micro_release, tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy as np\nclass Bad:\n    name='bad'\n    track='gradient'\n"
                   "    tasks=('rollouts',)\n    def score_rollouts(self, view):\n"
                   "        return np.full(view.n, np.nan)\n")
    out = tmp_path / "results.json"
    out.write_text("previous results")
    rc = main(["evaluate", str(bad), "--release", str(micro_release), "--out", str(out),
               "--no-progress", "--no-isolation", "--no-causal"])
    assert rc == 2
    assert "non-finite scores" in capsys.readouterr().err
    assert out.read_text() == "previous results"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(EstimatorContractError):
        evaluate(bad, micro_release, NO_CAUSAL, progress=False, isolation=None)


def test_check_estimator_cli(micro_release, capsys):
    rc = main(["check-estimator", str(ROOT / "estimators" / "examples" / "my_estimator.py"),
               "--release", str(micro_release), "--no-isolation"])
    out = capsys.readouterr().out
    assert rc == 0 and "follows the estimator contract" in out and out.count("ok  ") >= 4


def test_evaluate_console_script(micro_release, tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmark.cli", "evaluate",
         str(ROOT / "estimators" / "examples" / "my_estimator.py"), "--release",
         str(micro_release), "--out", str(out), "--seeds", "0", "--tasks", "qzxbt",
         "--no-progress", "--no-causal", "--no-isolation"],
        capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "overall verdict for in-context-cosine" in proc.stdout
    res = json.loads(out.read_text())
    assert res["settings"]["seeds"] == [0] and list(res["tasks"]) == ["qzxbt"]
    seeds_item = next(c for c in res["tasks"]["qzxbt"]["checklist"] if c["key"] == "seeds")
    assert seeds_item["verdict"] in ("inconclusive", "fail")  # one seed can never pass item 5
