"""The one way data comes back from the estimator sandbox: bounded frames on a pipe.

A frame is a 5-byte header (tag, payload length as little-endian uint32) and the payload:

* ``J``: a JSON object (at most :data:`MAX_JSON` bytes): ``ready``, ``meta``, ``error``, ``done``;
* ``A``: one score array: a 2-byte key length, the key (ASCII), then the array in ``.npy``
  format.

The evaluator never trusts the sandbox: :class:`Reader` refuses a frame whose declared length
is over its bound before reading the payload, an array whose key was not asked for or came
twice, and an ``.npy`` payload whose header is not a plain numeric 1-D array of exactly the
expected length (checked before anything is allocated; no pickles, no object arrays).

Importing this module needs the standard library only (numpy is imported where arrays are
handled): the sandboxed child reports *ready* before its site-packages are on its path.
"""

from __future__ import annotations

import io
import json
import os
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

HEADER = struct.Struct("<cI")
TAG_JSON, TAG_ARRAY = b"J", b"A"
MAX_JSON = 64 << 10
MAX_KEY = 256
MAX_NPY_HEADER = 4096
_KINDS = "biuf"  # bool, signed and unsigned integers, floats


class ChannelError(Exception):
    """The sandbox sent something that is not a well-formed, expected frame."""


# ----------------------------------------------------------------------------------------------
# sandbox side


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def send_json(fd: int, obj: dict) -> None:
    """Send one JSON frame (cut to :data:`MAX_JSON` bytes by the caller's care)."""
    data = json.dumps(obj, allow_nan=False).encode()
    _write_all(fd, HEADER.pack(TAG_JSON, len(data)) + data)


def send_array(fd: int, key: str, arr: np.ndarray) -> None:
    """Send one score array under ``key``."""
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    k = key.encode("ascii")
    payload = struct.pack("<H", len(k)) + k + buf.getvalue()
    _write_all(fd, HEADER.pack(TAG_ARRAY, len(payload)) + payload)


# ----------------------------------------------------------------------------------------------
# evaluator side


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ChannelError("a JSON object repeats a key")
    return dict(pairs)


def _reject_constant(name: str) -> None:
    raise ChannelError(f"JSON constant {name} (NaN/Infinity) is not allowed")


def decode_json(payload: bytes) -> dict:
    """A JSON frame's object (strict: UTF-8, no NaN, no repeated keys, an object at the top)."""
    try:
        obj = json.loads(payload.decode("utf-8"), object_pairs_hook=_no_duplicates,
                         parse_constant=_reject_constant)
    except ChannelError:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise ChannelError(f"malformed JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise ChannelError("a JSON frame is not an object with a 'type'")
    return obj


def array_bound(n: int) -> int:
    """Largest array frame payload for ``n`` values (16-byte items, a full-size header)."""
    return 2 + MAX_KEY + 16 + MAX_NPY_HEADER + 16 * n


def decode_npy(payload: bytes, n: int) -> np.ndarray:
    """A ``.npy`` payload as a 1-D numeric array of length ``n``; header checked first.

    Raises:
        ChannelError: bad magic or header, a non-numeric or structured dtype, another shape, or
            a payload size that does not match the header.
    """
    import numpy as np

    fh = io.BytesIO(payload)
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(
                fh, max_header_size=MAX_NPY_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(
                fh, max_header_size=MAX_NPY_HEADER)
        else:
            raise ChannelError(f".npy version {version}")
    except ChannelError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy's parser on hostile bytes
        raise ChannelError(f"malformed .npy header ({type(exc).__name__})") from None
    if not isinstance(dtype, np.dtype) or dtype.hasobject or dtype.fields is not None \
            or dtype.subdtype is not None or dtype.kind not in _KINDS or dtype.itemsize > 16:
        raise ChannelError(f"dtype {dtype}; a numeric dtype is required (no objects)")
    if shape != (n,):
        raise ChannelError(f"shape {shape}; expected ({n},)")
    body = payload[fh.tell():]
    if len(body) != n * dtype.itemsize:
        raise ChannelError(f"{len(body)} data bytes; the header announces {n * dtype.itemsize}")
    return np.frombuffer(body, dtype=dtype, count=n)


class Reader:
    """Incremental, bounded parser of the sandbox's frames.

    Attributes:
        expected: key -> length of the arrays still welcome (set once the sandbox declared what
            it scores); an array frame for any other key is an error.
    """

    def __init__(self, one_json_at_a_time: bool = False) -> None:
        self.buf = bytearray()
        self.expected: dict[str, int] = {}
        self.seen: set[str] = set()
        #: return after each JSON frame, so that the caller can set :attr:`expected` from it
        #: before the next frame's bound is checked (call ``feed(b"")`` to go on)
        self.one_json_at_a_time = one_json_at_a_time

    def _bound(self, tag: bytes) -> int:
        if tag == TAG_JSON:
            return MAX_JSON
        if tag == TAG_ARRAY:
            if not self.expected:
                raise ChannelError("a score array arrived before it was asked for")
            return array_bound(max(self.expected.values()))
        raise ChannelError(f"unknown frame tag {tag!r}")

    def feed(self, data: bytes) -> list[tuple[str, object]]:
        """Add bytes; return complete frames as ``("json", dict)`` or ``("array", (key, arr))``."""
        self.buf += data
        out: list[tuple[str, object]] = []
        while len(self.buf) >= HEADER.size:
            tag, length = HEADER.unpack_from(self.buf)
            if length > self._bound(tag):
                raise ChannelError(f"a frame of {length} bytes is over its bound")
            if tag == TAG_ARRAY and len(self.buf) >= HEADER.size + 2:
                (klen,) = struct.unpack_from("<H", self.buf, HEADER.size)
                if klen > MAX_KEY or klen + 2 > length:
                    raise ChannelError("a score array with a malformed key")
                if len(self.buf) >= HEADER.size + 2 + klen:
                    key = self._key(bytes(self.buf[HEADER.size + 2: HEADER.size + 2 + klen]))
                    if length > array_bound(self.expected[key]):
                        raise ChannelError(f"score array {key!r} of {length} bytes is too large")
            if len(self.buf) < HEADER.size + length:
                break
            payload = bytes(self.buf[HEADER.size: HEADER.size + length])
            del self.buf[: HEADER.size + length]
            if tag == TAG_JSON:
                out.append(("json", decode_json(payload)))
                if self.one_json_at_a_time:
                    break
            else:
                (klen,) = struct.unpack_from("<H", payload)
                key = self._key(payload[2: 2 + klen])
                arr = decode_npy(payload[2 + klen:], self.expected[key])
                self.seen.add(key)
                out.append(("array", (key, arr)))
        return out

    def _key(self, raw: bytes) -> str:
        try:
            key = raw.decode("ascii")
        except UnicodeDecodeError:
            raise ChannelError("a score array key that is not ASCII") from None
        if key not in self.expected:
            raise ChannelError(f"score array {key[:80]!r} was not asked for")
        if key in self.seen:
            raise ChannelError(f"score array {key!r} arrived twice")
        return key
