"""Live draws (issue 23) at the micro-family scale: the cached build, evaluate --live, verify's
live check (the fresh-draw gate), and the gate and suite margin as pure functions. The season
panel's draws are live draws too: tests/test_panel.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from benchmark import live as L
from benchmark.causal.score import CROSS_MACHINE_TOLERANCE, band_margins, mean_over_seeds
from benchmark.cli import main
from benchmark.errors import BuildError

ROOT = Path(__file__).resolve().parents[1]
GAS = ROOT / "estimators" / "gas.py"
SCALE = "micro-family"
DRAW = 5


# ---------------------------------------------------------------------------- pure functions
def _iv(point: float, lo: float, hi: float) -> dict:
    return {"point": point, "lo": lo, "hi": hi}


@pytest.mark.parametrize("public, live, ok, says", [
    # public clearly above the band (lo 0.05 > 0.01), live too (lo 0.02 > 0.01): kept
    (_iv(0.30, 0.05, 0.55), _iv(0.20, 0.02, 0.38), True, "on the live draw"),
    # public above, live lower end exactly at the tolerance: not significantly above the band,
    # but its upper end (0.29 + 0.01) reaches the public lower end 0.05: not caught -> kept
    (_iv(0.30, 0.05, 0.55), _iv(0.15, 0.01, 0.29), True, "not significantly below"),
    # a weak method barely above the band in public (text-only on tiny 3.0: lower end 0.017)
    # and at it on the live draw: kept
    (_iv(0.05, 0.017, 0.08), _iv(0.04, -0.003, 0.09), True, "not significantly below"),
    # public well above (lower end 0.20); live at the band and below the claim (0.18 + 0.01 <
    # 0.20): fail
    (_iv(0.30, 0.20, 0.40), _iv(0.05, 0.005, 0.18), False, "does not carry over"),
    # ... but an upper end that reaches the claim within the tolerance (0.195 + 0.01): kept
    (_iv(0.30, 0.20, 0.40), _iv(0.05, 0.005, 0.195), True, "not significantly below"),
    # public above, live in the band (a memorizer: 0.46 public, -0.02 live): fail
    (_iv(0.46, 0.40, 0.52), _iv(-0.02, -0.20, 0.15), False, "does not carry over"),
    # public lower end 0.01 is not > 0.01: nothing claimed, live irrelevant
    (_iv(0.20, 0.01, 0.40), _iv(-0.50, -0.60, -0.40), True, "nothing claimed"),
    # public below the band: nothing claimed
    (_iv(-0.10, -0.30, 0.05), _iv(0.30, 0.10, 0.50), True, "nothing claimed"),
    # no public margin (no causal score), or no live margin (no bonus effect): not decided
    (None, _iv(0.3, 0.1, 0.5), True, "no public causal score"),
    (_iv(0.30, 0.05, 0.55), None, True, "gives no causal score"),
])
def test_live_gate_table(public, live, ok, says):
    pub = {} if public is None else {"vs_random": public}
    liv = {} if live is None else {"vs_random": live}
    got, reason = L.live_gate(pub, liv, "est", CROSS_MACHINE_TOLERANCE)
    assert got is ok and says in reason and reason.startswith("est: ")
    if public is not None and live is not None and not ok:
        assert f"{public['point']:+.3f}" in reason and f"[{live['lo']:+.3f}," in reason


def test_band_margins_pair_the_estimator_with_each_random_reference_and_average():
    """Hand computation: two tasks, task a on seeds 1 and 2 (random references 0.1, 0.3: one
    random set each, effect -0.05 and -0.15 against a constant bonus-off change -0.5, so the
    reference has no spread), task b on seed 1 with no bonus effect (no methods: skipped).
    Margins (point, replicates) minus each reference; the suite margin is their mean: point
    ((0.5-0.1) + (0.2-0.3)) / 2 = 0.15, replicates ([0.4, 0.6] - 0.1 + [0.1, 0.3] - 0.3) / 2 =
    [0.05, 0.25]."""
    from benchmark.causal.score import CausalSettings, encode_array

    def blk(effect):
        return {"methods": {"e": {}}, "k_fractions": [1.0],
                "bonus_off_prompt_delta": encode_array(np.full(4, -0.5)),
                "random_effects": encode_array(np.array([[effect]]))}

    tasks = {"a": {"per_seed": {"2": blk(-0.15), "1": blk(-0.05)}},
             "b": {"per_seed": {"1": {"methods": {}}}}}
    samples = {"a": {"e": [(0.5, np.array([0.4, 0.6])), (0.2, np.array([0.1, 0.3]))]}}
    m = band_margins(tasks, samples, "e", CausalSettings(n_boot=2))
    assert [p for p, _ in m] == pytest.approx([0.4, -0.1])
    np.testing.assert_allclose(m[0][1], [0.3, 0.5], atol=1e-12)
    np.testing.assert_allclose(m[1][1], [-0.2, 0.0], atol=1e-12)
    s = mean_over_seeds([p for p, _ in m], [r for _, r in m], level=0.5)
    assert s["point"] == pytest.approx(0.15)
    # the 25th and 75th percentiles of [0.05, 0.25] (linear interpolation)
    assert (s["lo"], s["hi"]) == pytest.approx((0.1, 0.2))


def test_draw_ids_are_checked_and_pinned_by_flag_then_environment(monkeypatch):
    assert L.check_draw_id(7) == 7 == L.check_draw_id("7") == L.check_draw_id(np.int64(7))
    for bad in (-1, 2**31, "x", 1.5, True, None):
        with pytest.raises(BuildError, match=r"live draw id .* expected an integer in "):
            L.check_draw_id(bad)
    monkeypatch.setenv(L.LIVE_DRAW_ENV, "11")
    assert L.gate_draw_id(3) == (3, "--live-draw")
    assert L.gate_draw_id() == (11, "$BT_BENCH_LIVE_DRAW")
    monkeypatch.delenv(L.LIVE_DRAW_ENV)
    d, source = L.gate_draw_id()
    assert 0 <= d < 2**31 and source == "chosen by this run"
    assert L.live_dir(7, SCALE).parts[-2:] == ("live", "micro-family-draw7")


# ---------------------------------------------------------------------------- the build
@pytest.fixture(scope="module")
def live5() -> Path:
    return L.live_release(DRAW, SCALE, progress=False)


def test_live_release_is_a_release_with_a_lean_reference(live5):
    from benchmark.build.family import FAMILY_VERSION, draw_config
    from benchmark.releases.release import load_release

    assert live5 == L.live_dir(DRAW, SCALE) and L.cached_release(DRAW, SCALE) == live5
    rel = load_release(live5)
    fam = rel.manifest["build"]["family"]
    assert (fam["draw_id"], fam["version"], fam["scale"]) == (DRAW, FAMILY_VERSION, SCALE)
    assert "build_seconds" not in fam
    assert all("timings_s" not in s for s in rel.manifest["seeds"].values())
    (seed,) = rel.seeds
    assert seed == draw_config(DRAW, scale=SCALE).seed
    ref = json.loads((live5 / f"seed{seed}" / "causal.json").read_text())
    assert ref["lean"] is True and ref["n_random"] == L.LIVE_N_RANDOM
    assert "exact_replay" not in ref and "seconds" not in ref
    for t in rel.tasks:
        # both reference rows: a season panel screens draws by the stronger of the two
        assert {"oracle", "provenance", "norm-only", "step-order", "text-only", "bm25"} <= \
            set(ref["tasks"][t]["methods"])
        assert all(len(lvl["sets"]) == L.LIVE_N_RANDOM for lvl in ref["tasks"][t]["random"])
    t = L.live_timings(live5)
    assert t["draw_id"] == DRAW and t["build_seconds"] > 0 and t["reference_seconds"] > 0
    assert set(t["build_phases_seconds"][str(seed)]) >= {"sft", "grpo"}
    assert not list(live5.parent.glob(".*tmp*"))


def test_same_id_reuses_the_cache_and_rebuilds_the_same_run(live5, monkeypatch, tmp_path):
    import shutil

    from benchmark.build.trajectory import trajectory_sha256
    from benchmark.releases.release import MANIFEST

    sha = _sha(live5 / MANIFEST)
    run = trajectory_sha256(live5)

    def no_build(*a, **k):
        raise AssertionError("a cached draw was rebuilt")

    with monkeypatch.context() as m:
        m.setattr("benchmark.build.family.build_draw", no_build)
        assert L.live_release(DRAW, SCALE, progress=False) == live5
    # a cached copy that no longer verifies is not reused; the rebuild is the same run, with
    # the same manifest bytes (times are kept in live.json, outside the manifest)
    keep = tmp_path / "keep"
    shutil.copytree(live5, keep)
    try:
        with open(next(live5.glob("seed*/causal.json")), "a") as f:
            f.write(" ")
        assert L.cached_release(DRAW, SCALE) is None
        # a temporary folder left by a killed build of this draw is removed by the next build
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = live5.parent / f".{live5.name}.tmp-{dead.pid}-0000"
        stale.mkdir()
        assert L.live_release(DRAW, SCALE, progress=False) == live5
        assert _sha(live5 / MANIFEST) == sha
        assert trajectory_sha256(live5) == run
        assert json.loads((live5 / MANIFEST).read_text())["build"]["family"][
            "trajectory_sha256"] == run
        assert not stale.exists()
    finally:  # put the first build back (the replay store is keyed by its manifest)
        shutil.rmtree(live5)
        shutil.copytree(keep, live5)


def test_a_cached_draw_edited_with_its_manifest_rewritten_is_rebuilt(live5, tmp_path,
                                                                      monkeypatch, capsys):
    """Issue 39: a cached live draw is bound to this machine's key. Edit its causal reference
    and rewrite the manifest entry to match (what someone with write access to the cache, or a
    restored CI cache, can do): the manifest still verifies, the seal does not, so
    ``cached_release`` refuses it and ``live build`` rebuilds it; the same holds for a draw
    sealed under another machine's key (a cache brought from elsewhere)."""
    import shutil

    from benchmark.releases.format import sha256_file
    from benchmark.releases.release import MANIFEST, load_release
    from benchmark.seal import KEY_ENV

    keep = tmp_path / "keep"
    shutil.copytree(live5, keep)
    try:
        causal = next(live5.glob("seed*/causal.json"))
        doc = json.loads(causal.read_text())
        t = next(iter(doc["tasks"]))
        doc["tasks"][t]["bonus_off"]["effect"] = -0.999  # a made-up number
        causal.write_text(json.dumps(doc))
        man = json.loads((live5 / MANIFEST).read_text())
        rel = causal.relative_to(live5).as_posix()
        man["files"][rel] = {"sha256": sha256_file(causal), "size": causal.stat().st_size}
        (live5 / MANIFEST).write_text(json.dumps(man))
        load_release(live5, verify=True)  # the forgery passes the manifest check ...
        assert L.cached_release(DRAW, SCALE) is None  # ... not the seal
        assert main(["live", "build", str(DRAW), "--scale", SCALE, "--no-progress"]) == 0
        assert "built in" in capsys.readouterr().out  # rebuilt, not found in the cache
        assert json.loads(causal.read_text())["tasks"][t]["bonus_off"]["effect"] != -0.999
        assert L.cached_release(DRAW, SCALE) == live5
        # the same genuine files under another machine's key: rebuilt too
        monkeypatch.setenv(KEY_ENV, str(tmp_path / "other.key"))
        assert L.cached_release(DRAW, SCALE) is None
    finally:
        shutil.rmtree(live5)
        shutil.copytree(keep, live5)


