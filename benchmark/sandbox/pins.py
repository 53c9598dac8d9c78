"""A submission's declared requirements, the pure part: parsing the pins and the cache key.

Split from :mod:`benchmark.sandbox.requirements` (which builds the environments and re-exports
every public name here): what a pin may be (:func:`parse_requirements`), which installed
distributions the core needs (:func:`core_closure`), where pip takes wheels from
(:func:`package_source`) and the key of an environment in the cache (:func:`env_key`). Nothing
here installs or runs anything.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import site
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmark.errors import BenchmarkError

#: packages bt-bench itself pins (its dependencies and test extras, and itself): a submission can
#: never declare them, the core environment provides them
CORE_PACKAGES = ("bt-bench", "torch", "transformers", "numpy", "datasets", "huggingface-hub",
                 "scikit-learn", "tabulate", "tqdm", "safetensors", "pyarrow", "pyyaml",
                 "matplotlib", "scipy", "rank-bm25")
#: bump when the layout of an environment changes (invalidates every cached one)
ENV_FORMAT = 2
#: the file written last into a finished environment (its presence marks it intact)
MARKER = "bt-bench-env.json"
#: pip's own time limit for one install
PIP_TIMEOUT = 1800
#: the smoke test's time limit (imports torch and transformers, builds a tiny model)
SMOKE_TIMEOUT = 300
#: lines of an error shown in a message
TAIL_LINES = 12
# SMOKE_STEPS (the smoke test's steps before the requirements are imported, ``smoke_inside``'s
# ``step``) lives in benchmark.sandbox.limits: the sandbox checks a report's step against it
#: the environment variables through which pip chooses where wheels come from
PIP_SOURCE_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX",
                        "PIP_CONFIG_FILE")

# matched in full (fullmatch): ``$`` would accept a final newline
_NAME_RE = re.compile(r"[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9]")
_PIN_RE = re.compile(r"\s*(?P<name>[^=<>!~\s\[;@]+)\s*==\s*(?P<version>[^\s=;]+)\s*")
_EXAMPLE = "kronfluence==1.0.1"


class RequirementError(BenchmarkError):
    """A declared requirement is malformed, cannot be installed, or breaks the core environment."""


def canonical_name(name: str) -> str:
    """PEP 503 normalized distribution name (``Opt_Einsum`` -> ``opt-einsum``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------------------------
# parsing


def _pin_problem(item: str) -> str:
    """Why ``item`` is not an exact pin ("" when it is one)."""
    s = item.strip()
    if not s:
        return "it is empty"
    if "://" in s or "@" in s or s.startswith(("-", ".", "/", "~")) or s.endswith(".whl"):
        return "URLs, paths, files and pip options are not allowed"
    if ";" in s:
        return "environment markers are not allowed"
    if "[" in s or "]" in s:
        return "extras are not allowed (pin every package the extra needs instead)"
    m = _PIN_RE.fullmatch(s)
    if m is None:
        return "it does not pin an exact version with =="
    if not _NAME_RE.fullmatch(m["name"]):
        return f"{m['name']!r} is not a valid package name"
    version = m["version"]
    if "*" in version or "," in version:
        return "wildcards and version ranges are not allowed"
    try:
        from packaging.version import InvalidVersion, Version

        Version(version)
    except InvalidVersion:
        return f"{version!r} is not a valid version (PEP 440)"
    except ImportError:  # pragma: no cover - packaging ships with every core install
        pass
    return ""


def parse_requirements(value: object, where: str = "submission.yaml") -> list[str]:
    """Validate the ``requirements:`` value of ``submission.yaml``; return the canonical pins.

    Args:
        value: the parsed YAML value: a list of strings ``name==version`` (None = no requirements).
        where: how to name the file in error messages.

    Returns:
        ``["name==version", ...]`` with PEP 503 normalized names, in the given order.

    Raises:
        RequirementError: not a list of strings, an item that is not an exact pin (a range, a URL,
            extras, markers or pip options), a package listed twice, or a core package.
    """
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RequirementError(
            f"{where}: requirements {value!r} must be a list of exact pins name==version, e.g. "
            f"requirements: [{_EXAMPLE}, accelerate==1.15.0] (or omit the key)."
        )
    out: list[str] = []
    seen: dict[str, str] = {}
    for item in value:
        problem = _pin_problem(item)
        if problem:
            raise RequirementError(
                f"{where}: requirement {item!r} is not an exact pin ({problem}); expected "
                f"name==version of a wheel on PyPI, e.g. {_EXAMPLE} (find the version with "
                "pip index versions NAME)."
            )
        m = _PIN_RE.fullmatch(item)
        name = canonical_name(m["name"])
        if name in CORE_PACKAGES:
            raise RequirementError(
                f"{where}: requirement {item!r} names {name}, which the core environment "
                f"provides (bt-bench pins {', '.join(CORE_PACKAGES)}); remove it from "
                "requirements: the estimator uses the installed version."
            )
        if name in seen:
            raise RequirementError(
                f"{where}: requirement {item!r} names {name} again (already {seen[name]!r}); "
                "list each package once."
            )
        seen[name] = item
        out.append(f"{name}=={m['version']}")
    return out


# ----------------------------------------------------------------------------------------------
# the core environment


def _requires(dist: md.Distribution) -> list[str]:
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for r in dist.requires or []:
        try:
            req = Requirement(r)
        except InvalidRequirement:  # pragma: no cover - a broken installed METADATA
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        out.append(req.name)
    return out


def parse_sdists(names: object, pins: Sequence[str], where: str = "submission.yaml") -> list[str]:
    """``build_from_sdist``: canonical names, each the name of one of ``pins``.

    Raises:
        RequirementError: not a list of names, a name twice, or a name without an exact pin.
    """
    if names is None:
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise RequirementError(
            f"{where}: build_from_sdist must be a list of package names whose exact pins are in "
            f"requirements, e.g. build_from_sdist: [traker]; got {names!r}.")
    pinned = {p.split("==", 1)[0]: p for p in pins}
    out = []
    for n in names:
        c = canonical_name(n.strip())
        if not _NAME_RE.fullmatch(n.strip()) or c not in pinned:
            raise RequirementError(
                f"{where}: build_from_sdist names {n!r}, which is not the name of a pin in "
                f"requirements ({', '.join(pins) or 'none'}); add its exact pin name==version "
                "there, or drop it from build_from_sdist.")
        if c in out:
            raise RequirementError(f"{where}: build_from_sdist names {n!r} twice; list it once.")
        out.append(c)
    return out


def core_closure() -> dict[str, str]:
    """Every installed distribution the core needs: name -> the core package that pulls it in.

    The transitive closure of :data:`CORE_PACKAGES` over their installed (non-extra)
    dependencies, e.g. ``{"torch": "torch", "filelock": "torch", "packaging": "transformers"}``.
    """
    out: dict[str, str] = {}
    todo = [(n, n) for n in CORE_PACKAGES]
    while todo:
        name, root = todo.pop(0)
        key = canonical_name(name)
        if key in out:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        out[key] = root
        todo += [(r, root) for r in _requires(dist)]
    return out


def _core_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for n in CORE_PACKAGES:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = None
    return out


def _core_site_dirs() -> list[str]:
    """Site folders of this interpreter that a ``--system-site-packages`` env does not see.

    Empty unless bt-bench itself runs in a virtual environment (then its site-packages, which
    hold torch and the other core packages, are added to the new environment's path).
    """
    base = set(site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]))
    return [d for d in site.getsitepackages() if d not in base and Path(d).is_dir()]


