"""Launcher of the estimator sandbox: the last trusted step before bubblewrap.

Run by :mod:`benchmark.sandbox.launch` as ``python -I -S _launch.py SPEC_JSON`` (a fresh, single-
threaded interpreter that imports nothing from the environment). In this order it

1. moves itself into the sandbox's cgroups (memory and process limits of the whole tree);
2. sets hard resource limits that every process of the sandbox inherits;
3. when running as root: enters a private mount namespace and bind-mounts each path the sandbox
   may read onto an empty *staging* mount point the unprivileged uid can reach (``/root`` is
   ``0700``; the binds are made while still root and vanish with this namespace), then drops to
   the sandbox's unprivileged uid/gid with no supplementary groups;
4. asks for SIGKILL when the evaluator dies (after the uid change, which would clear it) and
   checks that the evaluator is still alive;
5. replaces itself with bubblewrap.

Standard library only; nothing here imports the estimator or the ``benchmark`` package.
"""

import ctypes
import json
import os
import resource
import signal
import sys

_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG = 1


def _fail(msg: str) -> None:
    os.write(2, f"bt-bench sandbox launcher: {msg}\n".encode())
    os._exit(125)


def main() -> None:
    spec = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    for procs in spec["cgroups"]:
        try:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
        except OSError as exc:
            _fail(f"cannot join cgroup {procs}: {exc}")
    for name, value in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if spec["stage"]:
        if libc.unshare(_CLONE_NEWNS) != 0:
            _fail(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
        if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            _fail(f"mount --make-rprivate /: {os.strerror(ctypes.get_errno())}")
        for src, dst in spec["stage"]:
            if libc.mount(src.encode(), dst.encode(), None, _MS_BIND | _MS_REC, None) != 0:
                _fail(f"bind {src} -> {dst}: {os.strerror(ctypes.get_errno())}")
    if spec["uid"] is not None:
        os.setgroups([])
        os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        _fail("prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != spec["parent"]:
        _fail("the evaluator exited before the sandbox started")
    argv = spec["argv"]
    os.execve(argv[0], argv, spec["env"])


if __name__ == "__main__":
    main()
