"""Hostile estimators: each is stopped with a message naming it and what was refused, in time,
with nothing left behind and no results written. Plus what the evaluator records itself.

The cases are classes of attack (see docs/isolation.md); each hostile estimator tries its attack
and lets the refusal propagate. An attack that worked would let the evaluation finish (exit 0),
leak a value into the message, or leave something behind; every test checks for all three.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from benchmark.cli import main
from benchmark.sandbox import cgroups
from benchmark.sandbox import layers as sandbox
from benchmark.sandbox.isolation import IsolationError, Limits
from benchmark.sandbox.limits import TEMP_PREFIX
from tests.wheels import build_wheel, offline

REPO = Path(__file__).resolve().parents[1]
FULL = sandbox.probe()
needs_bwrap = pytest.mark.skipif(
    not FULL.full, reason=f"the full sandbox cannot run here ({FULL.problem}); .ci/run installs "
    "bubblewrap, so CI always runs these tests")


# ----------------------------------------------------------------------------------------------
# helpers


def hostile(tmp_path: Path, body: str, *, prelude: str = "", attrs: str = "",
            score: str = "np.zeros(view.n)", name: str = "hostile.py") -> Path:
    """An estimator file whose score_rollouts runs ``body`` (module code ``prelude``)."""
    lines = [
        "import os, sys, json, time, errno, ctypes, signal, socket",
        "import numpy as np",
        "from estimators.base import BaseEstimator",
        *prelude.splitlines(),
        "",
        "def channel_fd():",
        "    cfg = json.loads(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[-2])",
        "    return cfg['channel']",
        "",
        "class Hostile(BaseEstimator):",
        '    name = "hostile"',
        *("    " + a for a in attrs.splitlines()),
        "",
        "    def score_rollouts(self, view):",
        *("        " + line for line in body.splitlines()),
        f"        return {score}",
    ]
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def run(tmp_path: Path, release: Path, est: Path, *extra: str, rc: int = 2,
        capsys=None) -> tuple[str, float]:
    """Evaluate ``est`` through the CLI; check the exit code and that nothing was written."""
    out = tmp_path / "results.json"
    out.write_text("previous")
    t0 = time.monotonic()
    code = main(["evaluate", str(est), "--release", str(release), "--out", str(out),
                 "--no-progress", "--no-causal", "--seeds", "0", *extra])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err if capsys is not None else ""
    assert code == rc, err
    if rc == 2:
        assert out.read_text() == "previous"  # nothing written, nothing lost
    return err, elapsed


def sandbox_processes(uids: set[int]) -> list[int]:
    """Processes running as one of ``uids`` (the sandboxes' fresh uids)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for line in (d / "status").read_text().splitlines():
                if line.startswith("Uid:") and int(line.split()[1]) in uids:
                    out.append(int(d.name))
        except (OSError, ValueError):
            pass
    return out


@pytest.fixture(autouse=True)
def nothing_left_behind(monkeypatch):
    """After each test: no sandbox process, temp folder or cgroup of this process remains."""
    uids: set[int] = set()
    real = sandbox.sandbox_uid

    def recording() -> int | None:
        uid = real()
        if uid is not None:
            uids.add(uid)
        return uid

    monkeypatch.setattr(sandbox, "sandbox_uid", recording)
    yield uids
    tag = f"{TEMP_PREFIX}{os.getpid()}-"
    assert not [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(tag)]
    groups = [d / n for d in (cgroups._group_dir("memory"), cgroups._group_dir("pids"),
                               cgroups._group_dir("")) if d for n in os.listdir(d)
              if n.startswith(f"bt-bench-{os.getpid()}-")]
    assert not groups
    assert not sandbox_processes(uids)


def labels(release: Path) -> Path:
    return release / "seed0" / "labels.parquet"


def checkpoint_file(release: Path) -> Path:
    return next((p for p in (release / "seed0" / "checkpoints").rglob("*") if p.is_file()),
                release / "seed0" / "checkpoints" / "missing")


# ----------------------------------------------------------------------------------------------
# attacks that end with a refusal, run through `bt-bench evaluate`

SYSCALLS = {"x86_64": {"perf_event_open": 298, "bpf": 321, "ptrace": 101, "fanotify_init": 300,
                       "keyctl": 250, "unshare": 272},
            "aarch64": {"perf_event_open": 241, "bpf": 280, "ptrace": 117, "fanotify_init": 262,
                        "keyctl": 219, "unshare": 97}}


FORGED_META = (
    "_fd = json.loads(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[-2])['channel']\n"
    "_d = json.dumps({'type': 'meta', 'meta': {'name': '\\x1b]0;owned\\x07PASS', 'class': "
    "'Hostile', 'track': 'gradient', 'tasks': ['rollouts'], 'config': {}, "
    "'has_score_draw': False, 'fallbacks': []}}).encode()\n"
    "os.write(_fd, b'J' + len(_d).to_bytes(4, 'little') + _d)\ntime.sleep(30)")


# the estimator replaces the sandbox's own sender (it controls its whole process): the frame
# carries a real key, so only the header checks stand between it and the evaluator
FORGE_ARRAY = """import io
import benchmark.sandbox.channel as _ch

def _forge(fd, key, arr):
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        b, {{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}}})
    k = key.encode()
    p = len(k).to_bytes(2, 'little') + k + b.getvalue() + b'\\0' * ({pad})
    os.write(fd, b'A' + len(p).to_bytes(4, 'little') + p)
    time.sleep(30)

_ch.send_array = _forge"""


def _refused(call: str) -> str:
    """Estimator code: raise OSError unless the raw system call ``call(...)`` succeeded."""
    return ("libc = ctypes.CDLL(None, use_errno=True)\n"
            f"r = {call}\n"
            "if r < 0:\n"
            "    e = ctypes.get_errno()\n"
            "    raise OSError(e, os.strerror(e))\n")


def cases(release: Path, tmp_path: Path) -> dict[str, tuple[str, dict, list[str]]]:
    """id -> (score_rollouts body, hostile() keywords, fragments the message must contain)."""
    import platform

    nr = SYSCALLS.get(platform.machine(), SYSCALLS["x86_64"])
    lab = str(labels(release))
    return {
        # labels by every route
        "labels by path": (f"open({lab!r}, 'rb').read()", {}, ["labels.parquet",
                                                                "sandbox refused"]),
        "labels by symlink": (f"os.symlink({lab!r}, '/tmp/l')\nopen('/tmp/l', 'rb').read()",
                              {}, ["/tmp/l", "sandbox refused"]),
        "labels in the release folder": (
            f"names = os.listdir({str(release / 'seed0')!r})\n"
            "assert 'labels.parquet' in names, f'not visible: {names}'", {},
            ["not visible", "checkpoints"]),
        "the git object store": (f"os.listdir({str(REPO / '.git' / 'objects')!r})", {},
                                 [".git", "sandbox refused"]),
        "the evaluator's memory": ("open(f'/proc/{os.getppid()}/mem', 'rb').read(16)", {},
                                   ["/mem", "denied"]),
        "another process in /proc": (
            "seen = {}\nfor p in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
            "    try:\n        seen[p] = open(f'/proc/{p}/cmdline', 'rb').read()\n"
            "    except OSError as e:\n        seen[p] = str(e).encode()\n"
            "assert any(b'\\0pytest' in c or b'benchmark.cli' in c or b'bin/bt-bench' in c "
            "for c in seen.values()), "
            "f'only {len(seen)} sandbox processes'", {}, ["only", "sandbox processes"]),
        "kernel tracing (perf_event_open)": (
            _refused(f"libc.syscall({nr['perf_event_open']}, ctypes.create_string_buffer(128), "
                     "-1, 0, -1, 0)"), {}, ["Operation not permitted", "sandbox refused"]),
        "kernel tracing (bpf)": (
            _refused(f"libc.syscall({nr['bpf']}, 0, ctypes.create_string_buffer(128), 128)"),
            {}, ["Operation not permitted"]),
        # forging what the evaluator records
        "a forged 'done' frame": (
            "fd = channel_fd()\nd = json.dumps({'type': 'done'}).encode()\n"
            "os.write(fd, b'J' + len(d).to_bytes(4, 'little') + d)\nos._exit(0)", {},
            ["refused", "no scores for seed0/"]),
        "a forged 'ready' frame with protections": (
            "fd = channel_fd()\nd = json.dumps({'type': 'ready', 'pid': 1, 'layers': "
            "{'landlock': 'all of them'}}).encode()\n"
            "os.write(fd, b'J' + len(d).to_bytes(4, 'little') + d)\ntime.sleep(30)", {},
            ["refused", "unexpected message type 'ready'"]),
        "an .npy header claiming 8 TiB": (
            "pass", {"prelude": FORGE_ARRAY.format(descr="<f8", shape="(2**40,)", pad="64")},
            ["refused", "shape (1099511627776,)"]),
        "an object array": (
            "pass", {"prelude": FORGE_ARRAY.format(descr="|O", shape="(len(arr),)",
                                                   pad="8 * len(arr)")},
            ["refused", "dtype object"]),
        "a name with escape codes": ("pass", {"attrs": 'name = "x\\x1b[2K\\rPASS\\x07"'},
                                     ["printable", "x\\x1b[2K"]),
        "a forged metadata frame at import": (
            "pass", {"prelude": FORGED_META}, ["declared metadata was refused", "printable"]),
        "a config that smuggles data": (
            "pass", {"attrs": "def __init__(self, data=None):\n"
                              "    self.data = data if data is not None else {'k': [1, 2]}"},
            ["not plain JSON scalars", "data is a dict"]),
        # kills and the terminal
        "killing the evaluator": (
            "import resource\n"
            "for f in (lambda: resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (0, 0)),"
            " lambda: os.kill(os.getppid(), signal.SIGKILL)):\n"
            "    try:\n        f()\n    except OSError:\n        pass\n    else:\n"
            "        raise SystemExit('reached the parent')\n"
            "raise PermissionError(errno.EPERM, 'prlimit and kill on the parent')", {},
            ["prlimit and kill on the parent", "sandbox refused"]),
        "killing every process it can": (
            "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
            "raise RuntimeError('the evaluator survived kill(-1)')",
            {}, ["the evaluator survived kill(-1)"]),
        "terminal injection (TIOCSTI)": (
            "import fcntl, termios\n"
            "fd = os.open('/dev/tty', os.O_RDWR)\n"
            "fcntl.ioctl(fd, termios.TIOCSTI, b'x')", {}, ["/dev/tty", "sandbox refused"]),
        # writes and metadata outside
        "changing a checkpoint's mode": (
            f"os.chmod({str(checkpoint_file(release))!r}, 0o777)", {},
            ["Read-only file system", "sandbox refused"]),
        "changing the estimator file's times and xattrs": (
            "os.utime(__file__, (0, 0))\nos.setxattr(__file__, 'user.x', b'1')", {},
            ["Read-only file system"]),
        "writing into the release": (
            f"open({str(release / 'seed0' / 'planted.txt')!r}, 'w').write('x')", {},
            ["planted.txt", "sandbox refused"]),
        "a setuid binary in /dev/shm": (
            "import shutil\nshutil.copy('/bin/sh', '/dev/shm/sh')\nos.chmod('/dev/shm/sh', 0o4755)",
            {}, ["Operation not permitted", "sandbox refused"]),
        "files left in /dev": ("open('/dev/left-behind', 'w').write('x')", {},
                               ["Read-only file system"]),
        # sockets
        "a TCP connection": ("socket.create_connection(('127.0.0.1', 9), 2)", {},
                             ["Operation not permitted", "sandbox refused"]),
        "a vsock connection (the VM host)": ("socket.socket(40, socket.SOCK_STREAM)", {},
                                             ["Operation not permitted"]),
        # malformed returns and exits
        "NaN scores": ("pass", {"score": "np.full(view.n, np.nan)"}, ["non-finite scores"]),
        "timedelta64 scores": ("pass", {"score": "np.arange(view.n).astype('m8[s]')"},
                               ["returned dtype timedelta64[s]; return a numeric numpy array"]),
        "a masked array (its mask would be dropped)": (
            "pass", {"score": "np.ma.masked_array(np.zeros(view.n), mask=np.arange(view.n) % 2)"},
            ["returned a masked array (numpy.ma.MaskedArray)"]),
        "a timedelta64 array forged on the channel": (
            "pass", {"prelude": FORGE_ARRAY.format(descr="<m8[s]", shape="(len(arr),)",
                                                   pad="8 * len(arr)")},
            ["refused", "dtype timedelta64[s]; a numeric dtype is required"]),
        "os._exit": ("os._exit(0)", {}, ["exited with code 0 before returning its scores"]),
        "scores that differ between processes": (
            "pass", {"score": "np.frombuffer(os.urandom(8 * view.n), np.uint64) % 7 * 1.0"},
            ["not deterministic", "fresh sandboxes"]),
    }


CASES = list(cases(Path("/nonexistent-release"), Path("/nonexistent")))


@needs_bwrap
@pytest.mark.parametrize("attack", CASES)
def test_attack_is_refused(attack, micro_release, tmp_path, capsys):
    body, kw, fragments = cases(micro_release, tmp_path)[attack]
    before = {p: p.stat() for p in (checkpoint_file(micro_release), labels(micro_release))}
    err, elapsed = run(tmp_path, micro_release, hostile(tmp_path, body, **kw), capsys=capsys)
    assert err.startswith("bt-bench: error: ") and "hostile.py" in err.splitlines()[0]
    for frag in fragments:
        assert frag in err, err
    assert "\x1b" not in err and "\x07" not in err
    assert elapsed < 60
    assert not (micro_release / "seed0" / "planted.txt").exists()
    for p, st in before.items():  # mode, owner, times of files outside: unchanged
        now = p.stat()
        assert (now.st_mode, now.st_uid, now.st_mtime_ns) == (st.st_mode, st.st_uid,
                                                               st.st_mtime_ns)


# ----------------------------------------------------------------------------------------------
# attacks that need more than a refusal check


@needs_bwrap
def test_secrets_in_the_environment_stay_outside(micro_release, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BT_BENCH_TEST_TOKEN", "tok-7f3a9c")
    body = ("found = dict(os.environ)\n"
            "for p in os.listdir('/proc'):\n"
            "    try:\n        found[p] = open(f'/proc/{p}/environ', 'rb').read()\n"
            "    except OSError as e:\n        found[p] = str(e)\n"
            "hits = [k for k, v in found.items() if b'tok-7f3a9c' in "
            "(v if isinstance(v, bytes) else str(v).encode())]\n"
            "raise RuntimeError(f'published: {hits} of {len(found)} places')")
    err, _ = run(tmp_path, micro_release, hostile(tmp_path, body), capsys=capsys)
    assert "published: [] of " in err


@needs_bwrap
def test_unix_sockets_outside_are_unreachable(micro_release, tmp_path, capsys):
    path = Path(tempfile.mkdtemp(prefix="bt-sock-")) / "s"
    servers, accepted = [], []
    # the abstract namespace is the machine's (per network namespace): a name of its own per run,
    # so two suites running at once do not collide
    abstract = f"\0bt-bench-test-abstract-{os.getpid()}-{path.parent.name}"
    for addr in (str(path), abstract):
        s = socket.socket(socket.AF_UNIX)
        s.bind(addr)
        s.listen(1)
        servers.append(s)
        threading.Thread(target=lambda s=s: accepted.append(s.accept()), daemon=True).start()
    body = (f"for a in ({str(path)!r}, {abstract!r}):\n"
            "    try:\n        socket.socket(socket.AF_UNIX).connect(a)\n"
            "    except OSError:\n        continue\n    raise SystemExit(f'connected to {a}')\n"
            "raise ConnectionRefusedError(errno.ECONNREFUSED, 'both unix sockets')")
    err, _ = run(tmp_path, micro_release, hostile(tmp_path, body), capsys=capsys)
    for s in servers:
        s.close()
    path.unlink()
    path.parent.rmdir()
    assert "both unix sockets" in err and "sandbox refused" in err and not accepted


@needs_bwrap
def test_files_written_inside_vanish(micro_release, tmp_path, capsys):
    marker = f"bt-bench-leftover-{os.getpid()}"
    body = (f"open('/dev/shm/{marker}', 'w').write('x')\nopen('/tmp/{marker}', 'w').write('x')\n"
            "os.makedirs('/tmp/big')\nopen('/tmp/big/f', 'wb').write(b'x' * (80 << 20))\n"
            "raise RuntimeError('left files behind')")
    err, _ = run(tmp_path, micro_release, hostile(tmp_path, body), capsys=capsys)
    assert "left files behind" in err
    assert not Path(f"/dev/shm/{marker}").exists() and not Path(f"/tmp/{marker}").exists()


@needs_bwrap
@pytest.mark.parametrize("how", ["a grandchild holding the pipes", "sleeping"])
def test_hangs_end_at_the_time_limit(how, micro_release, tmp_path, capsys):
    body = ("if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(600)\n    os._exit(0)\n"
            if how.startswith("a grandchild") else "") + "time.sleep(600)"
    err, elapsed = run(tmp_path, micro_release, hostile(tmp_path, body), "--time-limit", "4",
                       capsys=capsys)
    assert "exceeded the wall-time limit of 4 s" in err
    assert elapsed < 4 + 8


@needs_bwrap
def test_a_grandchild_holding_the_pipes_does_not_delay_the_end(micro_release, tmp_path, capsys):
    body = ("if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(600)\n    os._exit(0)\n"
            "raise RuntimeError('main process gives up')")
    err, elapsed = run(tmp_path, micro_release, hostile(tmp_path, body), "--time-limit", "60",
                       capsys=capsys)
    assert "main process gives up" in err and elapsed < 20


@needs_bwrap
def test_printing_a_gibibyte_is_stopped_and_not_buffered(micro_release, tmp_path, capsys):
    body = "chunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    print(chunk)"
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    err, elapsed = run(tmp_path, micro_release, hostile(tmp_path, body), capsys=capsys)
    assert "printed more than 64 MiB and was stopped" in err and "xxxx" in err
    assert len(err) < 20000
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 256 << 10  # KiB


@needs_bwrap
@pytest.mark.parametrize("how", ["one process", "forked processes",
                                 "forked processes, no cgroups (the monitor)"])
def test_memory_is_bounded_for_the_whole_tree(how, micro_release, tmp_path, capsys,
                                              monkeypatch):
    if "monitor" in how:
        monkeypatch.setattr(cgroups, "_group_dir", lambda ctrl: None)
    body = ("x = np.ones((3 << 30) // 8)" if how == "one process" else
            "kids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
            "        a = np.ones((700 << 20) // 8)\n        time.sleep(60)\n        os._exit(0)\n"
            "    kids.append(pid)\ntime.sleep(60)")
    err, elapsed = run(tmp_path, micro_release, hostile(tmp_path, body), "--memory-limit", "2",
                       capsys=capsys)
    assert "ran out of memory under the limit of 2.0 GiB" in err
    assert elapsed < 40


@needs_bwrap
def test_process_count_is_bounded_for_the_whole_tree(micro_release, tmp_path, capsys):
    body = ("while True:\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)")
    err, elapsed = run(tmp_path, micro_release, hostile(tmp_path, body), capsys=capsys)
    assert f"limit of {Limits().max_processes} processes and threads" in err
    assert elapsed < 40


@needs_bwrap
def test_disk_exhaustion_stops_at_the_private_tmpfs(micro_release, tmp_path, capsys):
    body = ("with open('/tmp/fill', 'wb') as fh:\n"
            "    for _ in range(2048):\n        fh.write(b'x' * (1 << 20))")
    err, _ = run(tmp_path, micro_release, hostile(tmp_path, body), capsys=capsys)
    assert "No space left on device" in err and "sandbox refused" in err


@needs_bwrap
def test_terminal_of_the_evaluator_is_never_reached(micro_release, tmp_path, capsys):
    """The evaluator's stdin is a terminal; the sandbox's stdin is /dev/null, TIOCSTI refused."""
    import pty

    master, slave = pty.openpty()
    saved = os.dup(0)
    os.dup2(slave, 0)
    try:
        body = ("import fcntl, termios\nfor fd in (0, 1, 2):\n    try:\n"
                "        fcntl.ioctl(fd, termios.TIOCSTI, b'!')\n    except OSError:\n"
                "        continue\n    raise SystemExit(f'injected through fd {fd}')\n"
                "stdin = os.readlink('/proc/self/fd/0')\n"
                "raise PermissionError(errno.EPERM, f'no terminal: stdin is {stdin}')")
        err, _ = run(tmp_path, micro_release, hostile(tmp_path, body), capsys=capsys)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    os.set_blocking(slave, False)
    with pytest.raises(BlockingIOError):
        os.read(slave, 100)  # nothing was pushed into the terminal's input
    os.close(master)
    os.close(slave)
    assert "no terminal: stdin is /dev/null" in err


@needs_bwrap
def test_import_time_code_never_runs_in_the_evaluator(micro_release, tmp_path, capsys):
    flag = tmp_path / "ran_in_parent"
    p = tmp_path / "import_time.py"
    p.write_text(f"open({str(flag)!r}, 'w').write('x')\n")
    for argv in (["submit", str(p), "--name", "x", "--authors", "me", "--release",
                  str(micro_release), "--submissions-dir", str(tmp_path / "subs"),
                  "--no-progress"],
                 ["check-estimator", str(p), "--release", str(micro_release)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "import_time.py" in err and "ran_in_parent" in err and not flag.exists()
    assert not (tmp_path / "subs" / "x").exists()


@needs_bwrap
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_signals_to_the_evaluator_remove_everything(sig, micro_release, tmp_path):
    """The evaluator is stopped while the estimator runs: the sandbox dies with it; its folders
    go at once (SIGTERM) or at the next evaluation (SIGKILL cannot be caught)."""
    from benchmark.sandbox.launch import _remove_stale

    est = hostile(tmp_path, "time.sleep(600)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmark.cli", "evaluate", str(est), "--release",
         str(micro_release), "--seeds", "0", "--no-progress", "--no-causal", "--out",
         str(tmp_path / "r.json")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tag = f"{TEMP_PREFIX}{proc.pid}-"
    end = time.monotonic() + 60
    while time.monotonic() < end:  # wait until the scoring sandbox runs
        busy = [p for p in Path(tempfile.gettempdir()).iterdir()
                if p.name.startswith(tag) and (p / "view").exists()]
        if busy and cgroups.tree_pids(proc.pid)[1:]:
            break
        time.sleep(0.2)
    time.sleep(1.0)
    kids = cgroups.tree_pids(proc.pid)[1:]
    assert kids, "the sandbox never started"
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert proc.returncode != 0 and not (tmp_path / "r.json").exists()
    time.sleep(0.5)
    if sig == signal.SIGKILL:
        _remove_stale()  # what the next evaluation does first
    assert not [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(tag)]
    assert not [d / n for d in (cgroups._group_dir("memory"), cgroups._group_dir("pids"),
                                 cgroups._group_dir("")) if d for n in os.listdir(d)
                if n.startswith(f"bt-bench-{proc.pid}-")]

    def running(pid: int) -> bool:  # zombies of a killed parent are the machine init's to reap
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    assert not [k for k in kids if running(k)]


@needs_bwrap
def test_the_sandbox_is_checked_from_outside(micro_release, tmp_path, capsys, monkeypatch):
    """A sandbox that comes up without its seccomp filters is refused before any estimator code."""
    from benchmark.sandbox import seccomp

    monkeypatch.setattr(seccomp, "build_filters", lambda: ([], "none"))
    est = hostile(tmp_path, "pass", prelude="print('estimator code ran')")
    err, _ = run(tmp_path, micro_release, est, capsys=capsys)
    assert "did not come up as specified" in err and "seccomp 0" in err
    assert "estimator code ran" not in err


# ----------------------------------------------------------------------------------------------
# a battery of probes in one sandbox: every route must be closed

PROBES = {
    # name: code that returns normally only if the attack worked
    "open labels": "open(LABELS, 'rb')",
    "list the release folder": "assert 'labels.parquet' in os.listdir(os.path.dirname(LABELS))",
    "list the repository": "assert '.git' in os.listdir(REPO)",
    "read .git/HEAD": "open(REPO + '/.git/HEAD')",
    "read the parent's environ":
        "assert b'PYTEST' in open(f'/proc/{os.getppid()}/environ', 'rb').read()",
    "read /proc/1/mem": "open('/proc/1/mem', 'rb').read(1)",
    "see the evaluator in /proc":
        "assert any(b'\\0pytest' in open(f'/proc/{p}/cmdline', 'rb').read() "
        "for p in os.listdir('/proc') if p.isdigit())",
    "ptrace pid 1": "sc('ptrace', 16, 1, 0, 0)",
    "process_vm_readv": "sc('process_vm_readv', 1, 0, 0, 0, 0, 0)",
    "perf_event_open": "sc('perf_event_open', ctypes.create_string_buffer(128), -1, 0, -1, 0)",
    "bpf": "sc('bpf', 0, ctypes.create_string_buffer(128), 128)",
    "fanotify_init": "sc('fanotify_init', 0, 0)",
    "keyctl (read keyring)": "sc('keyctl', 0, -4, 0)",
    "add_key": "sc('add_key', b'user', b'x', b'y', 1, -4)",
    "mount": "sc('mount', b'none', b'/tmp', b'tmpfs', 0, 0)",
    "unshare(NEWUSER)": "sc('unshare', 0x10000000)",
    "clone(NEWNET)": "sc('clone', 0x40000000 | 17, 0, 0, 0, 0)",
    "setns": "sc('setns', 0, 0)",
    "mknod a FIFO": "os.mkfifo('/tmp/fifo')",
    "io_uring_setup": "sc('io_uring_setup', 1, ctypes.create_string_buffer(120))",
    "userfaultfd": "sc('userfaultfd', 0)",
    "init_module": "sc('init_module', 0, 0, b'')",
    "open_by_handle_at": "sc('open_by_handle_at', -100, ctypes.create_string_buffer(64), 0)",
    "prlimit on pid 1": "import resource; resource.prlimit(1, resource.RLIMIT_NOFILE, (1, 1))",
    "TIOCSTI on stdin": "import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b'x')",
    "open /dev/tty": "os.open('/dev/tty', os.O_RDWR)",
    "open /dev/mem": "open('/dev/mem', 'rb')",
    "read /sys": "os.listdir('/sys/kernel')",
    "setuid(0)": "os.setuid(0)",
    "write to /": "open('/x', 'w')",
    "write into the packages": "open(REPO + '/benchmark/x.py', 'w')",
    "chmod the estimator file": "os.chmod(__file__, 0o777)",
    "set-ID bit in /tmp": "open('/tmp/s', 'w').close(); os.chmod('/tmp/s', 0o4755)",
    "AF_INET": "socket.socket(socket.AF_INET)",
    "AF_INET6": "socket.socket(socket.AF_INET6)",
    "AF_NETLINK": "socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)",
    "AF_PACKET": "socket.socket(socket.AF_PACKET, socket.SOCK_RAW)",
    "AF_VSOCK": "socket.socket(40, socket.SOCK_STREAM)",
    "AF_ALG": "socket.socket(38, socket.SOCK_SEQPACKET)",
    "nested sandbox (bwrap)":
        "import subprocess; subprocess.run(['bwrap', '--ro-bind', '/', '/', 'true'], check=True)",
}

BATTERY = '''
import os, sys, ctypes, errno, signal, socket, platform
import numpy as np
from estimators.base import BaseEstimator

LABELS, REPO = {labels!r}, {repo!r}
NR = {nr!r}[platform.machine() if platform.machine() in {nr!r} else "x86_64"]
NR.update(process_vm_readv=310, setns=308, io_uring_setup=425, userfaultfd=323,
          init_module=175, open_by_handle_at=304, add_key=248, mount=165, clone=56)
libc = ctypes.CDLL(None, use_errno=True)

def sc(name, *args):
    r = libc.syscall(NR[name], *args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))

PROBES = {probes!r}

class Battery(BaseEstimator):
    name = "battery"

    def score_rollouts(self, view):
        worked = []
        for name, code in PROBES.items():
            try:
                exec(code)
            except BaseException:
                continue
            worked.append(name)  # the attack worked
        raise RuntimeError(f"of {{len(PROBES)}} probes these worked: {{worked}}")
'''


@needs_bwrap
def test_every_route_is_closed(micro_release, tmp_path, capsys, monkeypatch):
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("the probe battery's raw system call numbers are x86-64's")
    monkeypatch.setenv("PYTEST_BT_SECRET", "1")
    est = tmp_path / "battery.py"
    est.write_text(BATTERY.format(labels=str(labels(micro_release)), repo=str(REPO),
                                  nr=SYSCALLS, probes=PROBES))
    err, _ = run(tmp_path, micro_release, est, capsys=capsys)
    assert f"of {len(PROBES)} probes these worked: []" in err, err


@needs_bwrap
def test_another_interpreter_and_extra_read_only_paths(tmp_path):
    """``python`` runs inside (its installation bound); ``extra_read_only`` paths are readable;
    a folder holding a git repository is never bound."""
    from benchmark.sandbox.isolation import inspect_isolated

    data = tmp_path / "env-data"
    data.mkdir()
    (data / "name.txt").write_text("from-the-extra-path")
    hidden = tmp_path / "not-bound.txt"
    hidden.write_text("x")
    est = hostile(tmp_path, "pass", attrs=f"name = open({str(data / 'name.txt')!r}).read()\n"
                  f"track = 'gradient' if sys.executable == {sys.executable!r} else 'x'\n"
                  f"tasks = ('rollouts',) if not os.path.exists({str(hidden)!r}) else ()")
    meta = inspect_isolated(est, python=sys.executable, extra_read_only=[data])
    assert meta["name"] == "from-the-extra-path" and meta["track"] == "gradient"
    with pytest.raises(Exception, match="No such file or directory"):
        inspect_isolated(est, python=sys.executable)
    (tmp_path / "repo" / ".git").mkdir(parents=True)  # a clone's object store holds the labels
    with pytest.raises(IsolationError, match="the git repository at .*repo"):
        inspect_isolated(est, extra_read_only=[tmp_path / "repo"])


# ----------------------------------------------------------------------------------------------
# a submission's requirements: their code (import time, .pth files) runs in the sandbox only

# the module the malicious wheel's .pth file imports at every start of the environment's
# interpreter, and its package imports again: each tries the attacks and keeps a compact report
EVIL_PROBE = """
import errno, os

LABELS, TARGETS, SECRET = {labels!r}, {targets!r}, {secret!r}


def _try(f):
    try:
        f()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    except Exception as e:
        return type(e).__name__
    return "ok"


def _read(p):
    with open(p, "rb") as fh:
        fh.read(1)


def _write(p):
    with open(p, "w") as fh:
        fh.write("planted")


def _secrets():
    places = [str(os.environ)]
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{{pid}}/environ", "rb") as fh:
                places.append(fh.read().decode("latin-1"))
        except OSError:
            pass
    return sum(SECRET in p for p in places)


def _ok(f):  # the same in every sandbox (the estimator's config must not change between them)
    return "ok" if _try(f) == "ok" else "no"


def probe(where):
    targets = TARGETS + [os.path.join(os.path.dirname(__file__), "btb_evil_planted.py")]
    return (f"{{where}}:u{{os.getuid()}}"
            f" L{{','.join(_ok(lambda p=p: _read(p)) for p in LABELS)}}"
            f" S{{_secrets()}}"
            f" W{{','.join(_ok(lambda p=p: _write(p)) for p in targets)}}"
            f" K{{_try(lambda: os.kill(1, 0))}}")


PTH = probe("pth")
"""


def evil_wheels(folder: Path, release: Path, token: str) -> list[Path]:
    """``btb-evil`` 1.0 (attacks quietly, keeps ``btb_evil.REPORT``) and 2.0 (also raises its
    report at import): a ``.pth`` file and import-time code try to read label files and a
    secret of the evaluator's environment, and to write outside (into the host's /tmp, the
    repository, the test's folder, the release, the environment cache)."""
    labels_files = [str(labels(release)), str(REPO / "releases" / "tiny" / "seed0" /
                                               "labels.parquet")]
    targets = [f"/tmp/btb-evil-{token}", str(REPO / f"btb-evil-{token}"),
               str(folder.parent / f"btb-evil-{token}"),
               str(release / "seed0" / f"btb-evil-{token}")]
    probe = EVIL_PROBE.format(labels=labels_files, targets=targets, secret=f"ci-secret-{token}")
    init = ("import btb_evil_probe\n"
            "REPORT = btb_evil_probe.PTH + ' ' + btb_evil_probe.probe('import')\n")
    return [build_wheel(folder, "btb-evil", version, {
        "btb_evil_probe.py": probe, "btb_evil.pth": "import btb_evil_probe\n",
        "btb_evil/__init__.py": init + ("raise RuntimeError('evil report: ' + REPORT)\n"
                                        if version == "2.0" else "")})
        for version in ("1.0", "2.0")]


EVIL_REPORT = re.compile(r"(pth|import):u(\d+) L(\S+) S(\d+) W(\S+) K(\S+)")


def check_evil_report(text: str, release: Path, tmp_path: Path, token: str) -> None:
    """Both the .pth and the import ran, in the sandbox, and no attack worked."""
    found = {m[0]: m[1:] for m in EVIL_REPORT.findall(text)}
    assert set(found) == {"pth", "import"}, text
    for where, (uid, read, secrets, writes, kill) in found.items():
        assert uid == str(sandbox.INSIDE_UID), (where, uid)  # the sandbox's uid, never 0
        assert read == "no,no"  # no label file can be read
        assert secrets == "0"  # the secret is in no environment it can read
        # /tmp inside is the sandbox's own tmpfs; the repository, the test's folder, the release
        # and the environment cache are absent or read-only
        assert writes == "ok,no,no,no,no", (where, writes)
        if sandbox.landlock_abi() >= 6:  # Landlock was on before any of it ran (-S, then site)
            assert kill == "EPERM", (where, kill)
    for p in (Path(f"/tmp/btb-evil-{token}"), REPO / f"btb-evil-{token}",
              tmp_path / f"btb-evil-{token}", release / "seed0" / f"btb-evil-{token}"):
        assert not p.exists(), p
    assert not list(Path(os.environ["BT_BENCH_CACHE"]).rglob("btb_evil_planted.py"))
    assert not list(tmp_path.rglob("btb_evil_planted.py"))


@needs_bwrap
def test_a_requirements_smoke_test_runs_in_the_sandbox(micro_release, tmp_path, monkeypatch):
    """The smoke test imports every requirement in the sandbox: a wheel whose import-time code
    and .pth try to read labels, a CI secret and write outside reach nothing, and its failure
    comes back as a clear error, its report shown as the requirement's own text."""
    from benchmark.sandbox.requirements import RequirementError, ensure_env

    token = f"{os.getpid()}-smoke"
    monkeypatch.setenv("BT_BENCH_TEST_CI_SECRET", f"ci-secret-{token}")
    evil_wheels(tmp_path / "wheels", micro_release, token)
    before = labels(micro_release).stat()
    with pytest.raises(RequirementError, match=r"(?s)requirement 'btb-evil==2\.0' installs "
                       r"but "
                       r"importing btb_evil fails:.*RuntimeError: evil report: ") as info:
        ensure_env(["btb-evil==2.0"], cache=tmp_path / "cache",
                   pip_args=offline(tmp_path / "wheels"))
    check_evil_report(str(info.value), micro_release, tmp_path, token)
    assert labels(micro_release).stat().st_mtime_ns == before.st_mtime_ns
    assert not (tmp_path / "cache" / "envs").exists() or not [
        p for p in (tmp_path / "cache" / "envs").iterdir()]  # nothing half-built is kept


@needs_bwrap
def test_a_malicious_requirement_reaches_nothing_and_the_evaluation_works(
        micro_release, tmp_path, capsys, monkeypatch):
    """``bt-bench evaluate --requirements`` with a wheel from a local folder (PIP_NO_INDEX,
    PIP_FIND_LINKS): its .pth and import-time code run in the smoke test's sandbox and in each
    of the estimator's, and the estimator reports what they found through its config."""
    token = f"{os.getpid()}-eval"
    monkeypatch.setenv("BT_BENCH_TEST_CI_SECRET", f"ci-secret-{token}")
    evil_wheels(tmp_path / "wheels", micro_release, token)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    est = tmp_path / "reporter.py"
    est.write_text("import numpy as np\nimport btb_evil\nfrom estimators.base import "
                   "BaseEstimator\n\n\nclass Reporter(BaseEstimator):\n"
                   "    name = 'reporter'\n\n"
                   "    def __init__(self, report: str = btb_evil.REPORT):\n"
                   "        self.report = report\n\n"
                   "    def score_rollouts(self, view):\n"
                   "        return np.asarray(view.advantages, float)\n")
    run(tmp_path, micro_release, est, "--requirements", "btb-evil==1.0", rc=0, capsys=capsys)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["requirements"] == [{"name": "btb-evil", "version": "1.0"}]
    check_evil_report(results["estimator"]["config"]["report"], micro_release, tmp_path, token)


# ----------------------------------------------------------------------------------------------
# what the evaluator records, and the same results with and without the sandbox


@needs_bwrap
def test_results_are_byte_identical_to_the_unsandboxed_run(micro_release, tmp_path, capsys):
    est = REPO / "estimators" / "examples" / "my_estimator.py"
    runs = {}
    for flag in ("", "--no-isolation"):
        out = tmp_path / f"r{flag}.json"
        argv = ["evaluate", str(est), "--release", str(micro_release), "--out", str(out),
                "--no-progress", "--no-causal", "--seeds", "0", *([flag] if flag else [])]
        assert main(argv) == 0
        runs[flag] = json.loads(out.read_text())
    capsys.readouterr()
    iso, plain = runs[""].pop("isolation"), runs["--no-isolation"].pop("isolation")
    assert runs[""] == runs["--no-isolation"]
    assert plain == {"protections": {"isolation": "none (in-process)"}, "limits": None}
    assert iso["limits"] == {"wall_seconds": Limits().wall_seconds,
                             "memory_bytes": Limits().memory_bytes,
                             "max_processes": Limits().max_processes,
                             "tmp_bytes": Limits().tmp_bytes}
    assert set(iso["protections"]) == {"sandbox", "user", "files", "seccomp", "network",
                                       "landlock", "memory", "processes", "time", "output",
                                       "results"}
    assert runs[""]["estimator"]["contract_checks"][-1].startswith("score_draw on draw")


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox changes uid only when bt-bench runs "
                    "as root (as in CI)")
@pytest.mark.parametrize("checked", [True, False])
def test_a_temporary_folder_the_sandbox_user_cannot_reach_is_named(checked, micro_release,
                                                                   tmp_path, capsys, monkeypatch):
    """bt-bench as root with TMPDIR under a 0700 folder: the fresh uid cannot reach the staging
    folder. Refused up front naming the folder and the fix; and were that check missing, the
    launcher's or bubblewrap's own complaint is reported as the sandbox failing to start."""
    from benchmark.sandbox import launch

    private = Path(tempfile.mkdtemp(prefix="bt-private-"))  # 0700, owned by root
    (private / "tmp").mkdir(mode=0o777)
    if not checked:
        monkeypatch.setattr(launch, "_require_reachable_tmp", lambda: None)
    est = REPO / "estimators" / "examples" / "my_estimator.py"
    saved, tempfile.tempdir = tempfile.tempdir, str(private / "tmp")  # what TMPDIR sets
    try:
        err, _ = run(tmp_path, micro_release, est, capsys=capsys)
        leftover = [p.name for p in (private / "tmp").iterdir()]
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(private)
    assert not leftover
    if checked:
        assert f"cannot reach the temporary folder {private}/tmp: {private} has mode 0700" in err
        assert "export TMPDIR=/tmp" in err and f"chmod o+x {private}" in err
    else:
        assert "the sandbox for my_estimator.py could not start (bwrap: " in err
        assert "Permission denied" in err and "TMPDIR" in err


@needs_bwrap
def test_a_release_file_the_sandbox_cannot_read_is_named(micro_release, tmp_path, capsys):
    """A 0600 checkpoint (transformers writes safetensors that way) is refused up front with
    the file and the fix, not left to surface inside as "No such file or directory"."""
    import shutil

    rel = tmp_path / "release"
    shutil.copytree(micro_release, rel)
    private = checkpoint_file(rel)
    os.chmod(private, 0o600)
    est = REPO / "estimators" / "examples" / "my_estimator.py"
    err, _ = run(tmp_path, rel, est, capsys=capsys)
    assert str(private) in err and "chmod -R a+rX" in err


@pytest.mark.parametrize("isolated", [True, False])
def test_estimator_errors_show_its_traceback_and_output(isolated, micro_release, tmp_path,
                                                        capsys):
    if isolated and not FULL.full:
        pytest.skip(f"the full sandbox cannot run here ({FULL.problem})")
    est = hostile(tmp_path, "print('\\x1b[31mlooking up the table\\x1b[0m')\nreturn helper(None)",
                  prelude="def helper(table):\n    return table[0]")
    err, _ = run(tmp_path, micro_release, est, *([] if isolated else ["--no-isolation"]),
                 capsys=capsys)
    assert "Hostile.score_rollouts raised TypeError: 'NoneType' object is not subscriptable" in err
    assert "the estimator's traceback:" in err
    assert f'File "{est}", line ' in err and "in helper" in err and "return table[0]" in err
    assert "\x1b" not in err
    if isolated:  # its own output, cleaned, labelled
        assert "its last output" in err and "| looking up the table" in err


# ----------------------------------------------------------------------------------------------
# where bubblewrap is missing


@pytest.fixture
def no_bwrap(monkeypatch):
    monkeypatch.setenv("BT_BENCH_BWRAP", "")
    assert not sandbox.probe().full


def test_submit_and_verify_refuse_without_bubblewrap(no_bwrap, tmp_path, capsys):
    est = REPO / "estimators" / "examples" / "my_estimator.py"
    assert main(["submit", str(est), "--name", "x", "--authors", "me",
                 "--submissions-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bt-bench submit" in err and "apt-get install bubblewrap" in err
    assert main(["verify", "--submissions-dir", str(REPO / "submissions"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "bt-bench verify" in err and "bubblewrap" in err
    assert not list(tmp_path.iterdir())


def test_evaluate_without_bubblewrap_warns_and_records_it(no_bwrap, micro_release, tmp_path,
                                                          capsys):
    from benchmark.sandbox import launch

    launch._WARNED.clear()
    est = REPO / "estimators" / "examples" / "my_estimator.py"
    out = tmp_path / "r.json"
    assert main(["evaluate", str(est), "--release", str(micro_release), "--out", str(out),
                 "--no-progress", "--no-causal", "--seeds", "0"]) == 0
    err = capsys.readouterr().err
    assert "warning: bubblewrap (bwrap) is not installed" in err
    prot = json.loads(out.read_text())["isolation"]["protections"]
    assert prot["sandbox"].startswith("missing: bubblewrap (bwrap) is not installed")
    assert prot["seccomp"].startswith("missing")
