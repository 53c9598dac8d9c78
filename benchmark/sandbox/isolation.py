"""Running an untrusted estimator in the sandbox, and trusting nothing it sends back but scores.

For every piece of estimator code (``inspect``: load it and read its declared capabilities and
config; ``score``: score every view and draw) the evaluator

1. copies the estimator file into a private folder (the sha256 recorded is that of the bytes
   that run), exports the label-free views into a *view folder* (:mod:`benchmark.sandbox.view_io`),
   and lists what the sandbox may read: the Python installation, the ``benchmark`` and
   ``estimators`` packages, the estimator file, the view folder, the release files the views
   read in place (sketches), the release's checkpoint and tokenizer folders, and the paths the
   caller adds; it refuses when a label file or a git repository would be among them;
2. starts the sandbox (:mod:`benchmark.sandbox.layers`: bubblewrap, seccomp, an unprivileged uid,
   Landlock inside; limits on the whole process tree from :mod:`benchmark.sandbox.cgroups`) through
   the
   launcher :mod:`benchmark.sandbox._launch`, with stdin from ``/dev/null`` and the estimator's
   stdout/stderr on a pipe that is drained, capped and kept only as a tail;
3. when the sandboxed process says it is ready (before any estimator code ran), checks it from
   outside in ``/proc`` (namespaces, seccomp, no_new_privs, no capabilities, its uid) and
   records the protections itself; only then lets it load the estimator;
4. reads the result channel (:mod:`benchmark.sandbox.channel`): the declared metadata, validated
   (JSON scalars, bounded, printable), and one score array per expected call, each checked
   (header before allocation, numeric dtype, exact shape, finite);
5. holds one wall-clock deadline over all of it (both sandboxes of a ``score``), kills the whole
   process tree at the end of every run, and removes every temporary folder on every exit path,
   signals included.

The same sandbox runs a submission environment's smoke test (:func:`smoke_isolated`): the
environment's interpreter imports the core and every requirement there, never in the evaluator.

Determinism is checked from outside: a second, fresh sandbox re-scores the first seed's rollout
and step views (and its first draw when the estimator scores draws) and the arrays must match
byte for byte. A crash, a timeout, a limit, a refused access or a malformed result ends in an
:class:`IsolationError` (or an ``EstimatorContractError``) naming the estimator and what
happened; text from the estimator is shown cleaned and labelled as its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from benchmark.errors import BenchmarkError
from benchmark.sandbox import cgroups, channel
from benchmark.sandbox import layers as sandbox

# the view folder and the list of scoring calls, shared with the sandboxed side
from benchmark.sandbox.view_io import Views, assemble, export_views, load_views, score_calls
from benchmark.untrusted import clean_text, quote

__all__ = ["INSIDE_VIEW", "IsolationError", "Limits", "Views", "assemble", "export_views",
           "inspect_isolated", "load_views", "score_calls", "score_isolated", "smoke_isolated",
           "validate_meta"]
#: where the view folder appears inside the sandbox
INSIDE_VIEW = "/bt-bench/view"
#: output of the estimator past which it is stopped; the last OUTPUT_TAIL characters are shown
OUTPUT_STOP, OUTPUT_TAIL = 64 << 20, 3000
#: largest estimator file accepted
MAX_ESTIMATOR_BYTES = 16 << 20
TEMP_PREFIX = "bt-bench-sandbox-"
_POLL = 0.2
_WARNED: set[str] = set()


class IsolationError(BenchmarkError):
    """The estimator's sandbox failed: crash, limit, refused access or a malformed result."""


@dataclass(frozen=True)
class Limits:
    """Limits of the estimator's sandbox (defaults fit the ``tiny`` release).

    Attributes:
        wall_seconds: one wall-clock deadline for starting, checking, scoring and reading back
            (both sandboxes of a ``score``: the full run and the determinism re-run).
        memory_bytes: memory of the whole process tree (cgroup) and address space of each
            process (``RLIMIT_AS``); Python + torch need about 1 GiB.
        max_processes: processes and threads of the whole tree.
        tmp_bytes: size of each private tmpfs (``/tmp``, ``/dev/shm``); counts as memory too.
    """

    wall_seconds: float = 600.0
    memory_bytes: int = 6 << 30
    max_processes: int = 512
    tmp_bytes: int = 1 << 30


# ----------------------------------------------------------------------------------------------
# validation of what the sandbox declares


