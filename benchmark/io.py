"""Small I/O helpers: strict JSON/JSONL reading with located errors, and atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmark.errors import InputFileError


def cache_root() -> Path:
    """The folder for everything bt-bench caches: ``$BT_BENCH_CACHE`` or ``~/.cache/bt-bench``."""
    env = os.environ.get("BT_BENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "bt-bench"


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read one JSON document. ``-Infinity``/``NaN`` tokens (non-standard) are accepted.

    Raises:
        InputFileError: the file is missing or malformed (the message names file, line, column).
    """
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"{p}: file not found; check the path (expected a JSON file).")
    try:
        with p.open(encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise InputFileError(
            f"{p}:{exc.lineno}:{exc.colno}: malformed JSON ({exc.msg}); "
            "the file may be truncated: re-download or regenerate it."
        ) from exc


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON-lines file.

    Raises:
        InputFileError: missing file, a line that is not JSON, or a line that is not an object.
    """
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"{p}: file not found; check the path (expected a JSON-lines file).")
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputFileError(
                    f"{p}:{lineno}: malformed JSON line ({exc.msg}): {line.strip()[:80]!r}; "
                    "each line must be one JSON object."
                ) from exc
            if not isinstance(obj, dict):
                raise InputFileError(
                    f"{p}:{lineno}: expected a JSON object per line, got {type(obj).__name__}."
                )
            yield lineno, obj


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` whole or not at all (temp file in the same folder + rename).

    The file gets ``mode`` (default 0644, like any file a user creates; the temp file's own
    0600 would make results and release files unreadable to others, sandboxes included).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def dumps_json(obj: Any) -> str:
    """Stable, strict JSON: sorted keys, 2-space indent, no NaN/Infinity (they become null)."""
    return json.dumps(_finite(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj
