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