def validate_meta(obj: object, who: str) -> dict:
    """The sandbox's declared metadata, checked field by field (never trusted as sent)."""
    from benchmark.contract import MAX_NAME, config_problem
    from estimators.base import FALLBACK_VIEWS, TASKS, TRACKS

    def bad(what: str) -> IsolationError:  # the caller names the estimator ({who})
        return IsolationError(f"its declared metadata was refused ({what}).")

    keys = {"name", "class", "track", "tasks", "fallbacks", "config", "has_score_draw"}
    if not isinstance(obj, dict) or set(obj) != keys:
        raise bad("not the expected fields")
    name, cls, track, tasks = obj["name"], obj["class"], obj["track"], obj["tasks"]
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME \
            or not name.isprintable() or name != name.strip():
        raise bad(f"name {clean_text(ascii(name), 80, multiline=False)} is not at most "
                  f"{MAX_NAME} printable characters")
    if not isinstance(cls, str) or not cls.isidentifier() or len(cls) > 100:
        raise bad(f"class {clean_text(ascii(cls), 80, multiline=False)} is not an identifier")
    if track not in TRACKS:
        raise bad(f"track {clean_text(ascii(track), 80, multiline=False)}")
    if not isinstance(tasks, list) or not tasks or len(set(map(str, tasks))) != len(tasks) \
            or any(t not in TASKS for t in tasks) or "rollouts" not in tasks:
        raise bad(f"tasks {clean_text(ascii(tasks), 80, multiline=False)}")
    if not isinstance(obj["has_score_draw"], bool) or ("draws" in tasks
                                                       and not obj["has_score_draw"]):
        raise bad("'draws' declared without score_draw")
    fb = obj["fallbacks"]
    if not isinstance(fb, list) or len(set(map(str, fb))) != len(fb) \
            or any(v not in FALLBACK_VIEWS for v in fb):
        raise bad(f"fallbacks {clean_text(ascii(fb), 80, multiline=False)}")
    problem = config_problem(obj["config"])
    if problem:
        raise bad(f"config: {problem}")
    return {k: obj[k] for k in ("name", "class", "track", "tasks", "fallbacks", "config")}


# ----------------------------------------------------------------------------------------------
# the private folder of one inspect/score


def _reachable_by_others(path: str) -> bool:
    """True when a uid that is neither owner nor group member can read ``path``."""
    p = Path(path)
    try:
        for anc in list(p.parents)[::-1]:
            if not os.stat(anc).st_mode & 0o001:
                return False
        mode = os.stat(p).st_mode
    except OSError:
        return False
    return bool(mode & 0o005 == 0o005) if stat.S_ISDIR(mode) else bool(mode & 0o004)


def _python_paths(python: str | None) -> tuple[str, list[str]]:
    """The interpreter to run and the installation folders it needs (never run outside)."""
    if python is None:
        paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
        paths |= {p for p in sys.path if p and Path(p).is_dir() and "site-packages" in p}
        return sys.executable, sorted(paths)
    exe = Path(python).absolute()
    paths = {str(exe.parent.parent), str(Path(os.path.realpath(exe)).parent.parent)}
    cfg = exe.parent.parent / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text(errors="replace").splitlines():
            k, _, v = line.partition("=")
            if k.strip() == "home" and v.strip():
                paths.add(str(Path(v.strip()).parent))
    return str(exe), sorted(p for p in paths if p not in ("/", "/usr"))


def _copy_estimator(src: Path, dst: Path) -> str:
    """Copy a regular, bounded estimator file (never a FIFO or device); return its sha256."""
    import hashlib

    from benchmark.contract import EstimatorContractError, check_estimator_path

    check_estimator_path(src)
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise EstimatorContractError(f"{src}: cannot be read ({exc.strerror}).") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ESTIMATOR_BYTES:
            raise EstimatorContractError(
                f"{src}: an estimator file must be a regular file of at most "
                f"{MAX_ESTIMATOR_BYTES >> 20} MiB.")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(MAX_ESTIMATOR_BYTES + 1)
    finally:
        os.close(fd)
    dst.parent.mkdir(mode=0o755)
    dst.write_bytes(data)
    os.chmod(dst, 0o644)
    return hashlib.sha256(data).hexdigest()


def _remove_stale() -> None:
    """Remove folders of earlier evaluations whose process died (e.g. killed with SIGKILL)."""
    base = Path(tempfile.gettempdir())
    try:
        entries = list(base.iterdir())
    except OSError:
        return
    for p in entries:
        if not p.name.startswith(TEMP_PREFIX):
            continue
        try:
            pid = int(p.name[len(TEMP_PREFIX):].split("-", 1)[0])
            if p.lstat().st_uid != os.geteuid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except (ValueError, OSError):
            continue
    cgroups.remove_stale()


