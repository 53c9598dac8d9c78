"""The layers of the estimator sandbox, and a probe of which ones this machine offers.

* **bubblewrap** (``bwrap``, the sandbox Flatpak uses), the outer layer: new user, PID, IPC,
  UTS, network, cgroup and mount namespaces; no capabilities; a read-only root holding nothing
  but read-only binds of exactly what the estimator may read; private size-limited tmpfs for
  ``/tmp`` and ``/dev/shm``; a minimal ``/dev``; a new session; dies with its parent
  (:func:`bwrap_argv`);
* **seccomp** (:mod:`benchmark.sandbox.seccomp`): an allow-list of system calls plus argument
checks;
* **an unprivileged uid**: when the evaluator runs as root, the launcher
  (:mod:`benchmark.sandbox._launch`) drops to a fresh uid of its own before starting bubblewrap
  (:func:`sandbox_uid`); otherwise the sandbox runs as the caller's uid, without capabilities;
* **Landlock** (Linux >= 5.13), the inner layer, applied by the sandboxed process to itself
  before the estimator is loaded (:func:`apply_landlock`): read-only beneath the bound paths,
  writes beneath ``/tmp`` and ``/dev/shm`` only, no TCP, no ioctl on devices, and (Linux >= 6.12)
  no signals or abstract unix sockets beyond its own domain;
* **limits of the process tree**: :mod:`benchmark.sandbox.cgroups` and resource limits set by the
  launcher.

Without bubblewrap or user namespaces, :func:`apply_fallback` gives a child process Landlock and
an empty network namespace (root only) and the evaluator records what was missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from benchmark.errors import BenchmarkError

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWNET = 0x40000000
_RULE_PATH_BENEATH = 1
_READ = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE | READ_FILE | READ_DIR
_IOCTL_DEV = 1 << 15
# rights that apply to a regular file: EXECUTE, WRITE_FILE, READ_FILE, TRUNCATE, IOCTL_DEV
_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | _IOCTL_DEV
# number of filesystem access bits known to each Landlock ABI version
_FS_BITS = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16, 6: 16, 7: 16}

#: the uid and gid the estimator sees inside the sandbox ("nobody")
INSIDE_UID = 65534
#: fresh uids for sandboxes started by root are drawn from [base, base + span)
UID_BASE, UID_SPAN = 2_000_000_000, 100_000_000
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf "
                "install bubblewrap) and allow unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1)")
LAUNCHER = Path(__file__).resolve().parent / "_launch.py"


class SandboxUnavailable(BenchmarkError):
    """The machine lacks bubblewrap or user namespaces, and the command requires them."""


# ----------------------------------------------------------------------------------------------
# Landlock (inner layer, applied by the sandboxed process itself)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is unavailable."""
    try:
        r = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(int(r), 0)


def landlock_summary(abi: int) -> str:
    """What a Landlock domain of ABI ``abi`` restricts, as recorded in ``results.json``."""
    if abi <= 0:
        return "unavailable (kernel without Landlock)"
    parts = ["files"] + (["TCP"] if abi >= 4 else []) + (["device ioctl"] if abi >= 5 else []) \
        + (["signals and abstract unix sockets"] if abi >= 6 else [])
    return f"abi {abi}: " + ", ".join(parts)


def apply_landlock(read: Iterable[str], write: Iterable[str]) -> str:
    """Restrict the calling process for good: read beneath ``read``, write beneath ``write``.

    Returns:
        :func:`landlock_summary` of the domain, or why it could not be applied.
    """
    abi = landlock_abi()
    if abi <= 0:
        return landlock_summary(0)
    libc = _libc()
    fs_all = (1 << _FS_BITS.get(abi, 16)) - 1
    attr = _RulesetAttr(fs_all, 0, 0)
    size = 8
    if abi >= 4:
        attr.handled_access_net, size = 0b11, 16  # BIND_TCP | CONNECT_TCP, no port allowed
    if abi >= 6:
        attr.scoped, size = 0b11, 24  # ABSTRACT_UNIX_SOCKET | SIGNAL
    fd = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                      ctypes.c_uint32(0))
    if fd < 0:
        return f"failed ({os.strerror(ctypes.get_errno())})"
    try:
        for paths, access in ((read, _READ), (write, fs_all & ~_IOCTL_DEV)):
            for p in paths:
                if not os.path.exists(p):
                    continue
                pfd = os.open(p, os.O_PATH | os.O_CLOEXEC)
                try:
                    allowed = access & fs_all
                    if not os.path.isdir(p):
                        allowed &= _FILE_RIGHTS
                    rule = _PathBeneath(allowed, pfd)
                    if libc.syscall(_SYS_ADD_RULE, fd, _RULE_PATH_BENEATH, ctypes.byref(rule),
                                    ctypes.c_uint32(0)) != 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule({p})")
                finally:
                    os.close(pfd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_SYS_RESTRICT_SELF, fd, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)
    return landlock_summary(abi)


