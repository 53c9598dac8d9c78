"""Kernel-level limits a child process applies to itself before it runs estimator code.

* memory: ``RLIMIT_AS`` (address space); an allocation past it raises ``MemoryError``;
* network: a new, empty network namespace (``unshare(CLONE_NEWNET)``, needs root or user
  namespaces) and, independently, Landlock's TCP bind/connect restriction (Linux >= 6.7);
* files: Landlock (Linux >= 5.13): read-only access beneath an allow-list of paths, read-write
  beneath a scratch folder, nothing else (the labels and the release folder are not in the list);
* signals / abstract unix sockets: Landlock scoping (Linux >= 6.12), so the child cannot signal
  or connect to processes outside its sandbox.

Each layer that the platform lacks is skipped and reported by :func:`apply`; the parent records
which protections were active. Landlock is reached through its three system calls with ctypes
(x86-64 and arm64 share the syscall numbers 444-446).
"""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Iterable

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWNET = 0x40000000
_RULE_PATH_BENEATH = 1
_READ = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE | READ_FILE | READ_DIR
# rights that apply to a regular file: EXECUTE, WRITE_FILE, READ_FILE, TRUNCATE, IOCTL_DEV
_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)
# number of filesystem access bits known to each Landlock ABI version
_FS_BITS = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16, 6: 16, 7: 16}


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


def _landlock(read: Iterable[str], write: Iterable[str]) -> str:
    abi = landlock_abi()
    if abi <= 0:
        return "unavailable"
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
        for paths, access in ((read, _READ), (write, fs_all)):
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
    return f"landlock abi {abi}" + (" (+tcp)" if abi >= 4 else "")


def _new_netns() -> str:
    libc = _libc()
    if libc.unshare(_CLONE_NEWNET) != 0:
        return f"unavailable ({os.strerror(ctypes.get_errno())})"
    return "empty network namespace"


def apply(read: Iterable[str], write: Iterable[str], memory_bytes: int | None) -> dict[str, str]:
    """Restrict the calling process for good; return which protections are active.

    Args:
        read: paths (files or folders) readable afterwards, with everything beneath them.
        write: folders writable afterwards (e.g. the scratch and output folders).
        memory_bytes: address-space limit in bytes, or None for no limit.
    """
    active = {}
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        active["memory"] = f"RLIMIT_AS {memory_bytes / 2**30:.2f} GiB"
    active["network"] = _new_netns()
    active["files"] = _landlock(list(read), list(write))
    return active
