"""Season panels (issue 32) at the micro-family scale: a panel of three draws, entries scored on
it, verify re-scoring every panel number, provisional entries, and draws that must rebuild to
their recorded trajectory (on this machine and under another kernel width)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmark import live as L
from benchmark.submissions import panel as P

ROOT = Path(__file__).resolve().parents[1]
GAS = ROOT / "estimators" / "gas.py"
TRACINCP = ROOT / "estimators" / "tracincp.py"
SCALE = "micro-family"
DRAWS = [5, 6, 7]


@pytest.fixture(scope="module")
def season(micro_causal, tmp_path_factory):
    """Two entries submitted on the micro release, then a panel of draws 5, 6, 7 drawn."""
    from benchmark.submissions import submit

    root = tmp_path_factory.mktemp("season") / "submissions"
    for name, f in (("gas", GAS), ("tracincp", TRACINCP)):
        submit(f, name, ["A"], release=micro_causal, submissions_dir=root, progress=False)
    panel = P.new_panel(root, 3, scale=SCALE, progress=False, draw_ids=DRAWS)
    return root, panel


# ---------------------------------------------------------------------------- pure functions
def test_panel_score_is_the_mean_of_draws_with_a_shared_draw_resample():
    rng = np.random.default_rng(0)
    a = [(0.1 * i, rng.normal(0.1 * i, 0.01, 500)) for i in range(3)]
    b = [(p + 0.05, r + 0.05) for p, r in a]
    pa, ra = P.panel_score(a, "2026-12-07-abcdef")
    pb, rb = P.panel_score(b, "2026-12-07-abcdef")
    assert pa == pytest.approx(0.1) and pb == pytest.approx(0.15)
    # the same season resamples the same draws for every entry: the pairs shift by 0.05 exactly
    np.testing.assert_allclose(rb - ra, 0.05, atol=1e-12)
    # the draw resample widens the interval beyond any one draw's spread (draws differ by 0.1)
    assert np.quantile(ra, 0.975) - np.quantile(ra, 0.025) > 0.1
    # a replicate is a mean of draws' replicates: it lies inside their range
    assert ra.min() >= min(r.min() for _, r in a) and ra.max() <= max(r.max() for _, r in a)
    # a draw without a causal score (no bonus effect on that run) is left out; none: None
    pm, _ = P.panel_score([a[0], None, a[2]], "2026-12-07-abcdef")
    assert pm == pytest.approx((a[0][0] + a[2][0]) / 2)
    assert P.panel_score([None, None], "2026-12-07-abcdef") is None


def _panel_doc(**over) -> dict:
    doc = {"schema_version": 1, "season": "2026-12-07-abcdef",
           "created_utc": "2026-12-07T06:00:00Z", "family_version": "2.0", "scale": SCALE,
           "draws": [{"draw_id": i, "redraw": 0, "sft_sha256": "c" * 64,
                      "trajectory_sha256": "a" * 64, "reference": {"x": 0.5}}
                     for i in (1, 2, 3)],
           "entries": {"gas": {"estimator_sha256": "b" * 64,
                               "frozen_utc": "2026-12-06T06:00:00Z"}}}
    return doc | over


@pytest.mark.parametrize("over, says", [
    ({"draws": []}, "a panel has 3-8 draws"),
    ({"draws": [{"draw_id": i, "redraw": 0, "sft_sha256": "c" * 64,
                 "trajectory_sha256": "a" * 64, "reference": {}} for i in (1, 1, 2)]},
     "a draw id repeats"),
    ({"draws": [{"draw_id": "٧", "redraw": 0, "sft_sha256": "c" * 64,
                 "trajectory_sha256": "a" * 64, "reference": {}}] * 3},
     r"draws\[0\]: draw_id '٧' is not an integer"),
    ({"draws": [{"draw_id": 1, "redraw": 0, "sft_sha256": "c" * 64,
                 "trajectory_sha256": "A" * 64, "reference": {}}] * 3},
     "is not a sha256"),
    ({"draws": [{"draw_id": 1, "redraw": -1, "sft_sha256": "c" * 64,
                 "trajectory_sha256": "a" * 64, "reference": {}}] * 3},
     "is not the attempt that passed"),
    ({"created_utc": "yesterday"}, "is not a UTC time"),
    ({"season": "x" * 10_000}, "is not a season id"),
    ({"entries": {"gas": {"estimator_sha256": "b" * 64, "frozen_utc": "2026-12-08T00:00:00Z"}}},
     "after the panel was created"),
    ({"scale": "huge"}, "is not a family scale"),
])
def test_a_malformed_panel_file_is_refused_naming_the_field(over, says):
    with pytest.raises(P.PanelError, match=says):
        P.check_panel(_panel_doc(**over), "panel.json")
    assert P.check_panel(_panel_doc(), "panel.json").draw_ids == [1, 2, 3]


def test_entry_status():
    panel = P.check_panel(_panel_doc(), "panel.json")
    assert P.entry_status(panel, "gas", "b" * 64) == "ranked"
    assert P.entry_status(panel, "gas", "c" * 64) == "provisional"  # changed since
    assert P.entry_status(panel, "new", "b" * 64) == "provisional"  # frozen later
    assert P.entry_status(None, "gas", "b" * 64) == "unscored"


# ---------------------------------------------------------------------------- a micro season
def test_new_panel_records_the_season_and_scores_every_entry(season):
    from benchmark.build.trajectory import trajectory_sha256
    from benchmark.contract import file_sha256

    root, panel = season
    doc = json.loads((root / "_panel" / "panel.json").read_text())
    assert doc["season"] == panel.season and doc["draws"][0]["draw_id"] == DRAWS[0]
    assert [d["draw_id"] for d in doc["draws"]] == DRAWS
    for d in doc["draws"]:
        path = L.live_dir(d["draw_id"], SCALE)
        assert d["trajectory_sha256"] == trajectory_sha256(path)
        pin = root / "_panel" / "draws" / str(d["draw_id"]) / "model.safetensors"
        assert d["sft_sha256"] == _sha256(pin) and d["redraw"] == 0
        man = json.loads((path / "manifest.json").read_text())
        assert man["build"]["family"]["trajectory_sha256"] == d["trajectory_sha256"]
        assert d["reference"] == P.reference_summary(path) and len(d["reference"]) > 20
    for name in ("gas", "tracincp"):
        e = doc["entries"][name]
        assert e["estimator_sha256"] == file_sha256(root / name / "estimator.py")
        assert e["frozen_utc"] <= doc["created_utc"]
        sub = json.loads((root / name / "panel.json").read_text())
        assert sub["season"] == panel.season and len(sub["draws"]) == 3
        s = sub["summary"]
        assert s["item"]["item"] == 11 and s["verdict"] in ("pass", "fail", "inconclusive")
        assert set(s["per_draw"]) == {str(d) for d in DRAWS}


def _sha256(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_verify_rescores_every_panel_draw(season, micro_causal):
    from benchmark.submissions import verify_submission

    root, panel = season
    r = verify_submission(root / "gas", micro_causal, progress=False, panel=panel)
    assert r.ok and r.panel_status == "ranked", r.format()
    assert "ranked on the season panel" in r.format()


def test_an_edited_panel_number_and_a_changed_file_fail_verify(season, micro_causal, tmp_path):
    from benchmark.submissions import verify_submission

    root, panel = season
    copy = tmp_path / "submissions"
    shutil.copytree(root, copy)
    f = copy / "tracincp" / "panel.json"
    doc = json.loads(f.read_text())
    est = doc["draws"][1]["results"]["estimator"]["name"]
    doc["draws"][1]["results"]["suite"]["causal_score"][est]["point"] += 0.5
    doc["summary"]["verdict"] = "pass" if doc["summary"]["verdict"] != "pass" else "fail"
    f.write_text(json.dumps(doc))
    # the file is no longer the frozen one: provisional, and verify fails it
    with open(copy / "tracincp" / "estimator.py", "a") as fh:
        fh.write("\n# changed\n")
    r = verify_submission(copy / "tracincp", micro_causal, progress=False, panel=panel)
    assert not r.ok and r.code_changed and r.panel_status == "provisional"
    # the edited numbers, and the file's new sha256 wherever the results record it
    paths = sorted(d.path for d in r.drifts if not d.path.endswith("sha256"))
    assert paths == [f"panel.draws.1.results.suite.causal_score.{est}.point",
                     "panel.summary.verdict"]


def test_a_panel_draw_that_does_not_rebuild_fails_never_a_note(season, micro_causal, tmp_path):
    from benchmark.submissions import verify_submission

    root, panel = season
    copy = tmp_path / "submissions"
    shutil.copytree(root, copy)
    doc = panel.to_dict()
    doc["draws"][0]["trajectory_sha256"] = "0" * 64  # a made-up run under a real draw id
    bad = P.check_panel(doc, str(panel.path))
    entry = json.loads((copy / "gas" / "panel.json").read_text())
    entry["draws"][0]["trajectory_sha256"] = "0" * 64  # recorded alike: a consistent forgery
    (copy / "gas" / "panel.json").write_text(json.dumps(entry))
    r = verify_submission(copy / "gas", micro_causal, progress=False, panel=bad)
    assert not r.ok and not r.ignored
    assert "is not season" in r.error and "(another run)" in r.error
    assert f"bt-bench live build {DRAWS[0]} --scale micro-family" in r.error


def test_an_edited_cached_draw_is_rebuilt(season, capsys):
    """A cached panel draw whose causal reference was edited and its manifest rewritten to
    match verifies as a release, but not against the panel: it is rebuilt, never used."""
    from benchmark.releases.format import write_manifest

    _, panel = season
    d = DRAWS[2]
    path = L.live_dir(d, SCALE)
    (seed_dir,) = sorted(path.glob("seed*"))
    ref = json.loads((seed_dir / "causal.json").read_text())
    t = sorted(ref["tasks"])[0]
    ref["tasks"][t]["bonus_off"]["effect"] -= 0.3
    (seed_dir / "causal.json").write_text(json.dumps(ref))
    m = json.loads((path / "manifest.json").read_text())
    write_manifest(path, m["release_id"], m["build"],
                   {int(s): v for s, v in m["seeds"].items()}, version=m["release_version"])
    assert L.cached_release(d, SCALE) == path  # the cache alone accepts it
    capsys.readouterr()
    got = P.panel_release(panel, d, progress=False)
    assert "does not match season" in capsys.readouterr().out
    assert got == path
    assert json.loads((seed_dir / "causal.json").read_text())["tasks"][t]["bonus_off"][
        "effect"] == pytest.approx(ref["tasks"][t]["bonus_off"]["effect"] + 0.3)


def test_an_entry_submitted_after_the_panel_is_provisional(season, micro_causal):
    from benchmark.contract import file_sha256
    from benchmark.submissions import submit

    root, panel = season
    c1 = ROOT / "estimators" / "c1_dot.py"
    sub = submit(c1, "c1-dot", ["A"], release=micro_causal, submissions_dir=root,
                 progress=False)
    try:
        doc = P.check_entry_doc(json.loads((sub / "panel.json").read_text()), panel, "c1-dot")
        assert len(doc["draws"]) == 3 and "causal_score" in doc["summary"]
        assert "c1-dot" not in P.load_panel(root).entries
        assert P.entry_status(panel, "c1-dot", file_sha256(sub / "estimator.py")) == \
            "provisional"
    finally:
        shutil.rmtree(sub)


def test_an_attack_control_must_not_rank_above_its_base_on_the_panel(season, tmp_path,
                                                                    monkeypatch):
    """public-tuned-tracincp is TracInCP on every panel draw: a tie with its base passes (with a
    note); ranking above it (public answers bought rank) fails the attack's report."""
    from benchmark.submissions import gate as G
    from benchmark.submissions.verify import VerifyReport

    root, panel = season
    attack = tmp_path / "public-tuned-tracincp"
    shutil.copytree(root / "tracincp", attack)
    reports = [VerifyReport(root / "tracincp"), VerifyReport(attack)]
    G.attack_panel_checks(reports, panel)
    assert reports[1].ok and "not above tracincp" in reports[1].notes[0]
    better = {"point": 0.2, "lo": 0.1, "hi": 0.3, "verdict": "better"}
    monkeypatch.setattr("benchmark.submissions.panel.panel_pair", lambda *a, **k: better)
    reports = [VerifyReport(root / "tracincp"), VerifyReport(attack)]
    G.attack_panel_checks(reports, panel)
    assert not reports[1].ok and "ranks above its base 'tracincp'" in reports[1].error
    assert reports[0].ok


