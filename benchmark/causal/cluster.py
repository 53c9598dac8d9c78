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

Connecting (docs/security.md): a Ray cluster runs bt-bench's code, and bt-bench deserialises
(with pickle) what its tasks return, so a cluster is a trust domain.

* Without ``$RAY_ADDRESS``: a new private local cluster, never one found on the machine
  (``address="local"``, so a ``ray_current_cluster`` file planted in a shared temp folder is not
  read): its temp folder lies in one bt-bench creates 0700 (Ray makes its own world-writable),
  it has no dashboard (Ray 2.60 cannot be bound to loopback: it replaces ``127.0.0.1`` by the
  node's address and its gRPC servers listen on all interfaces, so the token is what keeps
  others out),
  requires a token (``RAY_AUTH_MODE=token``, a fresh token in a 0600 file of that folder), and
  is shut down when bt-bench exits (:func:`shutdown`, also registered with ``atexit``).
* With ``$RAY_ADDRESS``: that cluster, which must be one the user controls. bt-bench requires
  token authentication (``RAY_AUTH_MODE=token`` with the cluster's token) or the explicit,
  loud opt-out ``BT_BENCH_RAY_UNAUTHENTICATED_OK=1``.

Whatever a task returns is checked before use (:func:`_check_lane_result`): its type, the file
names it writes (``seed<S>/<name>.npy|pt`` inside the store) and each file's dtype and shape
(loaded without pickle).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import time
from pathlib import Path

from benchmark.errors import BenchmarkError

#: the oldest Ray whose token authentication bt-bench relies on (the [cluster] extra's floor)
RAY_MIN_VERSION = (2, 60)
#: set to 1 to use a $RAY_ADDRESS cluster without token authentication (knowingly)
UNAUTHENTICATED_ENV = "BT_BENCH_RAY_UNAUTHENTICATED_OK"

#: the private local cluster this process started: its folder and the environment it changed
_LOCAL: dict = {}


class ClusterError(BenchmarkError):
    """The Ray executor cannot run: Ray missing, nodes of different machines, a failed task."""


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError("the 'ray' executor needs Ray: pip install -e \".[cluster]\" (or "
                           "use the default local executor: --executor local)") from None
    if _version_tuple(ray.__version__) < RAY_MIN_VERSION:
        need = ".".join(map(str, RAY_MIN_VERSION))
        raise ClusterError(f"Ray {ray.__version__} is installed; the ray executor needs Ray >= "
                           f"{need} (token authentication): pip install 'ray>={need}', or use "
                           "--executor local")
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            _check_named_cluster(address)
            ray.init(address=address, log_to_driver=False, include_dashboard=False,
                     logging_level="ERROR")
        else:
            _start_private(ray)
    return ray


def _check_named_cluster(address: str) -> None:
    """Refuse a ``$RAY_ADDRESS`` cluster without token authentication, unless opted out."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return
    if os.environ.get(UNAUTHENTICATED_ENV) == "1":
        print(f"bt-bench: WARNING: using the Ray cluster at {address} without token "
              f"authentication ({UNAUTHENTICATED_ENV}=1): whoever can reach it can run code "
              "as bt-bench", file=sys.stderr)
        return
    raise ClusterError(
        f"RAY_ADDRESS={address} names a Ray cluster, which runs bt-bench's code and whose "
        "results bt-bench runs; it must be one you control, reached with token "
        "authentication: set RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN or "
        f"RAY_AUTH_TOKEN_PATH), or set {UNAUTHENTICATED_ENV}=1 to use it without "
        "authentication knowingly (or unset RAY_ADDRESS for a private local cluster)")


def _start_private(ray) -> None:
    """Start a new local cluster of this process only (see the module docstring)."""
    import secrets
    import tempfile

    # short: Ray's socket paths live under it (at most ~107 characters)
    folder = Path(tempfile.mkdtemp(prefix="bt-ray-", dir="/tmp" if os.path.isdir("/tmp")
                                   else None))  # mkdtemp creates it 0700
    token = folder / "auth_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32))
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                                            "RAY_AUTH_TOKEN_PATH")}
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    _LOCAL.update(folder=folder, saved=saved)
    atexit.register(shutdown)
    try:
        _reload_auth_config()
        # Ray makes its temp folder world-writable: it lives inside ours, which stays 0700
        ray.init(address="local", _temp_dir=str(folder / "r"), include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")
    except BaseException:
        shutdown()
        raise


def _reload_auth_config() -> None:
    """Make this process's Ray read ``RAY_AUTH_MODE`` and the token again (Ray caches both)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:
        raise ClusterError("the installed Ray has no token authentication; pip install "
                           f"'ray>={'.'.join(map(str, RAY_MIN_VERSION))}'") from None
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def shutdown() -> None:
    """Disconnect from Ray; stop and delete the private local cluster if this process started one.

    No Ray process of that cluster outlives bt-bench. Safe to call more than once.
    """
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    folder, saved = _LOCAL.pop("folder", None), _LOCAL.pop("saved", {})
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if folder is not None:
        _reload_auth_config()
        shutil.rmtree(folder, ignore_errors=True)


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
    from benchmark.seal import SEAL_SUFFIX

    torch.set_num_threads(REPLAY_THREADS)
    with tempfile.TemporaryDirectory(prefix="bt-bench-ray-") as tmp:
        store = ReplayStore(Path(release), manifest_sha256, Path(tmp), machine=machine)
        for rel, data in files.items():  # the driver's checked entries, sealed here anew
            store.put(store.dir / rel, lambda p, data=data: p.write_bytes(data))
        t0 = time.perf_counter()
        facts = run_lane(store, [(int(s), [Job.from_dict(j) for j in js]) for s, js in lane], {})
        out = {str(p.relative_to(store.dir)): p.read_bytes()
               for p in sorted(store.dir.rglob("*")) if p.is_file()
               and not p.name.endswith(SEAL_SUFFIX)  # seals are the driver's to write
               and str(p.relative_to(store.dir)) not in files}
        return {"files": out, "batches": facts, "seconds": round(time.perf_counter() - t0, 2)}


def run_lanes_ray(store, lanes: list, bar) -> list[dict]:
    """Run lanes as Ray tasks (one CPU each) and install their results into ``store``.

    Raises:
        ClusterError: the store's machine is not the cluster's, or a task failed (the lanes
            that finished are installed first, so a rerun continues from them).
    """
    ray = _ray()
    from benchmark.causal.store import baseline_job, batch_start

    task = ray.remote(num_cpus=1, max_retries=1)(_lane_task)
    refs = []
    for lane in lanes:
        files = {}
        for seed, jobs in lane:
            base = store.path(baseline_job(seed))
            if not store.has(baseline_job(seed)):
                continue
            start = batch_start(store.release_path, seed, jobs)
            store.state(seed, start)  # its seal and form, before a worker trusts it
            files[str(base.relative_to(store.dir))] = base.read_bytes()
            st = store.state_path(seed, start)
            files[str(st.relative_to(store.dir))] = st.read_bytes()
        spec = [[s, [j.to_dict() for j in js]] for s, js in lane]
        refs.append(task.remote(str(store.release_path), store.manifest_sha256, store.machine,
                                spec, files))
    facts, errors = [], []
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            res = _check_lane_result(ray.get(done[0]), store)
        except Exception as exc:  # noqa: BLE001 - a task's error, reported below
            errors.append(str(exc)[-2000:])
            continue
        for rel, data in res["files"].items():  # checked above; sealed under our key
            store.put(store.dir / rel, lambda p, data=data: p.write_bytes(data))
        bar.update(sum(b["jobs"] for b in res["batches"]))
        facts.append({"batches": res["batches"], "seconds": res["seconds"]})
    if errors:
        raise ClusterError(f"a Ray replay task failed; the finished lanes are kept in {store.dir} "
                           "and a rerun continues from them:\n" + "\n".join(errors))
    return facts


_RESULT_FILE = re.compile(r"seed\d{1,6}/(baseline\.pt|state_\d{4}\.pt|[A-Za-z0-9_-]{1,80}\.npy)\Z")


def _check_lane_result(res: object, store) -> dict:
    """A lane task's return value, checked before anything of it is used or installed.

    Expected: ``{"files": {"seed<S>/<name>": bytes}, "batches": [{"jobs": int, ...}],
    "seconds": number}``; each file must load without pickle as the store's entry of that
    name (a ``(P,)`` float64 array, a baseline or a state).

    Raises:
        ClusterError: naming the first thing that is not as expected.
    """
    import tempfile

    from benchmark.causal.store import ReplayStore
    from benchmark.errors import UnsafeFileError

    def bad(what: str) -> ClusterError:
        return ClusterError(f"a Ray task returned {what}; refused (is RAY_ADDRESS a cluster "
                            "you control running this bt-bench?)")

    if not isinstance(res, dict) or not isinstance(res.get("files"), dict) \
            or not isinstance(res.get("batches"), list):
        raise bad(f"a {type(res).__name__} that is not {{files, batches, seconds}}")
    if isinstance(res.get("seconds"), bool) or not isinstance(res.get("seconds"), int | float):
        raise bad("no time in seconds")
    for b in res["batches"]:
        if not isinstance(b, dict) or not isinstance(b.get("jobs"), int) \
                or isinstance(b.get("jobs"), bool) or b["jobs"] < 0:
            raise bad("a batch without a job count")
    with tempfile.TemporaryDirectory(prefix="bt-bench-check-") as tmp:
        probe = ReplayStore(store.release_path, store.manifest_sha256, Path(tmp),
                            machine=store.machine)
        for rel, data in res["files"].items():
            if not isinstance(rel, str) or not _RESULT_FILE.match(rel):
                raise bad(f"a file named {str(rel)[:80]!r} (expected seed<S>/<name>.npy|pt)")
            if not isinstance(data, bytes):
                raise bad(f"{rel} as {type(data).__name__}, not bytes")
            path = probe.dir / rel
            probe.put(path, lambda p, data=data: p.write_bytes(data))  # form is checked next
            seed, name = int(rel.split("/")[0][4:]), Path(rel).name
            try:
                if name == "baseline.pt":
                    probe.baseline(seed)
                elif name.startswith("state_"):
                    probe.state(seed, int(name[6:10]))
                else:
                    from benchmark.io import load_npy

                    load_npy(path, "", dtype="float64", ndim=1)
            except UnsafeFileError as exc:
                raise bad(f"{rel}, which does not load as a replay-store entry ({exc})") \
                    from None
    return res


__all__ = ["ClusterError", "cluster_fingerprint", "run_lanes_ray", "shutdown"]
