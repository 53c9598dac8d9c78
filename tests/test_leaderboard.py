"""Leaderboard generation: ordering, ties, stable output, --check, reference table, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmark.cli import main
from benchmark.errors import InputFileError
from benchmark.leaderboard import (
    LeaderboardError,
    build_row,
    check,
    generate,
    paper_reference,
    rank_rows,
)
from benchmark.submissions import submit

ROOT = Path(__file__).resolve().parents[1]
CONTROLS = ["random", "norm-only", "fluency", "advantage-only", "step-order"]
GATED_ITEMS = [(1, "magnitude"), (2, "fluency"), (3, "headroom"), (4, "timing"), (5, "seeds"),
               (6, "draws"), (7, "precision_of_estimate"), (10, "causal")]
GATED = [k for _, k in GATED_ITEMS]


# ----------------------------------------------------------------------------------------------
# hand-built results (no evaluation needed); also used by test_leaderboard_browser.py


def fake_results(est: str, point: float, lo: float, hi: float, *, draws: bool = True,
                 verdict: str = "fail", release: str = "tiny", manifest: str = "a" * 64,
                 seeds: tuple[str, ...] = ("0", "1", "2"), track: str = "gradient") -> dict:
    """A results dict with every field the leaderboard reads, values derived from ``point``."""
    def window(p: float, chance: float, ceiling: float) -> dict:
        return {"precision": p, "chance": chance, "ceiling": ceiling, "lift": p / chance,
                "interval": [max(p - 0.05, 0.0), min(p + 0.05, 1.0)], "k": 4, "n": 16}

    def auc(p: float) -> dict:
        return {"point": p, "lo": max(p - 0.1, 0.0), "hi": min(p + 0.1, 1.0)}

    methods = [est, *[c for c in CONTROLS if c != est]]
    per_seed = {}
    for i, s in enumerate(seeds):
        p = round(point + 0.01 * (i - 1), 10)
        per_seed[s] = {
            "training": {m: {"rollout": {"group": {"window": window(p, 0.25, 1.0)}},
                             "step": {"group": {"window": window(p / 2, 0.25, 0.5)}}}
                         for m in methods},
            "draws": {m: ({f"step000{k}_draw{d}": {"raw": auc(p), "residualized": auc(p)}
                           for k in (1, 2) for d in (0, 1)} if draws or m != est else {})
                      for m in methods},
        }
    return {
        "estimator": {"name": est, "class": "X", "sha256": "0" * 64, "track": track,
                      "config": {}},
        "release": {"id": release, "version": "1.0.0", "manifest_sha256": manifest},
        "controls": CONTROLS,
        "seeds": per_seed,
        "summary": {
            "precision_window_group": {est: {"point": point, "lo": lo, "hi": hi}},
            "strongest_control": "random",
            "margin_over_strongest_control": {"point": point - 0.3, "lo": lo - 0.3,
                                              "hi": hi - 0.3},
            "draw_auc_residualized_mean": {est: point} if draws else {},
        },
        "checklist": [{"item": i, "key": k, "verdict": verdict, "gated": True}
                      for i, k in GATED_ITEMS],
        "verdict": verdict,
    }


def make_submission(root: Path, name: str, results: dict, kind: str = "estimator") -> Path:
    sub = root / name
    sub.mkdir(parents=True)
    (sub / "estimator.py").write_text("# hand-built test submission\n")
    meta = {"name": name, "authors": ["Test Author"], "track": results["estimator"]["track"],
            "kind": kind, "description": f"hand-built {name}"}
    (sub / "submission.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    (sub / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    return sub


def standard_submissions(root: Path) -> Path:
    """Five submissions: two tied at the top, a clear third, a control, one without draws."""
    make_submission(root, "alpha", fake_results("Alpha", 0.80, 0.70, 0.90, verdict="pass"))
    make_submission(root, "beta", fake_results("Beta", 0.75, 0.68, 0.85))
    make_submission(root, "gamma", fake_results("Gamma", 0.50, 0.45, 0.55, draws=False))
    make_submission(root, "random", fake_results("random", 0.30, 0.20, 0.40), kind="control")
    make_submission(root, "delta", fake_results("Delta", 0.62, 0.58, 0.66, verdict="inconclusive"))
    return root


REFERENCE_ROWS = [
    {"seed": "0", "table": "overall", "method": "C1-dot", "value": 0.4042, "lo": None,
     "hi": None, "chance": 0.0943, "ceiling": 0.5815, "n": 16000, "source": "recomputed"},
    {"seed": "1", "table": "overall", "method": "C1-dot", "value": 0.3825, "lo": None,
     "hi": None, "chance": 0.0936, "ceiling": 0.5721, "n": 16000, "source": "paper_csv"},
]


# ----------------------------------------------------------------------------------------------
# ranking


def _row(name: str, point: float | None, lo: float = 0.0, hi: float = 0.0) -> dict:
    return {"name": name, "precision": None if point is None else
            {"point": point, "lo": lo, "hi": hi}}


def test_rows_are_ordered_by_precision_and_overlaps_tie():
    rows = rank_rows([_row("c", 0.5, 0.45, 0.55), _row("a", 0.8, 0.7, 0.9),
                      _row("none", None), _row("b", 0.75, 0.68, 0.85), _row("d", 0.2, 0.1, 0.3)])
    assert [r["name"] for r in rows] == ["a", "b", "c", "d", "none"]
    assert [r["rank_label"] for r in rows] == ["=1", "=1", "3", "4", "-"]
    assert [r["tied"] for r in rows] == [True, True, False, False, False]
    assert [r["position"] for r in rows] == [1, 2, 3, 4, 5]


def test_ties_chain_through_the_previous_row_and_ranks_skip():
    # b overlaps a, c overlaps b (not a): one tie group; then competition ranking skips to 4
    rows = rank_rows([_row("a", 0.8, 0.75, 0.85), _row("b", 0.72, 0.65, 0.76),
                      _row("c", 0.62, 0.55, 0.66), _row("d", 0.4, 0.35, 0.45),
                      _row("e", 0.3, 0.25, 0.34), _row("f", 0.3, 0.25, 0.34)])
    assert [r["rank_label"] for r in rows] == ["=1", "=1", "=1", "4", "=5", "=5"]
    # equal points are ordered by name, so the order never depends on input order
    again = rank_rows(list(reversed([_row("f", 0.3, 0.25, 0.35), _row("e", 0.3, 0.25, 0.35)])))
    assert [r["name"] for r in again] == ["e", "f"]


def test_touching_intervals_tie_disjoint_do_not():
    assert rank_rows([_row("a", 0.6, 0.5, 0.7), _row("b", 0.4, 0.3, 0.5)])[1]["rank_label"] == "=1"
    assert rank_rows([_row("a", 0.6, 0.51, 0.7), _row("b", 0.4, 0.3, 0.5)])[1]["rank_label"] == "2"


def test_build_row_metrics():
    row = build_row({"name": "alpha", "authors": ["A"], "track": "gradient", "kind": "estimator"},
                    fake_results("Alpha", 0.8, 0.7, 0.9, verdict="pass"))
    assert row["precision"] == {"point": 0.8, "lo": 0.7, "hi": 0.9}
    assert row["chance"] == pytest.approx(0.25) and row["lift"] == pytest.approx(3.2)
    assert row["step_precision"] == pytest.approx(0.4)
    assert row["margin"]["point"] == pytest.approx(0.5) and row["strongest_control"] == "random"
    assert row["draw_auc"] == 0.8 and row["verdict"] == "pass"
    assert row["checklist"] == dict.fromkeys(GATED, "pass")
    assert [s["seed"] for s in row["seeds"]] == ["0", "1", "2"]
    assert row["figure"] == "figures/submissions/alpha.png"


# ----------------------------------------------------------------------------------------------
# generation


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> tuple[Path, Path]:
    root = standard_submissions(tmp_path_factory.mktemp("lb") / "submissions")
    (root / "_reference").mkdir()
    (root / "_reference" / "paper_rows.json").write_text(json.dumps(REFERENCE_ROWS))
    out = root.parent / "leaderboard"
    generate(root, out)
    return root, out


def test_markdown_json_html_agree_on_order_and_ties(board):
    _, out = board
    data = json.loads((out / "leaderboard.json").read_text())
    (rel,) = data["releases"]
    assert rel["id"] == "tiny"
    assert [r["name"] for r in rel["rows"]] == ["alpha", "beta", "delta", "gamma", "random"]
    assert [r["rank_label"] for r in rel["rows"]] == ["=1", "=1", "3", "4", "5"]
    md = (out / "README.md").read_text()
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    ranked = [ln for ln in lines if "../submissions/" in ln]
    assert [ln.split("|")[1].strip() for ln in ranked] == ["=1", "=1", "3", "4", "5"]
    assert "0.800 [0.700, 0.900]" in ranked[0] and "+0.500 [+0.400, +0.600] vs random" in ranked[0]
    assert "control" in ranked[4] and "*[random]" in ranked[4]
    html = (out / "index.html").read_text()
    order = [html.index(f'data-name="{n}"') for n in ("alpha", "beta", "delta", "gamma", "random")]
    assert order == sorted(order)
    assert '<tr data-name="random" class="control">' in html
    assert "http://" not in html and "https://" not in html  # nothing fetched from the network
    for png in ("figures/precision_tiny.png", "figures/draw_auc_tiny.png",
                *[f"figures/submissions/{n}.png" for n in ("alpha", "gamma", "random")]):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png in data["figures"] and f'src="{png}"' in html or f'href="{png}"' in html
        assert png in md


def test_reference_table_is_separate_and_labelled(board):
    _, out = board
    md = (out / "README.md").read_text()
    head, ref = md.split("## Reference: the paper's Qwen2.5-1.5B results (not ranked)")
    assert "C1-dot" not in head and "0.4042" in ref and "paper_csv" in ref and "recomputed" in ref
    data = json.loads((out / "leaderboard.json").read_text())
    assert data["reference"]["rows"] == REFERENCE_ROWS
    assert 'id="reference"' in (out / "index.html").read_text()


def test_same_inputs_give_byte_identical_output(board, tmp_path):
    root, out = board
    again = tmp_path / "again"
    generate(root, again)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again).as_posix() for p in again.rglob("*")
                           if p.is_file())
    assert len(files) == 3 + 2 + 5
    for f in files:
        assert (out / f).read_bytes() == (again / f).read_bytes(), f
    # input order on disk never matters: rank_rows sorts; the folder listing is sorted too
    assert check(root, again) == []


def test_check_detects_stale_files(board, tmp_path, capsys):
    import shutil

    root, out = board
    lb = tmp_path / "leaderboard"
    shutil.copytree(out, lb)
    assert main(["leaderboard", "--submissions-dir", str(root), "--out", str(lb),
                 "--check"]) == 0
    (lb / "README.md").write_text((lb / "README.md").read_text() + "hand edit\n")
    (lb / "figures" / "submissions" / "gamma.png").unlink()
    (lb / "figures" / "submissions" / "old.png").write_bytes(b"x")
    rc = main(["leaderboard", "--submissions-dir", str(root), "--out", str(lb), "--check"])
    out_text = capsys.readouterr().out
    assert rc == 1
    assert f"{lb}/README.md" in out_text
    assert f"{lb}/figures/submissions/gamma.png" in out_text
    assert f"{lb}/figures/submissions/old.png (no longer generated)" in out_text
    assert "leaderboard.json" not in out_text.split("stale files:")[1].split("fix:")[0]
    assert f"fix: bt-bench leaderboard --submissions-dir {root} --out {lb}" in out_text
    # regenerating fixes it and removes the stale figure
    generate(root, lb)
    assert check(root, lb) == []
    assert not (lb / "figures" / "submissions" / "old.png").exists()


def test_check_flags_figures_whose_data_changed(board, tmp_path):
    import shutil

    root, out = board
    subs = tmp_path / "submissions"
    shutil.copytree(root, subs)
    res = json.loads((subs / "gamma" / "results.json").read_text())
    res["seeds"]["1"]["training"]["Gamma"]["rollout"]["group"]["window"]["precision"] = 0.1
    (subs / "gamma" / "results.json").write_text(json.dumps(res))
    stale = check(subs, out)
    assert f"{out}/leaderboard.json" in stale
    assert f"{out}/figures/precision_tiny.png" in stale
    assert f"{out}/figures/submissions/gamma.png" in stale
    assert f"{out}/figures/submissions/alpha.png" not in stale
    assert f"{out}/figures/draw_auc_tiny.png" not in stale  # gamma scores no draws


def test_releases_are_ranked_apart_and_must_agree_on_the_build(tmp_path):
    root = tmp_path / "submissions"
    make_submission(root, "a", fake_results("A", 0.8, 0.7, 0.9))
    make_submission(root, "b", fake_results("B", 0.6, 0.5, 0.65, release="small"))
    generate(root, tmp_path / "lb")
    data = json.loads((tmp_path / "lb" / "leaderboard.json").read_text())
    assert [(r["id"], [x["rank_label"] for x in r["rows"]]) for r in data["releases"]] == [
        ("small", ["1"]), ("tiny", ["1"])]
    make_submission(root, "c", fake_results("C", 0.5, 0.4, 0.6, manifest="b" * 64))
    with pytest.raises(LeaderboardError, match=r"disagree on its manifest sha256: a \(aaaa"):
        generate(root, tmp_path / "lb2")


def test_malformed_reference_file_is_an_error(tmp_path):
    root = tmp_path / "submissions"
    make_submission(root, "a", fake_results("A", 0.8, 0.7, 0.9))
    (root / "_reference").mkdir()
    (root / "_reference" / "paper_rows.json").write_text(json.dumps([{"seed": "0"}]))
    with pytest.raises(InputFileError, match=r"row 0 has keys \['seed'\]; expected exactly"):
        generate(root, tmp_path / "lb")


def test_empty_submissions_give_an_empty_board(tmp_path):
    (tmp_path / "submissions").mkdir()
    generate(tmp_path / "submissions", tmp_path / "lb")
    assert "No submissions yet." in (tmp_path / "lb" / "README.md").read_text()
    assert "Not available" in (tmp_path / "lb" / "index.html").read_text()


# ----------------------------------------------------------------------------------------------
# the paper's reference rows


def test_paper_reference_rows(paper_runs):
    rows = paper_reference(paper_runs, paper_runs / "results_table.csv", n_boot=200)
    keys = [(r["seed"], r["table"], r["method"]) for r in rows]
    assert len(keys) == len(set(keys))
    by_source = {s: [r for r in rows if r["source"] == s] for s in ("recomputed", "paper_csv")}
    assert len(by_source["recomputed"]) + len(by_source["paper_csv"]) == len(rows)
    recomputed = {(r["seed"], r["table"], r["method"]) for r in by_source["recomputed"]}
    assert ("0", "overall", "C1-dot") in recomputed
    # seeds 1 and 2 of the step-level tables need files the paper did not release
    assert ("1", "overall", "C1-dot") in {(r["seed"], r["table"], r["method"])
                                         for r in by_source["paper_csv"]}
    # every row of the paper's CSV is present exactly once
    import csv

    with (paper_runs / "results_table.csv").open() as fh:
        csv_keys = {(r["seed"], r["table"], r["method"]) for r in csv.DictReader(fh)}
    assert csv_keys <= set(keys)
    assert set(rows[0]) == {"seed", "table", "method", "value", "lo", "hi", "chance", "ceiling",
                            "n", "source"}


# ----------------------------------------------------------------------------------------------
# end to end on a real release: submit a new estimator, the row appears everywhere


NEW_ESTIMATOR = '''"""A new estimator for the test: in-context cosine minus a step penalty."""

import numpy as np

from estimators.base import BaseEstimator, cosine


class EarlyCosine(BaseEstimator):
    name = "early-cosine"
    track = "gradient"
    tasks = ("rollouts", "draws")

    def __init__(self, weight: float = 0.1) -> None:
        self.weight = weight

    def score_rollouts(self, view):
        return cosine(view.sketches, view.target("in_context")) - self.weight * view.steps

    def score_draw(self, view, draw):
        return cosine(draw.sketches, view.target("in_context", draw.checkpoint_step))
'''


def test_new_submission_appears_in_markdown_json_html_and_figures(micro_release, tmp_path):
    est = tmp_path / "early_cosine.py"
    est.write_text(NEW_ESTIMATOR)
    subs = tmp_path / "submissions"
    submit(ROOT / "estimators" / "gas.py", "gas", ["bt-bench"], release=micro_release,
           submissions_dir=subs, progress=False)
    rc = main(["submit", str(est), "--name", "early-cosine", "--authors", "New Person",
               "--release", str(micro_release), "--submissions-dir", str(subs), "--no-progress"])
    assert rc == 0
    out = tmp_path / "leaderboard"
    assert main(["leaderboard", "--submissions-dir", str(subs), "--out", str(out)]) == 0
    data = json.loads((out / "leaderboard.json").read_text())
    (rel,) = data["releases"]
    row = next(r for r in rel["rows"] if r["name"] == "early-cosine")
    assert row["estimator"]["name"] == "early-cosine" and row["kind"] == "estimator"
    assert row["precision"]["point"] is not None
    assert "[early-cosine](../submissions/early-cosine/)" in (out / "README.md").read_text()
    assert 'data-name="early-cosine"' in (out / "index.html").read_text()
    assert (out / "figures" / "submissions" / "early-cosine.png").is_file()
    assert "figures/submissions/early-cosine.png" in data["figures"]
    assert main(["leaderboard", "--submissions-dir", str(subs), "--out", str(out),
                 "--check"]) == 0
