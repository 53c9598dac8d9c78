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
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmark.errors import (
    BenchmarkError,
    BuildError,
    CacheRootError,
    InputLimitError,
    UnsafeFileError,
)

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
    with open(path, "wb") as fh:  # a file object: np.save would append .npy to other names
        np.save(fh, np.array([_Payload(marker)], dtype=object), allow_pickle=True)


# ----------------------------------------------------------------------------------------------
# the replay store


@pytest.fixture
def store(tmp_path):
    from benchmark.causal.store import ReplayStore

    return ReplayStore(tmp_path / "release", "0" * 64, root=tmp_path / "cache",
                       machine={"key": "test-machine"})


def _sealed(store, path: Path, plant) -> None:
    """Plant a file through ``plant(path)`` and seal it as the store would: even an entry that
    carries a valid seal (written by a buggy or older bt-bench) is never unpickled."""
    store.put(path, lambda p: plant(p))


def test_replay_store_never_unpickles_a_planted_entry(store, tmp_path):
    from benchmark.causal.store import Job, baseline_job

    marker = tmp_path / "PAYLOAD_RAN"
    base = store.path(baseline_job(0))
    _sealed(store, base, lambda p: _plant_pt(
        p, marker, {"measures": {}, "stops": {}, "first_divergent_step": None}))
    _sealed(store, store.state_path(0, 0), lambda p: _plant_pt(p, marker))
    job = Job(0, "zorp", (1, 2), 3, 4)
    _sealed(store, store.path(job), lambda p: _plant_npy(p, marker))

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
    from benchmark.causal.store import Job, _save_npy, baseline_job

    out = {"measures": {"zorp": np.linspace(0, 1, 5)[:4]}, "stops": {"zorp": 3},
           "first_divergent_step": None}
    store.put(store.path(baseline_job(0)), lambda p: torch.save(out, p))
    state = {"step": 10, "params": {"w": torch.ones(2, 3, dtype=torch.float64)},
             "exp_avg": {"w": torch.zeros(2, 3, dtype=torch.float64)},
             "exp_avg_sq": {"w": torch.zeros(2, 3, dtype=torch.float64)}}
    store.put(store.state_path(0, 10), lambda p: torch.save(state, p))
    job = Job(0, "zorp", (1,), 3, 4)
    _save_npy(store, store.path(job), np.arange(4.0))
    assert store.has(baseline_job(0)) and store.has(job)
    assert np.array_equal(store.baseline(0)["measures"]["zorp"], out["measures"]["zorp"])
    assert torch.equal(store.state(0, 10)["params"]["w"], state["params"]["w"])
    assert np.array_equal(store.result(job), np.arange(4.0))
    with pytest.raises(UnsafeFileError, match=r"not a replay state of step 20"):
        store.put(store.state_path(0, 20), lambda p: torch.save(state, p))
        store.state(0, 20)
    store.put(store.path(job), lambda p: np.save(open(p, "wb"), np.zeros((2, 2))))
    with pytest.raises(UnsafeFileError, match=r"shape \(2, 2\); expected float64 array of 1 "
                                              r"dimensions; delete it"):
        store.result(job)


def test_a_replay_store_entry_edited_in_place_or_copied_from_elsewhere_is_rebuilt(
        store, tmp_path, monkeypatch):
    """Issue 39: a store entry is bound to this machine's key. An edited value (its form still
    right), an unsealed file, a seal copied beside other bytes, and a whole entry sealed under
    another machine's key are all refused and dropped, so they are replayed again."""
    from benchmark.causal.store import Job, _save_npy
    from benchmark.seal import KEY_ENV

    job = Job(0, "zorp", (1,), 3, 4)
    _save_npy(store, store.path(job), np.arange(4.0))
    assert store.has(job)
    # edited in place: the right form, another number (what would move a causal score)
    np.save(store.path(job), np.arange(4.0) + 0.5)
    with pytest.raises(UnsafeFileError, match=r"seal is missing or does not match.*delete it"):
        store.result(job)
    assert not store.has(job) and not store.path(job).exists()
    # planted without a seal (the refused entry's seal went with it)
    assert not store.path(job).with_name(store.path(job).name + ".seal").exists()
    np.save(store.path(job), np.arange(4.0) + 0.5)
    assert not store.has(job)
    # a genuine entry, then the same bytes and seal under another key (a restored CI cache)
    _save_npy(store, store.path(job), np.arange(4.0))
    assert store.has(job)
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "other-machine.key"))
    from benchmark.causal.store import ReplayStore

    fresh = ReplayStore(store.release_path, store.manifest_sha256, root=store.root,
                        machine=store.machine)
    assert not fresh.has(job) and not fresh.path(job).exists()


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


# ----------------------------------------------------------------------------------------------
# the cache root


def test_cache_root_is_created_private(tmp_path, monkeypatch):
    from benchmark.io import cache_root

    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "new" / "cache"))
    root = cache_root()
    assert root.is_dir() and (root.stat().st_mode & 0o777) == 0o700


