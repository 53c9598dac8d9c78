"""The release file format: layout constants, atomic writes, the sha256 manifest and its check."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import numpy as np

from benchmark.errors import ReleaseError
from benchmark.io import atomic_write_bytes

SCHEMA_VERSION = 3
RELEASE_VERSION = "3.0.0"
LABEL_FILE = "labels.parquet"
MANIFEST = "manifest.json"
WORK_DIR = ".work"


def atomic_write_json(path: Path, obj) -> None:
    """Write ``obj`` as sorted, indented, standard JSON (no NaN) atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False)
                              + "\n").encode())


def atomic_write_parquet(path: Path, df) -> None:
    """Write a pandas DataFrame as parquet (no index) atomically."""
    import io

    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def release_files(root: Path) -> list[Path]:
    """Every file of a release except the manifest and the build's work folder, sorted."""
    root = Path(root)
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and rel.parts[0] != WORK_DIR and str(rel) != MANIFEST:
            out.append(p)
    return out


def package_versions() -> dict:
    """Versions of the packages a build depends on."""
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__}


def write_manifest(root: Path, release_id: str, build: dict, seeds: dict,
                   version: str = RELEASE_VERSION) -> dict:
    """Write ``manifest.json`` at ``root`` with sha256 and size of every file; return it.

    Args:
        root: release folder.
        release_id: e.g. ``"tiny"``.
        build: the build description (preset, configs, thread count ...).
        seeds: per-seed summaries (gates, sketch fidelity, timings), keyed by seed number.
        version: the release version string.
    """
    root = Path(root)
    files = {}
    for p in release_files(root):
        if p.name.endswith(".tmp"):
            raise ReleaseError(f"half-written file {p} in the release; rerun the build")
        files[p.relative_to(root).as_posix()] = {"sha256": sha256_file(p),
                                                 "size": p.stat().st_size}
    manifest = {
        "schema_version": SCHEMA_VERSION, "release_id": release_id, "release_version": version,
        "build": build, "packages": package_versions(),
        "seeds": {str(k): v for k, v in sorted(seeds.items())},
        "label_file": LABEL_FILE, "files": files,
        "total_bytes": sum(f["size"] for f in files.values()),
    }
    atomic_write_json(root / MANIFEST, manifest)
    return manifest


def verify_release(root: Path, manifest: dict | None = None) -> None:
    """Check that every manifest file exists with its size and sha256; raise ReleaseError if not."""
    root = Path(root)
    if manifest is None:
        manifest = json.loads((root / MANIFEST).read_text())
    for rel, meta in manifest["files"].items():
        p = root / rel
        if not p.is_file():
            raise ReleaseError(
                f"release file {rel} listed in {root / MANIFEST} is missing; restore it "
                "(git checkout / re-download the release)"
            )
        actual = sha256_file(p)
        if actual != meta["sha256"]:
            raise ReleaseError(
                f"release file {rel} fails its checksum: expected sha256 {meta['sha256']}, "
                f"actual {actual}; restore the original file (git checkout -- {p} or "
                "re-download the release), never edit a frozen release"
            )
