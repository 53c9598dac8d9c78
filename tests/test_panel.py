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


#: the test season's seed: its candidate ids are a function of it alone
SEED = "5eed" * 8


def _lenient_screen():
    """A screen for the micro scale (whose six-step runs show no measurable effect): it rejects
    the first candidate it sees and accepts every later one, marking its cells measurable; the
    real screen's cell records are kept, so the panel file has the real numbers."""
    from benchmark.submissions.screen import screen_release

    seen = []

    def screen(path):
        real = screen_release(path)
        seen.append(path)
        if len(seen) == 1:
            return real | {"accepted": False, "reason": "test: the first candidate is rejected"}
        return {"accepted": True, "reason": "test: accepted",
                "cells": {c: r | {"measurable": True} for c, r in real["cells"].items()}}

    return screen


@pytest.fixture(scope="module")
def season(micro_causal, tmp_path_factory):
    """Two entries submitted on the micro release, then a panel screened from SEED's candidates
    (the first rejected) until 6 cells: three draws of two tasks each."""
    from benchmark.submissions import submit
    from benchmark.submissions.seasons import new_panel

    root = tmp_path_factory.mktemp("season") / "submissions"
    for name, f in (("gas", GAS), ("tracincp", TRACINCP)):
        submit(f, name, ["A"], release=micro_causal, submissions_dir=root, progress=False)
    panel = new_panel(root, 6, scale=SCALE, progress=False, season_seed=SEED,
                      screen=_lenient_screen())
    return root, panel


# ---------------------------------------------------------------------------- pure functions
def test_panel_score_holds_the_draws_fixed_and_the_family_interval_resamples_them():
    rng = np.random.default_rng(0)
    a = [(0.1 * i, rng.normal(0.1 * i, 0.01, 500)) for i in range(3)]
    b = [(p + 0.05, r + 0.05) for p, r in a]
    pa, ra = P.panel_score(a)
    pb, rb = P.panel_score(b)
    assert pa == pytest.approx(0.1) and pb == pytest.approx(0.15)
    # draws fixed: replicate b is the mean of the draws' replicate b, exactly
    np.testing.assert_allclose(ra, np.mean([r for _, r in a], axis=0), atol=0)
    np.testing.assert_allclose(rb - ra, 0.05, atol=1e-12)
    # its spread is the draws' own (sd 0.01 / sqrt(3)), not the spread between draws (0.1)
    assert np.std(ra) == pytest.approx(0.01 / np.sqrt(3), rel=0.15)
    fa = P.family_score(a, "2026-12-07-abcdef")
    fb = P.family_score(b, "2026-12-07-abcdef")
    assert fa[0] == pa and fb[0] == pb
    # the same season resamples the same draws for every entry: the pairs shift by 0.05 exactly
    np.testing.assert_allclose(fb[1] - fa[1], 0.05, atol=1e-12)
    # the draw resample widens the interval beyond any one draw's spread (draws differ by 0.1)
    assert np.quantile(fa[1], 0.975) - np.quantile(fa[1], 0.025) > 0.1
    assert np.quantile(ra, 0.975) - np.quantile(ra, 0.025) < 0.03
    # a replicate is a mean of draws' replicates: it lies inside their range
    assert fa[1].min() >= min(r.min() for _, r in a) and fa[1].max() <= max(r.max() for _, r in a)
    # a draw without a causal score (no bonus effect on that run) is left out; none: None
    pm, _ = P.panel_score([a[0], None, a[2]])
    assert pm == pytest.approx((a[0][0] + a[2][0]) / 2)
    assert P.panel_score([None, None]) is None and P.family_score([None], "x") is None


def test_candidate_ids_are_a_function_of_the_season_seed_alone():
    from benchmark.submissions.screen import candidate_ids

    ids = candidate_ids(SEED, 12)
    assert ids == candidate_ids(SEED, 12) and ids[:5] == candidate_ids(SEED, 5)
    assert len(set(ids)) == 12 and all(0 <= d < 2**31 for d in ids)
    assert candidate_ids("5eed" * 7 + "5eee", 12) != ids
    # the stream is numpy's PCG64 under a SeedSequence (stable across versions): recompute it
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [0x5C2E_E7ED, int(SEED, 16)])))
    assert ids[0] == int(rng.integers(0, 2**31))
    with pytest.raises(ValueError, match="expected lowercase hex"):
        candidate_ids("not hex", 3)


