"""The release registry (``registry.json``): each release id -> Hub repo, revision, sha256."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from benchmark.errors import ReleaseError

REGISTRY_FILE = Path(__file__).with_name("registry.json")
REGISTRY_SCHEMA_VERSION = 1
#: a pinned revision: a commit SHA (a branch or tag name moves)
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
#: a manifest's sha256
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
#: a Hub repo id, ``org/name``
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class RegistryEntry:
    """One registered release.

    Attributes:
        release_id: the id users type (``"tiny"``).
        repo_id: the Hub dataset repo (``"org/name"``).
        revision: the pinned commit SHA (40 hex digits), ``None`` until the release is pushed.
        manifest_sha256: sha256 of the release's ``manifest.json`` bytes.
        shipped: folder in this repository that holds the same release (relative to the repo
            root), ``None`` for Hub-only releases.
        description: one line for people.
    """

    release_id: str
    repo_id: str
    revision: str | None
    manifest_sha256: str
    shipped: str | None = None
    description: str = ""


def registry_path() -> Path:
    """The registry file in use: ``$BT_BENCH_REGISTRY`` or the one in the package."""
    env = os.environ.get("BT_BENCH_REGISTRY")
    return Path(env) if env else REGISTRY_FILE


def load_registry(path: str | os.PathLike | None = None) -> dict[str, RegistryEntry]:
    """Read and validate a registry file (default :func:`registry_path`); return id -> entry.

    Raises:
        ReleaseError: the file is missing, not JSON, or an entry is malformed (the message names
            the entry, the bad value and the expected form).
    """
    path = Path(path) if path is not None else registry_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReleaseError(f"release registry {path} does not exist; unset BT_BENCH_REGISTRY or "
                           "point it at a registry JSON file (format: docs/hub.md)") from None
    except json.JSONDecodeError as e:
        raise ReleaseError(f"release registry {path} is not valid JSON ({e}); fix the file "
                           "(format: docs/hub.md)") from None
    if raw.get("schema_version") != REGISTRY_SCHEMA_VERSION or not isinstance(
            raw.get("releases"), dict):
        raise ReleaseError(f"release registry {path} has schema_version "
                           f"{raw.get('schema_version')!r} or no 'releases' object; expected "
                           f"schema_version {REGISTRY_SCHEMA_VERSION} and a 'releases' object "
                           "(format: docs/hub.md)")
    out = {}
    for rid, e in raw["releases"].items():
        where = f"release registry {path}, entry {rid!r}"
        if not isinstance(e, dict):
            raise ReleaseError(f"{where} is {e!r}; expected an object (format: docs/hub.md)")
        repo_id, rev, msha = e.get("repo_id"), e.get("revision"), e.get("manifest_sha256")
        if not isinstance(repo_id, str) or not REPO_ID.fullmatch(repo_id):
            raise ReleaseError(f"{where}: repo_id {repo_id!r} is not a Hub repo id; expected "
                               "'org/name'")
        if rev is not None and (not isinstance(rev, str) or not COMMIT_SHA.fullmatch(rev)):
            raise ReleaseError(f"{where}: revision {rev!r} is not a commit SHA; expected 40 "
                               "lowercase hex digits (a branch or tag name moves), or null "
                               "before the first push")
        if not isinstance(msha, str) or not SHA256_HEX.fullmatch(msha):
            raise ReleaseError(f"{where}: manifest_sha256 {msha!r} is not a sha256; expected 64 "
                               "lowercase hex digits (sha256sum manifest.json)")
        out[rid] = RegistryEntry(release_id=rid, repo_id=repo_id, revision=rev,
                                 manifest_sha256=msha, shipped=e.get("shipped"),
                                 description=e.get("description", ""))
    return out


def registry_entry(release_id: str,
                   registry: dict[str, RegistryEntry] | None = None) -> RegistryEntry:
    """Return the registry entry of ``release_id``.

    Raises:
        ReleaseError: the id is not registered (the message lists the registered ids).
    """
    registry = load_registry() if registry is None else registry
    if release_id not in registry:
        raise ReleaseError(f"release {release_id!r} is not in the release registry "
                           f"{registry_path()}; registered: {sorted(registry)}. Pass a registered "
                           "id, or a release folder path")
    return registry[release_id]


def find_entry(release_id: str) -> RegistryEntry | None:
    """The registry entry of ``release_id``, or ``None`` when it is not registered."""
    return load_registry().get(str(release_id))


def entry_for_manifest(release_id: str, manifest_sha256: str) -> RegistryEntry | None:
    """The registry entry whose id and manifest sha256 both match, else ``None``.

    A match proves the folder holds the pinned Hub revision's files byte for byte (the manifest
    pins every file's sha256), so its ``revision`` is the one to record.
    """
    e = load_registry().get(release_id)
    return e if e is not None and e.manifest_sha256 == manifest_sha256 else None
