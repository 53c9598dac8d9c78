"""Limits on the estimator sandbox's whole process tree: control groups, or a monitor.

Where the evaluator may create control groups (root on CI; cgroup v1 ``memory`` and ``pids``
hierarchies, or cgroup v2 with those controllers), each sandbox gets its own group: memory and
process count are bounded for the tree (every fork and thread counts), an out-of-memory kill is
recorded, and ``cgroup.kill`` (cgroup v2, Linux >= 5.14) ends every process of the group at
once. Elsewhere :class:`TreeLimits` falls back to a parent-side monitor that sums the resident
memory and counts the processes of the tree a few times a second and kills the tree when a limit
is passed (coarser: a fast allocation can overshoot between two looks).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path


def _mounts() -> dict[str, tuple[str, str]]:
    """Controller ("memory", "pids", "" for cgroup v2) -> (mount point, mount root)."""
    out: dict[str, tuple[str, str]] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype, opts = rfields[0], rfields[2].split(",")
        if fstype == "cgroup2":
            out.setdefault("", (fields[4], fields[3]))
        elif fstype == "cgroup":
            for c in ("memory", "pids"):
                if c in opts:
                    out.setdefault(c, (fields[4], fields[3]))
    return out


def _own_groups() -> dict[str, str]:
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in (ctrls.split(",") if ctrls else [""]):
                out[c] = path
    except (OSError, ValueError):
        pass
    return out


def _group_dir(ctrl: str) -> Path | None:
    mounts, own = _mounts(), _own_groups()
    if ctrl not in mounts or ctrl not in own:
        return None
    point, root = mounts[ctrl]
    rel = own[ctrl]
    if root != "/" and rel.startswith(root):
        rel = rel[len(root):]
    d = Path(point) / rel.lstrip("/")
    return d if d.is_dir() else None


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


class TreeLimits:
    """Memory and process limits for one sandbox's process tree.

    Use :attr:`procs_files` (files the launcher writes its pid into before dropping privileges),
    then :meth:`check` while the sandbox runs, :meth:`kill` and :meth:`remove` after it.
    """

    def __init__(self, memory_bytes: int, max_processes: int) -> None:
        self.memory_bytes, self.max_processes = memory_bytes, max_processes
        self.groups: dict[str, Path] = {}
        name = f"bt-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        v2 = _group_dir("")
        v2_ctrls = set()
        if v2 is not None:
            try:
                v2_ctrls = set((v2 / "cgroup.subtree_control").read_text().split())
            except OSError:
                v2_ctrls = set()
        for ctrl in ("memory", "pids"):
            base = _group_dir(ctrl)
            if base is not None and self._make(ctrl, base / name):
                continue
            if v2 is not None and ctrl in v2_ctrls:
                self._make("v2", v2 / name)
        if v2 is not None and "v2" not in self.groups:
            self._make("v2", v2 / name)  # for cgroup.kill and the list of processes
        self.memory_mode = self._configure_memory()
        self.process_mode = self._configure_pids()

    def _make(self, key: str, d: Path) -> bool:
        try:
            d.mkdir()
        except OSError:
            return False
        if not os.access(d / "cgroup.procs", os.W_OK):
            d.rmdir()
            return False
        self.groups[key] = d
        return True

    def _configure_memory(self) -> str:
        gib = f"{self.memory_bytes / 2**30:.2f} GiB"
        d = self.groups.get("memory")
        if d is not None and _write(d / "memory.limit_in_bytes", str(self.memory_bytes)):
            _write(d / "memory.memsw.limit_in_bytes", str(self.memory_bytes))  # no swap beyond
            return f"cgroup v1 memory {gib} for the process tree"
        d = self.groups.get("v2")
        if d is not None and _write(d / "memory.max", str(self.memory_bytes)):
            _write(d / "memory.swap.max", "0")
            return f"cgroup v2 memory.max {gib} for the process tree"
        return f"parent-side monitor of the tree's resident memory, {gib} (cgroups not writable)"

    def _configure_pids(self) -> str:
        n = self.max_processes
        d = self.groups.get("pids")
        if d is not None and _write(d / "pids.max", str(n)):
            return f"cgroup v1 pids {n} processes and threads for the tree"
        d = self.groups.get("v2")
        if d is not None and _write(d / "pids.max", str(n)):
            return f"cgroup v2 pids.max {n} processes and threads for the tree"
        return f"parent-side monitor, {n} processes and threads (cgroups not writable)"

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the launcher joins (all of this tree's groups)."""
        return [str(d / "cgroup.procs") for d in self.groups.values()]

    @property
    def tree_wide(self) -> bool:
        """True when both limits are enforced by the kernel (no monitor needed)."""
        return not (self.memory_mode.startswith("parent") or self.process_mode.startswith("parent"))

    def oom_killed(self) -> bool:
        """True when the kernel killed a process of the tree for passing the memory limit."""
        for key, fname, field in (("memory", "memory.oom_control", "oom_kill"),
                                  ("v2", "memory.events", "oom_kill")):
            d = self.groups.get(key)
            if d is None:
                continue
            try:
                for line in (d / fname).read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k == field and int(v) > 0:
                        return True
            except (OSError, ValueError):
                pass
        return False

    def pids_refused(self) -> bool:
        """True when a fork or thread was refused for passing the process limit."""
        for key in ("pids", "v2"):
            d = self.groups.get(key)
            if d is None or not (d / "pids.events").exists():
                continue
            try:
                for line in (d / "pids.events").read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k == "max" and int(v) > 0:
                        return True
            except (OSError, ValueError):
                pass
        return False

    def pids(self) -> set[int]:
        """Every process still in the tree's groups."""
        out: set[int] = set()
        for d in self.groups.values():
            try:
                out |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
        return out

    def kill(self) -> None:
        """SIGKILL every process of the tree's groups (cgroup.kill where the kernel has it)."""
        d = self.groups.get("v2")
        if d is not None:
            _write(d / "cgroup.kill", "1")
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self, timeout: float = 2.0) -> None:
        """Kill what is left and remove the groups (retrying while dying processes leave)."""
        end = time.monotonic() + timeout
        for d in self.groups.values():
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > end:
                        break
                    self.kill()
                    time.sleep(0.02)
        self.groups = {}


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants (read from ``/proc/<pid>/task/<tid>/children``)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                todo += [int(c) for c in kids]
            except (OSError, ValueError):
                pass
    return out


def tree_usage(root: int) -> tuple[int, int]:
    """(resident bytes, number of threads) of ``root``'s process tree."""
    rss = threads = 0
    for pid in tree_pids(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith("Threads:"):
                    threads += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return rss, threads


def remove_stale() -> None:
    """Remove groups left by evaluators that died (named ``bt-bench-<pid>-...``)."""
    dirs = [d for d in (_group_dir("memory"), _group_dir("pids"), _group_dir("")) if d]
    for base in dirs:
        try:
            entries = [p for p in base.iterdir() if p.name.startswith("bt-bench-")]
        except OSError:
            continue
        for p in entries:
            try:
                os.kill(int(p.name.split("-")[2]), 0)
                continue
            except (ValueError, IndexError, PermissionError):
                continue
            except ProcessLookupError:
                pass
            for pid in (p / "cgroup.procs").read_text().split() if (p / "cgroup.procs").exists() \
                    else []:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            try:
                p.rmdir()
            except OSError:
                pass
