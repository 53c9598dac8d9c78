"""Shared fixtures: the paper's reference files (skipped with a reason when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def reference_dir() -> Path:
    """The paper's released files: ``$BT_BENCH_REFERENCE`` or ``<repo>/../shared/reference``."""
    env = os.environ.get("BT_BENCH_REFERENCE")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def paper_runs() -> Path:
    runs = reference_dir() / "paper-runs"
    if not (runs / "results_table.csv").is_file():
        pytest.skip(
            f"the paper's reference files are not at {runs} (set BT_BENCH_REFERENCE to the "
            "folder holding paper-runs/); .ci/run requires them, so CI always runs these tests"
        )
    return runs


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """One replay store and requirements cache for the session, not the user's ~/.cache/bt-bench:
    tests neither read what an earlier run left there nor leave their micro releases' replays."""
    if os.environ.get("BT_BENCH_CACHE"):
        yield Path(os.environ["BT_BENCH_CACHE"])
        return
    path = tmp_path_factory.mktemp("bt-bench-cache")
    os.environ["BT_BENCH_CACHE"] = str(path)
    # the key that seals cache entries (benchmark.seal) lives outside the cache, as it must
    key_set = "BT_BENCH_CACHE_KEY" not in os.environ
    if key_set:
        os.environ["BT_BENCH_CACHE_KEY"] = str(tmp_path_factory.mktemp("bt-bench-key") / "key")
    try:
        yield path
    finally:
        del os.environ["BT_BENCH_CACHE"]
        if key_set:
            del os.environ["BT_BENCH_CACHE_KEY"]


@pytest.fixture(scope="session")
def micro_release(tmp_path_factory) -> Path:
    """A three-seed release of the ``micro`` preset (two GRPO steps), built once per session."""
    from benchmark.build import build_release

    out = tmp_path_factory.mktemp("micro_release")
    build_release("micro", [0, 1, 2], out, progress=False)
    return out


@pytest.fixture(scope="session")
def micro_causal(micro_release, tmp_path_factory) -> Path:
    """The micro release with a causal reference (two random sets per k), built once."""
    import shutil

    from benchmark.causal.reference import install, reference
    from benchmark.releases.release import load_release

    out = tmp_path_factory.mktemp("micro_causal") / "rel"
    shutil.copytree(micro_release, out)
    rel = load_release(out)
    install(out, {s: reference(rel, s, workers=2, progress=False, n_random=2)
                  for s in rel.seeds})
    return out
