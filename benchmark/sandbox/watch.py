"""Watching one sandboxed child: the exchange under the deadline, its limits, its end.

A :class:`_Run` starts the child (:mod:`benchmark.sandbox.launch`), checks it from outside in
``/proc`` when it says it is ready (namespaces, seccomp, no_new_privs, no capabilities, its uid)
and records the protections itself, then reads the result channel and the drained, capped
output until the child is done, fails, passes a limit or the deadline; it kills the whole process
tree at the end of every run. What it saw is an :class:`~benchmark.sandbox.outcome._Outcome`.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from benchmark.errors import BenchmarkError
from benchmark.sandbox import cgroups, channel
from benchmark.sandbox import layers as sandbox
from benchmark.sandbox.launch import _child_config, _launch_spec, _start, _Workspace
from benchmark.sandbox.limits import OUTPUT_STOP, OUTPUT_TAIL, IsolationError
from benchmark.sandbox.outcome import _Outcome
from benchmark.sandbox.validate import validate_meta
from benchmark.sandbox.view_io import score_calls
from benchmark.untrusted import clean_text

_POLL = 0.2


@contextlib.contextmanager
def _signals_end_cleanly() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit (so every ``finally`` runs) while inside."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _outcome(ws: _Workspace, mode: str, subset: bool, deadline: float,
             smoke: dict | None = None) -> _Outcome:
    """One sandboxed run (with the seccomp filters when bubblewrap runs), as it ended."""
    fds: list[int] = []
    summary = ""
    if ws.full:
        from benchmark.sandbox import seccomp

        fds, summary = seccomp.build_filters()
    try:
        return _Run(ws, mode, subset, deadline, fds, summary, smoke).run()
    finally:
        for fd in fds:
            os.close(fd)


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


class _Run:
    """One sandboxed child process: start, exchange frames under the deadline, stop, clean up."""

    def __init__(self, ws: _Workspace, mode: str, subset: bool, deadline: float,
                 seccomp_fds: list[int], seccomp_summary: str, smoke: dict | None = None) -> None:
        self.ws, self.mode, self.subset, self.deadline = ws, mode, subset, deadline
        self.seccomp_fds, self.seccomp_summary = seccomp_fds, seccomp_summary
        self.smoke = smoke
        self.out = _Outcome()

    # -- start and stop ------------------------------------------------------------------------
    def run(self) -> _Outcome:
        """Start the sandbox, exchange frames until done/error/deadline; always clean up."""
        with sandbox.adopt_orphans():
            return self._run()

    def _run(self) -> _Outcome:
        lim = self.ws.limits
        tree = cgroups.TreeLimits(lim.memory_bytes, lim.max_processes)
        self.tree = tree
        self.seen_pids: set[int] = set()
        own: list[int] = []
        proc = None
        try:
            chan_r, chan_w = os.pipe()
            go_r, go_w = os.pipe()
            out_r, out_w = os.pipe()
            own += [chan_r, chan_w, go_r, go_w, out_r, out_w]
            cfg = _child_config(self.ws, self.mode, self.subset, self.smoke, chan_w, go_r)
            spec = _launch_spec(self.ws, cfg, tree, self.seccomp_fds)
            proc = _start(self.ws, spec, [chan_w, go_r, *self.seccomp_fds], out_w)
            self.proc = proc
            for fd in (chan_w, go_r, out_w):
                os.close(fd)
                own.remove(fd)
            self._loop(proc, chan_r, out_r, go_w)
            self.out.oom = tree.oom_killed() or self.out.stopped == "memory"
            self.out.pids_refused = tree.pids_refused()
        finally:
            if proc is not None:
                self._kill(proc)
                self.out.returncode = proc.returncode
                sandbox.reap_orphans(self.seen_pids - {proc.pid})
            tree.remove()
            for fd in own:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return self.out

    def _kill(self, proc: subprocess.Popen) -> None:
        """Kill the tree from the leaves up, so each process is reaped by its own parent.

        The launcher's descendants go first (in the PID namespace, killing them ends the
        sandbox's init, which bubblewrap reaps); then the launcher itself, then anything left in
        the tree's groups. Killing bubblewrap first would orphan its children to the machine's
        init, which in some containers never reaps them.
        """
        if proc.poll() is None:
            self.seen_pids |= set(cgroups.tree_pids(proc.pid))
            # without bubblewrap the launcher became the estimator's process: it goes too
            first = cgroups.tree_pids(proc.pid)[0 if not self.ws.full else 1:]
            for pid in [*first, *(self.tree.pids() - {proc.pid})]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        for pid in cgroups.tree_pids(proc.pid) if proc.poll() is None else []:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        self.tree.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - an unkillable process
            pass

    # -- exchange ------------------------------------------------------------------------------
    def _loop(self, proc: subprocess.Popen, chan_r: int, out_r: int, go_w: int) -> None:
        sel = selectors.DefaultSelector()
        sel.register(chan_r, selectors.EVENT_READ, "chan")
        sel.register(out_r, selectors.EVENT_READ, "out")
        # a build's report announces the size of the wheel that follows it
        reader = channel.Reader(one_json_at_a_time=self.mode == "build")
        self.state, self.go_w, self.reader = "ready", go_w, reader
        output = bytearray()
        exited_at = None
        checked = 0.0
        try:
            while sel.get_map():
                now = time.monotonic()
                if now >= self.deadline:
                    self.out.timed_out = True
                    return
                if exited_at is not None and now - exited_at > 1.0:
                    return  # the process ended; a leftover holding a pipe is not waited for
                for key, _ in sel.select(timeout=min(_POLL, max(self.deadline - now, 0))):
                    try:
                        data = os.read(key.fd, 1 << 16)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fd)
                        continue
                    over = self._output(data, output) if key.data == "out" else self._frames(data)
                    if over:
                        return
                if time.monotonic() - checked >= _POLL:
                    checked = time.monotonic()
                    if self._over_limits(proc):
                        return
                if exited_at is None and proc.poll() is not None:
                    exited_at = time.monotonic()
        finally:
            self.out.output = bytes(output)
            sel.close()

    def _output(self, data: bytes, output: bytearray) -> bool:
        """Keep the tail of the child's stdout/stderr in ``output``; True when it said too much."""
        self.out.output_bytes += len(data)
        output += data
        del output[: max(0, len(output) - 4 * OUTPUT_TAIL)]
        if self.out.output_bytes > OUTPUT_STOP:
            self.out.stopped = "output"
            return True
        return False

    def _frames(self, data: bytes) -> bool:
        """Feed the result channel; handle the frames it completes; True when it is over."""
        while True:
            try:
                frames = self.reader.feed(data)
            except channel.ChannelError as exc:
                self.out.channel_error = str(exc)
                return True
            try:
                for kind, payload in frames:
                    if self._frame(kind, payload):
                        return True
            except BenchmarkError as exc:
                self.out.exception = exc
                return True
            if not frames or not self.reader.one_json_at_a_time:
                return False
            data = b""

    def _over_limits(self, proc: subprocess.Popen) -> bool:
        """True when the tree passed a limit: a kill by the cgroup, or the monitor's count."""
        lim, tree = self.ws.limits, self.tree
        if tree.oom_killed():
            self.out.stopped = "memory"
        elif tree.pids_refused():
            self.out.stopped = "processes"
        elif not tree.tree_wide:
            rss, threads = cgroups.tree_usage(proc.pid)
            if rss > lim.memory_bytes:
                self.out.stopped = "memory"
            elif threads > lim.max_processes:
                self.out.stopped = "processes"
        return bool(self.out.stopped)

    def _frame(self, kind: str, payload: object) -> bool:
        """Handle one frame; True when the exchange is over."""
        if kind == "array" and self.mode == "build":
            key, arr = payload  # the wheel's bytes: bounded by the size the report announced
            if arr.dtype.kind != "u" or arr.dtype.itemsize != 1:
                self.out.channel_error = f"the built wheel came as {arr.dtype}, not bytes"
                return True
            self.out.arrays[key] = arr
            return False
        if kind == "array":
            from benchmark.contract import validate_scores

            key, arr = payload
            method, n = self.calls[key]
            self.out.arrays[key] = validate_scores(arr, n, self.out.meta["class"], method)
            return False
        msg = payload
        if self.state == "ready":
            return self._ready(msg)
        if msg["type"] == "error":
            self.out.error = msg
            return True
        if self.state == "meta":
            if self.mode == "build":
                return self._build(msg)
            return self._smoke(msg) if self.mode == "smoke" else self._meta(msg)
        if msg["type"] == "done":
            missing = [k for k in self.reader.expected if k not in self.out.arrays]
            if missing:
                self.out.channel_error = f"no scores for {', '.join(missing[:3])}"
            self.out.done = not missing
            return True
        self.out.channel_error = f"unexpected message type {clean_text(msg['type'], 40)!r}"
        return True

    def _ready(self, msg: dict) -> bool:
        """The child is ready: check it from outside, then let it load the estimator."""
        if msg["type"] != "ready":
            self.out.channel_error = "the first message was not the sandbox's 'ready'"
            return True
        try:
            self.out.protections = self._verify(msg)
        except IsolationError as exc:
            self.out.refused_sandbox = str(exc)
            return True
        try:
            os.write(self.go_w, b"g")
        except OSError:  # the sandboxed process is gone; its exit is reported
            return True
        self.out.started = True
        self.state = "meta"
        return False

    def _smoke(self, msg: dict) -> bool:
        """The smoke test's report, kept unchecked (:func:`~.validate._smoke_report` judges it)."""
        if msg["type"] != "smoke":
            self.out.channel_error = "a message came before the smoke test's report"
            return True
        self.out.smoke = msg.get("result")
        self.state = "scores"
        return False

    def _build(self, msg: dict) -> bool:
        """The sdist build's report; when it announces a wheel, the one array to expect."""
        from benchmark.sandbox.sdist import MAX_WHEEL

        if msg["type"] != "build":
            self.out.channel_error = "a message came before the build's report"
            return True
        report = msg.get("result")
        self.out.smoke = report
        size = report.get("size") if isinstance(report, dict) else None
        if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= MAX_WHEEL:
            self.reader.expected = {"wheel": size}
        self.state = "scores"
        return False

    def _meta(self, msg: dict) -> bool:
        """The estimator's metadata, validated; when scoring, the arrays to expect from it."""
        if msg["type"] != "meta":
            self.out.channel_error = "a message came before the estimator's metadata"
            return True
        self.out.meta = validate_meta(msg.get("meta"), self.ws.name)
        if self.mode == "score":
            self.calls = {k: (m, n) for k, m, _, n in score_calls(
                self.ws.views, self.out.meta["tasks"], self.subset)}
            self.reader.expected = {k: n for k, (_, n) in self.calls.items()}
        self.state = "scores"
        return False

    # -- the sandbox, checked from outside ---------------------------------------------------
    def _sandboxed_pid(self, inside_pid: object) -> int:
        if not isinstance(inside_pid, int):
            raise IsolationError(f"the sandbox for {self.ws.name} sent no process id")
        tree = cgroups.tree_pids(self.proc.pid)
        self.seen_pids |= set(tree)
        for pid in tree:
            try:
                nspid = _status(pid).get("NSpid", "").split()
            except OSError:
                continue
            if self.ws.full and len(nspid) >= 2 and nspid[-1] == str(inside_pid):
                return pid
            if not self.ws.full and pid == inside_pid:
                return pid
        raise IsolationError(f"the sandboxed process of {self.ws.name} was not found in /proc")

    def _verify(self, msg: dict) -> dict:
        """The protections, recorded by the evaluator once it has checked them in ``/proc``."""
        pid = self._sandboxed_pid(msg.get("pid"))
        st = _status(pid)
        layers = msg.get("layers") if isinstance(msg.get("layers"), dict) else {}
        common = _common_protections(self.ws, self.tree, layers)
        if not self.ws.full:
            return _fallback_protections(self.ws, layers, common)
        problems = _problems(self.ws, pid, st, len(self.seccomp_fds))
        if problems:
            raise IsolationError(
                f"the sandbox for {self.ws.name} did not come up as specified ("
                f"{', '.join(problems)}); nothing was run. Check the bubblewrap installation.")
        return _full_protections(self.ws, self.seccomp_summary, common)


