"""Small I/O helpers: strict JSON/JSONL reading with located errors, and atomic writes."""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmark.errors import CacheRootError, InputFileError, InputLimitError, UnsafeFileError

#: set to 1 to accept a cache folder that another user owns or others may write (knowingly)
CACHE_INSECURE_ENV = "BT_BENCH_CACHE_INSECURE_OK"


def cache_root() -> Path:
    """The folder for everything bt-bench caches: ``$BT_BENCH_CACHE`` or ``~/.cache/bt-bench``.

    Created mode 0700 when missing. Whatever sits in it is trusted only as far as it is
    checked, but a folder that others can write lets them plant entries, so one owned by
    another user or writable by group or others is refused (like OpenSSH's StrictModes),
    unless ``$BT_BENCH_CACHE_INSECURE_OK=1`` accepts it knowingly.

    Raises:
        CacheRootError: the folder is owned by another user, writable by group or others,
            or not a folder; the message names the path, the problem and the fix.
    """
    env = os.environ.get("BT_BENCH_CACHE")
    root = Path(env) if env else Path.home() / ".cache" / "bt-bench"
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir(mode=0o700)
        except FileExistsError:
            pass  # made by another process meanwhile: checked below like any other
    check_private_dir(root, what="the cache folder", env=CACHE_INSECURE_ENV,
                      hint="or point $BT_BENCH_CACHE at a folder of your own")
    return root


def check_private_dir(path: Path, what: str, env: str, hint: str = "") -> None:
    """Refuse ``path`` unless it is a folder owned by this user that no one else may write.

    Raises:
        CacheRootError: naming ``path``, its owner or mode, and the fix (``chmod 700``, or
            ``env=1`` to accept it knowingly).
    """
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise CacheRootError(f"{what} {path} cannot be read ({exc.strerror}); "
                             f"check the path{', ' + hint if hint else ''}.") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheRootError(f"{what} {path} is not a folder (a symlink or a file); "
                             f"remove it and rerun{', ' + hint if hint else ''}.")
    if os.environ.get(env) == "1":
        return
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"is owned by user id {st.st_uid}, not by this user ({os.geteuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = (f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}), "
                   "so they could plant entries that bt-bench would load")
    if problem:
        fix = (f"chown it to yourself and chmod 700 {path}" if st.st_uid != os.geteuid()
               else f"chmod 700 {path}")
        raise CacheRootError(f"{what} {path} {problem}; fix: {fix}"
                             f"{' (' + hint + ')' if hint else ''}, or set {env}=1 to "
                             "accept it knowingly.")


#: read_json's limits: whole file, nesting depth of arrays/objects, characters of one number
MAX_JSON_BYTES = 64 << 20
MAX_JSON_DEPTH = 64
MAX_NUMBER_CHARS = 100

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_LONG_NUMBER = re.compile(rb"[-+0-9.eE]{%d,}" % (MAX_NUMBER_CHARS + 1))


def check_json_limits(data: bytes, where: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Check a JSON text's nesting depth and number lengths before parsing, without recursion.

    A linear scan: the strings are masked out (a regex), the brackets counted with a cumulative
    sum. Takes well under a second for ``MAX_JSON_BYTES``.

    Raises:
        InputLimitError: deeper than ``max_depth`` or a number literal longer than
            :data:`MAX_NUMBER_CHARS` characters (naming ``where``, line and column).
    """
    import numpy as np

    arr = np.frombuffer(data, np.uint8).copy()
    for m in _JSON_STRING.finditer(data):
        arr[m.start():m.end()] = 0x20
    opens = (arr == 0x5B) | (arr == 0x7B)
    closes = (arr == 0x5D) | (arr == 0x7D)
    depth = np.cumsum(opens.astype(np.int64) - closes.astype(np.int64))
    if depth.size and int(depth.max()) > max_depth:
        pos = int(np.argmax(depth > max_depth))
        raise InputLimitError(
            f"{where}:{_line_col(data, pos)}: JSON nested deeper than {max_depth} levels of "
            "arrays/objects; bt-bench's files are far shallower: this file is not one of them "
            "(regenerate it with bt-bench).")
    long = _LONG_NUMBER.search(arr.tobytes())
    if long:
        raise InputLimitError(
            f"{where}:{_line_col(data, long.start())}: a number literal of "
            f"{long.end() - long.start()} characters (at most {MAX_NUMBER_CHARS}); bt-bench "
            "writes no such number: regenerate the file with bt-bench.")


def _line_col(data: bytes, pos: int) -> str:
    line = data.count(b"\n", 0, pos) + 1
    col = pos - (data.rfind(b"\n", 0, pos) + 1) + 1
    return f"{line}:{col}"


def read_json(path: str | os.PathLike[str], max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Read one JSON document. ``-Infinity``/``NaN`` tokens (non-standard) are accepted.

    Safe on untrusted files: at most ``max_bytes`` bytes are read, and the nesting depth and
    number lengths are checked (:func:`check_json_limits`) before parsing, so a crafted file
    gives an :class:`InputLimitError` within a second, never a ``RecursionError``.

    Raises:
        InputFileError: the file is missing or malformed (the message names file, line, column).
        InputLimitError: the file exceeds a limit (naming the file, the limit and the fix).
    """
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"{p}: file not found; check the path (expected a JSON file).")
    with p.open("rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputLimitError(f"{p}: larger than {max_bytes} bytes, the most bt-bench reads "
                              "as one JSON file; this is not a file bt-bench wrote "
                              "(regenerate it).")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{p}: not UTF-8 text (byte {exc.start}); expected a JSON file "
                             "written by bt-bench: regenerate it.") from None
    check_json_limits(data, str(p), max_depth)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(
            f"{p}:{exc.lineno}:{exc.colno}: malformed JSON ({exc.msg}); "
            "the file may be truncated: re-download or regenerate it."
        ) from exc
    except (ValueError, RecursionError, MemoryError) as exc:  # limits missed something
        raise InputLimitError(f"{p}: cannot be parsed within bt-bench's limits "
                              f"({type(exc).__name__}: {str(exc)[:200]}); regenerate the "
                              "file with bt-bench.") from None


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


