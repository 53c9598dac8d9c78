"""Real ``.whl`` files built here (zipfile + a valid dist-info and RECORD), installed offline.

pip installs them from a local folder (``--no-index --find-links DIR``, or ``PIP_NO_INDEX=1
PIP_FIND_LINKS=DIR`` for the CLI) through the same path as a wheel from PyPI.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def build_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """Write a pure-Python wheel ``name==version`` holding ``files`` (path -> text); its path.

    Paths under ``<dist>-<version>.data/{scripts,data}/`` install beside ``site-packages``
    (into the environment's ``bin/`` and its root), as in any wheel.
    """
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    entries[f"{info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: bt-bench-tests\n"
                                "Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = []
    for path, text in entries.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in entries.items():
            z.writestr(path, text)
    return whl


def offline(folder: Path) -> list[str]:
    """pip options that install from ``folder`` only."""
    return ["--no-index", "--find-links", str(folder)]
