"""Starting a sandboxed child: its private workspace, what it may read, its command and environment.

A :class:`_Workspace` copies the estimator file (the sha256 recorded is that of the bytes that
run), exports the label-free views into a view folder and lists what the sandbox may read (bind
mounts, and symlinks granted one by one); it refuses when a label file or a git repository would
be among them. :func:`_child_config`, :func:`_launch_spec` and :func:`_start` build the child's
command and environment and start it through the launcher (:mod:`benchmark.sandbox._launch`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from benchmark.sandbox import cgroups
from benchmark.sandbox import layers as sandbox
from benchmark.sandbox.limits import (
    INSIDE_VIEW,
    MAX_ESTIMATOR_BYTES,
    TEMP_PREFIX,
    IsolationError,
    Limits,
)
from benchmark.sandbox.view_io import Views, export_views

_WARNED: set[str] = set()


def _platform() -> sandbox.Platform:
    plat = sandbox.probe()
    if not plat.full and plat.problem not in _WARNED:
        _WARNED.add(plat.problem)
        print(f"bt-bench: warning: {plat.problem}; the estimator runs in a child process with "
              "fewer protections (recorded in results.json under isolation.protections). "
              f"{sandbox.INSTALL_HINT[0].upper()}{sandbox.INSTALL_HINT[1:]}; "
              "bt-bench submit and verify refuse to run without it.", file=sys.stderr)
    return plat


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


def _write_etc(etc: Path) -> Path:
    """The sandbox's ``/etc/passwd`` and ``/etc/group`` (root and its unprivileged user)."""
    etc.mkdir(mode=0o755)
    (etc / "passwd").write_text(f"root:x:0:0::/:/usr/sbin/nologin\nnobody:x:"
                                f"{sandbox.INSIDE_UID}:{sandbox.INSIDE_UID}:nobody:/tmp:"
                                "/usr/sbin/nologin\n")
    (etc / "group").write_text(f"root:x:0:\nnogroup:x:{sandbox.INSIDE_UID}:\n")
    for f in ("passwd", "group"):
        os.chmod(etc / f, 0o644)
    return etc


def _release_data(views: Views | None) -> list[str]:
    """The release's checkpoint and tokenizer folders the views need, and their symlinks' targets.

    A release in the Hugging Face cache holds symlinks into ``blobs/``: their targets are granted
    one by one (granting ``blobs/`` itself would expose the labels).
    """
    data = []
    for rv, _, _ in (views or {}).values():
        dirs = [*rv.checkpoint_dir.values(), *([rv.tokenizer_dir] if rv.tokenizer_dir else [])]
        data += [str(Path(d).absolute()) for d in dirs]
        data += [os.path.realpath(f) for d in dirs for f in Path(d).rglob("*")
                 if f.is_symlink() and f.is_file()]
    return data


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
        in_place = self._export_views(view_dir)
        etc = _write_etc(self.tmp / "etc")
        self.python, py_paths = _python_paths(python)
        pkgs = [str(Path(benchmark.__file__).parent), str(Path(estimators.__file__).parent)]
        self.pythonpath = sorted({str(Path(p).parent) for p in pkgs})
        data = _release_data(self.views) + in_place
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
        self._grant(binds, etc)
        self._stage_unreachable()

    def _export_views(self, view_dir: Path) -> list[str]:
        """Export the views (world-readable); the release files they read in place (sketches)."""
        if not self.views:
            return []
        view_dir.mkdir(mode=0o755)
        in_place = [str(Path(f).absolute()) for f in export_views(self.views, view_dir)]
        for root, dirs, files in os.walk(view_dir):
            for d in dirs:
                os.chmod(Path(root) / d, 0o755)
            for f in files:
                os.chmod(Path(root) / f, 0o644)
        return in_place

    def _grant(self, binds: list[tuple[str, str]], etc: Path) -> None:
        """The host's system entries and ``binds``, normalised; what is readable inside/outside."""
        system = sandbox.host_system_entries()
        self.symlinks = [(s, d) for k, s, d in system if k == "symlink"]
        binds = [(s, d) for k, s, d in system if k == "bind"] + \
            [(str(etc / "passwd"), "/etc/passwd"), (str(etc / "group"), "/etc/group")] + binds
        self.binds = _normalise(binds)
        self.read_inside = sorted({d for _, d in self.binds} | {"/proc", "/dev"})
        self.read_host = sorted({s for s, _ in binds} | {"/etc", "/proc", "/sys", "/dev"}
                                | {"/" + s for s, _ in self.symlinks})

    def _stage_unreachable(self) -> None:
        """Bind each source the fresh uid cannot reach from a mount point in the stage folder."""
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
# the child's command and environment


def _child_env(ws: _Workspace, home: str) -> dict[str, str]:
    """The sandboxed interpreter's environment: fixed and offline; ``home`` is HOME and TMPDIR."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home,
           "LANG": "C.UTF-8", "USER": "nobody", "LOGNAME": "nobody",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": ":".join(ws.pythonpath), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "*"}
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env


def _child_config(ws: _Workspace, mode: str, subset: bool, smoke: dict | None, chan_w: int,
                  go_r: int) -> dict:
    """What :mod:`benchmark.sandbox.child` is told: its mode, pipes, paths and the smoke spec."""
    return {"mode": mode, "subset": subset, "channel": chan_w, "go": go_r,
            "estimator": ws.estimator_inside, "view": ws.view_inside, "fallback": not ws.full,
            "read": ws.read_inside if ws.full else ws.read_host,
            "write": ["/tmp", "/dev"] if ws.full else [str(ws.scratch), "/dev"],
            "smoke": smoke}


def _launch_spec(ws: _Workspace, cfg: dict, tree: cgroups.TreeLimits,
                 seccomp_fds: list[int]) -> dict:
    """The launcher's spec: cgroups, rlimits, staging, uid, and the command (bubblewrap or not)."""
    lim = ws.limits
    # -S: the site-packages (their .pth files, sitecustomize, a submission environment's
    # requirements) are added by the child only after Landlock and the check from outside
    child = [ws.python, "-B", "-P", "-S", "-m", "benchmark.sandbox.child", json.dumps(cfg)]
    rlimits = {"RLIMIT_AS": lim.memory_bytes, "RLIMIT_CORE": 0}
    if ws.uid is not None:  # a fresh uid: RLIMIT_NPROC counts exactly this tree
        rlimits["RLIMIT_NPROC"] = lim.max_processes + (16 if "pids" in tree.process_mode
                                                       else 0)
    if ws.full:
        env = _child_env(ws, "/tmp")
        argv = sandbox.bwrap_argv(ws.plat.bwrap, ws.binds, ws.symlinks, env, lim.tmp_bytes,
                                  seccomp_fds, child)
        launcher_env = {"PATH": env["PATH"]}
    else:
        argv, launcher_env = child, _child_env(ws, str(ws.scratch))
    return {"cgroups": tree.procs_files, "rlimits": rlimits, "stage": ws.staged,
            "uid": ws.uid, "gid": ws.uid, "parent": os.getpid(), "argv": argv,
            "env": launcher_env}


def _start(ws: _Workspace, spec: dict, pass_fds: list[int], out_w: int) -> subprocess.Popen:
    """Start the launcher in a new session: stdin ``/dev/null``, stdout and stderr on ``out_w``."""
    return subprocess.Popen(
        sandbox.launch_command(spec), stdin=subprocess.DEVNULL, stdout=out_w,
        stderr=out_w, pass_fds=pass_fds, cwd=str(ws.scratch), env=spec["env"],
        start_new_session=True)