def test_power_of_is_half_the_interval_plus_the_tolerance():
    from benchmark.submissions.screen import power_of

    reps = np.random.default_rng(1).normal(0.2, 0.05, 20_000)
    p = power_of(0.2, reps, tol=0.01)
    assert p["half_width"] == pytest.approx(1.96 * 0.05, rel=0.03)
    assert p["detectable"] == pytest.approx(p["half_width"] + 0.01)
    assert p["detectable_80"] == pytest.approx(2.8016 * p["sd"] + 0.01, rel=1e-3)
    assert p["lo"] < 0.2 < p["hi"]


def _draw_rec(i: int, **over) -> dict:
    return {"draw_id": i, "redraw": 0, "sft_sha256": "c" * 64, "trajectory_sha256": "a" * 64,
            "reference": {"x": 0.5}, "cells": {"1/a": {"measurable": True},
                                               "1/b": {"measurable": True}}} | over


def _panel_doc(**over) -> dict:
    draws = [_draw_rec(i) for i in (1, 2, 3)]
    doc = {"schema_version": 2, "season": "2026-12-07-abcdef",
           "created_utc": "2026-12-07T06:00:00Z", "family_version": "2.0", "scale": SCALE,
           "season_seed": "abcdef" + "0" * 26, "screen": {"rule": "x"}, "min_cells": 6,
           "candidates": [{"index": 0, "draw_id": 9, "accepted": False, "reason": "no"}]
           + [{"index": k + 1, "draw_id": d["draw_id"], "accepted": True, "reason": "ok"}
              for k, d in enumerate(draws)],
           "draws": draws, "power": {},
           "entries": {"gas": {"estimator_sha256": "b" * 64,
                               "frozen_utc": "2026-12-06T06:00:00Z"}},
           "bindings": {"gas": {"estimator_sha256": "b" * 64, "results_sha256": "d" * 64,
                                "panel_sha256": "e" * 64}}}
    return doc | over


