"""The estimator sandbox's system-call filter, built with libseccomp (through ctypes).

Two filters are exported as BPF programs into memory files and handed to bubblewrap
(``--add-seccomp-fd``); the kernel applies both and the most restrictive answer wins.

1. **allow-list** (default: ``ENOSYS``, the answer of a kernel that lacks the call, so libraries
   fall back as they do on older kernels): the calls a Python/NumPy/PyTorch process needs, and
   an explicit ``EPERM`` for each call of :data:`DENIED` (kernel tracing and perf, BPF,
   fanotify, ptrace and reading other processes' memory, keyrings, mounting and namespaces,
   kernel modules, device nodes, io_uring, userfaultfd, clocks, reboot, ...);
2. **argument checks** (default: allow): ``EPERM`` for terminal injection (``ioctl``
   ``TIOCSTI``/``TIOCLINUX``), ``clone`` with any namespace flag, sockets of any family but
   ``AF_UNIX``, ``prlimit64`` on another process, and setting the set-user/group-ID bit.

System calls of another ABI (i386 ``int 0x80``, x32) kill the process (libseccomp's
architecture check). libseccomp resolves names per architecture and skips names it does not
know, so the same lists work on x86-64 and arm64.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from functools import cache

_ACT_ALLOW = 0x7FFF0000


def _act_errno(e: int) -> int:
    return 0x00050000 | (e & 0xFFFF)


_CMP_NE, _CMP_EQ, _CMP_MASKED_EQ = 1, 4, 7
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_AF_UNIX = 1
_CLONE_NS_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                   0x40000000, 0x00000080)  # NEWNS CGROUP UTS IPC USER PID NET TIME
_S_ISUID, _S_ISGID = 0o4000, 0o2000

#: system calls answered with EPERM: whatever reaches beyond the sandbox's own processes/files
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise",
    "perf_event_open", "bpf", "fanotify_init", "fanotify_mark", "lookup_dcookie",
    "keyctl", "add_key", "request_key",
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns",
    "open_by_handle_at", "name_to_handle_at",
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "quotactl_fd", "mknod", "mknodat", "iopl", "ioperm", "syslog", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
    "setdomainname", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "personality", "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "migrate_pages",
    "move_pages", "mbind", "set_mempolicy_home_node", "lsm_set_self_attr",
)

#: calls allowed as they are (the rest of the allow-list has argument checks in filter 2)
ALLOWED = (
    # files and descriptors
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
    "pwritev2", "open", "openat", "openat2", "creat", "close", "close_range", "dup", "dup2",
    "dup3", "lseek", "_llseek", "fcntl", "fcntl64", "ioctl", "stat", "stat64", "fstat",
    "fstat64", "lstat", "lstat64", "newfstatat", "fstatat64", "statx", "statfs", "statfs64",
    "fstatfs", "fstatfs64", "access", "faccessat", "faccessat2", "getdents", "getdents64",
    "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "rename", "renameat", "renameat2",
    "link", "linkat", "unlink", "unlinkat", "symlink", "symlinkat", "readlink", "readlinkat",
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
    "chown32", "fchown32", "lchown32", "umask", "truncate", "truncate64", "ftruncate",
    "ftruncate64", "fallocate", "fadvise64", "fadvise64_64", "readahead", "fsync", "fdatasync",
    "sync", "syncfs", "sync_file_range", "flock", "utime", "utimes", "utimensat", "futimesat",
    "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr", "setxattr",
    "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "sendfile",
    "sendfile64", "splice", "tee", "vmsplice", "copy_file_range", "pipe", "pipe2",
    "memfd_create", "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch",
    "eventfd", "eventfd2", "signalfd", "signalfd4", "timerfd_create", "timerfd_settime",
    "timerfd_gettime", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "_newselect", "pselect6",
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
    "cachestat",
    # memory
    "brk", "mmap", "mmap2", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync",
    "mlock", "mlock2", "munlock", "mlockall", "munlockall", "membarrier", "get_mempolicy",
    "set_mempolicy", "pkey_alloc", "pkey_free", "pkey_mprotect", "remap_file_pages",
    "map_shadow_stack", "mseal",
    # processes, threads, signals (only the sandbox's own are reachable: new PID namespace)
    "clone", "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
    "waitpid", "kill", "tkill", "tgkill", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn",
    "sigreturn", "rt_sigpending", "rt_sigsuspend", "rt_sigtimedwait", "rt_sigqueueinfo",
    "rt_tgsigqueueinfo", "sigaltstack", "pause", "restart_syscall", "pidfd_open",
    "pidfd_send_signal", "futex", "futex_waitv", "set_robust_list", "get_robust_list",
    "set_tid_address", "rseq", "arch_prctl", "set_thread_area", "get_thread_area", "prctl",
    "seccomp", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
    "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam",
    "sched_setparam", "sched_getscheduler", "sched_setscheduler", "sched_getattr",
    "sched_setattr", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "getpriority", "setpriority", "ioprio_get", "ioprio_set",
    "getrlimit", "ugetrlimit", "setrlimit", "prlimit64", "getrusage", "times", "getcpu",
    "setsid", "getsid", "setpgid", "getpgid", "getpgrp", "getpid", "getppid", "gettid",
    "getuid", "geteuid", "getgid", "getegid", "getuid32", "geteuid32", "getgid32",
    "getegid32", "getresuid", "getresgid", "getresuid32", "getresgid32", "getgroups",
    "getgroups32", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
    "setfsuid", "setfsgid", "setgroups", "setuid32", "setgid32", "setreuid32", "setregid32",
    "setresuid32", "setresgid32", "setfsuid32", "setfsgid32", "setgroups32", "capget",
    "capset",
    # time
    "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time",
    "alarm", "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete", "clock_gettime64", "clock_nanosleep_time64",
    # system information and randomness
    "uname", "sysinfo", "getrandom",
    # sockets (filter 2 keeps only AF_UNIX; the network namespace is empty anyway)
    "socket", "socketpair", "socketcall", "bind", "listen", "accept", "accept4", "connect",
    "shutdown", "getsockname", "getpeername", "getsockopt", "setsockopt", "sendto", "recvfrom",
    "sendmsg", "recvmsg", "sendmmsg", "recvmmsg",
    # System V IPC and POSIX message queues (a new IPC namespace: the sandbox's own only)
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl", "msgget",
    "msgsnd", "msgrcv", "msgctl", "ipc", "mq_open", "mq_unlink", "mq_timedsend",
    "mq_timedreceive", "mq_notify", "mq_getsetattr",
)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class SeccompUnavailable(OSError):
    """libseccomp is not installed (or too old)."""


@cache
def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp not found ({exc})") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def libseccomp_version() -> str:
    """``"2.5.4"``, or raise :class:`SeccompUnavailable`."""
    lib = _lib()

    class _Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]

    lib.seccomp_version.restype = ctypes.POINTER(_Version)
    v = lib.seccomp_version().contents
    return f"{v.major}.{v.minor}.{v.micro}"


class _Filter:
    def __init__(self, default: int) -> None:
        self.lib = _lib()
        self.ctx = self.lib.seccomp_init(default)
        if not self.ctx:
            raise SeccompUnavailable("seccomp_init failed")
        self.rules = 0

    def add(self, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # unknown on this architecture / libseccomp version
            return
        arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(cmps), arr)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add({name}): {os.strerror(-rc)}")
        self.rules += 1

    def export(self) -> int:
        fd = os.memfd_create("bt-bench-seccomp", os.MFD_CLOEXEC)
        try:
            rc = self.lib.seccomp_export_bpf(self.ctx, fd)
            if rc < 0:
                raise OSError(-rc, f"seccomp_export_bpf: {os.strerror(-rc)}")
            os.lseek(fd, 0, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        finally:
            self.lib.seccomp_release(self.ctx)
        return fd


def build_filters() -> tuple[list[int], str]:
    """Export the two filters; return their file descriptors (memfds, close-on-exec) and a summary.

    Raises:
        SeccompUnavailable / OSError: libseccomp is missing or refused a rule.
    """
    eperm = _act_errno(errno.EPERM)
    allow = _Filter(_act_errno(errno.ENOSYS))
    for name in ALLOWED:
        allow.add(_ACT_ALLOW, name)
    n_allowed = allow.rules
    for name in DENIED:
        allow.add(eperm, name)
    n_denied = allow.rules - n_allowed
    # clone3 keeps the default ENOSYS (its flags are in memory, out of the filter's reach), so
    # glibc falls back to clone, whose flags filter 2 checks

    args = _Filter(_ACT_ALLOW)
    low32 = 0xFFFFFFFF
    for cmd in (_TIOCSTI, _TIOCLINUX):
        args.add(eperm, "ioctl", (1, _CMP_MASKED_EQ, low32, cmd))
    for flag in _CLONE_NS_FLAGS:
        args.add(eperm, "clone", (0, _CMP_MASKED_EQ, flag, flag))
    for name in ("socket", "socketpair"):
        args.add(eperm, name, (0, _CMP_NE, _AF_UNIX, 0))
    args.add(eperm, "prlimit64", (0, _CMP_NE, 0, 0))
    for name, pos in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2)):
        for bit in (_S_ISUID, _S_ISGID):
            args.add(eperm, name, (pos, _CMP_MASKED_EQ, bit, bit))
    fds = []
    try:
        fds.append(allow.export())
        fds.append(args.export())
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    summary = (f"libseccomp {libseccomp_version()}: {n_allowed} system calls allowed, "
               f"{n_denied} refused with EPERM, the rest ENOSYS; argument checks on ioctl "
               "(TIOCSTI, TIOCLINUX), clone (namespace flags), socket (AF_UNIX only), prlimit64 "
               "(own process only), chmod (no set-ID bits)")
    return fds, summary
