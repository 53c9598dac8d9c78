"""`bt-bench paper reproduce`: exact agreement with the paper's CSV, other files, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmark import metrics, paper
from benchmark.cli import main
from benchmark.errors import InputFileError

# ---------------------------------------------------------------------------------------------
# the paper's released files


@pytest.fixture(scope="module")
def reproduced(paper_runs):
    return paper.reproduce(paper_runs, n_boot=2000)


def test_step_level_rows_match_paper_csv(paper_runs, reproduced):
    expected = paper.read_expected(paper_runs / "results_table.csv")
    step = [r for r in reproduced if r.table in ("overall", "early_nonzero")]
    assert len(step) == 14 and {r.seed for r in step} == {"0"}
    for r in step:
        e = expected[(r.seed, r.table, r.method)]
        # the CSV prints 4 decimals: rounding alone moves a value by <= 5e-5 (measured 4.9e-5,
        # here and in the minimal pairs below); 5e-4 allows 10x that
        assert r.value == pytest.approx(e.value, abs=5e-4), r
        assert r.n == e.n
    overall = [r for r in step if r.table == "overall"]
    early = [r for r in step if r.table == "early_nonzero"]
    assert {round(r.chance, 4) for r in overall} == {0.0943}
    assert {round(r.chance, 4) for r in early} == {0.4716}
    assert {round(r.ceiling, 4) for r in step} == {0.5815}


def test_minimal_pair_rows_match_paper_csv(paper_runs, reproduced):
    expected = paper.read_expected(paper_runs / "results_table.csv")
    mp = [r for r in reproduced if r.table.startswith("mp_")]
    assert len(mp) == 7
    for r in mp:
        e = expected[(r.seed, r.table, r.method)]
        assert r.value == pytest.approx(e.value, abs=5e-4), r
        assert r.n == 882
        # intervals: different rng and resample count, documented to agree to about 0.01
        assert r.lo == pytest.approx(e.lo, abs=0.015) and r.hi == pytest.approx(e.hi, abs=0.015)


def test_token_level_means_match_table4(reproduced):
    vs_ctx = {r.seed: r.value for r in reproduced if r.method == "vs_ctx"}
    assert {s: round(v, 3) for s, v in vs_ctx.items()} == {"0": 0.230, "1": 0.114, "2": 0.295}


def test_cli_exit_code_and_json(paper_runs, tmp_path, capsys):
    out = tmp_path / "rows.json"
    rc = main(["paper", "reproduce", "--runs", str(paper_runs), "--expected",
               str(paper_runs / "results_table.csv"), "--json", str(out), "--n-boot", "300"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "21 match within 0.0005, 0 differ" in text
    rows = json.loads(out.read_text())
    columns = {"seed", "table", "method", "value", "lo", "hi", "chance", "ceiling", "n"}
    assert set(rows[0]) == columns
    assert len(rows) == 30


def test_cli_reports_mismatch(paper_runs, tmp_path, capsys):
    csv = (paper_runs / "results_table.csv").read_text().replace(
        "0,overall,TRAK,0.3993", "0,overall,TRAK,0.3999")
    bad = tmp_path / "expected.csv"
    bad.write_text(csv)
    rc = main(["paper", "reproduce", "--runs", str(paper_runs), "--expected", str(bad),
               "--n-boot", "100"])
    assert rc == 1
    assert "1 differ" in capsys.readouterr().out


def test_console_script_smoke(paper_runs):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmark.cli", "paper", "reproduce", "--runs", str(paper_runs),
         "--n-boot", "100"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "C1-cosine" in proc.stdout and "30 rows computed" in proc.stdout


# ---------------------------------------------------------------------------------------------
# other files in the same format (made here, with known answers)


def write_run(root: Path, seed: int = 7) -> Path:
    d = root / f"seed{seed}"
    d.mkdir(parents=True)
    steps = {f"r{s}_{i}": s for s in range(4) for i in range(4)}  # 4 steps x 4 rollouts
    step_score = {0: 3.0, 1: 2.0, 2: 1.0, 3: 0.0}
    methods = {
        "stepwise": [[rid, step_score[s]] for rid, s in steps.items()],
        "oracle": [[rid, 1.0 if rid in ("r1_0", "r1_1", "r2_0") else 0.0] for rid in steps],
        "buffer": [[rid, float("-inf") if s < 3 else 1.0] for rid, s in steps.items()],
    }
    json.dump({"methods": methods, "rollout_steps": steps, "nonzero_steps": [0, 1, 3]},
              (d / "attribution_scores.json").open("w"))
    with (d / "ground_truth.jsonl").open("w") as fh:
        for rid in ("r1_0", "r1_1", "r2_0"):
            fh.write(json.dumps({"rollout_id": rid, "step": steps[rid]}) + "\n")
    rng = np.random.default_rng(0)
    rows = []
    for g in range(20):
        for _ in range(6):
            has = bool(rng.random() < 0.5)
            rows.append({"group": g, "has_qzxbt": has, "fluency": float(rng.normal()),
                         "norm": float(rng.normal() + has), "mp": float(rng.normal()),
                         "mp_centered": float(rng.normal() + 0.5 * has)})
    json.dump({"ckpt_seed": seed, "gen_seed": 9, "rows": rows},
              (d / f"minimal_pair_rows_ckpt{seed}_gen9.json").open("w"))
    json.dump({"vs_ctx": [0.1, 0.3], "vs_cont": [0.0, 0.0, 0.3]},
              (d / "token_level_cos_temp1.3.json").open("w"))
    return d


def test_same_command_on_other_files(tmp_path):
    write_run(tmp_path)
    rows = paper.reproduce(tmp_path, n_boot=200, early_cutoff=3)
    by = {(r.table, r.method): r for r in rows}
    # overall: k=3; stepwise ranks step0 (0 hits), step1 (2 hits) -> credit 2*2/4... :
    # block step0 fills 3 slots of 4 with 0 hits -> 0
    assert by[("overall", "stepwise")].value == 0.0
    assert by[("overall", "oracle")].value == 1.0
    assert by[("overall", "stepwise")].chance == pytest.approx(3 / 16)
    # ceiling: step1 density 0.5 (2 hits), step2 density .25: take 3 of step1's 4 -> 1.5/3
    assert by[("overall", "stepwise")].ceiling == pytest.approx(0.5)
    # early_nonzero: steps < 3 and in {0, 1, 3} -> steps 0, 1: 8 rollouts, GT r1_0, r1_1 (k=2)
    early = by[("early_nonzero", "stepwise")]
    assert early.n == 8 and early.chance == pytest.approx(2 / 8) and early.value == 0.0
    assert by[("early_nonzero", "buffer")].value == pytest.approx(0.25)  # all tied -> chance
    # a draw with gen seed != ckpt seed is a diagnostic draw, labelled as the paper's CSV does
    mp = [r for r in rows if r.table.startswith("mp_")]
    assert {r.seed for r in mp} == {"7_gen9"}
    assert {r.table for r in mp} == {"mp_raw_diag", "mp_residualized_diag"}
    assert by[("token_level_temp1.3", "vs_ctx")].value == pytest.approx(0.2)
    assert by[("token_level_temp1.3", "vs_cont")].n == 3


def test_mp_rows_use_the_metrics_library(tmp_path):
    d = write_run(tmp_path)
    data = json.loads((d / "minimal_pair_rows_ckpt7_gen9.json").read_text())["rows"]
    g = np.array([r["group"] for r in data])
    y = np.array([r["has_qzxbt"] for r in data])
    s = np.array([r["mp_centered"] for r in data])
    f = np.array([r["fluency"] for r in data])
    rows = {(r.table, r.method): r for r in paper.minimal_pair_rows(
        d / "minimal_pair_rows_ckpt7_gen9.json", n_boot=100)}
    assert rows[("mp_raw_diag", "GAS_centered")].value == pytest.approx(
        metrics.within_group_auc(s, y, g)[0])
    resid = metrics.residualize_within_group(s, f, g)
    assert rows[("mp_residualized_diag", "GAS_centered")].value == pytest.approx(
        metrics.within_group_auc(resid, y, g)[0])
    assert ("mp_residualized_diag", "fluency") not in rows


# ---------------------------------------------------------------------------------------------
# bad input: clear errors, nothing written


def test_missing_runs_folder(tmp_path):
    with pytest.raises(InputFileError, match="runs folder not found"):
        paper.reproduce(tmp_path / "nope")
    with pytest.raises(InputFileError, match="no seed<S>/ subfolders"):
        paper.reproduce(tmp_path)


def test_scores_without_ground_truth(tmp_path):
    d = write_run(tmp_path)
    (d / "ground_truth.jsonl").unlink()
    with pytest.raises(InputFileError, match="ground_truth.jsonl: file not found"):
        paper.reproduce(tmp_path)


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    d = write_run(tmp_path)
    with (d / "ground_truth.jsonl").open("a") as fh:
        fh.write('{"rollout_id": "r3_0", \n')
    with pytest.raises(InputFileError, match=r"ground_truth.jsonl:4: malformed JSON line"):
        paper.reproduce(tmp_path)


def test_malformed_json_file(tmp_path):
    d = write_run(tmp_path)
    text = (d / "attribution_scores.json").read_text()
    (d / "attribution_scores.json").write_text(text[: len(text) // 2])
    with pytest.raises(InputFileError, match=r"attribution_scores.json:1:\d+: malformed JSON"):
        paper.reproduce(tmp_path)


def test_ground_truth_ids_not_in_scores(tmp_path):
    d = write_run(tmp_path)
    with (d / "ground_truth.jsonl").open("a") as fh:
        fh.write(json.dumps({"rollout_id": "grpo_999999_000", "step": 1}) + "\n")
    with pytest.raises(InputFileError, match="1 ground-truth rollout ids are not among the 16"):
        paper.reproduce(tmp_path)


def test_empty_ground_truth(tmp_path):
    d = write_run(tmp_path)
    (d / "ground_truth.jsonl").write_text("\n")
    with pytest.raises(InputFileError, match="the ground truth is empty"):
        paper.reproduce(tmp_path)


def test_error_writes_nothing_and_keeps_previous_json(tmp_path, capsys):
    d = write_run(tmp_path / "runs")
    out = tmp_path / "rows.json"
    out.write_text("previous")
    (d / "ground_truth.jsonl").write_text("not json\n")
    rc = main(["paper", "reproduce", "--runs", str(tmp_path / "runs"), "--json", str(out)])
    assert rc == 2
    assert "malformed JSON line" in capsys.readouterr().err
    assert out.read_text() == "previous"
    assert not list(tmp_path.glob(".rows.json.*"))