@pytest.mark.parametrize("over, says", [
    ({"draws": []}, "a panel has 3-16 draws"),
    ({"draws": [_draw_rec(i) for i in (1, 1, 2)]}, "a draw id repeats"),
    ({"draws": [_draw_rec("٧")] * 3}, r"draws\[0\]: draw_id '٧' is not an integer"),
    ({"draws": [_draw_rec(1, trajectory_sha256="A" * 64)] * 3}, "is not a sha256"),
    ({"draws": [_draw_rec(1, redraw=-1)] * 3}, "is not the attempt that passed"),
    ({"draws": [_draw_rec(i, cells={"1/a": {"measurable": False}}) for i in (1, 2, 3)]},
     "only a draw that passed the screen enters a panel"),
    ({"min_cells": 12}, "hold 6 measurable cells, fewer than its min_cells 12"),
    ({"season_seed": "ffffff" + "0" * 26}, "beginning with the season id's 'abcdef'"),
    ({"season_seed": "abcdef"}, "is not 32 lowercase hex digits"),
    ({"candidates": [{"index": 0, "draw_id": 1, "accepted": True, "reason": "ok"}] * 3},
     r"candidates\[1\] is not a candidate record"),
    ({"candidates": [{"index": i, "draw_id": d, "accepted": True, "reason": "ok"}
                     for i, d in enumerate((1, 3, 2))]},
     r"the accepted candidates \[1, 3, 2\] are not the panel's draws"),
    ({"bindings": {"gas": {"estimator_sha256": "b" * 64}}}, "is not an object with exactly"),
    ({"created_utc": "yesterday"}, "is not a UTC time"),
    ({"season": "x" * 10_000}, "is not a season id"),
    ({"entries": {"gas": {"estimator_sha256": "b" * 64, "frozen_utc": "2026-12-08T00:00:00Z"}}},
     "after the panel was created"),
    ({"scale": "huge"}, "is not a family scale"),
    ({"schema_version": 1}, "regenerate it with bt-bench panel new"),
])
def test_a_malformed_panel_file_is_refused_naming_the_field(over, says):
    with pytest.raises(P.PanelError, match=says):
        P.check_panel(_panel_doc(**over), "panel.json")
    panel = P.check_panel(_panel_doc(), "panel.json")
    assert panel.draw_ids == [1, 2, 3] and panel.n_cells == 6 and len(panel.candidates) == 4


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
    from benchmark.submissions.screen import candidate_ids

    root, panel = season
    doc = json.loads((root / "_panel" / "panel.json").read_text())
    assert doc["season"] == panel.season and doc["season_seed"] == SEED
    assert panel.season.endswith(SEED[:6])
    # the candidates are the seed's sequence; the first was rejected (its reason kept) and
    # replaced by the next id; screening stopped once the accepted draws held 6 cells
    ids = candidate_ids(SEED, 4)
    assert [c["draw_id"] for c in doc["candidates"]] == ids
    assert [c["accepted"] for c in doc["candidates"]] == [False, True, True, True]
    assert doc["candidates"][0]["reason"] == "test: the first candidate is rejected"
    assert [d["draw_id"] for d in doc["draws"]] == ids[1:] == panel.draw_ids
    assert panel.n_cells == 6 and doc["min_cells"] == 6
    for c in doc["candidates"]:  # every candidate, rejected ones too, is pinned: replayable
        pin = root / "_panel" / "draws" / str(c["draw_id"]) / "model.safetensors"
        assert c["sft_sha256"] == _sha256(pin) and len(c["cells"]) == 2
    for d in doc["draws"]:
        path = L.live_dir(d["draw_id"], SCALE)
        assert d["trajectory_sha256"] == trajectory_sha256(path)
        assert d["redraw"] == 0 and set(d["cells"]) == set(
            next(c for c in doc["candidates"] if c["draw_id"] == d["draw_id"])["cells"])
        man = json.loads((path / "manifest.json").read_text())
        assert man["build"]["family"]["trajectory_sha256"] == d["trajectory_sha256"]
        assert d["reference"] == P.reference_summary(path) and len(d["reference"]) > 20
    design = doc["power"]["design"]
    # draws whose oracle has a margin (a micro draw may pay no bonus at all)
    assert design["pair"] == "oracle - random reference" and 1 <= design["n_draws"] <= 3
    assert design["detectable"] == pytest.approx(design["half_width"] + 0.01)
    assert doc["power"]["entries"] is None  # no random entry in this season
    for name in ("gas", "tracincp"):
        e = doc["entries"][name]
        assert e["estimator_sha256"] == file_sha256(root / name / "estimator.py")
        assert e["frozen_utc"] <= doc["created_utc"]
        assert doc["bindings"][name] == P.binding_of(root / name)
        sub = json.loads((root / name / "panel.json").read_text())
        assert sub["season"] == panel.season and len(sub["draws"]) == 3
        s = sub["summary"]
        assert s["item"]["item"] == 11 and s["verdict"] in ("pass", "fail", "inconclusive")
        assert set(s["per_draw"]) == {str(d) for d in panel.draw_ids}
        assert set(s["items"]) == {"1", "2", "3", "4", "10"}
        if s["causal_score"] is not None:  # the family interval is at least as wide
            assert s["family"]["hi"] - s["family"]["lo"] >= \
                s["causal_score"]["hi"] - s["causal_score"]["lo"] - 1e-12