class _Workspace:
    """The private folders of one inspect/score and the list of what the sandbox may read."""

    def __init__(self, estimator_file: Path | None, views: Views | None, forbidden: list[Path],
                 limits: Limits, python: str | None, extra_read_only: Iterable[str | Path],
                 plat: sandbox.Platform, name: str = "") -> None:
        self.estimator = Path(estimator_file).absolute() if estimator_file else None
        self.name = name or (self.estimator.name if self.estimator else "")
        self.limits, self.plat, self.views = limits, plat, views
        self.full = plat.full
        self.uid = sandbox.sandbox_uid() if self.full else None
        if self.uid is not None:
            _require_reachable_tmp()
        _remove_stale()
        tag = f"{TEMP_PREFIX}{os.getpid()}-"
        self.tmp = Path(tempfile.mkdtemp(prefix=tag))
        self.stage = Path(tempfile.mkdtemp(prefix=tag)) if self.uid is not None else None
        try:
            self._prepare(forbidden, python, extra_read_only)
        except BaseException:
            self.close()
            raise

    def _prepare(self, forbidden: list[Path], python: str | None,
                 extra_read_only: Iterable[str | Path]) -> None:
        import benchmark
        import estimators

        copy = self.tmp / "estimator" / (self.estimator.name if self.estimator else "none")
        self.sha256 = _copy_estimator(self.estimator, copy) if self.estimator else None
        self.scratch = self.tmp / "scratch"  # the writable folder without bubblewrap
        self.scratch.mkdir()
        view_dir = self.tmp / "view"
        in_place: list[str] = []  # release files the views read in place (e.g. sketches)
        if self.views:
            view_dir.mkdir(mode=0o755)
            in_place = [str(Path(f).absolute()) for f in export_views(self.views, view_dir)]
            for root, dirs, files in os.walk(view_dir):
                for d in dirs:
                    os.chmod(Path(root) / d, 0o755)
                for f in files:
                    os.chmod(Path(root) / f, 0o644)
        etc = self.tmp / "etc"
        etc.mkdir(mode=0o755)
        (etc / "passwd").write_text(f"root:x:0:0::/:/usr/sbin/nologin\nnobody:x:"
                                    f"{sandbox.INSIDE_UID}:{sandbox.INSIDE_UID}:nobody:/tmp:"
                                    "/usr/sbin/nologin\n")
        (etc / "group").write_text(f"root:x:0:\nnogroup:x:{sandbox.INSIDE_UID}:\n")
        for f in ("passwd", "group"):
            os.chmod(etc / f, 0o644)
        self.python, py_paths = _python_paths(python)
        pkgs = [str(Path(benchmark.__file__).parent), str(Path(estimators.__file__).parent)]
        self.pythonpath = sorted({str(Path(p).parent) for p in pkgs})
        data = []
        for rv, _, _ in (self.views or {}).values():
            dirs = [*rv.checkpoint_dir.values(), *([rv.tokenizer_dir] if rv.tokenizer_dir else [])]
            data += [str(Path(d).absolute()) for d in dirs]
            # a release in the Hugging Face cache holds symlinks into blobs/: grant their targets
            # one by one (granting blobs/ itself would expose the labels)
            data += [os.path.realpath(f) for d in dirs for f in Path(d).rglob("*")
                     if f.is_symlink() and f.is_file()]
        data += in_place
        _require_world_readable(data)
        extra = [str(Path(p).absolute()) for p in extra_read_only]
        # (host source, path inside)
        binds = [(p, p) for p in [*py_paths, *pkgs, *data, *extra]]
        if self.estimator:
            binds += [(str(copy), str(self.estimator))]
        if self.views:
            binds.append((str(view_dir), INSIDE_VIEW))
        _refuse_label_exposure([s for s, _ in binds], forbidden, data)
        self.view_inside = INSIDE_VIEW if self.full else str(view_dir)
        self.estimator_inside = "" if not self.estimator else \
            str(self.estimator) if self.full else str(copy)
        system = sandbox.host_system_entries()
        self.symlinks = [(s, d) for k, s, d in system if k == "symlink"]
        binds = [(s, d) for k, s, d in system if k == "bind"] + \
            [(str(etc / "passwd"), "/etc/passwd"), (str(etc / "group"), "/etc/group")] + binds
        self.binds = _normalise(binds)
        self.read_inside = sorted({d for _, d in self.binds} | {"/proc", "/dev"})
        self.read_host = sorted({s for s, _ in binds} | {"/etc", "/proc", "/sys", "/dev"}
                                | {"/" + s for s, _ in self.symlinks})
        self.staged: list[tuple[str, str]] = []
        if self.stage is not None:
            os.chmod(self.stage, 0o711)
            out = []
            for i, (src, dst) in enumerate(self.binds):
                if _reachable_by_others(src):
                    out.append((src, dst))
                    continue
                point = self.stage / str(i)
                if Path(src).is_dir():
                    point.mkdir(mode=0o755)
                else:
                    point.touch(mode=0o644)
                self.staged.append((src, str(point)))
                out.append((str(point), dst))
            self.binds = out

    def close(self) -> None:
        """Remove both private folders."""
        for d in (self.tmp, self.stage):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)

    def __enter__(self) -> _Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _normalise(binds: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Existing sources resolved, one bind per destination, parents first, redundant ones out."""
    seen: dict[str, str] = {}
    for src, dst in binds:
        if not os.path.exists(src):
            continue
        seen.setdefault(dst, os.path.realpath(src))
    out: list[tuple[str, str]] = []
    for dst in sorted(seen, key=lambda d: (d.count("/"), d)):
        src = seen[dst]
        covered = any(dst.startswith(d.rstrip("/") + "/") and src == os.path.join(
            s, os.path.relpath(dst, d)) for s, d in out)
        if not covered:
            out.append((src, dst))
    return out


def _require_reachable_tmp() -> None:
    """Refuse a temporary folder the sandbox's fresh uid cannot reach (bt-bench runs as root).

    The launcher stages every bound path the fresh uid could not reach on a mount point in a
    folder under ``$TMPDIR``; bubblewrap, already running as that uid, must reach that folder.
    Under a ``0700`` folder (``TMPDIR=/root/tmp``) it could not, and bubblewrap would fail with
    "Can't find source path ...: Permission denied".
    """
    base = Path(tempfile.gettempdir()).absolute()
    for folder in [*list(base.parents)[::-1], base]:
        try:
            mode = os.stat(folder).st_mode
        except OSError:
            continue
        if not mode & 0o001:
            raise IsolationError(
                f"the estimator sandbox runs as a fresh unprivileged uid (bt-bench runs as "
                f"root) that cannot reach the temporary folder {base}: {folder} has mode "
                f"{stat.S_IMODE(mode):04o}, without search permission for other users. Fix: "
                "point TMPDIR at a folder every user can traverse (e.g. export TMPDIR=/tmp), "
                f"or chmod o+x {folder}.")


def _require_world_readable(paths: list[str]) -> None:
    """Refuse release files the sandbox's unprivileged user could not read.

    The child runs as ``nobody`` without capabilities, so a 0600 checkpoint would surface inside
    as a confusing "No such file or directory" from the estimator; say so up front instead.
    """
    bad = []
    for p in map(Path, paths):
        for f in [p, *(p.rglob("*") if p.is_dir() else [])]:
            need = 0o005 if f.is_dir() else 0o004
            if f.exists() and (f.stat().st_mode & need) != need:
                bad.append(str(f))
    if bad:
        raise IsolationError(
            f"release files not readable by the sandbox's unprivileged user: {bad[:5]}"
            f"{' ...' if len(bad) > 5 else ''}; expected world-readable files (mode 0644) and "
            "folders (0755). Fix: chmod -R a+rX on the release folder.")


def _refuse_label_exposure(read: list[str], forbidden: list[Path], data: list[str]) -> None:
    """Refuse when ``read`` exposes a label file or a git repository, or ``data`` a hard link.

    A hard link to a label file inside a release folder the sandbox reads (``data``) would
    expose the labels under another name.
    """
    for p in read:
        rp = Path(p).resolve()
        if ".git" in rp.parts or (rp.is_dir() and (rp / ".git").exists()):
            raise IsolationError(
                f"the estimator sandbox would be able to read the git repository at {rp} (its "
                "object store holds every committed label file); bind narrower folders.")
    forbidden_ids = set()
    for f in forbidden:
        f = Path(f).resolve()
        with contextlib.suppress(OSError):
            st = f.stat()
            forbidden_ids.add((st.st_dev, st.st_ino))
        for p in read:
            rp = Path(p).resolve()
            if f == rp or rp in f.parents:
                raise IsolationError(
                    f"the estimator sandbox would be able to read {f} through the allowed path "
                    f"{rp}; keep releases outside {rp} (e.g. not inside the Python installation)."
                )
    if not forbidden_ids:
        return
    for p in data:  # hard links to a label file from a readable release folder
        rp = Path(p)
        if rp.exists():
            files = [rp] if rp.is_file() else [f for f in rp.rglob("*") if f.is_file()]
            for f in files:
                st = f.stat()
                if (st.st_dev, st.st_ino) in forbidden_ids:
                    raise IsolationError(
                        f"{f} is a hard link to a label file; the estimator sandbox would read "
                        "it. Remove the link from the release.")


# ----------------------------------------------------------------------------------------------
# one sandboxed run

@dataclass
class _Outcome:
    meta: dict | None = None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    error: dict | None = None
    done: bool = False
    timed_out: bool = False
    stopped: str = ""  # why the evaluator stopped it early ("" = it ended by itself)
    refused_sandbox: str = ""
    channel_error: str = ""
    exception: BenchmarkError | None = None  # a refused metadata or score array
    returncode: int | None = None
    oom: bool = False
    pids_refused: bool = False
    output: bytes = b""
    output_bytes: int = 0
    protections: dict = field(default_factory=dict)
    started: bool = False  # the sandboxed process said it was ready
    smoke: object = None  # the smoke test's report (mode "smoke"), unchecked


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

    # -- start ---------------------------------------------------------------------------------
    def _env(self, home: str) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home,
               "LANG": "C.UTF-8", "USER": "nobody", "LOGNAME": "nobody",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": ":".join(self.ws.pythonpath), "HF_HUB_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "*"}
        for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                  "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
            if k in os.environ:
                env[k] = os.environ[k]
        return env

    def _spec(self, chan_w: int, go_r: int, tree: cgroups.TreeLimits) -> dict:
        ws, lim = self.ws, self.ws.limits
        cfg = {"mode": self.mode, "subset": self.subset, "channel": chan_w, "go": go_r,
               "estimator": ws.estimator_inside, "view": ws.view_inside, "fallback": not ws.full,
               "read": ws.read_inside if ws.full else ws.read_host,
               "write": ["/tmp", "/dev"] if ws.full else [str(ws.scratch), "/dev"],
               "smoke": self.smoke}
        # -S: the site-packages (their .pth files, sitecustomize, a submission environment's
        # requirements) are added by the child only after Landlock and the check from outside
        child = [ws.python, "-B", "-P", "-S", "-m", "benchmark.sandbox.child", json.dumps(cfg)]
        rlimits = {"RLIMIT_AS": lim.memory_bytes, "RLIMIT_CORE": 0}
        if ws.uid is not None:  # a fresh uid: RLIMIT_NPROC counts exactly this tree
            rlimits["RLIMIT_NPROC"] = lim.max_processes + (16 if "pids" in tree.process_mode
                                                           else 0)
        if ws.full:
            env = self._env("/tmp")
            argv = sandbox.bwrap_argv(ws.plat.bwrap, ws.binds, ws.symlinks, env, lim.tmp_bytes,
                                      self.seccomp_fds, child)
            launcher_env = {"PATH": env["PATH"]}
        else:
            argv, launcher_env = child, self._env(str(ws.scratch))
        return {"cgroups": tree.procs_files, "rlimits": rlimits, "stage": ws.staged,
                "uid": ws.uid, "gid": ws.uid, "parent": os.getpid(), "argv": argv,
                "env": launcher_env}

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
            spec = self._spec(chan_w, go_r, tree)
            proc = subprocess.Popen(
                sandbox.launch_command(spec), stdin=subprocess.DEVNULL, stdout=out_w,
                stderr=out_w, pass_fds=[chan_w, go_r, *self.seccomp_fds],
                cwd=str(self.ws.scratch), env=spec["env"], start_new_session=True)
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
        reader = channel.Reader()
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
                    if key.data == "out":
                        self.out.output_bytes += len(data)
                        output += data
                        del output[: max(0, len(output) - 4 * OUTPUT_TAIL)]
                        if self.out.output_bytes > OUTPUT_STOP:
                            self.out.stopped = "output"
                            return
                        continue
                    try:
                        frames = reader.feed(data)
                    except channel.ChannelError as exc:
                        self.out.channel_error = str(exc)
                        return
                    try:
                        for kind, payload in frames:
                            if self._frame(kind, payload):
                                return
                    except BenchmarkError as exc:
                        self.out.exception = exc
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
        if kind == "array":
            from benchmark.contract import validate_scores

            key, arr = payload
            method, n = self.calls[key]
            self.out.arrays[key] = validate_scores(arr, n, self.out.meta["class"], method)
            return False
        msg = payload
        if self.state == "ready":
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
        if msg["type"] == "error":
            self.out.error = msg
            return True
        if self.state == "meta" and self.mode == "smoke":
            if msg["type"] != "smoke":
                self.out.channel_error = "a message came before the smoke test's report"
                return True
            self.out.smoke = msg.get("result")
            self.state = "scores"
            return False
        if self.state == "meta":
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
        if msg["type"] == "done":
            missing = [k for k in self.reader.expected if k not in self.out.arrays]
            if missing:
                self.out.channel_error = f"no scores for {', '.join(missing[:3])}"
            self.out.done = not missing
            return True
        self.out.channel_error = f"unexpected message type {clean_text(msg['type'], 40)!r}"
        return True

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
        pid = self._sandboxed_pid(msg.get("pid"))
        st = _status(pid)
        layers = msg.get("layers") if isinstance(msg.get("layers"), dict) else {}
        lim = self.ws.limits
        gib = f"{lim.memory_bytes / 2**30:.2f} GiB"
        common = {
            "landlock": clean_text(layers.get("landlock", "missing"), 200, multiline=False)
            + " (applied inside by bt-bench's own code before the estimator is loaded)",
            "memory": f"{self.tree.memory_mode}; RLIMIT_AS {gib} per process",
            "processes": self.tree.process_mode + ("; RLIMIT_NPROC for the sandbox's own uid"
                                                   if self.ws.uid is not None else ""),
            "time": f"one deadline of {lim.wall_seconds:g} s over starting, scoring and "
                    "reading back; the whole process tree is killed after every run",
            "output": f"stdout and stderr drained, the last {OUTPUT_TAIL} characters kept, "
                      f"stopped past {OUTPUT_STOP >> 20} MiB; stdin /dev/null",
            "results": "only score arrays are read back (header checked before allocation, "
                       "numeric dtype, exact shape, finite); determinism checked in a second "
                       "fresh sandbox; metadata validated; protections recorded by the evaluator",
        }
        if not self.ws.full:
            return {"sandbox": f"missing: {self.ws.plat.problem}; a child process only "
                               f"({sandbox.INSTALL_HINT})",
                    "user": f"the caller's uid {os.geteuid()} "
                            + ("(root: every capability)" if os.geteuid() == 0 else ""),
                    "seccomp": "missing (needs bubblewrap)",
                    "network": clean_text(layers.get("network", "missing"), 200,
                                          multiline=False),
                    **common}
        problems = []
        want_uid = str(self.ws.uid if self.ws.uid is not None else os.geteuid())
        if st.get("Uid", "").split() != [want_uid] * 4:
            problems.append(f"uid {st.get('Uid')}")
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            if int(st.get(cap, "1"), 16) != 0:
                problems.append(f"{cap} {st.get(cap)}")
        if st.get("NoNewPrivs") != "1":
            problems.append("no_new_privs off")
        if st.get("Seccomp") != "2" or int(st.get("Seccomp_filters", "0")) < len(
                self.seccomp_fds):
            problems.append(f"seccomp {st.get('Seccomp')}/{st.get('Seccomp_filters')}")
        for ns in ("user", "pid", "net", "ipc", "uts", "mnt", "cgroup"):
            try:
                if os.readlink(f"/proc/{pid}/ns/{ns}") == os.readlink(f"/proc/self/ns/{ns}"):
                    problems.append(f"shares the evaluator's {ns} namespace")
            except OSError as exc:
                problems.append(f"{ns} namespace unreadable ({exc.strerror})")
        if problems:
            raise IsolationError(
                f"the sandbox for {self.ws.name} did not come up as specified ("
                f"{', '.join(problems)}); nothing was run. Check the bubblewrap installation.")
        tmp = f"{lim.tmp_bytes / 2**30:.2f} GiB"
        return {
            "sandbox": f"{self.ws.plat.bwrap_version}: new user, PID, IPC, UTS, network, cgroup "
                       "and mount namespaces, new session, dies with the evaluator (checked in "
                       "/proc)",
            "user": ("a fresh unprivileged uid per sandbox (the evaluator runs as root)"
                     if self.ws.uid is not None else "the caller's uid")
                    + "; no capabilities, no_new_privs, no nested user namespaces",
            "files": "read-only root holding only read-only binds of the Python installation, "
                     "the benchmark and estimators packages, the estimator file, its views and "
                     "the release's checkpoints and tokenizer; private /tmp and /dev/shm of "
                     f"{tmp} each; minimal /dev",
            "seccomp": self.seccomp_summary,
            "network": "empty network namespace (loopback only); sockets other than AF_UNIX "
                       "refused",
            **common,
        }


# ----------------------------------------------------------------------------------------------
# turning an outcome into scores or an error


def _output_tail(out: _Outcome) -> str:
    if not out.output_bytes:
        return ""
    text = out.output.decode("utf-8", "replace")
    return quote(text, f"its last output ({out.output_bytes} bytes in all; the estimator's own "
                       "text, cleaned)", OUTPUT_TAIL, keep="tail")


def _start_failure(out: _Outcome, name: str) -> str:
    """Why the sandbox never became ready, when bubblewrap or the launcher said so ("" else).

    Before *ready* only bt-bench's launcher, bubblewrap and the interpreter's start (without
    site-packages) have run, so their last line is shown as the reason.
    """
    if out.started or out.timed_out:
        return ""
    text = out.output.decode("utf-8", "replace")
    said = [ln for ln in text.splitlines()
            if ln.startswith(("bwrap: ", "bt-bench sandbox launcher: "))]
    if not said:
        return ""
    line = clean_text(said[-1], 500, multiline=False)
    hint = ("the sandbox's unprivileged user cannot read that path: make it and every folder "
            "above it readable by other users (chmod o+rx), or keep it (TMPDIR, the "
            "BT_BENCH_CACHE folder, the release) in a folder every user can traverse"
            if "Permission denied" in line
            else f"check the sandbox's setup: {sandbox.INSTALL_HINT}")
    return (f"the sandbox for {name} could not start ({line}); nothing ran in it. Fix: {hint}.")


def _raise_for(out: _Outcome, name: str, limits: Limits) -> None:
    """Raise the error an unsuccessful outcome deserves (nothing when it is complete)."""
    from benchmark.contract import EstimatorContractError

    tail = _output_tail(out)
    gib = f"{limits.memory_bytes / 2**30:.1f} GiB"
    if out.refused_sandbox:
        raise IsolationError(out.refused_sandbox)
    start = _start_failure(out, name)
    if start:
        raise IsolationError(start)
    if out.exception is not None:
        raise type(out.exception)(f"estimator {name}: {out.exception}" + tail)
    if out.timed_out:
        raise IsolationError(
            f"estimator {name} exceeded the wall-time limit of {limits.wall_seconds:g} s and "
            "was stopped; make it faster or raise the limit (--time-limit SECONDS)." + tail)
    if out.channel_error:
        raise IsolationError(
            f"estimator {name} sent a result the evaluator refused ({out.channel_error}); only "
            "the declared metadata and score arrays of the expected shape are accepted." + tail)
    if out.stopped == "output":
        raise IsolationError(
            f"estimator {name} printed more than {OUTPUT_STOP >> 20} MiB and was stopped; "
            "print less." + tail)
    if out.oom or out.stopped == "memory":
        raise IsolationError(
            f"estimator {name}: ran out of memory under the limit of {gib} for all its "
            "processes together and was stopped; use less memory or raise the limit "
            "(--memory-limit)." + tail)
    if out.stopped == "processes" or (out.pids_refused and not out.done):
        raise IsolationError(
            f"estimator {name} reached the limit of {limits.max_processes} processes and "
            "threads and was stopped; start fewer." + tail)
    if out.error is not None:
        kind = out.error.get("kind")
        text = clean_text(out.error.get("message", ""), 4000)
        tb = quote(out.error.get("traceback", ""), "the estimator's traceback")
        if kind == "memory":
            raise IsolationError(
                f"estimator {name}: ran out of memory under the limit of {gib} ({text}); use "
                "less memory (stream the sketches in chunks) or raise the limit "
                "(--memory-limit)." + tb + tail)
        if kind == "refused":
            why = " (the sandbox refused it)" if "was denied access" in text else (
                "; the sandbox refused it (an estimator sees only its view, the Python "
                "installation and the release's checkpoints and tokenizer, writes only to /tmp, "
                "and has no network and no other process).")
            raise IsolationError(f"estimator {name}: {text}{why}" + tb + tail)
        cls = EstimatorContractError if kind == "contract" else IsolationError
        raise cls(f"estimator {name}: {text}" + tb + tail)
    if not out.done:
        rc = out.returncode
        how = ("was killed by a signal" if rc is None or rc < 0 or rc >= 128
               else f"exited with code {rc}")
        raise IsolationError(
            f"estimator {name}: its process {how} before returning its scores; an estimator "
            "must return scores, never exit the process." + tail)


def _platform() -> sandbox.Platform:
    plat = sandbox.probe()
    if not plat.full and plat.problem not in _WARNED:
        _WARNED.add(plat.problem)
        print(f"bt-bench: warning: {plat.problem}; the estimator runs in a child process with "
              "fewer protections (recorded in results.json under isolation.protections). "
              f"{sandbox.INSTALL_HINT[0].upper()}{sandbox.INSTALL_HINT[1:]}; "
              "bt-bench submit and verify refuse to run without it.", file=sys.stderr)
    return plat


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


def _run(ws: _Workspace, mode: str, subset: bool, deadline: float) -> _Outcome:
    out = _outcome(ws, mode, subset, deadline)
    try:
        _raise_for(out, ws.name, ws.limits)
    except BenchmarkError as exc:
        if ws.full or ws.estimator_inside == str(ws.estimator):
            raise
        # without bubblewrap the estimator ran from its private copy: name the user's file
        raise type(exc)(str(exc).replace(ws.estimator_inside, str(ws.estimator))) from None
    return out


# ----------------------------------------------------------------------------------------------
# public API


def inspect_isolated(estimator_file: Path, limits: Limits | None = None, *,
                     python: str | None = None,
                     extra_read_only: Iterable[str | Path] = ()) -> dict:
    """Load the estimator file in the sandbox and return its declared metadata, validated.

    Args:
        estimator_file: the estimator's ``.py`` file.
        limits: the sandbox's limits (one deadline for the whole inspection).
        python: the interpreter to run inside (default: this one); its installation is bound
            read-only, never run outside the sandbox.
        extra_read_only: more paths the sandbox may read (e.g. that interpreter's environment).

    Returns:
        ``{"name", "class", "track", "tasks", "config", "sha256"}``; the file's code never runs
        in the calling process; ``sha256`` is that of the bytes that ran.
    """
    limits = limits or Limits()
    deadline = time.monotonic() + limits.wall_seconds
    plat = _platform()
    with _signals_end_cleanly(), _Workspace(Path(estimator_file), None, [], limits, python,
                                            extra_read_only, plat) as ws:
        out = _run(ws, "inspect", False, deadline)
        if out.meta is None:  # pragma: no cover - _raise_for covers every way to get here
            raise IsolationError(f"estimator {ws.name}: no metadata came back.")
        return out.meta | {"sha256": ws.sha256}


def _smoke_report(out: _Outcome, spec: dict, name: str, limits: Limits) -> dict:
    """The smoke test's report, checked field by field, or a timeout/crash naming what ended it.

    The report comes from the environment's own process, where its requirements ran: only its
    form is trusted (a stage, a known step, a pin and module that were asked for), its text is
    cleaned.
    """
    from benchmark.sandbox.requirements import SMOKE_STEPS

    if out.refused_sandbox:
        raise IsolationError(out.refused_sandbox)
    start = _start_failure(out, name)
    if start:
        raise IsolationError(start)
    tail = clean_text(out.output.decode("utf-8", "replace"), 4000, keep="tail")
    if out.timed_out:
        return {"stage": "timeout", "error": tail}
    r = out.smoke
    if out.done and isinstance(r, dict) and isinstance(r.get("error", ""), str):
        stage, error = r.get("stage"), clean_text(r.get("error", ""), 16000, keep="tail")
        if stage == "ok" and set(r) == {"stage"}:
            return {"stage": "ok"}
        if stage == "core" and r.get("step") in SMOKE_STEPS and set(r) == {"stage", "step",
                                                                           "error"}:
            return {"stage": "core", "step": r["step"], "error": error}
        modules = spec["modules"].get(r.get("pin"), []) if isinstance(r.get("pin"), str) else []
        if stage == "import" and r.get("module") in modules and \
                set(r) == {"stage", "pin", "module", "error"}:
            return {"stage": "import", "pin": r["pin"], "module": r["module"], "error": error}
    gib = f"{limits.memory_bytes / 2**30:.1f} GiB"
    if out.oom or out.stopped == "memory":
        how = f"it ran out of memory under the sandbox's limit of {gib}"
    elif out.stopped == "processes" or out.pids_refused:
        how = f"it reached the sandbox's limit of {limits.max_processes} processes"
    elif out.stopped == "output":
        how = f"it printed more than {OUTPUT_STOP >> 20} MiB"
    elif out.channel_error or out.exception is not None or out.done:
        how = "it sent a malformed report: " + clean_text(
            out.channel_error or str(out.exception or "not the expected fields"), 300)
    elif out.error is not None:
        how = "its interpreter failed while adding the site-packages: " + clean_text(
            out.error.get("message", ""), 2000)
        tail = clean_text(out.error.get("traceback", ""), 8000, keep="tail") + "\n" + tail
    else:
        rc = out.returncode
        how = ("the interpreter was killed by a signal" if rc is None or rc < 0 or rc >= 128
               else f"the interpreter exited with code {rc}")
    return {"stage": "crash", "how": how, "error": tail}


def smoke_isolated(spec: dict, limits: Limits | None = None, *, python: str | None = None,
                   extra_read_only: Iterable[str | Path] = ()) -> dict:
    """Run a submission environment's smoke test in the estimator sandbox; return its report.

    Args:
        spec: ``{"modules": {pin: [module, ...]}, "core_only": bool}``, what
            :func:`benchmark.sandbox.requirements.smoke_inside` checks.
        limits: the sandbox's limits (the wall time bounds the whole test).
        python, extra_read_only: the environment's interpreter and folders, as in
            :func:`inspect_isolated` (default: bt-bench's own interpreter).

    Returns:
        ``{"stage": "ok"}``; ``{"stage": "core", "step", "error"}``; ``{"stage": "import",
        "pin", "module", "error"}``; ``{"stage": "timeout", "error"}``; or ``{"stage":
        "crash", "how", "error"}`` (``error``: cleaned text, a traceback or the output's tail).

    Raises:
        IsolationError: the sandbox could not start or did not come up as specified.
    """
    limits = limits or Limits()
    deadline = time.monotonic() + limits.wall_seconds
    plat = _platform()
    name = "the requirements' smoke test"
    with _signals_end_cleanly(), _Workspace(None, None, [], limits, python, extra_read_only,
                                            plat, name=name) as ws:
        return _smoke_report(_outcome(ws, "smoke", False, deadline, spec), spec, name, limits)


def score_isolated(
    estimator_file: Path,
    views: Views,
    forbidden: list[Path],
    limits: Limits | None = None,
    *,
    python: str | None = None,
    extra_read_only: Iterable[str | Path] = (),
    meta: dict | None = None,
) -> tuple[dict[int, dict], dict]:
    """Score an estimator in the sandbox; check its contract from outside.

    Args:
        estimator_file: the estimator's ``.py`` file.
        views: seed -> (rollout view, step view, draws), built by the evaluator.
        forbidden: label files the sandbox must not be able to read (checked before it starts).
        limits: the sandbox's limits (one deadline over both sandboxes).
        python, extra_read_only: as in :func:`inspect_isolated`.
        meta: the metadata :func:`inspect_isolated` returned; when given, the scoring run must
            declare the same (and run the same bytes).

    Returns:
        ``(scores, info)``: scores[seed] = ``{"rollout": (n,), "step": (n_steps,),
        "draws": {draw_id: (m,)}}`` float64 arrays (validated: shape, dtype, finite), and
        ``info`` with the contract checks and protections the evaluator established itself and
        the limits.

    Raises:
        IsolationError / EstimatorContractError: the sandbox failed; nothing was scored.
    """
    from benchmark.contract import EstimatorContractError

    limits = limits or Limits()
    deadline = time.monotonic() + limits.wall_seconds
    plat = _platform()
    with _signals_end_cleanly(), _Workspace(Path(estimator_file), views, forbidden, limits,
                                            python, extra_read_only, plat) as ws:
        if meta is not None and meta.get("sha256") not in (None, ws.sha256):
            raise IsolationError(f"estimator {ws.name} changed while it was being evaluated; "
                                 "rerun when the file is stable.")
        main = _run(ws, "score", False, deadline)
        if meta is not None and any(main.meta[k] != meta[k] for k in main.meta):
            raise IsolationError(f"estimator {ws.name} declared other capabilities or config "
                                 "when scoring than when inspected; they must be constant.")
        again = _run(ws, "score", True, deadline)
        who = main.meta["class"]
        checks = ["capabilities (name, track, tasks)",
                  "__init__ stores its hyperparameters (JSON config)"]
        for key, method, args, n in score_calls(views, main.meta["tasks"], subset=True):
            a, b = main.arrays[key], again.arrays[key]
            if a.tobytes() != b.tobytes():
                what = (f"{args[0].granularity} view" if method == "score_rollouts"
                        else f"draw {args[1].draw_id}")
                raise EstimatorContractError(
                    f"estimator {ws.name}: {who}.{method} is not deterministic: two runs in "
                    f"fresh sandboxes on the same {what} differ at {int((a != b).sum())} "
                    "units; seed any randomness from view.seed.")
            checks.append(f"score_rollouts on the {args[0].granularity} view: shape ({n},), "
                          "finite, deterministic, inputs unchanged" if method == "score_rollouts"
                          else f"score_draw on draw {args[1].draw_id}: shape ({n},), finite, "
                          "deterministic, inputs unchanged")
    return assemble(views, main.arrays), {"contract_checks": checks,
                                           "protections": main.protections,
                                           "limits": asdict(limits)}