def test_new_panel_refuses_too_few_draws_and_unfrozen_entries(season, tmp_path):
    root, _ = season
    with pytest.raises(P.PanelError, match="a panel has 3-8 draws"):
        P.new_panel(root, 2, scale=SCALE, progress=False)
    copy = tmp_path / "submissions"
    shutil.copytree(root, copy)
    meta = (copy / "gas" / "submission.yaml").read_text()
    (copy / "gas" / "submission.yaml").write_text(
        "\n".join(x for x in meta.splitlines() if not x.startswith(("frozen", "  sha256",
                                                                     "  utc"))) + "\n")
    with pytest.raises(P.PanelError, match="is not the frozen file"):
        P.new_panel(copy, 3, scale=SCALE, progress=False, draw_ids=DRAWS)


def test_live_build_of_a_panel_draw_is_checked_against_the_panel(season, capsys):
    from benchmark.cli import main

    root, panel = season
    assert main(["live", "build", str(DRAWS[1]), "--scale", SCALE, "--no-progress",
                 "--submissions-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"season {panel.season} panel draw {DRAWS[1]}" in out
    assert f"trajectory {panel.draws[1]['trajectory_sha256']} (as recorded)" in out


def test_a_pinned_checkpoint_that_is_not_the_recorded_one_is_refused(season, tmp_path):
    _, panel = season
    copy = tmp_path / "_panel"
    shutil.copytree(panel.path.parent, copy)
    f = copy / "draws" / str(DRAWS[1]) / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-8] + b"\0" * 8)
    edited = P.Panel(**{**panel.__dict__, "path": copy / "panel.json"})
    with pytest.raises(P.PanelError, match="pinned post-SFT checkpoint of panel draw"):
        P.panel_release(edited, DRAWS[1], progress=False)


@pytest.mark.cross_width
def test_a_panel_draw_rebuilds_to_its_trajectory_under_another_kernel_width(season, tmp_path):
    """The panel's draw, rebuilt in a fresh cache with ATEN_CPU_CAPABILITY=default (no SIMD
    kernels) from its id and pinned post-SFT checkpoint, trains the same run: panel_release
    recomputes its trajectory hash and reference summary and accepts it (a PanelError
    otherwise), while its float files differ in the last bits (docs/task_family.md)."""
    root, panel = season
    code = ("import sys; from benchmark.submissions.panel import load_panel, panel_release; "
            "p = load_panel(sys.argv[1]); print(panel_release(p, int(sys.argv[2]), "
            "progress=False))")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", BT_BENCH_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code, str(root), str(DRAWS[0])], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rebuilt = Path(out.stdout.strip().splitlines()[-1])
    assert rebuilt.is_relative_to(tmp_path)
    man = json.loads((rebuilt / "manifest.json").read_text())
    assert man["build"]["family"]["trajectory_sha256"] == panel.draws[0]["trajectory_sha256"]
    assert man["build"]["family"]["sft_sha256"] == panel.draws[0]["sft_sha256"]
