"""Requirements published as source only: fetch the sdist, build its wheel in the sandbox.

Some libraries publish no wheel (``traker`` 0.3.2 is an sdist alone), and building an sdist runs
its ``setup.py`` or build backend: code from a stranger, like the estimator. A submission lists
such pins under ``build_from_sdist:`` (names of pins that are also in ``requirements:``), and
bt-bench then

1. **fetches the file, running nothing of it**: the index's PEP 691 JSON page of the project
   (``$PIP_INDEX_URL``, default PyPI's simple index) names the files of every version with their
   sha256; the one sdist ``NAME-VERSION.tar.gz`` is downloaded with ``urllib`` and checked
   against that sha256 (with ``--no-index --find-links DIR`` in the pip options: the file from
   ``DIR``, its sha256 recorded). ``pip download`` is not used: for an sdist it prepares the
   metadata, i.e. runs the build backend, outside any sandbox;
2. **builds the wheel in the estimator sandbox** (:func:`build_inside`, run by
   :func:`benchmark.sandbox.isolation.build_isolated`): bt-bench's interpreter, read-only, a fresh
   uid without capabilities, seccomp, Landlock, no network, the sdist's folder bound read-only,
   ``pip wheel --no-deps --no-build-isolation --no-index`` writing into the sandbox's private
   ``/tmp``. The wheel's bytes come back on the result channel as one bounded ``uint8`` array,
   the only thing read back;
3. **checks the wheel** (:func:`check_wheel`) before anything else touches it: a zip archive of
   at most :data:`MAX_WHEEL` bytes, named ``NAME-VERSION-TAG.whl`` for a pure-Python tag
   (``-none-any``), every member a relative path without ``..``, exactly one ``.dist-info``
   folder whose ``METADATA`` names the pinned project and version and whose ``RECORD`` exists;
4. installs it like any wheel (``pip install --no-deps --only-binary=:all:`` of the file), and the
   environment's smoke test runs in the sandbox as for every requirement.

Importing this module needs the standard library only (the sandboxed child imports it).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

#: the largest sdist fetched and the largest wheel read back (bytes)
MAX_SDIST = 64 << 20
MAX_WHEEL = 64 << 20
#: how long one fetch from the index may take (s)
FETCH_TIMEOUT = 120
#: how long ``pip wheel`` may take inside the sandbox (s)
BUILD_TIMEOUT = 600
DEFAULT_INDEX = "https://pypi.org/simple"
#: a pure-Python wheel's file name: NAME-VERSION(-BUILD)?-PY-none-any.whl
_WHEEL_RE = re.compile(r"(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.+!]+)"
                       r"(?:-\d[A-Za-z0-9_.]*)?-(?P<py>py[23](?:\.py3)?)-none-any\.whl")


class SdistError(Exception):
    """An sdist that cannot be fetched, or a wheel built from it that is refused."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sdist_names(name: str, version: str) -> list[str]:
    """The file names an sdist of ``name==version`` may have (``-``, ``_`` or ``.`` spelled)."""
    base = {name, name.replace("-", "_"), name.replace("_", "-"), name.replace("-", "."),
            _canonical(name).replace("-", "_")}
    return sorted(f"{b}-{version}.tar.gz" for b in base)


def _pip_option(pip_args: Sequence[str], option: str) -> str | None:
    args = list(pip_args)
    for i, a in enumerate(args):
        if a == option and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(option + "="):
            return a.split("=", 1)[1]
    return None


