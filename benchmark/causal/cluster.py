"""Replays on a Ray cluster: the same lanes as the local workers, as Ray tasks.

At paper scale one replay of a 1.5B-parameter run costs GPU-hours, so a causal reference (a few
hundred replays) needs many machines. Replays are independent jobs, which is what Ray schedules
well: tasks with resource requests (``num_cpus``, ``num_gpus``), placement across nodes, retries
of failed nodes, and a local multi-node cluster for tests (``ray.cluster_utils.Cluster``). It is
an optional extra (``pip install -e ".[cluster]"``); the local batched path stays the default
(``--executor ray`` or ``BT_BENCH_EXECUTOR=ray`` selects this one).

How a lane runs on a node: the task gets the release's path (the release must be readable there
at the same path: shared storage, or ``bt-bench download`` on every node), the lane's jobs and
the stored files of the driver's replay store that the lane needs (the seed's baseline and the
state it starts from). It runs :func:`benchmark.causal.store.run_lane` in a private store of its
own and returns the files it wrote; the driver installs them into its store. A replay's numbers
depend on the machine that made them (docs/causal.md), so the driver's store is keyed by the
cluster's machine fingerprint, which every node must share: :func:`cluster_fingerprint` asks
each node and refuses a mixed cluster.

Connecting: ``ray.init(address=$RAY_ADDRESS)`` when set (an existing cluster), else a local
Ray instance on this machine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmark.errors import BenchmarkError


class ClusterError(BenchmarkError):
    """The Ray executor cannot run: Ray missing, nodes of different machines, a failed task."""


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError("the 'ray' executor needs Ray: pip install -e \".[cluster]\" (or "
                           "use the default local executor: --executor local)") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=False,
                 include_dashboard=False, logging_level="ERROR")
    return ray


def _node_fingerprint() -> dict:
    import ray

    from benchmark.machine import fingerprint

    return {"node": ray.get_runtime_context().get_node_id(), "fingerprint": fingerprint()}


def cluster_fingerprint() -> dict:
    """The machine fingerprint every alive node of the cluster shares.

    Raises:
        ClusterError: nodes report different fingerprints (their replays would not be
            comparable within one store); the message names them.
    """
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(_node_fingerprint)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    return _check_one_machine(ray.get([probe.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n, soft=False)).remote()
        for n in nodes]))


def _check_one_machine(reports: list[dict]) -> dict:
    """The one fingerprint of ``[{"node", "fingerprint"}, ...]``, or a ClusterError."""
    keys = {g["fingerprint"]["key"]: g for g in reports}
    if len(keys) != 1:
        raise ClusterError(
            "the cluster's nodes are different machines (fingerprints "
            + ", ".join(f"{k} on node {g['node'][:8]} ({g['fingerprint']['cpu']})"
                        for k, g in keys.items())
            + "): causal replays are compared within one machine type; run on a cluster of "
              "one machine type, or use --executor local")
    return next(iter(keys.values()))["fingerprint"]


def _lane_task(release: str, manifest_sha256: str, machine: dict, lane: list,
               files: dict[str, bytes]) -> dict:  # pragma: no cover - runs in a Ray worker
    """Run one lane in a private store; return ``{"files": {relative path: bytes}, ...}``."""
    import tempfile

    import torch

    from benchmark.causal.store import REPLAY_THREADS, Job, ReplayStore, run_lane

    torch.set_num_threads(REPLAY_THREADS)
    with tempfile.TemporaryDirectory(prefix="bt-bench-ray-") as tmp:
        store = ReplayStore(Path(release), manifest_sha256, Path(tmp), machine=machine)
        for rel, data in files.items():
            p = store.dir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        t0 = time.perf_counter()
        facts = run_lane(store, [(int(s), [Job.from_dict(j) for j in js]) for s, js in lane], {})
        out = {str(p.relative_to(store.dir)): p.read_bytes()
               for p in sorted(store.dir.rglob("*")) if p.is_file()
               and str(p.relative_to(store.dir)) not in files}
        return {"files": out, "batches": facts, "seconds": round(time.perf_counter() - t0, 2)}


def run_lanes_ray(store, lanes: list, bar) -> list[dict]:
    """Run lanes as Ray tasks (one CPU each) and install their results into ``store``.

    Raises:
        ClusterError: the store's machine is not the cluster's, or a task failed (the lanes
            that finished are installed first, so a rerun continues from them).
    """
    ray = _ray()
    from benchmark.causal.store import baseline_job, batch_start, write_atomically

    task = ray.remote(num_cpus=1, max_retries=1)(_lane_task)
    refs = []
    for lane in lanes:
        files = {}
        for seed, jobs in lane:
            base = store.path(baseline_job(seed))
            if not base.exists():
                continue
            files[str(base.relative_to(store.dir))] = base.read_bytes()
            st = store.state_path(seed, batch_start(store.release_path, seed, jobs))
            files[str(st.relative_to(store.dir))] = st.read_bytes()
        spec = [[s, [j.to_dict() for j in js]] for s, js in lane]
        refs.append(task.remote(str(store.release_path), store.manifest_sha256, store.machine,
                                spec, files))
    facts, errors = [], []
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            res = ray.get(done[0])
        except Exception as exc:  # noqa: BLE001 - a task's error, reported below
            errors.append(str(exc)[-2000:])
            continue
        for rel, data in res["files"].items():
            write_atomically(store.dir / rel, lambda p, data=data: p.write_bytes(data))
        bar.update(sum(b["jobs"] for b in res["batches"]))
        facts.append({"batches": res["batches"], "seconds": res["seconds"]})
    if errors:
        raise ClusterError(f"a Ray replay task failed; the finished lanes are kept in {store.dir} "
                           "and a rerun continues from them:\n" + "\n".join(errors))
    return facts


__all__ = ["ClusterError", "cluster_fingerprint", "run_lanes_ray"]