def test_cache_root_others_can_write_is_refused(tmp_path, monkeypatch):
    from benchmark.io import cache_root

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("BT_BENCH_CACHE", str(shared))
    monkeypatch.delenv("BT_BENCH_CACHE_INSECURE_OK", raising=False)
    with pytest.raises(CacheRootError, match=rf"cache folder {re.escape(str(shared))} is "
                                             r"writable by group or others \(mode 0777\).*"
                                             rf"fix: chmod 700 {re.escape(str(shared))}.*"
                                             r"BT_BENCH_CACHE_INSECURE_OK=1"):
        cache_root()
    shared.chmod(0o1777)  # sticky, like /tmp: others still plant files
    with pytest.raises(CacheRootError, match=r"mode 1777"):
        cache_root()
    monkeypatch.setenv("BT_BENCH_CACHE_INSECURE_OK", "1")
    assert cache_root() == shared


def test_cache_root_of_another_user_is_refused(tmp_path, monkeypatch):
    from benchmark.io import cache_root

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root (CI runs as root)")
    os.chown(theirs, 65534, 65534)  # nobody
    monkeypatch.setenv("BT_BENCH_CACHE", str(theirs))
    monkeypatch.delenv("BT_BENCH_CACHE_INSECURE_OK", raising=False)
    with pytest.raises(CacheRootError, match=r"is owned by user id 65534, not by this user.*"
                                             r"chown it to yourself and chmod 700"):
        cache_root()


def test_cache_root_symlink_is_refused(tmp_path, monkeypatch):
    from benchmark.io import cache_root

    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "link"))
    with pytest.raises(CacheRootError, match=r"is not a folder \(a symlink or a file\)"):
        cache_root()


# ----------------------------------------------------------------------------------------------
# untrusted JSON: read_json's limits


def _timed_refusal(path: Path, match: str) -> None:
    from benchmark.io import read_json

    t0 = time.perf_counter()
    with pytest.raises(InputLimitError, match=match):
        read_json(path)
    assert time.perf_counter() - t0 < 1.0


def test_read_json_deep_nesting_is_refused_without_recursion(tmp_path):
    p = tmp_path / "results.json"
    p.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _timed_refusal(p, rf"{re.escape(str(p))}:1:\d+: JSON nested deeper than 64 levels")
    p.write_text('{"a": "' + "[" * 100_000 + '"}')  # brackets inside a string are text
    from benchmark.io import read_json

    assert read_json(p) == {"a": "[" * 100_000}


def test_read_json_huge_number_is_refused(tmp_path):
    p = tmp_path / "results.json"
    p.write_text('{"live": {"draws": [{"draw_id": ' + "7" * 10_000 + "}]}}")
    _timed_refusal(p, r"results\.json:1:\d+: a number literal of 10000 characters \(at most "
                      r"100\)")


def test_read_json_size_cap(tmp_path):
    from benchmark.io import read_json

    p = tmp_path / "results.json"
    p.write_text('{"a": "' + "x" * 2000 + '"}')
    with pytest.raises(InputLimitError, match=r"larger than 1000 bytes"):
        read_json(p, max_bytes=1000)
    p.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(BenchmarkError, match=r"not UTF-8 text"):
        read_json(p)


# ----------------------------------------------------------------------------------------------
# draw ids


@pytest.mark.parametrize("bad", ["²", "٧", "７", " 7", "7 ", "+7", "-1", "0x7", "7.0", "",
                                 "1" * 10_000, "9" * 21, 2**31, -1, True, False, 7.0, None,
                                 "2147483648", 10**5000],
                         ids=lambda v: f"{type(v).__name__}-"
                                       f"{v.bit_length() if isinstance(v, int) else ascii(v)[:12]}")
def test_check_draw_id_refuses_all_but_ascii_digits_in_range(bad):
    from benchmark.live import check_draw_id

    t0 = time.perf_counter()
    with pytest.raises(BuildError, match=r"live draw id .* is not valid; expected an integer "
                                         r"in \[0, 2147483648\).*ASCII digits.*--live-draw 7"):
        check_draw_id(bad)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize(("good", "value"), [("7", 7), (7, 7), ("0", 0), (np.int64(5), 5),
                                             ("2147483647", 2**31 - 1), ("007", 7)])
def test_check_draw_id_accepts_ascii_digits(good, value):
    from benchmark.live import check_draw_id

    assert check_draw_id(good) == value


def test_load_plain_reads_an_empty_array(tmp_path):
    """A build shard holds empty arrays (a step with no captured gradient); protocol-2 pickles
    write their data as GLOBAL bytes, a pure constructor that must be admitted (the float64
    family build failed on it at its first fidelity step)."""
    import io

    import numpy as np
    import torch

    from benchmark.io import load_plain

    buf = io.BytesIO()
    torch.save({"exact": np.zeros((0, 5), np.float64), "rows": [1]}, buf)
    (tmp_path / "s.pt").write_bytes(buf.getvalue())
    got = load_plain(tmp_path / "s.pt", "delete it")
    assert got["exact"].shape == (0, 5) and got["rows"] == [1]
