"""The memorizer attack control (``scripts/make_memorizer.py``): the oracle's precision on the
release whose labels it embeds, all-equal scores on any other run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmark.evaluate import EvalSettings, evaluate

ROOT = Path(__file__).resolve().parents[1]
NO_CAUSAL = EvalSettings(n_boot_precision=200, n_boot_auc=200, causal=False)


def _script():
    spec = importlib.util.spec_from_file_location("make_memorizer",
                                                  ROOT / "scripts" / "make_memorizer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_memorizer", mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def memorizer(micro_release, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("memorizer")
    done = _script().make_memorizer(micro_release, out)
    # three seeds, two tasks, two draws per (seed, task)
    assert done["counts"]["runs"] == 6 and done["counts"]["draws"] == 12
    return out


@pytest.fixture(scope="module")
def other_build(tmp_path_factory) -> Path:
    """A micro build of another seed (a run the memorizer has never seen)."""
    from benchmark.build import build_release

    out = tmp_path_factory.mktemp("micro_seed3")
    build_release("micro", [3], out, progress=False)
    return out


def _load(folder: Path):
    from benchmark.contract import load_estimator_file

    return load_estimator_file(folder / "estimator.py").instantiate()


def test_the_folder_is_a_gradient_track_control(memorizer, micro_release):
    from benchmark.submissions import validate_metadata

    meta = yaml.safe_load((memorizer / "submission.yaml").read_text())
    assert validate_metadata(meta) == meta
    assert meta["kind"] == "control" and meta["track"] == "gradient"
    assert meta["name"] == "memorizer" and "embeds the release's public labels" in \
        meta["description"]
    est = _load(memorizer)
    assert (est.name, est.track, est.tasks) == ("memorizer", "gradient", ("rollouts", "draws"))
    # the same release gives the same bytes
    again = memorizer.parent / "again"
    _script().make_memorizer(micro_release, again)
    assert (again / "estimator.py").read_bytes() == (memorizer / "estimator.py").read_bytes()


def test_on_its_release_it_scores_like_the_oracle(memorizer, micro_release):
    """Scored in the sandbox (views exported and read back): precision at the ceiling at both
    granularities on every seed and task, draw AUC 1.0 wherever it is defined."""
    res = evaluate(memorizer / "estimator.py", micro_release, NO_CAUSAL, progress=False)
    assert "sandbox" in res["isolation"]["protections"]
    checked, aucs = 0, []
    for t, task in res["tasks"].items():
        for s, block in task["seeds"].items():
            for gran in ("rollout", "step"):
                w = block["training"]["memorizer"][gran]["group"].get("window")
                if w is None:  # no ground truth in this seed's window
                    continue
                assert w["precision"] == w["ceiling"], (t, s, gran, w)
                checked += 1
            for d, m in block["draws"]["memorizer"].items():
                auc = m["raw"]["point"]  # NaN: a draw where every response, or none, has it
                assert auc == 1.0 or np.isnan(auc), (t, s, d)
                aucs.append(auc)
    assert checked >= 6 and aucs.count(1.0) >= 6
    for t, task in res["tasks"].items():
        pw = task["summary"]["precision_window_group"]["memorizer"]
        assert pw["point"] == 1.0, t


def test_on_another_run_every_score_is_equal(memorizer, other_build):
    from benchmark.releases.data import load_seed
    from benchmark.releases.release import load_release

    est = _load(memorizer)
    rel = load_release(other_build)
    for td in load_seed(rel, 3, "gradient").values():
        for view in (td.rollout_view, td.step_view):
            scores = est.score_rollouts(view)
            assert scores.shape == (view.n,) and np.all(scores == 0.0)
        assert td.draws
        for d in td.draws:
            assert np.all(est.score_draw(td.rollout_view, d) == 0.0)
        # labels exist on that run: the memorizer just does not have them
        assert td.gt["group"].any()


def test_packing_round_trips():
    mod = _script()
    labels = np.array([1, 0, 0, 1, 1, 0, 1, 0, 1, 1, 0], bool)
    table = {"k": mod.pack(labels)}
    est = mod.template_module({"id": "x", "version": "1", "manifest_sha256": "0" * 64},
                              mod.encode_table(table))
    np.testing.assert_array_equal(est._labels("k", labels.size), labels.astype(np.float64))
    assert est._labels("k", labels.size + 1) is None  # another size: not this view
    assert est._labels("other", labels.size) is None
