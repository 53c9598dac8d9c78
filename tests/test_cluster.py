"""The Ray executor: a local cluster of two worker nodes gives the local path's numbers."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip(
    "ray", reason="the Ray executor is the [cluster] extra (pip install -e '.[test,cluster]'; "
                  ".ci/run installs it, so CI runs this test)")


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head node that runs no replay and two worker nodes of one CPU each, started here."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_ADDRESS", cluster.address)
    mp.setenv("BT_BENCH_RAY_UNAUTHENTICATED_OK", "1")  # this test's own cluster, on this machine
    try:
        yield cluster
    finally:
        ray.shutdown()
        mp.undo()
        cluster.shutdown()


def _jobs(rel, seeds=(0, 1)):
    from benchmark.causal import score as C
    from benchmark.causal.replays import Job

    jobs = []
    for s in seeds:
        raw = C.load_reference(rel.path, s)
        n, nps = raw["n_rollouts"], raw["n_per_step"]
        rng = np.random.default_rng(s)
        for t, v in raw["tasks"].items():
            w = v["window_end"]
            for k in (2, 5):
                pos = tuple(sorted(int(p) for p in rng.choice(min(n, w * nps), k, replace=False)))
                jobs.append(Job(s, t, pos, w, nps))
            jobs.append(Job(s, t, (), w, nps, bonus_off=True))
    return jobs


def test_a_mixed_cluster_is_refused(monkeypatch):
    from benchmark.causal import cluster

    fps = iter([{"node": "a" * 16, "fingerprint": {"key": "k1", "cpu": "CPU one"}},
                {"node": "b" * 16, "fingerprint": {"key": "k2", "cpu": "CPU two"}}])
    with pytest.raises(cluster.ClusterError, match=r"different machines .*k1 on node a+.*CPU "
                                                   r"one.*k2.*run on a cluster of one machine"):
        cluster._check_one_machine([next(fps), next(fps)])


# ----------------------------------------------------------------------------------------------
# a private cluster unless the user names one (issue 35, docs/security.md)


def _ray_processes(needle: str = "ray") -> list[str]:
    import subprocess

    out = subprocess.run(["ps", "-ww", "-eo", "pid,stat,args"], capture_output=True,
                         text=True).stdout
    # a zombie (stat Z, "<defunct>") has exited already: only its parent has not reaped it yet
    rows = [ln.split(None, 2) for ln in out.splitlines()[1:]]
    return [" ".join(r) for r in rows if len(r) == 3 and not r[1].startswith("Z")
            and needle in r[2].lower() and "pytest" not in r[2]]


def test_private_cluster_ignores_a_planted_cluster_and_leaves_no_process(tmp_path, monkeypatch):
    """A ``ray_current_cluster`` file in ``$TMPDIR/ray`` (what another local user plants) is not
    joined; the cluster bt-bench starts authenticates, lives in a 0700 folder of its own, and no
    Ray process survives :func:`shutdown`."""
    from benchmark.causal import cluster

    planted = tmp_path / "ray"
    planted.mkdir(mode=0o777)
    (planted / "ray_current_cluster").write_text("203.0.113.9:6379")  # TEST-NET-3: no one
    for k in ("TMPDIR", "RAY_TMPDIR"):
        monkeypatch.setenv(k, str(tmp_path))
    for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    assert not ray.is_initialized()
    before = len(_ray_processes())
    try:
        r = cluster._ray()
        folder = cluster._LOCAL["folder"]
        assert (folder.stat().st_mode & 0o777) == 0o700
        assert ((folder / "auth_token").stat().st_mode & 0o777) == 0o600
        gcs = r.get_runtime_context().gcs_address
        assert not gcs.startswith("203.0.113.9"), gcs
        from ray._raylet import AuthenticationMode, get_authentication_mode

        assert get_authentication_mode() == AuthenticationMode.TOKEN
        assert r.get(r.remote(lambda: 6 * 7).remote()) == 42
        assert _ray_processes(str(folder)), "the cluster's processes run from its folder"
    finally:
        cluster.shutdown()
    import time

    deadline = time.monotonic() + 20
    while (_ray_processes(str(folder)) or len(_ray_processes()) > before) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ray_processes(str(folder)), "a Ray process outlived bt-bench"
    assert len(_ray_processes()) <= before
    assert not folder.exists() and "RAY_AUTH_MODE" not in __import__("os").environ


def test_a_named_cluster_needs_authentication_or_an_explicit_opt_out(monkeypatch, capsys):
    from benchmark.causal import cluster

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv(cluster.UNAUTHENTICATED_ENV, raising=False)
    with pytest.raises(cluster.ClusterError, match=r"RAY_ADDRESS=192\.0\.2\.7:6379 names a "
                                                   r"Ray cluster, which runs bt-bench's code.*"
                                                   r"set RAY_AUTH_MODE=token.*"
                                                   r"BT_BENCH_RAY_UNAUTHENTICATED_OK=1"):
        cluster._check_named_cluster("192.0.2.7:6379")
    monkeypatch.setenv(cluster.UNAUTHENTICATED_ENV, "1")
    cluster._check_named_cluster("192.0.2.7:6379")
    assert "WARNING: using the Ray cluster at 192.0.2.7:6379 without token" in \
        capsys.readouterr().err
    monkeypatch.delenv(cluster.UNAUTHENTICATED_ENV)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    cluster._check_named_cluster("192.0.2.7:6379")


def test_an_old_ray_is_refused(monkeypatch):
    from benchmark.causal import cluster

    monkeypatch.setattr(ray, "__version__", "2.9.3")
    with pytest.raises(cluster.ClusterError, match=r"Ray 2\.9\.3 is installed; the ray "
                                                   r"executor needs Ray >= 2\.60"):
        cluster._ray()


def test_what_a_worker_returns_is_checked_before_use(tmp_path):
    import io
    import os

    from benchmark.causal import cluster
    from benchmark.causal.store import ReplayStore

    store = ReplayStore(tmp_path / "rel", "0" * 64, root=tmp_path / "c", machine={"key": "m"})

    def npy(arr, **kw) -> bytes:
        buf = io.BytesIO()
        np.save(buf, arr, **kw)
        return buf.getvalue()

    good = {"files": {"seed0/zorp_abc.npy": npy(np.arange(3.0))}, "batches": [{"jobs": 1}],
            "seconds": 1.5}
    assert cluster._check_lane_result(good, store) is good

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'RAN'}",))

    for bad, match in [
        ("not a dict", r"returned a str that is not \{files, batches, seconds\}"),
        (good | {"files": {"../../../etc/x.npy": b""}}, r"a file named '\.\./\.\./"),
        (good | {"files": {"seed0/zorp_abc.npy": "text"}}, r"as str, not bytes"),
        (good | {"files": {"seed0/zorp_abc.npy": npy(np.arange(3, dtype=np.float32))}},
         r"does not load as a replay-store entry .*float32"),
        (good | {"files": {"seed0/zorp_abc.npy": npy(np.array([Payload()]), allow_pickle=True)}},
         r"Object arrays cannot be loaded"),
        (good | {"batches": [{"jobs": True}]}, r"a batch without a job count"),
    ]:
        with pytest.raises(cluster.ClusterError, match=match):
            cluster._check_lane_result(bad, store)
    assert not (tmp_path / "RAN").exists()


# the two-node cluster (a module fixture that stays connected) last: the tests above start and
# stop their own clusters and must find Ray not initialized
def test_ray_cluster_replays_equal_the_local_ones(two_node_cluster, micro_causal, tmp_path,
                                                   monkeypatch):
    from benchmark.causal.cluster import cluster_fingerprint
    from benchmark.causal.replays import baseline_job, open_store, run_jobs
    from benchmark.machine import fingerprint
    from benchmark.releases.release import load_release

    rel = load_release(micro_causal)
    assert cluster_fingerprint()["key"] == fingerprint()["key"]  # one machine here
    assert len([n for n in ray.nodes() if n["Alive"]]) == 3
    jobs = _jobs(rel)
    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "local"))
    local = open_store(rel.path, rel.manifest_sha256, "local")
    run_jobs(local, rel.manifest_sha256, jobs, workers=2, executor="local")
    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "ray"))
    remote = open_store(rel.path, rel.manifest_sha256, "ray")
    facts = run_jobs(remote, rel.manifest_sha256, jobs, workers=2, executor="ray")
    assert facts["executor"] == "ray" and len(facts["lanes"]) == 2  # both worker nodes ran
    # the two seeds' baselines ran first, one lane each; the removals then spread over both
    assert len(facts["baseline_lanes"]) == 2 and facts["baselines"] == 2
    for j in jobs:
        assert np.array_equal(remote.result(j), local.result(j)), j.key
    for s in (0, 1):
        a, b = local.baseline(s), remote.baseline(s)
        assert all(np.array_equal(a["measures"][t], b["measures"][t]) for t in a["measures"])
    # a second run finds everything stored and replays nothing
    assert run_jobs(remote, rel.manifest_sha256, jobs, workers=2,
                    executor="ray")["replayed"] == 0
    # removal replays that start from a stored baseline state, shipped to the nodes
    more = _jobs(rel)[:1]
    more = [type(more[0])(more[0].seed, more[0].task, more[0].positions[:1], more[0].stop,
                          more[0].n_per_step)]
    run_jobs(remote, rel.manifest_sha256, more, workers=2, executor="ray")
    run_jobs(local, rel.manifest_sha256, more, workers=2, executor="local")
    assert np.array_equal(remote.result(more[0]), local.result(more[0]))
    assert remote.has(baseline_job(0))


def test_same_causal_numbers_from_both_executors(two_node_cluster, micro_causal, tmp_path,
                                                  monkeypatch):
    from benchmark.causal import score as C
    from benchmark.releases.release import load_release

    rel = load_release(micro_causal)
    n = C.load_reference(micro_causal, 2)["n_rollouts"]
    scores = {(2, t): {"mine": np.random.default_rng(7).random(n), "norm-only": np.zeros(n),
                       "step-order": -np.arange(n, dtype=float)} for t in rel.tasks}
    out = {}
    for name in ("local", "ray"):
        monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / name))
        monkeypatch.setenv("BT_BENCH_EXECUTOR", name)
        out[name], _ = C.causal_results(rel, scores, "mine", settings=C.CausalSettings(n_boot=200))
    assert out["local"] == out["ray"]