def test_interrupted_build_leaves_no_cache_entry(monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("benchmark.causal.reference.reference", interrupted)
    with pytest.raises(KeyboardInterrupt):
        L.live_release(8, SCALE, progress=False)
    final = L.live_dir(8, SCALE)
    assert not final.exists() and L.cached_release(8, SCALE) is None
    assert not list(final.parent.glob(f".{final.name}*"))


def test_live_build_cli_prints_the_folder_and_times(live5, capsys):
    assert main(["live", "build", str(DRAW), "--scale", SCALE, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert str(live5) in out and "found in the cache" in out
    with pytest.raises(SystemExit):
        main(["live"])
    assert main(["live", "build", "7", "--scale", "huge"]) == 2
    assert "is not a family scale" in capsys.readouterr().err


# ---------------------------------------------------------------------------- scoring
def test_evaluate_live_is_evaluate_on_the_draws_release(live5, tmp_path):
    from benchmark.evaluate import evaluate, write_results

    out = tmp_path / "r.json"
    assert main(["evaluate", str(GAS), "--live", str(DRAW), "--live-scale", SCALE, "--out",
                 str(out), "--no-progress"]) == 0
    res = json.loads(out.read_text())
    assert res["release"]["id"] == f"{SCALE}-draw{DRAW}"
    est = res["estimator"]["name"]
    cs = res["suite"]["causal_score"][est]
    vr = res["suite"]["vs_random"]
    assert cs["lo"] <= cs["point"] <= cs["hi"] and vr["lo"] <= vr["point"] <= vr["hi"]
    # the margin is the score minus the random reference, the mean of the random sets (one
    # seed; tasks with a bonus effect)
    refs = [b["random_band"]["reference"]["point"] for t in res["tasks"].values()
            for b in t["causal"].get("per_seed", {}).values() if b.get("methods")]
    assert vr["point"] == pytest.approx(cs["point"] - np.mean(refs), abs=1e-9)
    # byte-identical to evaluating the cached release folder
    again = tmp_path / "again.json"
    write_results(evaluate(GAS, live5, progress=False), again)
    assert again.read_bytes() == out.read_bytes()
    assert main(["evaluate", str(GAS), "--live", "5", "--release", "tiny"]) == 2


MEMORIZER = """
import numpy as np

from estimators.base import BaseEstimator

SCORES = {scores!r}  # (seed, task) -> GAS's rollout scores on the public run, memorized


class Memorizer(BaseEstimator):
    name = "memorizer"

    def score_rollouts(self, view):
        key = (view.seed, view.behavior.id)
        if view.granularity == "rollout" and len(SCORES.get(key, ())) == view.n:
            return np.asarray(SCORES[key], np.float64)
        return np.zeros(view.n)
"""


def test_verify_fails_an_entry_that_memorized_the_public_answers(micro_causal, live5,
                                                                tmp_path, monkeypatch):
    """An entry that returns answers memorized from the public release (here GAS's own rollout
    scores there; the micro release's group labels score below its random band) keeps its
    public score and falls to the random band on a live draw: the live check fails it, naming
    the draw and the command that reproduces it."""
    from benchmark.contract import load_estimator_file
    from benchmark.releases.data import load_seed
    from benchmark.releases.release import load_release
    from benchmark.submissions import submit, verify_submission

    rel = load_release(micro_causal)
    gas = load_estimator_file(GAS).instantiate()
    scores = {(s, t): [float(x) for x in gas.score_rollouts(td.rollout_view)]
              for s in rel.seeds for t, td in load_seed(rel, s, "gradient").items()}
    est = tmp_path / "memorizer.py"
    est.write_text(MEMORIZER.format(scores=scores))
    sub = submit(est, "memorizer", ["A"], release=micro_causal,
                 submissions_dir=tmp_path / "submissions", progress=False)
    report = verify_submission(sub, micro_causal, progress=False, live_draw=DRAW, live_scale=SCALE)
    assert not report.drifts and report.error is None and not report.ok
    lc = report.live_check
    assert lc["ok"] is False and lc["draw_id"] == DRAW
    assert "significantly above the random band on the public release" in lc["reason"]
    text = report.format()
    assert f"live check on draw {DRAW} (micro-family): FAILED" in text
    assert f"reproduce: bt-bench verify {sub} --live-draw {DRAW} --live-scale micro-family" in text

    # the same file as an attack control (estimators/controls/attacks/): being caught is the
    # expected outcome, so verify passes it, and would fail it if the check let it through
    import benchmark.submissions.files as F
    import benchmark.submissions.gate as G

    attacks = tmp_path / "attacks"
    attacks.mkdir()
    (attacks / "memorizer.py").write_bytes(est.read_bytes())
    monkeypatch.setattr(F, "ATTACK_CONTROLS_DIR", attacks)
    sub = submit(est, "memorizer", ["A"], release=micro_causal,
                 submissions_dir=tmp_path / "attack-submissions", progress=False, force=True)
    assert "kind: control" in (sub / "submission.yaml").read_text()
    report = verify_submission(sub, micro_causal, progress=False, live_draw=DRAW, live_scale=SCALE)
    lc = report.live_check
    assert report.ok and lc["ok"] is True and lc["expected"] == "fail"
    assert lc["reason"].startswith("attack control, caught as expected")
    # an attack control built on a method (public-tuned, label-first) is that method on a new
    # run: gated like an entry, so this memorizer under such a name is failed, not excused
    import shutil

    tuned = sub.parent / "public-tuned-tracincp"
    shutil.copytree(sub, tuned)
    (tuned / "submission.yaml").write_text((sub / "submission.yaml").read_text().replace(
        "name: memorizer", "name: public-tuned-tracincp"))
    report = verify_submission(tuned, micro_causal, progress=False, live_draw=DRAW,
                               live_scale=SCALE)
    assert not report.ok and report.live_check["ok"] is False
    assert "expected" not in report.live_check
    # a control that is not an attack control (the evaluator's own) is not gated, nor scored
    monkeypatch.setattr(G, "_is_attack_control", lambda sub: False)
    monkeypatch.setattr("benchmark.live.score_live", lambda *a, **k: 1 / 0)
    report = verify_submission(sub, micro_causal, progress=False, live_draw=DRAW, live_scale=SCALE)
    lc = report.live_check
    assert report.ok and lc["ok"] is True and lc["gated"] is False
    assert lc["reason"].startswith("control, not gated")


def _sha(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()
