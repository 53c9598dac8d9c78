"""Trust boundaries outside the sandbox (issue 35, docs/security.md): files another party could
have written are never unpickled, the cache root is private, untrusted JSON is parsed within
limits, draw ids are ASCII digits in range.

Each test plants what an attacker would (a pickle whose payload creates a marker file, a deep or
long-numbered JSON, a shared cache folder) and checks that nothing runs and the refusal is a
:class:`~benchmark.errors.BenchmarkError` naming the file and the fix.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmark.errors import UnsafeFileError

ROOT = Path(__file__).resolve().parents[1]


class _Payload:
    """Pickles to a call of ``os.system`` that creates ``marker`` (what a planted entry runs)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant_pt(path: Path, marker: Path, around: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**(around or {}), "payload": _Payload(marker)}, path)


def _plant_npy(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.array([_Payload(marker)], dtype=object), allow_pickle=True)


# ----------------------------------------------------------------------------------------------
# the replay store


@pytest.fixture
def store(tmp_path):
    from benchmark.causal.store import ReplayStore

    return ReplayStore(tmp_path / "release", "0" * 64, root=tmp_path / "cache",
                       machine={"key": "test-machine"})


def test_replay_store_never_unpickles_a_planted_entry(store, tmp_path):
    from benchmark.causal.store import Job, baseline_job

    marker = tmp_path / "PAYLOAD_RAN"
    base = store.path(baseline_job(0))
    _plant_pt(base, marker, {"measures": {}, "stops": {}, "first_divergent_step": None})
    _plant_pt(store.state_path(0, 0), marker)
    job = Job(0, "zorp", (1, 2), 3, 4)
    _plant_npy(store.path(job), marker)

    with pytest.raises(UnsafeFileError, match=r"baseline\.pt: refused to load .*GLOBAL "
                                              r"posix\.system.*never pickled objects; delete"):
        store.baseline(0)
    with pytest.raises(UnsafeFileError, match=r"state_0000\.pt: refused to load.*delete it"):
        store.state(0, 0)
    with pytest.raises(UnsafeFileError, match=r"zorp_\w+\.npy: refused to load .*Object arrays"
                                              r".*delete it: bt-bench rebuilds"):
        store.result(job)
    # the planner asks has(): a bad entry is dropped, so it is replayed again (rebuilt)
    assert not store.has(baseline_job(0)) and not base.exists()
    assert not store.has(job) and not store.path(job).exists()
    assert not marker.exists(), "a planted pickle ran"


def test_replay_store_reads_the_files_it_writes(store):
    """The on-disk format is unchanged (numpy measures inside baseline.pt), so existing stores
    stay valid; a file of the wrong form is refused."""
    from benchmark.causal.store import Job, _save_npy, baseline_job, write_atomically

    out = {"measures": {"zorp": np.linspace(0, 1, 5)[:4]}, "stops": {"zorp": 3},
           "first_divergent_step": None}
    write_atomically(store.path(baseline_job(0)), lambda p: torch.save(out, p))
    state = {"step": 10, "params": {"w": torch.ones(2, 3, dtype=torch.float64)},
             "exp_avg": {"w": torch.zeros(2, 3, dtype=torch.float64)},
             "exp_avg_sq": {"w": torch.zeros(2, 3, dtype=torch.float64)}}
    write_atomically(store.state_path(0, 10), lambda p: torch.save(state, p))
    job = Job(0, "zorp", (1,), 3, 4)
    _save_npy(store.path(job), np.arange(4.0))
    assert store.has(baseline_job(0)) and store.has(job)
    assert np.array_equal(store.baseline(0)["measures"]["zorp"], out["measures"]["zorp"])
    assert torch.equal(store.state(0, 10)["params"]["w"], state["params"]["w"])
    assert np.array_equal(store.result(job), np.arange(4.0))
    with pytest.raises(UnsafeFileError, match=r"not a replay state of step 20"):
        torch.save(state, store.state_path(0, 20))
        store.state(0, 20)
    np.save(store.path(job), np.zeros((2, 2)))
    with pytest.raises(UnsafeFileError, match=r"shape \(2, 2\); expected float64 array of 1 "
                                              r"dimensions; delete it"):
        store.result(job)


# ----------------------------------------------------------------------------------------------
# the build's resume file and per-step shards


def test_build_never_unpickles_a_planted_shard_or_resume(tmp_path):
    from benchmark.build import _resume_hint
    from benchmark.build.pipeline import SeedBuild
    from benchmark.build.presets import get_preset

    marker = tmp_path / "PAYLOAD_RAN"
    sb = SeedBuild(get_preset("micro", 0), tmp_path / "out", progress=False)
    _plant_pt(sb._shard(0, 0), marker, {"rows": [], "grad_index": [], "sketches": None,
                                        "exact": None})
    with pytest.raises(UnsafeFileError, match=r"step00000\.pt: refused to load .*posix\.system"
                                              r".*delete .*seed0 and rerun the build"):
        sb._merge_shards(10, None, [])
    resume = sb._grpo_dir() / "resume.pt"
    _plant_pt(resume, marker, {"step": 5})
    hint = _resume_hint(tmp_path / "out", [0])
    assert re.search(r"seed 0: its .*resume\.pt is refused \(delete .*seed0", hint), hint
    assert not marker.exists(), "a planted pickle ran"


def test_a_resume_file_as_the_build_writes_it_loads():
    """``resume.pt`` (model and AdamW state dicts, the curve) passes the no-pickle loader."""
    import io

    from benchmark.io import load_plain

    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"step": 4, "curve": [{"step": 0, "zorp_prob": 0.5}], "model": m.state_dict(),
                "optimizer": opt.state_dict()}, buf)
    path = Path(os.environ["BT_BENCH_CACHE"]) / "resume-test.pt"
    path.write_bytes(buf.getvalue())
    st = load_plain(path, "")
    m2 = torch.nn.Linear(3, 2)
    m2.load_state_dict(st["model"])
    torch.optim.AdamW(m2.parameters(), lr=1e-3).load_state_dict(st["optimizer"])
    assert st["step"] == 4 and torch.equal(m2.weight, m.weight)


def test_no_pickle_loading_is_left_in_the_code():
    """Every ``torch.load`` names ``weights_only=True``; no ``np.load`` allows pickles."""
    bad = []
    for p in sorted((ROOT / "benchmark").rglob("*.py")):
        src = p.read_text()
        for m in re.finditer(r"torch\.load\(([^()]|\([^()]*\))*\)", src):
            if "weights_only=True" not in m.group(0):
                bad.append(f"{p.relative_to(ROOT)}: {m.group(0)[:80]}")
        for m in re.finditer(r"np\.load\(([^()]|\([^()]*\))*\)", src):
            if "allow_pickle=False" not in m.group(0):
                bad.append(f"{p.relative_to(ROOT)}: {m.group(0)[:80]}")
        if "weights_only=False" in src or "allow_pickle=True" in src or "pickle.load" in src:
            bad.append(f"{p.relative_to(ROOT)}: unpickles")
    assert not bad, "\n".join(bad)