def _problems(ws: _Workspace, pid: int, st: dict[str, str], n_filters: int) -> list[str]:
    """How the sandboxed process ``pid`` (its ``/proc`` status ``st``) differs from the spec."""
    problems = []
    want_uid = str(ws.uid if ws.uid is not None else os.geteuid())
    if st.get("Uid", "").split() != [want_uid] * 4:
        problems.append(f"uid {st.get('Uid')}")
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        if int(st.get(cap, "1"), 16) != 0:
            problems.append(f"{cap} {st.get(cap)}")
    if st.get("NoNewPrivs") != "1":
        problems.append("no_new_privs off")
    if st.get("Seccomp") != "2" or int(st.get("Seccomp_filters", "0")) < n_filters:
        problems.append(f"seccomp {st.get('Seccomp')}/{st.get('Seccomp_filters')}")
    for ns in ("user", "pid", "net", "ipc", "uts", "mnt", "cgroup"):
        try:
            if os.readlink(f"/proc/{pid}/ns/{ns}") == os.readlink(f"/proc/self/ns/{ns}"):
                problems.append(f"shares the evaluator's {ns} namespace")
        except OSError as exc:
            problems.append(f"{ns} namespace unreadable ({exc.strerror})")
    return problems


def _common_protections(ws: _Workspace, tree: cgroups.TreeLimits, layers: dict) -> dict:
    """The protections recorded with or without bubblewrap (Landlock, limits, output, results)."""
    lim = ws.limits
    gib = f"{lim.memory_bytes / 2**30:.2f} GiB"
    return {
        "landlock": clean_text(layers.get("landlock", "missing"), 200, multiline=False)
        + " (applied inside by bt-bench's own code before the estimator is loaded)",
        "memory": f"{tree.memory_mode}; RLIMIT_AS {gib} per process",
        "processes": tree.process_mode + ("; RLIMIT_NPROC for the sandbox's own uid"
                                          if ws.uid is not None else ""),
        "time": f"one deadline of {lim.wall_seconds:g} s over starting, scoring and "
                "reading back; the whole process tree is killed after every run",
        "output": f"stdout and stderr drained, the last {OUTPUT_TAIL} characters kept, "
                  f"stopped past {OUTPUT_STOP >> 20} MiB; stdin /dev/null",
        "results": "only score arrays are read back (header checked before allocation, "
                   "numeric dtype, exact shape, finite); determinism checked in a second "
                   "fresh sandbox; metadata validated; protections recorded by the evaluator",
    }


