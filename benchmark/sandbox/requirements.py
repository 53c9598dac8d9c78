"""A submission's declared requirements: exact pins, installed into its own environment.

``submission.yaml`` may list ``requirements:``, exact pins ``name==version`` of PyPI packages that
the estimator imports and bt-bench does not provide (e.g. ``kronfluence==1.0.1`` and the packages
it needs). The list is a lock: exactly those pins are installed, as wheels, without their
dependencies (``pip install --no-deps --only-binary=:all:``), so what runs is what was declared.

They are installed into a per-submission virtual environment created with
``--system-site-packages`` on top of the interpreter bt-bench runs in: the core packages (torch,
transformers, numpy, ...) are shared from there and a requirement can never replace one (naming a
core package, or any package installed as a dependency of one, is an error). The environment is
cached under ``$BT_BENCH_CACHE/envs/<key>/`` (default ``~/.cache/bt-bench``), keyed by the pins,
where pip takes wheels from (extra pip options, ``PIP_*`` index variables, pip's config files),
the core packages' versions and the interpreter, reused when present and intact, and built in a
temporary folder that is renamed into place only after it passed its smoke test: a failed or
interrupted install never leaves a half-built environment. The marker file records the name and
sha256 of every wheel installed.

A requirement is code from a stranger, like the estimator (docs/isolation.md, "Requirements"):
none of its code ever runs outside the estimator sandbox. Installing a wheel runs none of its
code (pip unpacks files, byte-compiles the ``.py`` files, which parses them and runs nothing,
and writes entry-point scripts that nothing runs); a wheel that would replace a file of the
environment itself (its interpreter link, ``pyvenv.cfg``) is refused. The smoke test runs in
the sandbox (:func:`benchmark.sandbox.isolation.smoke_isolated`) with the new environment's
interpreter:
it imports torch and transformers and loads a tiny Qwen2 model with ``AutoModelForCausalLM``
(the way estimators load checkpoints), then imports every top-level module of every requirement.
A failure names the requirement that broke which core package, the last lines of the error and
the fix. Its report is the requirements' own word (they run in the same process): it serves the
error messages, never security; the installed versions are read from the wheels' metadata.

Example:
    >>> from benchmark.sandbox.requirements import ensure_env                    # doctest: +SKIP
    >>> env = ensure_env(["kronfluence==1.0.1", "accelerate==1.15.0"])   # doctest: +SKIP
    >>> env.python, env.record()                                         # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from benchmark.sandbox.limits import SMOKE_STEPS, Limits
from benchmark.sandbox.pins import (  # noqa: F401 - re-exported, public names included
    _EXAMPLE,
    _NAME_RE,
    _PIN_RE,
    CORE_PACKAGES,
    ENV_FORMAT,
    MARKER,
    PIP_SOURCE_VARIABLES,
    PIP_TIMEOUT,
    SMOKE_TIMEOUT,
    TAIL_LINES,
    RequirementError,
    _core_site_dirs,
    _core_versions,
    _pin_problem,
    _pip_config_files,
    _requires,
    canonical_name,
    core_closure,
    env_key,
    package_source,
    parse_requirements,
    parse_sdists,
)

__all__ = [
    "CORE_PACKAGES",
    "RequirementError",
    "SubmissionEnv",
    "canonical_name",
    "core_closure",
    "ensure_env",
    "env_key",
    "parse_requirements",
    "refuse_in_process",
    "smoke_inside",
]

def refuse_in_process(env: SubmissionEnv | None) -> None:
    """Raise when a submission environment is asked to run in this process (``--no-isolation``).

    The evaluator calls this before scoring in-process: a submission's requirements live only in
    its environment's interpreter, which runs the estimator in the sandboxed child process.
    """
    if env is not None and env.requirements:
        raise RequirementError(
            f"the estimator declares requirements ({', '.join(env.requirements)}), which are "
            f"installed in their own environment ({env.prefix}) and run only in the sandboxed "
            "child process; drop --no-isolation (to debug in-process, pip install the pins into "
            "this interpreter and evaluate the file directly)."
        )


# ----------------------------------------------------------------------------------------------
# the environment


@dataclass(frozen=True)
class SubmissionEnv:
    """An installed per-submission environment (see :func:`ensure_env`).

    Attributes:
        prefix: the environment's folder.
        requirements: the canonical pins installed in it.
        versions: ``(name, version)`` of every pin as installed (read from the wheels' metadata).
        core_site_dirs: site folders of bt-bench's interpreter the environment adds to its path
            (only when bt-bench runs in a virtual environment itself).
        wheels: ``(file name, sha256)`` of every wheel installed, as pip reported them.
        build_seconds: wall time (s) the environment took to build on this machine (install,
            checks and the sandboxed smoke test), as its marker recorded it; None when unknown
            (an environment built before this was recorded).
    """

    prefix: Path
    requirements: tuple[str, ...]
    versions: tuple[tuple[str, str], ...]
    core_site_dirs: tuple[str, ...] = ()
    wheels: tuple[tuple[str, str], ...] = ()
    build_seconds: float | None = None

    @property
    def python(self) -> Path:
        """The environment's interpreter (run only inside the sandbox)."""
        return self.prefix / "bin" / "python"

    def sandbox_kwargs(self) -> dict:
        """Keyword arguments of ``inspect_isolated`` / ``score_isolated`` to run in this env."""
        return {"python": str(self.python),
                "extra_read_only": [str(self.prefix), *self.core_site_dirs]}

    def record(self) -> list[dict[str, str]]:
        """The installed requirements as ``results.json`` records them: ``[{name, version}]``."""
        return [{"name": n, "version": v} for n, v in self.versions]


def _site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages"


@dataclass(frozen=True)
class _Dist:
    """One ``*.dist-info`` folder: the version METADATA states and the files RECORD lists."""

    info: str
    version: str
    files: list[str]


def _installed(site_dir: Path) -> dict[str, list[_Dist]]:
    """Canonical distribution name -> its dist-info folders (read as text, nothing imported)."""
    out: dict[str, list[_Dist]] = {}
    for info in sorted(site_dir.glob("*.dist-info")):
        meta = info / "METADATA"
        fields: dict[str, str] = {}
        if meta.is_file():
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
                if not line.strip():
                    break  # the headers end at the first empty line
                key, _, value = line.partition(":")
                fields.setdefault(key.strip().lower(), value.strip())
        if "name" not in fields:
            continue
        record = info / "RECORD"
        rows = record.read_text(encoding="utf-8", errors="replace").splitlines() \
            if record.is_file() else []
        out.setdefault(canonical_name(fields["name"]), []).append(
            _Dist(info.name, fields.get("version", ""),
                  [r.split(",", 1)[0] for r in rows if r.strip()]))
    return out


def _installed_files(site_dir: Path) -> dict[str, list[str]]:
    """Canonical distribution name -> files it installed (paths relative to ``site_dir``)."""
    return {name: [f for d in dists for f in d.files]
            for name, dists in _installed(site_dir).items()}


def _top_level(files: Iterable[str]) -> list[str]:
    """Importable top-level modules among a distribution's installed files."""
    tops = set()
    for f in files:
        first = f.split("/", 1)[0]
        if first.endswith((".dist-info", ".data")) or first in ("..", "__pycache__", ""):
            continue
        if "/" in f:
            if first.isidentifier():
                tops.add(first)
            continue
        stem = first.split(".", 1)[0]
        if first.endswith((".py", ".so", ".pyd")) and stem.isidentifier():
            tops.add(stem)
    return sorted(tops)


def _tail(text: str, n: int = TAIL_LINES) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join("    " + ln for ln in lines[-n:])


_CHAIN = re.compile(r"\n\s*(?:The above exception was the direct cause of the following "
                    r"exception:|During handling of the above exception, another exception "
                    r"occurred:)\s*\n")


def _error_summary(text: str, n: int = TAIL_LINES, site_dir: Path | None = None) -> str:
    """The end of each exception of a (chained) traceback: its last frames and its message.

    For ``raise X from e`` chains the root cause comes first (e.g. torchvision's
    ``RuntimeError`` before transformers' ``ModuleNotFoundError``). The last frame inside
    ``site_dir`` (the requirements' files) is shown too. Without a traceback: the last ``n``
    lines of ``text``.
    """
    if "Traceback (most recent call last):" not in text:
        return _tail(text, n)
    roots = () if site_dir is None else tuple(
        f'  File "{r.rstrip("/")}/' for r in {str(site_dir), os.path.realpath(site_dir)})
    out: list[str] = []
    for block in _CHAIN.split(text.strip()):
        lines = block.rstrip().splitlines()
        frames = [i for i, ln in enumerate(lines) if ln.startswith('  File "')]
        ours = [i for i in frames if lines[i].startswith(roots)] if roots else []
        if ours and ours[-1] != frames[-1]:
            out.append(lines[ours[-1]].strip())
        if frames:
            out.append(lines[frames[-1]].strip())
            rest = lines[frames[-1] + 1:]
        else:
            rest = lines
        out += [ln for ln in rest if ln.strip() and not ln.startswith(" ")
                and not ln.startswith("Traceback (most recent call last)")]
    for r in roots:  # the temporary build folder means nothing to the reader
        out = [ln.replace(r.strip(), 'File "<new environment>/site-packages/') for ln in out]
    return "\n".join("    " + (ln if len(ln) <= 400 else ln[:397] + "...") for ln in out[-n:])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _remove_stale(envs: Path) -> None:
    """Remove temporary build folders of processes that died (e.g. killed with SIGKILL)."""
    for p in envs.glob(".build-*"):
        try:
            pid = int(p.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not _pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)


def _env_seal_parts(target: Path) -> tuple:
    """What an environment's seal binds: its key (folder name) and every file's content."""
    return ("bt-bench submission environment", target.name,
            json.dumps(_snapshot(target), sort_keys=True))


def _seal_env(target: Path) -> None:
    """Seal an installed environment under this machine's key (``<envs>/<key>.seal``)."""
    from benchmark.io import atomic_write_text
    from benchmark.seal import tag

    atomic_write_text(target.with_name(target.name + ".seal"), tag(*_env_seal_parts(target)))


def _seconds(value: object) -> float | None:
    """A recorded duration: a finite non-negative number, else None (unknown)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < float("inf") else None


def _load_intact(target: Path, pins: list[str]) -> SubmissionEnv | None:
    """The cached environment at ``target`` when it is complete, matches ``pins`` and is sealed.

    The seal (:mod:`benchmark.seal`) covers every file of the environment: one edited in place
    (a library file changed after install) or an environment copied from elsewhere is rebuilt.
    """
    from benchmark.seal import verify

    try:
        if not verify(target.with_name(target.name + ".seal").read_text(encoding="ascii"),
                      *_env_seal_parts(target)):
            return None
    except OSError:
        return None
    try:
        marker = json.loads((target / MARKER).read_text(encoding="utf-8"))
        env = SubmissionEnv(target, tuple(marker["requirements"]),
                            tuple((str(n), str(v)) for n, v in marker["versions"]),
                            tuple(_core_site_dirs()),
                            tuple((str(f), str(h)) for f, h in marker["wheels"]),
                            _seconds(marker.get("build_seconds")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if marker.get("format") != ENV_FORMAT or list(env.requirements) != pins \
            or not env.python.is_symlink():
        return None
    installed = _installed_files(_site_packages(target))
    if any(p.split("==", 1)[0] not in installed for p in pins):
        return None
    return env


def ensure_env(requirements: Sequence[str], *, cache: str | Path | None = None,
               pip_args: Sequence[str] = (), where: str = "submission.yaml",
               log=None, build_from_sdist: Sequence[str] = ()) -> SubmissionEnv | None:
    """Install ``requirements`` into their own cached environment (or reuse it) and return it.

    Args:
        requirements: pins as in ``submission.yaml`` (validated with :func:`parse_requirements`).
        cache: the cache folder (default :func:`benchmark.io.cache_root`); environments
        live
            in its ``envs/`` folder.
        pip_args: extra ``pip install`` options (e.g. ``["--no-index", "--find-links", DIR]``
            for an offline wheel folder; ``PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR`` in the
            environment do the same for the CLI). Part of the cache key.
        where: how to name the requirements' source in error messages.
        log: called with one line of progress text (default: silent).
        build_from_sdist: names of pins published as source only: each sdist is fetched
            without running any of its code, its wheel built in the estimator sandbox and
            checked (:mod:`benchmark.sandbox.sdist`), then installed like any wheel. Part of
            the cache key.

    Returns:
        The environment, or None when there are no requirements (use bt-bench's interpreter).

    Raises:
        RequirementError: a malformed pin, a package the core environment provides, a pin pip
            cannot install as a wheel, a wheel that replaces a file of the environment itself,
            or an environment that fails its smoke test (a requirement that breaks torch or
            transformers, or one that cannot be imported).
        IsolationError: the sandbox of the smoke test cannot start (e.g. its unprivileged user
            cannot reach the temporary folder).
    """
    from benchmark.io import cache_root

    pins = parse_requirements(list(requirements), where)
    if not pins:
        return None
    sdists = parse_sdists(list(build_from_sdist) if build_from_sdist else None, pins, where)
    say = log or (lambda _msg: None)
    closure = core_closure()
    for p in pins:
        name = p.split("==", 1)[0]
        if name in closure:
            root = closure[name]
            via = "" if root == name else f" (a dependency of {root})"
            raise RequirementError(
                f"{where}: requirement {p!r} names {name}, which is installed as part of "
                f"bt-bench's core environment{via}; a submission cannot replace it: remove it "
                f"from requirements (the installed {name} {md.version(name)} is used)."
            )
    envs = (Path(cache) if cache is not None else cache_root()).absolute() / "envs"
    envs.mkdir(parents=True, exist_ok=True)
    _remove_stale(envs)
    key = env_key(pins, pip_args, sdists)
    target = envs / key
    env = _load_intact(target, pins)
    if env is not None:
        return env
    if target.exists():  # a damaged environment (a missing marker or package): rebuild it
        shutil.rmtree(target, ignore_errors=True)
    say(f"installing {', '.join(pins)} into {target}")
    build = Path(tempfile.mkdtemp(prefix=f".build-{os.getpid()}-", dir=envs))
    try:
        env = _build(build / "env", pins, pip_args, where, sdists)
        try:
            os.rename(env.prefix, target)
        except OSError:  # another process finished the same environment first
            env = _load_intact(target, pins)
            if env is None:
                raise
            return env
        _seal_env(target)
        return SubmissionEnv(target, env.requirements, env.versions, env.core_site_dirs,
                             env.wheels, env.build_seconds)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _snapshot(prefix: Path) -> dict[str, str]:
    """The environment's own files before pip runs: relative path -> link target or sha256."""
    out = {}
    for root, dirs, files in os.walk(prefix):
        for n in dirs + files:
            f = Path(root) / n
            rel = f.relative_to(prefix).as_posix()
            if f.is_symlink():
                out[rel] = "-> " + os.readlink(f)
            elif f.is_file():
                out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _check_own_files(prefix: Path, before: dict[str, str], site_dir: Path, pins: list[str],
                     where: str) -> None:
    """Refuse a wheel that replaced a file of the environment itself (bin/python, pyvenv.cfg).

    A wheel's ``.data/scripts`` and ``.data/data`` folders install beside ``site-packages``:
    ``pyvenv.cfg`` from a wheel would choose which folders the sandbox binds for the
    interpreter, and a ``bin/python`` which program the sandbox runs.
    """
    after = _snapshot(prefix)
    changed = sorted(rel for rel, what in before.items() if after.get(rel) != what)
    if not changed:
        return
    owners = []
    for name, dists in _installed(site_dir).items():
        for d in dists:
            paths = {Path(os.path.normpath(site_dir / f)).relative_to(prefix).as_posix()
                     for f in d.files if os.path.normpath(site_dir / f).startswith(str(prefix))}
            if paths & set(changed):
                owners.append(next((p for p in pins if p.split("==")[0] == name), name))
    who = (f"requirement {owners[0]!r}" if len(owners) == 1 else
           f"requirements {', '.join(owners)}" if owners else "one of the requirements")
    raise RequirementError(
        f"{where}: {who} installs {', '.join(changed[:3])} over the environment's own "
        f"file{'s' if len(changed) > 1 else ''} (a wheel's .data folder may not replace the "
        "environment's interpreter or configuration, which decide what the sandbox runs and "
        "binds); drop the requirement or pin a version without those files."
    )


def _normalise_modes(prefix: Path) -> None:
    """Folders 0755, files 0644 (0755 when executable), whatever the umask was.

    Readable by the sandbox's fresh uid, writable by the owner only.
    """
    for root, dirs, files in os.walk(prefix):
        for n in dirs + files:
            f = Path(root) / n
            if f.is_symlink():
                continue
            mode = f.stat().st_mode
            os.chmod(f, 0o755 if f.is_dir() or mode & 0o100 else 0o644)
    os.chmod(prefix, 0o755)


def _wheels(report: Path) -> list[tuple[str, str]]:
    """``(file name, sha256)`` of each wheel pip installed (its ``--report``)."""
    try:
        items = json.loads(report.read_text(encoding="utf-8")).get("install", [])
    except (OSError, ValueError, AttributeError):
        return []
    out = []
    for item in items:
        info = item.get("download_info") or {}
        digest = ((info.get("archive_info") or {}).get("hashes") or {}).get("sha256", "")
        out.append((str(info.get("url", "")).rsplit("/", 1)[-1], str(digest)))
    return sorted(out)


def _wheels_from_sdists(folder: Path, pins: list[str], sdists: list[str],
                        pip_args: Sequence[str], where: str) -> tuple[dict[str, Path], list]:
    """Fetch each sdist, build its wheel in the sandbox, check it: pin -> wheel file, records."""
    from benchmark.sandbox.isolation import build_isolated
    from benchmark.sandbox.limits import Limits
    from benchmark.sandbox.sdist import BUILD_TIMEOUT, SdistError, check_wheel, fetch_sdist

    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)  # the sandbox's unprivileged uid reads the sdist from here
    out: dict[str, Path] = {}
    records = []
    for pin in [p for p in pins if p.split("==", 1)[0] in sdists]:
        try:
            sdist, digest, source = fetch_sdist(pin, folder, pip_args, where)
            os.chmod(sdist, 0o644)
            report, data = build_isolated(sdist, Limits(wall_seconds=BUILD_TIMEOUT + 60))
            if data is None:
                raise SdistError(
                    f"{where}: building the wheel of {pin} from its sdist {sdist.name} in the "
                    f"sandbox failed ({report['stage']}):\n{_tail(report.get('error', ''))}\n"
                    "fix: pin a version whose sdist builds with setuptools and no network (a "
                    "pure-Python package), or drop it.")
            name = check_wheel(report["wheel"], data, pin)
        except SdistError as exc:
            raise RequirementError(str(exc)) from None
        (folder / "wheels").mkdir(exist_ok=True, mode=0o755)
        wheel = folder / "wheels" / name
        wheel.write_bytes(data)
        out[pin] = wheel
        records.append({"pin": pin, "sdist": sdist.name, "sdist_sha256": digest,
                        "source": source, "wheel": name,
                        "wheel_sha256": hashlib.sha256(data).hexdigest()})
    return out, records


def _build(prefix: Path, pins: list[str], pip_args: Sequence[str], where: str,
           sdists: list[str] = ()) -> SubmissionEnv:
    """Create the environment at ``prefix``, install the pins, smoke-test it, write the marker.

    ``sdists``: names of pins whose wheel is built from their sdist in the sandbox first.
    """
    import time
    import venv

    t0 = time.monotonic()
    built, sdist_records = _wheels_from_sdists(prefix.parent / "sdists", pins, list(sdists),
                                               pip_args, where) if sdists else ({}, [])
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(prefix)
    site_dir = _site_packages(prefix)
    extra = _core_site_dirs()
    if extra:  # bt-bench runs in a venv: make its site-packages (the core) visible as well
        lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in extra)
        (site_dir / "_bt_bench_core.pth").write_text(lines, encoding="utf-8")
    own = _snapshot(prefix)
    python = prefix / "bin" / "python"
    report = prefix.parent / "pip-report.json"
    # pip re-runs itself under the new interpreter (--python) to install for it; that start sees
    # only the files created above: no file of any requirement exists yet, and installing a
    # wheel runs none of its code (docs/isolation.md, "Requirements")
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
           "--only-binary=:all:", "--ignore-installed", "--no-input",
           "--disable-pip-version-check", "--no-warn-script-location", "--report", str(report),
           *pip_args, *[str(built[p]) if p in built else p for p in pins]]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=PIP_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise RequirementError(
            f"{where}: installing {', '.join(pins)} did not finish in {PIP_TIMEOUT} s; check "
            "the network connection to the package index and retry."
        ) from exc
    if proc.returncode != 0:
        raise RequirementError(_install_failure(pins, proc.stdout + proc.stderr, where))
    _check_own_files(prefix, own, site_dir, pins, where)
    dists = _installed(site_dir)
    installed = _installed_files(site_dir)
    missing = [p for p in pins if p.split("==", 1)[0] not in installed]
    if missing:
        raise RequirementError(
            f"{where}: pip reported success but did not install {', '.join(missing)}; "
            "retry, and report the pip version (python -m pip --version) if it persists."
        )
    for p in pins:
        name = p.split("==", 1)[0]
        if len(dists[name]) > 1:
            raise RequirementError(
                f"{where}: the requirements install {len(dists[name])} metadata folders for "
                f"{name} ({', '.join(d.info for d in dists[name])}); one wheel carries another "
                "package's metadata: drop the requirement that ships it."
            )
    core_tops = _core_top_level()
    for p in pins:
        name = p.split("==", 1)[0]
        clash = sorted(set(_top_level(installed[name])) & core_tops)
        if clash:
            raise RequirementError(
                f"{where}: requirement {p!r} installs the module(s) {', '.join(clash)}, which "
                "belong to the core environment and would replace them; drop the requirement."
            )
    _normalise_modes(prefix)
    modules = {p: _top_level(installed[p.split("==", 1)[0]]) for p in pins}
    versions = [(p.split("==", 1)[0], dists[p.split("==", 1)[0]][0].version) for p in pins]
    env = SubmissionEnv(prefix, tuple(pins), tuple(versions), tuple(extra),
                        tuple(_wheels(report)))
    _smoke_test(env, modules, site_dir, where)
    env = replace(env, build_seconds=round(time.monotonic() - t0, 1))
    marker = {"build_seconds": env.build_seconds, "sdists": sdist_records,
              "requirements": list(env.requirements),
              "versions": [list(v) for v in versions],
              "wheels": [list(w) for w in env.wheels], "core_site_dirs": list(extra),
              "core": _core_versions(), "source": package_source(pip_args),
              "python": sys.version, "format": ENV_FORMAT}
    (prefix / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    os.chmod(prefix / MARKER, 0o644)
    return env


def _core_top_level() -> set[str]:
    """Top-level module names of the core closure's distributions."""
    closure = core_closure()
    tops = set()
    for mod, dists in md.packages_distributions().items():
        if any(canonical_name(d) in closure for d in dists):
            tops.add(mod)
    return tops


def _install_failure(pins: list[str], output: str, where: str) -> str:
    """The message for a failed ``pip install``: the pin it names, pip's last lines, the fix."""
    bad = [p for p in pins
           if re.search(rf"(?i)(no matching distribution found for|could not find a version "
                        rf"that satisfies the requirement|cannot install)\s+"
                        rf"{re.escape(p.split('==')[0])}\b",
                        output.replace("_", "-"))]
    what = (f"requirement {bad[0]!r} cannot be installed" if bad
            else f"the requirements {', '.join(pins)} cannot be installed")
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    errors = "\n".join(ln for ln in output.splitlines() if ln.startswith("ERROR:"))
    return (f"{where}: {what}: pip failed:\n{_tail(errors or output)}\n"
            f"fix: pin a version that exists on PyPI as a wheel for Python {py} on this platform "
            "(check with pip download --no-deps --only-binary=:all: NAME==VERSION), or drop it.")


def smoke_inside(spec: dict) -> dict:
    """The smoke test itself; runs inside the sandbox, in the environment's interpreter.

    Args:
        spec: ``{"modules": {pin: [module, ...]}, "core_only": bool}``.

    Returns:
        ``{"stage": "ok"}``, ``{"stage": "core", "step": one of SMOKE_STEPS, "error": tb}`` or
        ``{"stage": "import", "pin", "module", "error": tb}`` (tracebacks cut to their last
        8,000 characters, so the report fits one result frame).
    """
    import importlib
    import traceback

    def error() -> str:
        return traceback.format_exc()[-8000:]

    step = SMOKE_STEPS[0]
    try:
        import torch

        step = SMOKE_STEPS[1]
        import transformers
        from transformers import AutoModelForCausalLM, Qwen2Config

        step = SMOKE_STEPS[2]
        transformers.utils.logging.disable_progress_bar()
        with tempfile.TemporaryDirectory() as d:
            conf = Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=16,
                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                               max_position_embeddings=16, tie_word_embeddings=True)
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(conf).save_pretrained(d)
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                         attn_implementation="eager")
            loss = model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss
            loss.backward()
            if not torch.isfinite(loss):
                raise RuntimeError(f"the model's loss is {loss.item()}")
    except BaseException:  # noqa: BLE001 - every failure is the report
        return {"stage": "core", "step": step, "error": error()}
    if spec["core_only"]:
        return {"stage": "ok"}
    for pin, modules in spec["modules"].items():
        for m in modules:
            try:
                importlib.import_module(m)
            except BaseException:  # noqa: BLE001
                return {"stage": "import", "pin": pin, "module": m, "error": error()}
    return {"stage": "ok"}