def _pip_config_files() -> list[Path]:
    """The configuration files of pip that exist (they may name another index)."""
    home = Path.home()
    xdg_dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    xdg_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    paths = [Path(os.environ["PIP_CONFIG_FILE"])] if os.environ.get("PIP_CONFIG_FILE") else []
    paths += [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d] + [Path("/etc/pip.conf")]
    paths += [home / ".pip" / "pip.conf", xdg_home / "pip" / "pip.conf"]
    return [p for p in paths if p.is_file()]


def package_source(pip_args: Sequence[str] = ()) -> dict:
    """Where pip takes the wheels from: extra options, ``PIP_*`` index variables, config files.

    Part of the cache key: the same pins from another index or a local wheel folder (a test's,
    or a forged one) get an environment of their own, never one built from the other source.
    """
    config = {}
    for f in _pip_config_files():
        try:
            config[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
        except OSError:
            config[str(f)] = "unreadable"
    return {"pip_args": list(pip_args),
            "env": {k: os.environ[k] for k in PIP_SOURCE_VARIABLES if k in os.environ},
            "config": config}


def env_key(pins: Sequence[str], pip_args: Sequence[str] = (),
            sdists: Sequence[str] = ()) -> str:
    """Cache key of an environment: sha256 of the pins, their source, the core and interpreter.

    ``sdists``: the names of pins built from their sdist in the sandbox (``build_from_sdist``).
    """
    payload = {
        "format": ENV_FORMAT, "pins": sorted(pins), "core": _core_versions(),
        "python": sys.version, "executable": os.path.realpath(sys.executable),
        "site": _core_site_dirs(), "source": package_source(pip_args),
    }
    if sdists:  # absent otherwise: the keys of every environment without sdists stay as they were
        payload["sdists"] = sorted(sdists)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]