def load_plain(path: str | os.PathLike[str], fix: str) -> Any:
    """``torch.load`` a stored ``.pt`` file without running any code it may hold.

    ``weights_only=True`` admits tensors, numbers, strings, ``None`` and dicts/lists/tuples of
    them; numpy arrays (bt-bench's replay store and build shards hold some) are admitted too,
    and every array found must have a bool, integer or float dtype (no object arrays). A pickle
    that names any other global (a planted payload) is refused before anything of it runs.

    Args:
        path: the file.
        fix: what the user should do about a refused file (e.g. "delete it; it is rebuilt").

    Raises:
        UnsafeFileError: naming the file, what was refused and ``fix``.
    """
    import numpy as np
    import torch

    core = getattr(np, "_core", None) or np.core
    p = Path(path)
    try:
        numeric = [type(np.dtype(c)) for c in "?bBhHiIlLqQefd"]  # never the object dtype
        # bytes: protocol-2 pickles write an empty array's data as GLOBAL bytes (a pure
        # constructor: bytes() of nothing); nothing else outside numpy's numeric arrays
        with torch.serialization.safe_globals([core.multiarray._reconstruct, np.ndarray,
                                               np.dtype, bytes, *numeric]):
            obj = torch.load(p, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - whatever a crafted file provokes is refused
        why = _torch_load_reason(str(exc))
        raise UnsafeFileError(
            f"{p}: refused to load ({type(exc).__name__}: {why}); "
            "bt-bench loads only plain tensors, arrays and containers from stored files, never "
            f"pickled objects; {fix}") from None
    stack = [obj]
    while stack:  # iterative: a deep structure cannot exhaust the stack
        o = stack.pop()
        if isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, list | tuple):
            stack.extend(o)
        elif isinstance(o, np.ndarray) and o.dtype.kind not in "biuf":
            raise UnsafeFileError(f"{p}: holds an array of dtype {o.dtype} (expected bool, "
                                  f"integer or float); {fix}")
    return obj


def _torch_load_reason(msg: str) -> str:
    """The line of a ``torch.load`` error that says what was refused (not its advice)."""
    lines = [ln.strip() for ln in msg.replace("WeightsUnpickler error:", "\n").splitlines()]
    for ln in lines:
        if "GLOBAL" in ln or "global" in ln or "Can only build" in ln:
            return ln[:300]
    return (lines[0] if lines else "")[:300]


def load_npy(path: str | os.PathLike[str], fix: str, dtype: str | None = None,
             ndim: int | None = None, mmap: bool = False) -> Any:
    """``np.load`` a stored ``.npy`` file with ``allow_pickle=False``, checking its form.

    Args:
        path: the file.
        fix: what the user should do about a refused file.
        dtype: the expected dtype (e.g. ``"float64"``), or None for any bool/int/float dtype.
        ndim: the expected number of dimensions, or None for any.
        mmap: memory-map it read-only instead of reading it.

    Raises:
        UnsafeFileError: a pickle, an object array, or another dtype/ndim (names file and fix).
    """
    import numpy as np

    p = Path(path)
    try:
        arr = np.load(p, allow_pickle=False, mmap_mode="r" if mmap else None)
    except Exception as exc:  # noqa: BLE001 - whatever a crafted file provokes is refused
        raise UnsafeFileError(f"{p}: refused to load ({type(exc).__name__}: "
                              f"{str(exc)[:200]}); expected a plain .npy array; {fix}") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf" \
            or (dtype is not None and arr.dtype != np.dtype(dtype)) \
            or (ndim is not None and arr.ndim != ndim):
        dims = f" of {ndim} dimensions" if ndim else ""
        raise UnsafeFileError(f"{p}: holds {type(arr).__name__} of dtype "
                              f"{getattr(arr, 'dtype', '?')} and shape "
                              f"{getattr(arr, 'shape', '?')}; expected "
                              f"{dtype or 'a numeric'} array{dims}; {fix}")
    return arr
