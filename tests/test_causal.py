"""Causal scoring (benchmark.causal) on a small case: the micro release with reference effects."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from benchmark import causal
from benchmark.release import load_release


@pytest.fixture(scope="module")
def micro_causal(micro_release, tmp_path_factory):
    """A copy of the micro release with reference effects for seeds 0 and 1 (manifest rewritten)."""
    root = tmp_path_factory.mktemp("micro_causal") / "rel"
    shutil.copytree(micro_release, root)
    work = root.parent / "work"
    work.mkdir()
    for s in (0, 1):
        data = causal.reference_effects(root / f"seed{s}", n_random=3, lds_sets=4,
                                        progress=False)
        (work / f"seed{s}.json").write_text(json.dumps(data))
    before = json.loads((root / "manifest.json").read_text())["files"]
    causal.install_reference(root, work, [0, 1])
    return root, before


def test_reference_effects_prove_exact_replay_and_keep_other_files(micro_causal):
    root, before = micro_causal
    rel = load_release(root)  # verifies every sha256, causal.json included
    m = rel.manifest
    for s in (0, 1):
        ref = causal.load_reference(root, s)
        assert ref["exact_replay"]["all_equal"] is True
        assert ref["exact_replay"]["responses_first_divergent_step"] is None
        for c in ref["exact_replay"]["curve"].values():
            assert c["replay"] == c["recorded"]
        assert ref["gt_size"] == int(rel.labels(s)["group_label"].sum())
        assert len(ref["removals"]["random_group_label_size"]) == 3
        assert f"seed{s}/causal.json" in m["files"]
        assert m["seeds"][str(s)]["causal"]["exact_replay"]["all_equal"] is True
    for k, v in before.items():  # every other file unchanged
        assert m["files"][k] == v


def test_top_k_breaks_ties_by_rollout_order():
    s = np.array([0.0, 2.0, 1.0, 2.0, np.nan, 1.0])
    assert causal.top_k_positions(s, 3).tolist() == [1, 2, 3]
    assert causal.top_k_positions(np.zeros(4), 2).tolist() == [0, 1]
    assert causal.top_k_positions(s, 6).tolist() == [0, 1, 2, 3, 4, 5]


def test_causal_scores_api_small_case(micro_causal):
    root, _ = micro_causal
    rel = load_release(root, verify=False)
    n = causal.load_reference(root, 0)["n_rollouts"]
    scores = {}
    for s in (0, 1):
        gt = rel.labels(s)["group_label"].to_numpy(float)
        scores[s] = {"est": gt + 0.01 * np.arange(n)[::-1], "norm-only": np.ones(n),
                     "step-order": -np.arange(n, dtype=float)}
    out = causal.causal_scores(rel, [0, 1], scores, "est", parallel=True)
    json.dumps(out)  # plain JSON
    assert out["verdict"] in (causal.PASS, causal.FAIL)
    serial = causal.causal_scores(rel, [0, 1], scores, "est", parallel=False)
    for s in ("0", "1"):
        p = out["per_seed"][s]
        assert set(p["methods"]) == {"est", "norm-only", "step-order"}
        assert p["verdict"] in (causal.PASS, causal.FAIL)
        # same machine, same thread count: bit-identical local replays, in or out of process
        assert p["local_baseline"] == serial["per_seed"][s]["local_baseline"]
        for name, m in p["methods"].items():
            assert m["effect"] == serial["per_seed"][s]["methods"][name]["effect"]
            if p["bonus_off_effect"] != 0:
                assert m["fraction"] == pytest.approx(m["effect"] / p["bonus_off_effect"])
            else:
                assert m["fraction"] is None
        # norm-only's ties and step-order both pick the earliest rollouts: one replay, one effect
        assert p["methods"]["norm-only"]["effect"] == p["methods"]["step-order"]["effect"]
        assert p["beats"]["norm-only"] == p["beats"]["step-order"]
        assert p["local_baseline"] == p["reference_baseline"]


def test_estimator_equal_to_a_control_never_passes(micro_causal):
    root, _ = micro_causal
    n = causal.load_reference(root, 0)["n_rollouts"]
    sc = -np.arange(n, dtype=float)
    out = causal.causal_scores(root, [0], {0: {"step-order": sc, "norm-only": np.zeros(n)}},
                               "step-order", parallel=False)
    p = out["per_seed"]["0"]
    assert out["controls"] == ["norm-only", "step-order"]
    assert p["beats"]["step-order"] is False  # compared with itself
    assert p["verdict"] == causal.FAIL and out["verdict"] == causal.FAIL


def test_causal_scores_errors_and_not_run(micro_causal, micro_release):
    root, _ = micro_causal
    with pytest.raises(ValueError, match=r"no rollout scores for \['norm-only', 'step-order'\]"):
        causal.causal_scores(root, [0], {0: {"est": np.zeros(16)}}, "est", parallel=False)
    with pytest.raises(ValueError, match=r"shape \(3,\); expected \(16,\)"):
        causal.causal_scores(root, [0], {0: {"est": np.zeros(3), "norm-only": np.zeros(16),
                                             "step-order": np.zeros(16)}}, "est", parallel=False)
    out = causal.causal_scores(micro_release, [2], {}, "est")  # no reference effects shipped
    assert out["verdict"] == causal.NOT_RUN and "causal.json" in out["reason"]


def test_lds_on_reference_sets(micro_causal):
    root, _ = micro_causal
    ref = causal.load_reference(root, 0)
    res = causal.lds(np.arange(ref["n_rollouts"], dtype=float), ref, n_boot=50)
    assert res["n_sets"] == 4 and -1.0 <= res["rho"] <= 1.0