def test_a_resumed_panel_keeps_only_draws_scored_for_its_seed_and_trajectory(season, tmp_path):
    """``panel new --season-seed`` resumes (or extends) a season: an entry's draw records written
    for this season seed, from the frozen estimator, on one of the panel's draws (id and
    trajectory hash) are kept, and scoring with them gives the same summary as verify derives;
    another seed's file, a record whose trajectory hash differs, an edited estimator or an
    unreadable file are scored again."""
    from benchmark.submissions.compare import compare_results
    from benchmark.submissions.files import load_submission
    from benchmark.submissions.seasons import recorded_draws
    from benchmark.submissions.verify import _as_committed

    root, panel = season
    sub = load_submission(root / "gas")
    doc = json.loads((root / "gas" / "panel.json").read_text())
    kept = recorded_draws(sub, panel, SEED)
    assert sorted(kept) == sorted(panel.draw_ids)
    assert [kept[d] for d in panel.draw_ids] == doc["draws"]
    again = P.score_entry(sub.estimator_file, sub.results, panel, progress=False, recorded=kept)
    assert again["draws"] == doc["draws"]  # nothing scored: every draw was kept
    assert compare_results({"summary": doc["summary"]},
                           _as_committed({"summary": again["summary"]})) == []
    assert recorded_draws(sub, panel, "abcdef" + SEED[6:]) == {}  # another season's seed
    copy = tmp_path / "gas"
    shutil.copytree(root / "gas", copy)
    bad = json.loads(json.dumps(doc))
    bad["draws"][1]["trajectory_sha256"] = "0" * 64
    (copy / "panel.json").write_text(json.dumps(bad))
    assert sorted(recorded_draws(load_submission(copy), panel, SEED)) == sorted(
        panel.draw_ids[:1] + panel.draw_ids[2:])
    (copy / "panel.json").write_text("{not json")
    assert recorded_draws(load_submission(copy), panel, SEED) == {}
    (copy / "panel.json").write_text(json.dumps(doc))
    (copy / "estimator.py").write_text((copy / "estimator.py").read_text() + "\n# edited\n")
    assert recorded_draws(load_submission(copy), panel, SEED) == {}