def _run_smoke(sandbox_kwargs: dict, modules: dict[str, list[str]], core_only: bool) -> dict:
    """Run :func:`smoke_inside` in the sandbox; its report, validated, or a timeout/crash.

    ``sandbox_kwargs``: the environment's (``SubmissionEnv.sandbox_kwargs``), or ``{}`` for
    bt-bench's own interpreter.
    """
    from benchmark.sandbox.isolation import smoke_isolated

    return smoke_isolated({"modules": modules, "core_only": core_only},
                          Limits(wall_seconds=SMOKE_TIMEOUT), **sandbox_kwargs)


def _culprits(error: str, site_dir: Path, modules: dict[str, list[str]]) -> list[str]:
    """The pins whose installed files appear in a traceback."""
    roots = {str(site_dir).rstrip("/") + "/", os.path.realpath(site_dir).rstrip("/") + "/"}
    return [pin for pin, mods in modules.items()
            if any(f'"{r}{m}/' in error or f'"{r}{m}.' in error for r in roots for m in mods)]


def _smoke_test(env: SubmissionEnv, modules: dict[str, list[str]], site_dir: Path,
                where: str) -> None:
    """Run the smoke test of the new environment in the sandbox; raise when it fails."""
    pins = list(env.requirements)
    out = _run_smoke(env.sandbox_kwargs(), modules, core_only=False)
    stage = out["stage"]
    if stage == "ok":
        return
    fix = ("fix: pin a version of it that works with the core environment (torch "
           f"{_version('torch')}, transformers {_version('transformers')}), or drop it")
    if stage == "import":
        _import_failure(out, where, fix, site_dir)
    if stage in ("timeout", "crash"):
        how = (f"it timed out after {SMOKE_TIMEOUT} s" if stage == "timeout"
               else out.get("how", "the interpreter died"))
        raise RequirementError(
            f"{where}: the new environment with {', '.join(pins)} did not finish its smoke test "
            f"in the sandbox ({how}):\n{_error_summary(out.get('error', ''))}\n"
            f"{fix.replace('of it', 'of each requirement')}."
        )
    # stage "core": torch or transformers failed; is it the requirements' fault?
    error = out["error"]
    core = "torch" if out["step"] == SMOKE_STEPS[0] else "transformers"
    base = _run_smoke({}, {}, core_only=True)
    if base["stage"] != "ok":
        raise RequirementError(
            f"bt-bench's own environment fails the same check without any requirement "
            f"({out['step']}):\n{_error_summary(base.get('error', ''))}\n"
            "fix: repair the core install (pip install -e .) before installing requirements."
        )
    blamed = _culprits(error, site_dir, modules)
    who = (f"requirement {blamed[0]!r}" if len(blamed) == 1
           else f"requirements {', '.join(blamed)}" if blamed
           else f"one of the requirements {', '.join(pins)}")
    raise RequirementError(
        f"{where}: {who} breaks {core} (it works without the requirements): "
        f"{out['step']} failed in the new environment:\n"
        f"{_error_summary(error, site_dir=site_dir)}\n{fix}."
    )


def _import_failure(out: dict, where: str, fix: str, site_dir: Path):
    error, pin, module = out["error"], out["pin"], out["module"]
    missing = re.search(r"No module named '([^']+)'", error)
    if missing:
        hint = (f"fix: requirements are a lock installed without dependencies: add the package "
                f"that provides {missing.group(1).split('.')[0]!r} as an exact pin (and the "
                "packages it needs in turn)")
    else:
        hint = fix
    raise RequirementError(
        f"{where}: requirement {pin!r} installs but importing {module} fails:\n"
        f"{_error_summary(error, site_dir=site_dir)}\n{hint}."
    )


def _version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "(not installed)"