def _fallback_protections(ws: _Workspace, layers: dict, common: dict) -> dict:
    """The protections of a child process without bubblewrap (what is missing, said so)."""
    return {"sandbox": f"missing: {ws.plat.problem}; a child process only "
                       f"({sandbox.INSTALL_HINT})",
            "user": f"the caller's uid {os.geteuid()} "
                    + ("(root: every capability)" if os.geteuid() == 0 else ""),
            "seccomp": "missing (needs bubblewrap)",
            "network": clean_text(layers.get("network", "missing"), 200,
                                  multiline=False),
            **common}


def _full_protections(ws: _Workspace, seccomp_summary: str, common: dict) -> dict:
    """The protections of the full sandbox, once checked from outside."""
    tmp = f"{ws.limits.tmp_bytes / 2**30:.2f} GiB"
    return {
        "sandbox": f"{ws.plat.bwrap_version}: new user, PID, IPC, UTS, network, cgroup "
                   "and mount namespaces, new session, dies with the evaluator (checked in "
                   "/proc)",
        "user": ("a fresh unprivileged uid per sandbox (the evaluator runs as root)"
                 if ws.uid is not None else "the caller's uid")
                + "; no capabilities, no_new_privs, no nested user namespaces",
        "files": "read-only root holding only read-only binds of the Python installation, "
                 "the benchmark and estimators packages, the estimator file, its views and "
                 "the release's checkpoints and tokenizer; private /tmp and /dev/shm of "
                 f"{tmp} each; minimal /dev",
        "seccomp": seccomp_summary,
        "network": "empty network namespace (loopback only); sockets other than AF_UNIX "
                   "refused",
        **common,
    }