def _sha256(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_the_real_screen_decides_as_the_evaluator_does(season):
    """The screen is the evaluator's measurability rule on the reference rows alone: on every
    candidate the cell records agree with what evaluate writes into its per-seed blocks."""
    from benchmark.evaluate import evaluate
    from benchmark.submissions.screen import screen_release

    root, panel = season
    c = panel.candidates[0]
    path = L.live_dir(c["draw_id"], SCALE)
    real = screen_release(path)
    assert real["accepted"] == all(r["measurable"] for r in real["cells"].values())
    res = evaluate(GAS, path, progress=False)
    for cell, r in real["cells"].items():
        seed, task = cell.split("/")
        block = res["tasks"][task]["causal"]["per_seed"][seed]
        assert block["measurable"] == r["measurable"]
        assert block["measurable_reason"] == r["reason"]
    if not real["accepted"]:
        assert "not measurable" in real["reason"]


def test_verify_samples_bound_entries_and_rescores_unbound_ones_in_full(season, micro_causal):
    from benchmark.submissions import verify_submission
    from benchmark.submissions.scope import make_plan

    root, panel = season
    folders = [root / "gas", root / "tracincp"]
    plan = make_plan(panel, folders, seed="ab", sizes=(1, 1, 1))
    assert plan.state == {"gas": "bound", "tracincp": "bound"} and not plan.full
    assert len(plan.public) == 1 and len(plan.draws) == 1
    assert plan == make_plan(panel, folders, seed="ab", sizes=(1, 1, 1))  # reproducible
    (d,) = plan.draws
    (who,) = plan.draws[d]
    r = verify_submission(root / who, micro_causal, progress=False, panel=panel, plan=plan)
    assert r.ok and r.panel_status == "ranked", r.format()
    assert f"draw {d}" in r.rescored
    assert ("public" in r.rescored) == (who in plan.public)
    other = next(n for n in ("gas", "tracincp") if n != who)
    if other not in plan.public:
        r2 = verify_submission(root / other, micro_causal, progress=False, panel=panel,
                               plan=plan)
        assert r2.ok and r2.rescored == [], r2.format()
        assert "not in this run's sample" in r2.format()
    full = make_plan(panel, folders, full=True)
    assert full.full == {"gas", "tracincp"}
    r3 = verify_submission(root / "gas", micro_causal, progress=False, panel=panel, plan=full)
    assert r3.ok and r3.rescored == ["public"] + [f"draw {x}" for x in panel.draw_ids]
    assert "ranked on the season panel" in r3.format()


def test_verify_prints_its_plan_and_gates_only_unbound_entries(season, micro_causal, capsys,
                                                                monkeypatch):
    """The run's plan is printed before anything is scored (with the seed that reproduces it);
    bound entries are not scored on the fresh gate draw (the panel is their fresh-draw test),
    so with every entry bound no gate draw is built."""
    from benchmark.submissions import verify

    root, panel = season

    real = L.live_release

    def no_gate_build(draw_id, *a, **k):
        assert draw_id != 424242, "a gate draw was built although no entry is gated"
        return real(draw_id, *a, **k)

    monkeypatch.setattr(L, "live_release", no_gate_build)
    reports = verify([root / "gas", root / "tracincp"], root, release=micro_causal,
                     progress=False, live_draw=424242, live_scale=SCALE, sample_seed="0",
                     panel_check=True)
    out = capsys.readouterr().out
    assert "verify plan (sample seed 0, --sample-seed; reproduce with --sample-seed 0)" in out
    assert "0 entries in full; 2 bound" in out
    assert "live check: no entry scored on live draw 424242" in out
    assert all(r.ok for r in reports), [r.format() for r in reports]
    assert all(r.live_check is None for r in reports)


def test_an_edited_bound_file_fails_and_a_changed_entry_is_rescored_in_full(
        season, micro_causal, tmp_path):
    from benchmark.submissions import verify_submission
    from benchmark.submissions.scope import make_plan

    root, panel = season
    copy = tmp_path / "submissions"
    shutil.copytree(root, copy)
    f = copy / "tracincp" / "panel.json"
    doc = json.loads(f.read_text())
    est = doc["draws"][1]["results"]["estimator"]["name"]
    doc["draws"][1]["results"]["suite"]["causal_score"][est]["point"] += 0.5
    f.write_text(json.dumps(doc))
    plan = make_plan(panel, [copy / "tracincp"], seed="1")
    assert plan.state["tracincp"] == "edited"
    r = verify_submission(copy / "tracincp", micro_causal, progress=False, panel=panel,
                          plan=plan)
    assert not r.ok and "differs from the file the season panel binds" in r.error
    assert "panel bind" in r.error and r.rescored == []
    # the file is no longer the frozen one: unbound (a new version), re-scored in full, and
    # the edited number is a drift like any other
    doc["summary"]["verdict"] = "pass" if doc["summary"]["verdict"] != "pass" else "fail"
    f.write_text(json.dumps(doc))
    with open(copy / "tracincp" / "estimator.py", "a") as fh:
        fh.write("\n# changed\n")
    plan = make_plan(panel, [copy / "tracincp"], seed="1")
    assert plan.state["tracincp"] == "unbound" and plan.full == {"tracincp"}
    r = verify_submission(copy / "tracincp", micro_causal, progress=False, panel=panel,
                          plan=plan)
    assert not r.ok and r.code_changed and r.panel_status == "provisional", r.format()
    assert r.error is None, r.format()
    # the edited number is a drift; the recorded summary no longer follows from the recorded
    # draws (their stored curves do not give the edited score), which is a drift too
    paths = sorted(d.path for d in r.drifts if not d.path.endswith("sha256"))
    assert paths == [f"panel.draws.1.results.suite.causal_score.{est}.point", "panel.summary"]
    assert "cannot be recomputed" in str(next(d for d in r.drifts if d.path == "panel.summary"))


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
    assert f"bt-bench live build {panel.draw_ids[0]} --scale micro-family" in r.error


def test_an_edited_cached_draw_is_rebuilt(season):
    """A cached panel draw whose causal reference was edited and its manifest rewritten to
    match verifies as a release, but not against this machine's seal (nor the panel): it is
    rebuilt, never used."""
    from benchmark.releases.format import write_manifest

    _, panel = season
    d = panel.draw_ids[2]
    path = L.live_dir(d, SCALE)
    (seed_dir,) = sorted(path.glob("seed*"))
    ref = json.loads((seed_dir / "causal.json").read_text())
    t = sorted(ref["tasks"])[0]
    ref["tasks"][t]["bonus_off"]["effect"] -= 0.3
    (seed_dir / "causal.json").write_text(json.dumps(ref))
    m = json.loads((path / "manifest.json").read_text())
    write_manifest(path, m["release_id"], m["build"],
                   {int(s): v for s, v in m["seeds"].items()}, version=m["release_version"])
    assert L.cached_release(d, SCALE) is None  # the seal refuses it
    got = P.panel_release(panel, d, progress=False)
    assert got == path
    assert json.loads((seed_dir / "causal.json").read_text())["tasks"][t]["bonus_off"][
        "effect"] == pytest.approx(ref["tasks"][t]["bonus_off"]["effect"] + 0.3)


def test_a_rejected_candidate_replays_from_its_pin_and_entries_bind(season, capsys):
    from benchmark.cli import main
    from benchmark.submissions.seasons import bind_entries, rescreen

    root, panel = season
    c = panel.candidates[0]
    out = rescreen(root, c["draw_id"], progress=False)
    assert out["recorded"]["draw_id"] == c["draw_id"]
    assert set(out["here"]["cells"]) == set(c["cells"])
    for cell, r in out["here"]["cells"].items():  # the same numbers as recorded
        assert r["bonus_off"] == pytest.approx(c["cells"][cell]["bonus_off"])
    with pytest.raises(P.PanelError, match="is not a candidate of season"):
        rescreen(root, 123, progress=False)
    assert main(["panel", "show", "--submissions-dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert f"season seed {SEED}" in shown and "4 candidates screened, 3 accepted" in shown
    assert "rejected: test: the first candidate is rejected" in shown
    assert "power, design" in shown
    again = bind_entries(root, ["gas"])
    assert again.bindings["gas"] == P.binding_of(root / "gas")


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


def test_new_panel_refuses_unfrozen_entries_and_a_family_that_rarely_passes(season,
                                                                            tmp_path):
    from benchmark.submissions.seasons import new_panel

    root, _ = season
    copy = tmp_path / "submissions"
    shutil.copytree(root, copy)
    meta = (copy / "gas" / "submission.yaml").read_text()
    (copy / "gas" / "submission.yaml").write_text(
        "\n".join(x for x in meta.splitlines() if not x.startswith(("frozen", "  sha256",
                                                                     "  utc"))) + "\n")
    with pytest.raises(P.PanelError, match="is not the frozen file"):
        new_panel(copy, 6, scale=SCALE, progress=False, season_seed=SEED)
    shutil.rmtree(copy)
    shutil.copytree(root, copy)

    def never(path):
        return {"accepted": False, "reason": "test: never", "cells": {}}

    with pytest.raises(P.PanelError, match="2 candidates screened, 0 accepted"):
        new_panel(copy, 6, scale=SCALE, progress=False, season_seed=SEED, max_candidates=2,
                  screen=never)
    with pytest.raises(P.PanelError, match="expected 32 lowercase hex"):
        new_panel(copy, 6, scale=SCALE, progress=False, season_seed="xyz")


def test_live_build_of_a_panel_draw_is_checked_against_the_panel(season, capsys):
    from benchmark.cli import main

    root, panel = season
    d = panel.draw_ids[1]
    assert main(["live", "build", str(d), "--scale", SCALE, "--no-progress",
                 "--submissions-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"season {panel.season} panel draw {d}" in out
    assert f"trajectory {panel.draws[1]['trajectory_sha256']} (as recorded)" in out


def test_a_pinned_checkpoint_that_is_not_the_recorded_one_is_refused(season, tmp_path):
    _, panel = season
    copy = tmp_path / "_panel"
    shutil.copytree(panel.path.parent, copy)
    f = copy / "draws" / str(panel.draw_ids[1]) / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-8] + b"\0" * 8)
    edited = P.Panel(**{**panel.__dict__, "path": copy / "panel.json"})
    with pytest.raises(P.PanelError, match="pinned post-SFT checkpoint of panel draw"):
        P.panel_release(edited, panel.draw_ids[1], progress=False)


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
    out = subprocess.run([sys.executable, "-c", code, str(root), str(panel.draw_ids[0])], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rebuilt = Path(out.stdout.strip().splitlines()[-1])
    assert rebuilt.is_relative_to(tmp_path)
    man = json.loads((rebuilt / "manifest.json").read_text())
    assert man["build"]["family"]["trajectory_sha256"] == panel.draws[0]["trajectory_sha256"]
    assert man["build"]["family"]["sft_sha256"] == panel.draws[0]["sft_sha256"]
