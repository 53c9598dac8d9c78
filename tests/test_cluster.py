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


def test_a_mixed_cluster_is_refused(monkeypatch):
    from benchmark.causal import cluster

    fps = iter([{"node": "a" * 16, "fingerprint": {"key": "k1", "cpu": "CPU one"}},
                {"node": "b" * 16, "fingerprint": {"key": "k2", "cpu": "CPU two"}}])
    with pytest.raises(cluster.ClusterError, match=r"different machines .*k1 on node a+.*CPU "
                                                   r"one.*k2.*run on a cluster of one machine"):
        cluster._check_one_machine([next(fps), next(fps)])