def fetch_sdist(pin: str, dest: Path, pip_args: Sequence[str] = (),
                where: str = "submission.yaml") -> tuple[Path, str, str]:
    """Download the sdist of ``pin`` into ``dest`` without running any of its code.

    Args:
        pin: ``name==version`` (canonical).
        dest: an empty folder of the caller's.
        pip_args: pip options of the environment; ``--no-index`` with ``--find-links DIR``
            takes the file from ``DIR``, ``--index-url URL`` (else ``$PIP_INDEX_URL``, else
            PyPI) names the index.
        where: how to name the requirements' source in errors.

    Returns:
        ``(path, sha256, source)``: the file, its sha256 (checked against the index's when
        fetched from one) and where it came from (URL or folder).

    Raises:
        SdistError: no such sdist, a download error, a size over :data:`MAX_SDIST`, or a
            sha256 that differs from the index's.
    """
    import os

    name, version = pin.split("==", 1)
    names = sdist_names(name, version)
    links = _pip_option(pip_args, "--find-links") or os.environ.get("PIP_FIND_LINKS")
    if "--no-index" in pip_args or os.environ.get("PIP_NO_INDEX", "").lower() in ("1", "true",
                                                                                  "yes", "on"):
        folder = Path(links or ".")
        found = [folder / n for n in names if (folder / n).is_file()]
        if not found:
            raise SdistError(f"{where}: build_from_sdist {pin!r}: no sdist {names[0]} in "
                             f"{folder} (--no-index --find-links); put the file there or drop "
                             "--no-index.")
        data = found[0].read_bytes()
        if len(data) > MAX_SDIST:
            raise SdistError(f"{where}: build_from_sdist {pin!r}: {found[0]} is {len(data)} "
                             f"bytes, over the limit of {MAX_SDIST}.")
        path = dest / found[0].name
        path.write_bytes(data)
        return path, hashlib.sha256(data).hexdigest(), str(folder)
    index = (_pip_option(pip_args, "--index-url") or os.environ.get("PIP_INDEX_URL")
             or DEFAULT_INDEX).rstrip("/")
    page = f"{index}/{_canonical(name)}/"
    try:
        req = urllib.request.Request(page, headers={
            "Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=FETCH_TIMEOUT) as r:
            listing = json.loads(r.read(8 << 20))
    except (OSError, ValueError) as exc:
        raise SdistError(f"{where}: build_from_sdist {pin!r}: the index page {page} could not "
                         f"be read ({type(exc).__name__}: {exc}); check the network and "
                         "the index URL.") from None
    files = [f for f in listing.get("files", []) if isinstance(f, dict)
             and f.get("filename") in names]
    if len(files) != 1 or not isinstance((files[0].get("hashes") or {}).get("sha256"), str):
        raise SdistError(f"{where}: build_from_sdist {pin!r}: the index {page} lists "
                         f"{len(files)} sdist(s) named {names[0]} with a sha256; expected "
                         "exactly one (check the name and version).")
    meta = files[0]
    url = urllib.parse.urljoin(page, meta["url"])
    if urllib.parse.urlsplit(url).scheme not in ("https", "file"):
        raise SdistError(f"{where}: build_from_sdist {pin!r}: the index gives the URL {url!r}; "
                         "only https (or a local file index) is fetched.")
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as r:
            data = r.read(MAX_SDIST + 1)
    except OSError as exc:
        raise SdistError(f"{where}: build_from_sdist {pin!r}: downloading {url} failed "
                         f"({type(exc).__name__}: {exc}); retry.") from None
    if len(data) > MAX_SDIST:
        raise SdistError(f"{where}: build_from_sdist {pin!r}: {url} is over the limit of "
                         f"{MAX_SDIST} bytes.")
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta["hashes"]["sha256"]:
        raise SdistError(f"{where}: build_from_sdist {pin!r}: {url} has sha256 {digest}, the "
                         f"index says {meta['hashes']['sha256']}; the download was altered: "
                         "retry, and do not install it.")
    path = dest / meta["filename"]
    path.write_bytes(data)
    return path, digest, url


def check_wheel(name_of_file: str, data: bytes, pin: str) -> str:
    """Refuse a built wheel unless it is a sane pure-Python wheel of exactly ``pin``.

    Args:
        name_of_file: the file name the build reported.
        data: the wheel's bytes, as read back from the sandbox.
        pin: ``name==version`` it must be.

    Returns:
        The file name to install it under.

    Raises:
        SdistError: naming what is wrong (size, name, zip, a member path, the metadata).
    """
    name, version = pin.split("==", 1)
    what = f"the wheel built from the sdist of {pin}"
    if not 0 < len(data) <= MAX_WHEEL:
        raise SdistError(f"{what} is {len(data)} bytes; expected 1 to {MAX_WHEEL}.")
    m = _WHEEL_RE.fullmatch(name_of_file or "")
    if m is None or _canonical(m["name"]) != _canonical(name) or m["version"] != version:
        raise SdistError(f"{what} is named {name_of_file[:200]!r}; expected "
                         f"{_canonical(name).replace('-', '_')}-{version}-py3-none-any.whl (a "
                         "pure-Python wheel of that project and version; compiled builds are not "
                         "supported).")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        members = zf.namelist()
        bad = zf.testzip()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise SdistError(f"{what} is not a valid zip archive ({type(exc).__name__}).") from None
    if bad is not None:
        raise SdistError(f"{what} has a corrupt member {bad[:200]!r}.")
    for n in members:
        parts = n.split("/")
        if n.startswith(("/", "\\")) or "\\" in n or ".." in parts or ":" in n or "\0" in n:
            raise SdistError(f"{what} holds the member {n[:200]!r}; every member must be a "
                             "relative path inside the archive.")
    infos = sorted({n.split("/", 1)[0] for n in members if n.split("/", 1)[0]
                    .endswith(".dist-info")})
    if len(infos) != 1 or f"{infos[0]}/METADATA" not in members \
            or f"{infos[0]}/RECORD" not in members:
        raise SdistError(f"{what} has dist-info folders {infos}; expected exactly one with "
                         "METADATA and RECORD.")
    fields: dict[str, str] = {}
    for line in zf.read(f"{infos[0]}/METADATA").decode("utf-8", "replace").splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    if _canonical(fields.get("name", "")) != _canonical(name) or fields.get("version") != version:
        raise SdistError(f"{what} declares {fields.get('name')!r} {fields.get('version')!r} in "
                         f"its METADATA; expected {name} {version}.")
    return name_of_file


def build_inside(spec: dict) -> tuple[dict, bytes | None]:
    """Build the wheel of one sdist; runs inside the sandbox, in bt-bench's interpreter.

    Args:
        spec: ``{"sdist": path of the .tar.gz (bound read-only)}``.

    Returns:
        ``({"stage": "ok", "wheel": file name, "size": n}, bytes)``, or
        ``({"stage": "build", "error": pip's output tail}, None)``.
    """
    import os

    # without PYTHONPATH (bt-bench's own packages): pip scans every path entry, and only the
    # packages themselves, not the folder above them, are bound in the sandbox
    out = tempfile.mkdtemp(prefix="wheel-")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "--no-cache-dir", "--disable-pip-version-check", "--no-input",
             "-w", out, spec["sdist"]],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
            cwd=out, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        wheels = sorted(Path(out).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            return {"stage": "build",
                    "error": (proc.stdout + proc.stderr)[-8000:] or f"{len(wheels)} wheels"}, None
        data = wheels[0].read_bytes()
        return {"stage": "ok", "wheel": wheels[0].name, "size": len(data)}, data
    except subprocess.TimeoutExpired:
        return {"stage": "build", "error": f"pip wheel ran over {BUILD_TIMEOUT} s"}, None
    finally:
        shutil.rmtree(out, ignore_errors=True)