def apply_fallback(read: Iterable[str], write: Iterable[str]) -> dict[str, str]:
    """Without bubblewrap: an empty network namespace (needs root) and Landlock for the caller."""
    libc = _libc()
    net = "empty network namespace" if libc.unshare(_CLONE_NEWNET) == 0 else \
        f"missing ({os.strerror(ctypes.get_errno())})"
    return {"network": net, "landlock": apply_landlock(list(read), list(write))}


# ----------------------------------------------------------------------------------------------
# reaping the sandbox's processes

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_REAPER_LOCK = threading.Lock()
_REAPER_USERS = [0, 0]  # runs in progress, the setting before the first


@contextlib.contextmanager
def adopt_orphans() -> Iterator[None]:
    """Make this process adopt its orphaned descendants while sandboxes run.

    bubblewrap can exit before the sandbox's init process is reaped; that process is then
    re-parented to the nearest subreaper, which :func:`reap_orphans` waits for (without one it
    goes to the machine's init, which in some containers never reaps it).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    with _REAPER_LOCK:
        if _REAPER_USERS[0] == 0:
            old = ctypes.c_int(0)
            libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(old), 0, 0, 0)
            _REAPER_USERS[1] = old.value
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        _REAPER_USERS[0] += 1
    try:
        yield
    finally:
        with _REAPER_LOCK:
            _REAPER_USERS[0] -= 1
            if _REAPER_USERS[0] == 0:
                libc.prctl(_PR_SET_CHILD_SUBREAPER, _REAPER_USERS[1], 0, 0, 0)


def reap_orphans(pids: Iterable[int] = (), timeout: float = 2.0) -> None:
    """Wait for sandbox processes re-parented to this one: ``pids`` and orphaned ``bwrap``s."""
    me = str(os.getpid())
    left = set(pids)
    for d in Path("/proc").iterdir():  # bubblewrap's own orphans (its sandbox init)
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if d.name.isdigit() and fields[1] == me and (d / "comm").read_text().strip() == "bwrap":
                left.add(int(d.name))
        except (OSError, IndexError):
            continue
    end = time.monotonic() + timeout
    while left and time.monotonic() < end:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not (or no longer) our child
                left.discard(pid)
                continue
            if done:
                left.discard(pid)
        if left:
            time.sleep(0.01)


# ----------------------------------------------------------------------------------------------
# bubblewrap


def find_bwrap() -> str | None:
    """The bubblewrap binary: ``$BT_BENCH_BWRAP`` (empty = none, for tests) or ``bwrap`` on PATH."""
    env = os.environ.get("BT_BENCH_BWRAP")
    if env is not None:
        return env if env and os.access(env, os.X_OK) else None
    return shutil.which("bwrap")


def sandbox_uid() -> int | None:
    """The init-namespace uid of a new sandbox: a fresh unprivileged one under root, else None.

    Under root every sandbox gets its own uid in ``[UID_BASE, UID_BASE + UID_SPAN)``: no file
    outside the sandbox belongs to it, no other process runs as it, and ``RLIMIT_NPROC`` counts
    exactly the sandbox's processes. A normal user cannot change uid; the sandbox then runs as
    the caller's uid (inside it appears as ``INSIDE_UID``), without capabilities.
    """
    if os.geteuid() != 0:
        return None
    return UID_BASE + secrets.randbelow(UID_SPAN)


def launch_command(spec: dict) -> list[str]:
    """Argv of the launcher (:mod:`benchmark.sandbox._launch`) for ``spec``."""
    return [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(spec)]


def host_system_entries() -> list[tuple[str, str, str]]:
    """(kind, source, dest) of the top-level system folders: symlinks kept as symlinks."""
    out = [("bind", "/usr", "/usr")]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / name
        if p.is_symlink():
            out.append(("symlink", os.readlink(p), str(p)))
        elif p.is_dir():
            out.append(("bind", str(p), str(p)))
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives"):
        p = Path("/etc") / name
        if p.exists():
            out.append(("bind", str(p), str(p)))
    return out


def bwrap_argv(bwrap: str, binds: list[tuple[str, str]], symlinks: list[tuple[str, str]],
               env: dict[str, str], tmp_bytes: int, seccomp_fds: list[int],
               command: list[str]) -> list[str]:
    """The bubblewrap command line.

    Args:
        binds: (source, destination) read-only binds, parents before children.
        symlinks: (target, path) symlinks to create (e.g. ``/lib -> usr/lib``).
        env: the whole environment inside.
        tmp_bytes: size of each private tmpfs (``/tmp``, ``/dev/shm``).
        seccomp_fds: BPF programs (``--add-seccomp-fd``).
        command: what to run inside.
    """
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-net", "--unshare-cgroup", "--disable-userns", "--uid", str(INSIDE_UID),
            "--gid", str(INSIDE_UID), "--hostname", "sandbox", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_bytes), "--tmpfs", "/tmp",
             "--size", str(tmp_bytes), "--tmpfs", "/dev/shm"]
    # folders bubblewrap creates for binds beneath a writable tmpfs go on a small tmpfs of their
    # own that is made read-only after the binds (else the estimator could write there)
    dests = {dst for _, dst in binds}
    tops = sorted({"/".join(dst.split("/")[:3]) for dst in dests
                   if dst.startswith("/tmp/") and dst.count("/") > 2}
                  | {"/".join(dst.split("/")[:4]) for dst in dests
                     if dst.startswith("/dev/shm/") and dst.count("/") > 3})
    tops = [t for t in tops if t not in dests]
    for top in tops:
        argv += ["--size", str(1 << 20), "--tmpfs", top]
    for target, path in symlinks:
        argv += ["--symlink", target, path]
    for src, dst in binds:
        argv += ["--ro-bind", src, dst]
    for top in tops:
        argv += ["--remount-ro", top]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]
    for fd in seccomp_fds:
        argv += ["--add-seccomp-fd", str(fd)]
    return argv + ["--", *command]


def bwrap_version(bwrap: str) -> str:
    """``"bubblewrap 0.8.0"`` (or the path when ``--version`` fails)."""
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10,
                             check=False, stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out or bwrap


@dataclass(frozen=True)
class Platform:
    """What this machine offers the sandbox.

    Attributes:
        bwrap: path of bubblewrap, or None.
        bwrap_version: e.g. ``"bubblewrap 0.8.0"``.
        problem: why the full sandbox cannot run here ("" when it can).
        landlock_abi: the kernel's Landlock ABI (0 = none).
        libseccomp: libseccomp's version, or None.
    """

    bwrap: str | None
    bwrap_version: str
    problem: str
    landlock_abi: int
    libseccomp: str | None

    @property
    def full(self) -> bool:
        """True when bubblewrap, user namespaces and libseccomp all work."""
        return not self.problem


@cache
def _probe(bwrap: str | None) -> Platform:
    from benchmark.sandbox import seccomp

    abi = landlock_abi()
    try:
        lsc = seccomp.libseccomp_version()
    except OSError:
        lsc = None
    if bwrap is None:
        return Platform(None, "", "bubblewrap (bwrap) is not installed", abi, lsc)
    version = bwrap_version(bwrap)
    uid = sandbox_uid()
    symlinks = [(s, d) for k, s, d in host_system_entries() if k == "symlink"]
    binds = [(s, d) for k, s, d in host_system_entries() if k == "bind"]
    argv = bwrap_argv(bwrap, binds, symlinks, {"PATH": "/usr/bin:/bin"}, 1 << 20, [],
                      ["/bin/sh", "-c", "exit 0"])
    spec = {"cgroups": [], "rlimits": {}, "stage": [], "uid": uid, "gid": uid,
            "parent": os.getpid(), "argv": argv, "env": {}}
    try:
        with adopt_orphans():
            r = subprocess.run(launch_command(spec), capture_output=True, text=True, timeout=30,
                               check=False, stdin=subprocess.DEVNULL)
            reap_orphans()
        why = (r.stderr.strip() or f"exit {r.returncode}")[:200]
        problem = "" if r.returncode == 0 else \
            f"bubblewrap cannot create a sandbox here ({why}); user namespaces may be disabled"
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = f"bubblewrap failed to start ({exc})"
    if not problem and lsc is None:
        problem = "libseccomp is not installed (Debian: apt-get install libseccomp2)"
    return Platform(bwrap, version, problem, abi, lsc)


def probe() -> Platform:
    """Which layers work on this machine (cached per bubblewrap path; about 50 ms at first)."""
    return _probe(find_bwrap())


def require_sandbox(command: str) -> Platform:
    """Refuse (one line with the install hint) unless the full sandbox works here.

    Args:
        command: the refusing command, e.g. ``"bt-bench submit"``.
    """
    plat = probe()
    if not plat.full:
        raise SandboxUnavailable(
            f"{command} runs submitted code and needs the full sandbox, but {plat.problem}; "
            f"{INSTALL_HINT}."
        )
    return plat
