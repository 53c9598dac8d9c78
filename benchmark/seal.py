"""Cache entries bound to this machine's own key: an HMAC no one without the key can forge.

Everything bt-bench caches (cached live and panel draws, the replay store's baselines, states and
removals, the per-submission environments) is a file another party could have written: a CI
cache restored from elsewhere, a shared or copied folder, someone with write access to the cache.
Checking an entry's *form* (no pickle, the right shapes) or its *internal* consistency (a manifest
listing every file's sha256) does not stop an entry edited in place with its manifest rewritten to
match. So every entry bt-bench writes is **sealed**: an HMAC-SHA256 under a key that lives
outside the cache (:func:`key_path`, mode 0600, created on first use), over the entry's content
and identity. An entry whose seal is missing or wrong is treated as absent: rebuilt, never used.
An entry brought from another machine (or made under another key) is rebuilt the same way.

The key is 32 random bytes (``secrets``) written once as 64 hex characters. It is refused,
naming the path and the fix, when it is not a regular file owned by this user, when group or
others may read or write it, or when it lies inside the cache root it protects (whoever can
rewrite the cache could then rewrite the key).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from benchmark.errors import CacheRootError

__all__ = ["KEY_ENV", "SEAL_SUFFIX", "check_file", "key_path", "machine_key", "seal_file",
           "tag", "verify"]

#: environment variable naming the key file (default :func:`key_path`)
KEY_ENV = "BT_BENCH_CACHE_KEY"
#: a sealed file's seal sits beside it as ``<name>.seal`` (64 hex characters)
SEAL_SUFFIX = ".seal"
_KEY_CHARS = 64
_cached: tuple[tuple, bytes] | None = None


def key_path() -> Path:
    """``$BT_BENCH_CACHE_KEY``, else ``$XDG_CONFIG_HOME/bt-bench/cache.key`` (``~/.config``)."""
    env = os.environ.get(KEY_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "bt-bench" / "cache.key"


def _create(path: Path) -> None:
    """Write a new key with ``O_EXCL`` and mode 0600 (another process may win the race)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(_KEY_CHARS // 2))


def machine_key() -> bytes:
    """This machine's (this user's) cache key, created on first use.

    Raises:
        CacheRootError: the key file is a symlink or not a regular file, belongs to another
            user, may be read or written by group or others, is not 64 hex characters, or lies
            inside the cache root; the message names the path and the fix.
    """
    global _cached
    from benchmark.io import cache_root

    path = key_path()
    root = cache_root().resolve()
    where = path.parent.resolve() / path.name if path.parent.exists() else path
    if root == where or root in where.parents:
        raise CacheRootError(
            f"the cache key {path} lies inside the cache folder {root}: whoever can rewrite "
            f"cache entries could rewrite the key that vouches for them; point ${KEY_ENV} at a "
            "file outside the cache (default ~/.config/bt-bench/cache.key).")
    if not os.path.lexists(path):
        _create(path)
    st = os.lstat(path)
    mark = (str(path), st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode, st.st_uid)
    if _cached is not None and _cached[0] == mark:
        return _cached[1]
    fix = f"delete it (rm {path}; bt-bench writes a new one and rebuilds what it caches)"
    if not stat.S_ISREG(st.st_mode):
        raise CacheRootError(f"the cache key {path} is not a regular file (a symlink or "
                             f"something else); {fix}.")
    if st.st_uid != os.geteuid():
        raise CacheRootError(f"the cache key {path} is owned by user id {st.st_uid}, not by this "
                             f"user ({os.geteuid()}); {fix}.")
    if st.st_mode & 0o077:
        raise CacheRootError(f"the cache key {path} has mode {stat.S_IMODE(st.st_mode):04o}: "
                             "group or others may read or write it, so they could forge seals; "
                             f"chmod 600 {path}, or {fix}.")
    text = path.read_text(encoding="ascii", errors="replace").strip()
    if len(text) != _KEY_CHARS or any(c not in "0123456789abcdef" for c in text):
        raise CacheRootError(f"the cache key {path} is not {_KEY_CHARS} lowercase hex "
                             f"characters; {fix}.")
    key = bytes.fromhex(text)
    _cached = (mark, key)
    return key


def tag(*parts: bytes | str) -> str:
    """The hex HMAC-SHA256 of ``parts`` under :func:`machine_key` (length-prefixed, unambiguous)."""
    mac = hmac.new(machine_key(), digestmod=hashlib.sha256)
    for p in parts:
        b = p.encode() if isinstance(p, str) else bytes(p)
        mac.update(len(b).to_bytes(8, "little"))
        mac.update(b)
    return mac.hexdigest()


def verify(expected: str | None, *parts: bytes | str) -> bool:
    """Whether ``expected`` is :func:`tag` of ``parts`` (compared in constant time)."""
    return isinstance(expected, str) and hmac.compare_digest(expected, tag(*parts))


def _seal_of(path: Path) -> Path:
    return path.with_name(path.name + SEAL_SUFFIX)


def _file_parts(path: Path, identity: str) -> Iterable[bytes | str]:
    return (identity, path.read_bytes())


def seal_file(path: str | os.PathLike[str], identity: str) -> None:
    """Write ``<path>.seal``: the HMAC of ``identity`` and the file's bytes (atomically)."""
    p = Path(path)
    s = _seal_of(p)
    tmp = s.with_name(f".{s.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(tag(*_file_parts(p, identity)), encoding="ascii")
        os.replace(tmp, s)
    finally:
        tmp.unlink(missing_ok=True)


def check_file(path: str | os.PathLike[str], identity: str) -> bool:
    """Whether ``path`` carries a seal of ``identity`` and its bytes under this machine's key.

    False when the seal is missing, unreadable or wrong (the file was edited, or written under
    another key): the caller rebuilds the entry.
    """
    p = Path(path)
    try:
        got = _seal_of(p).read_text(encoding="ascii", errors="replace")[:_KEY_CHARS + 1]
        return verify(got, *_file_parts(p, identity))
    except OSError:
        return False
