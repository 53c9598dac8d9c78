"""CountSketch of full flattened gradients: the one implementation used by the builder and targets.

Format (part of the release format, see ``docs/release_format.md``)
------------------------------------------------------------------
A gradient is the concatenation, in ``model.named_parameters()`` order, of every parameter's
gradient flattened in row-major (C) order; a parameter whose ``.grad`` is ``None`` contributes zeros
(it is never skipped, so the global index of every coordinate is fixed by the parameter names and
shapes alone; the
release records both). Coordinate ``i`` (0-based, ``0 <= i < n_params``) goes to

    bucket(i) = splitmix64(i + seed + 0x9E3779B97F4A7C15) mod dim          (dim a power of two)
    sign(i)   = +1 if splitmix64(i + seed + 6971419160186945601) is even, else -1

where all additions wrap modulo 2**64 and ``splitmix64`` is the finalizer

    z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31

on unsigned 64-bit integers (logical shifts, multiplication modulo 2**64). This is the hash of the
paper's harness (SPEC section 2.1); the sketch is ``s[b] = sum_{i: bucket(i)=b} sign(i) * g[i]``,
accumulated in float32. CountSketch is linear, and ``E[<S x, S y>] = <x, y>`` over the hash.

Summation order (what makes every backend below agree bit for bit on the CPU): for each gradient
row and bucket, the float32 sum runs over the coordinates ``i`` in increasing order, starting from
0.0 (``sign * g[i]`` is exact, so this is one fixed sequence of float32 additions).

Implementation (``docs/sketch.md``): the hash is evaluated once per ``(n_params, dim, seed)`` and
cached as one ``int32`` code per coordinate, ``bucket`` when ``sign = +1`` and ``~bucket`` (that
is ``-bucket - 1``) when ``sign = -1`` (4 bytes a coordinate; ``dim <= 2**31``). Backends:

* ``"numba"`` (CPU, when numba is installed: ``pip install "bt-bench[fast]"``): a compiled loop
  (LLVM IR through a numba intrinsic) that reads each gradient row once in place (the flat
  ``(B, n_params)`` array, or every per-parameter tensor of a ``vmap(grad)`` result) and
  accumulates 8 or 16 rows at a time into an interleaved ``(dim, rows)`` float32 buffer: the rows
  of a coordinate are one vector (tiles of 8 coordinates transposed by shuffles), added to its
  bucket's line by one vector load, multiply by the sign, add and store, coordinate after
  coordinate; groups of rows are split over ``threads`` threads (default
  ``torch.get_num_threads()``). The same float32 operations in the same order as ``"torch"``:
  bit-identical on the CPU.
* ``"torch"``: batched ``index_add_`` along the coordinate axis (one per parameter for the
  per-parameter input), on any device. On CUDA it adds with atomics, so the last bits of the sums
  depend on the order the device happens to use (equal to the CPU result within float32
  accumulation error, not bit for bit).

``"auto"`` picks ``"numba"`` for CPU tensors when it is available (the environment variable
``BT_BENCH_SKETCH_BACKEND=torch`` turns it off) and ``"torch"`` otherwise.
``benchmarks/sketch_throughput.py`` prints the speed of each against a warm copy of the same array.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from types import SimpleNamespace

import numpy as np
import torch

from benchmark.fixed_order import build_numba_kernels

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SIGN_OFFSET = np.uint64(6971419160186945601)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

BACKENDS = ("auto", "numba", "torch")
_HASH_CHUNK = 1 << 22
_DEVICE_CHUNK_ELEMS = 1 << 26  # temporary (rows x columns) float32 values per index_add_ call


def splitmix64(z: np.ndarray) -> np.ndarray:
    """Return the splitmix64 finalizer of a ``uint64`` array (wrap-around arithmetic)."""
    z = np.asarray(z, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def _check_hash_args(n_params: int, dim: int, seed: int) -> None:
    if dim <= 0 or dim & (dim - 1):
        raise ValueError(f"sketch dim must be a power of two, got {dim}; use e.g. 2048 or 4096")
    if dim > 2**31:
        raise ValueError(f"sketch dim must be at most 2**31, got {dim}")
    if n_params <= 0:
        raise ValueError(f"n_params must be positive, got {n_params}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"sketch seed must be in [0, 2**64), got {seed}")


def hash_coordinates(n_params: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(bucket int64[n_params], sign float32[n_params])`` of the CountSketch hash.

    ``dim`` must be a power of two; ``seed`` is a non-negative integer below 2**64. This is the
    reference evaluation of the documented hash (numpy uint64 arithmetic).
    """
    _check_hash_args(n_params, dim, seed)
    buckets = np.empty(n_params, dtype=np.int64)
    signs = np.empty(n_params, dtype=np.float32)
    s = np.uint64(seed)
    with np.errstate(over="ignore"):
        for start in range(0, n_params, _HASH_CHUNK):
            i = np.arange(start, min(start + _HASH_CHUNK, n_params), dtype=np.uint64)
            b = splitmix64(i + s + _GOLDEN)
            buckets[start : start + len(i)] = (b & np.uint64(dim - 1)).astype(np.int64)
            g = splitmix64(i + s + _SIGN_OFFSET)
            signs[start : start + len(i)] = np.where((g & np.uint64(1)) == 0, 1.0, -1.0)
    return buckets, signs


def hash_codes(n_params: int, dim: int, seed: int, threads: int | None = None) -> np.ndarray:
    """Return the hash as ``int32[n_params]`` codes: ``bucket`` if ``sign = +1``, else ``~bucket``.

    ``bucket = code ^ (code >> 31)`` and ``sign = -1 if code < 0 else +1`` recover
    :func:`hash_coordinates`. Evaluated by a compiled loop over ``threads`` threads when numba is
    available, else with numpy; both give the same array.
    """
    _check_hash_args(n_params, dim, seed)
    out = np.empty(n_params, dtype=np.int32)
    nb = _numba()
    chunks = [(a, min(a + _HASH_CHUNK, n_params)) for a in range(0, n_params, _HASH_CHUNK)]

    def run(ab: tuple[int, int]) -> None:
        if nb is not None:  # about 1e8 coordinates per second and thread
            nb.hash_codes(np.uint64(seed), np.uint64(ab[0]), dim, out[ab[0] : ab[1]])
        else:  # about 1e7 per second and thread
            b, s = _hash_range(ab[0], ab[1], dim, seed)
            out[ab[0] : ab[1]] = np.where(s < 0, ~b, b)

    _run_threads(run, chunks, _threads(threads))
    return out


def _hash_range(start: int, stop: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Buckets (int32) and signs (+-1 int32) of coordinates ``start:stop`` (numpy reference)."""
    with np.errstate(over="ignore"):
        i = np.arange(start, stop, dtype=np.uint64) + np.uint64(seed)
        b = (splitmix64(i + _GOLDEN) & np.uint64(dim - 1)).astype(np.int32)
        g = splitmix64(i + _SIGN_OFFSET)
    return b, np.where((g & np.uint64(1)) == 0, 1, -1).astype(np.int32)


@lru_cache(maxsize=8)
def _cached_codes(n_params: int, dim: int, seed: int) -> np.ndarray:
    return hash_codes(n_params, dim, seed)  # shared by every CountSketch: never written


# ----------------------------------------------------------------------------------------------
# The compiled CPU kernels (numba), built on first use.


@lru_cache(maxsize=1)
def _load_numba() -> SimpleNamespace | None:
    return build_numba_kernels(_compile_kernels, "CountSketch", "torch index_add_")


def _numba() -> SimpleNamespace | None:
    """The compiled kernels, or None (numba missing, failed, or BT_BENCH_SKETCH_BACKEND=torch)."""
    if os.environ.get("BT_BENCH_SKETCH_BACKEND", "auto") == "torch":
        return None
    return _load_numba()


def numba_available() -> bool:
    """Whether the compiled CPU backend can be used in this process."""
    return _numba() is not None


def _compile_kernels(numba) -> SimpleNamespace:  # noqa: C901 (one place for all kernels)
    """Compile the kernels eagerly (explicit signatures: ~2 s once per process, no disk cache)."""
    njit = numba.njit
    f32 = np.float32
    golden, sign_off, m1, m2 = _GOLDEN, _SIGN_OFFSET, _M1, _M2
    s30, s27, s31, one = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(1)

    @njit("void(uint64, uint64, int64, int32[::1])", nogil=True, boundscheck=False)
    def hash_codes_kernel(seed, start, dim, out):
        mask = np.uint64(dim - 1)
        for k in range(out.shape[0]):
            i = start + np.uint64(k) + seed
            z = i + golden
            z = (z ^ (z >> s30)) * m1
            z = (z ^ (z >> s27)) * m2
            z = z ^ (z >> s31)
            b = np.int32(z & mask)
            z = i + sign_off
            z = (z ^ (z >> s30)) * m1
            z = (z ^ (z >> s27)) * m2
            z = z ^ (z >> s31)
            out[k] = b ^ -np.int32(z & one)

    @njit("void(float32[:, ::1], int32[::1], float32[:, ::1], int64, int64)", nogil=True,
          boundscheck=False)
    def rows1(x, code, out, r0, r1):
        m = x.shape[1]
        for r in range(r0, r1):
            xr = x[r]
            o = out[r]
            for i in range(m):
                c = code[i]
                neg = c >> 31
                o[c ^ neg] += f32(1 | neg) * xr[i]

    built: dict[tuple[int, bool], object] = {}
    lock = threading.Lock()

    def acc(width: int, prefetch: bool):
        """The accumulation kernel for ``width`` rows, with or without prefetch (built once)."""
        with lock:
            if (width, prefetch) not in built:
                built[(width, prefetch)] = _vector_acc(numba, width, prefetch)
            return built[(width, prefetch)]

    acc(_GROUP_WIDTHS[0], False)  # build one now: a failure falls back to torch, loudly
    finish = {width: _finish(njit, width) for width in _GROUP_WIDTHS}
    return SimpleNamespace(hash_codes=hash_codes_kernel, acc=acc, widths=_GROUP_WIDTHS,
                           rows1=rows1, finish=finish)


def _finish(njit, width: int):
    """``finish(acc, out, r0)``: ``out[r0 + j, b] = acc[width * b + j]``, then ``acc = 0``.

    De-interleaves in tiles of 256 buckets, so the tile of ``acc`` stays in L1 while its
    ``width`` rows are written and it is cleared for the next call.
    """

    @njit("void(float32[::1], float32[:, ::1], int64)", nogil=True, boundscheck=False)
    def finish(acc, out, r0):
        d = out.shape[1]
        for b0 in range(0, d, 256):
            b1 = min(b0 + 256, d)
            for j in range(width):
                o = out[r0 + j]
                for b in range(b0, b1):
                    o[b] = acc[width * b + j]
            for k in range(width * b0, width * b1):
                acc[k] = 0.0

    return finish


class _Buffers:
    """Zeroed float32 accumulators, reused between calls; thread-safe, at most ``cap_bytes``.

    A fresh buffer page-faults as it fills, and at ``dim = 65536`` its random updates miss the
    TLB on 4 KiB pages: buffers of 1 MiB and more are private anonymous maps aligned to 2 MiB
    with ``madvise(MADV_HUGEPAGE)`` (Linux transparent huge pages, where enabled; measured
    about 1.5x faster at that size), else plain numpy arrays.
    """

    cap_bytes = 64 << 20
    huge_from = 1 << 20
    _HUGE = 2 << 20

    def __init__(self) -> None:
        self._free: dict[int, list[np.ndarray]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def _new(self, size: int) -> np.ndarray:
        nbytes = size * 4
        if nbytes >= self.huge_from and hasattr(mmap, "MADV_HUGEPAGE") and hasattr(
                mmap, "MAP_PRIVATE"):
            try:
                m = mmap.mmap(-1, nbytes + self._HUGE,
                              flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                m.madvise(mmap.MADV_HUGEPAGE)
                base = np.frombuffer(m, np.uint8)
                off = (-base.ctypes.data) % self._HUGE
                return np.frombuffer(m, np.float32, count=size, offset=off)  # zero-filled
            except (OSError, ValueError, AttributeError):
                pass
        return np.zeros(size, dtype=np.float32)

    def take(self, size: int) -> np.ndarray:
        with self._lock:
            free = self._free.get(size)
            if free:
                self._held -= size * 4
                return free.pop()
        return self._new(size)

    def give(self, buf: np.ndarray) -> None:
        """Return a buffer that is all zeros again (``finish`` clears what it reads)."""
        with self._lock:
            if self._held + buf.nbytes <= self.cap_bytes:
                self._free.setdefault(buf.size, []).append(buf)
                self._held += buf.nbytes


_BUFFERS = _Buffers()


#: rows sketched together by one pass over the hash codes (the interleaved accumulator's width):
#: 8 rows = 32 bytes a bucket (16 was slower at dim 65536 once the buffer sits on huge pages)
_GROUP_WIDTHS = (8,)
#: coordinates between the prefetch of an accumulator line and its update
_LOOKAHEAD = 64
#: accumulators larger than this are prefetched (below, the buffer stays in L2 and the
#: prefetch only costs instructions)
_PREFETCH_FROM_BYTES = 256 << 10
# 8 x 8 transpose of float32 vectors by three rounds of shuffles (unpack, 64-bit, 128-bit)
_TRANSPOSE_MASKS = (([0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]),
                    ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]),
                    ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]))


def _vector_acc(numba, width: int, prefetch: bool):
    """``acc(x, code, buf, r0)``: rows ``r0 : r0 + width`` of ``x`` into the interleaved ``buf``.

    ``buf[width * b + j] += sign(i) * x[r0 + j, i]`` for every coordinate ``i`` in increasing
    order: written in LLVM IR (a numba intrinsic) so that the ``width`` rows of a coordinate are
    one vector: tiles of 8 coordinates x 8 rows are loaded as 8 vectors and transposed by
    shuffles, then each coordinate does one vector load-multiply-add-store of its bucket's
    ``width`` floats (``fmul`` by +-1.0 then ``fadd``, the reference's two float32 operations,
    coordinate after coordinate, so a bucket hit twice in a tile adds in order). With
    ``prefetch`` (for a buffer larger than L2), the line of the coordinate :data:`_LOOKAHEAD`
    ahead is prefetched: tries the prefetch intrinsic's opaque-pointer name, then the typed one,
    then none.
    """
    last = None
    for name in ("llvm.prefetch.p0", "llvm.prefetch.p0i8", None) if prefetch else (None,):
        try:
            kernel = _build_vector_acc(numba, width, name)
            probe_x = np.zeros((width, 24), np.float32)
            kernel(probe_x, np.zeros(24, np.int32), np.zeros(width, np.float32), 0)
            return kernel
        except Exception as e:  # noqa: BLE001 - next variant; the last error is raised
            last = e
    raise last


def _build_vector_acc(numba, width: int, prefetch: str | None,  # noqa: C901 - one kernel
                      lookahead: int = _LOOKAHEAD):
    """Compile the kernel of :func:`_vector_acc` (``width`` a multiple of 8)."""
    if width % 8:
        raise ValueError(f"width must be a multiple of 8, got {width}")
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    i8p, i32, i64, f32 = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64), ir.FloatType()
    vw, v8 = ir.VectorType(f32, width), ir.VectorType(f32, 8)

    def mask(m):
        return ir.Constant(ir.VectorType(i32, len(m)), list(m))

    def transpose8(b, v):
        for lo, hi in _TRANSPOSE_MASKS[:1]:
            v = [b.shuffle_vector(v[k & ~1], v[k | 1], mask(lo if k % 2 == 0 else hi))
                 for k in range(8)]
        (lo, hi) = _TRANSPOSE_MASKS[1]
        v = [b.shuffle_vector(v[(k // 4) * 4 + (k % 4) // 2], v[(k // 4) * 4 + (k % 4) // 2 + 2],
                              mask(lo if k % 2 == 0 else hi)) for k in range(8)]
        (lo, hi) = _TRANSPOSE_MASKS[2]
        return [b.shuffle_vector(v[k % 4], v[k % 4 + 4], mask(lo if k < 4 else hi))
                for k in range(8)]

    @intrinsic
    def scatter(typingctx, x, code, buf, r0):
        def codegen(context, b, sig, args):
            xa = context.make_array(sig.args[0])(context, b, args[0])
            ca = context.make_array(sig.args[1])(context, b, args[1])
            ba = context.make_array(sig.args[2])(context, b, args[2])
            m = cgutils.unpack_tuple(b, xa.shape, 2)[1]
            rows = [b.gep(xa.data, [b.mul(b.add(args[3], ir.Constant(i64, r)), m)])
                    for r in range(width)]

            def line(i):  # the accumulator address of coordinate i's bucket, and its code
                c = b.load(b.gep(ca.data, [i]))
                bucket = b.xor(c, b.ashr(c, ir.Constant(i32, 31)))
                return b.gep(ba.data, [b.mul(b.sext(bucket, i64), ir.Constant(i64, width))]), c

            def update(i, col):
                ptr, c = line(i)
                # the sign as a float: +-1.0 = the code's sign bit | the bits of 1.0
                s = b.or_(b.and_(c, ir.Constant(i32, -(1 << 31))), ir.Constant(i32, 0x3F800000))
                s = b.bitcast(s, f32)
                s = b.insert_element(ir.Constant(vw, ir.Undefined), s, ir.Constant(i32, 0))
                s = b.shuffle_vector(s, s, mask([0] * width))
                ptr = b.bitcast(ptr, vw.as_pointer())
                b.store(b.fadd(b.load(ptr, align=4), b.fmul(col, s)), ptr, align=4)

            fn = None
            if prefetch is not None:
                fn = cgutils.get_or_insert_function(
                    b.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), prefetch)
            tiles = b.udiv(m, ir.Constant(i64, 8))
            with cgutils.for_range(b, tiles) as loop:
                i0 = b.mul(loop.index, ir.Constant(i64, 8))
                vecs = [b.load(b.bitcast(b.gep(rows[r], [i0]), v8.as_pointer()), align=4)
                        for r in range(width)]
                blocks = [transpose8(b, vecs[8 * s:8 * s + 8]) for s in range(width // 8)]
                if fn is not None:
                    ahead = b.add(i0, ir.Constant(i64, lookahead))
                    with b.if_then(b.icmp_signed("<=", b.add(ahead, ir.Constant(i64, 8)), m)):
                        for k in range(8):  # write, keep in all cache levels, data
                            ptr = line(b.add(ahead, ir.Constant(i64, k)))[0]
                            b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(i32, 1),
                                        ir.Constant(i32, 3), ir.Constant(i32, 1)])
                for k in range(8):
                    col = [blk[k] for blk in blocks]  # concatenate the 8-row parts pairwise
                    while len(col) > 1:
                        n2 = 2 * col[0].type.count
                        col = [b.shuffle_vector(col[j], col[j + 1], mask(range(n2)))
                               for j in range(0, len(col), 2)]
                    update(b.add(i0, ir.Constant(i64, k)), col[0])
            tail = b.mul(tiles, ir.Constant(i64, 8))
            with cgutils.for_range_slice(b, tail, m, ir.Constant(i64, 1), inc=True) as (i, _):
                col = ir.Constant(vw, ir.Undefined)
                for r in range(width):
                    col = b.insert_element(col, b.load(b.gep(rows[r], [i])), ir.Constant(i32, r))
                update(i, col)
            return context.get_dummy_value()

        return types.void(x, code, buf, r0), codegen

    @numba.njit("void(float32[:, ::1], int32[::1], float32[::1], int64)", nogil=True,
                boundscheck=False)
    def acc(x, code, buf, r0):
        scatter(x, code, buf, r0)

    return acc


# ----------------------------------------------------------------------------------------------


def _threads(threads: int | None) -> int:
    t = torch.get_num_threads() if threads is None else int(threads)
    if t < 1:
        raise ValueError(f"threads must be at least 1, got {threads}; pass None for "
                         "torch.get_num_threads()")
    return t


def _run_threads(fn, items: list, threads: int) -> None:
    if threads <= 1 or len(items) <= 1:
        for it in items:
            fn(it)
        return
    with ThreadPoolExecutor(min(threads, len(items))) as ex:
        for _ in ex.map(fn, items):
            pass


class CountSketch:
    """CountSketch ``R^n_params -> R^dim`` with the documented splitmix64 hash.

    Args:
        n_params: length of the flattened gradient (all parameters, ``named_parameters()`` order).
        dim: sketch dimension, a power of two (at most 2**31).
        seed: hash seed (the release records it; the builder uses 0).

    Example:
        >>> cs = CountSketch(10, 4, 0)
        >>> cs.sketch(torch.ones(2, 10)).shape
        torch.Size([2, 4])
        >>> grads = {"w": torch.ones(2, 3, 2), "b": torch.ones(2, 4)}  # vmap(grad) layout
        >>> bool(torch.equal(cs.sketch_params(grads), cs.sketch(torch.ones(2, 10))))
        True
    """

    def __init__(self, n_params: int, dim: int, seed: int = 0) -> None:
        self.n_params = int(n_params)
        self.dim = int(dim)
        self.seed = int(seed)
        self.codes = _cached_codes(self.n_params, self.dim, self.seed)
        self._bucket: torch.Tensor | None = None
        self._sign: torch.Tensor | None = None
        self._device_codes: dict[torch.device, torch.Tensor] = {}
        self._matrix_t: torch.Tensor | None = None

    @property
    def bucket(self) -> torch.Tensor:
        """``int64[n_params]`` bucket of every coordinate (derived from :attr:`codes`)."""
        if self._bucket is None:
            c = self.codes.astype(np.int64)
            self._bucket = torch.from_numpy(c ^ (c >> 31))
        return self._bucket

    @property
    def sign(self) -> torch.Tensor:
        """``float32[n_params]`` sign (+1 or -1) of every coordinate (from :attr:`codes`)."""
        if self._sign is None:
            self._sign = torch.from_numpy(np.where(self.codes < 0, -1.0, 1.0).astype(np.float32))
        return self._sign

    def sketch(self, x: torch.Tensor, *, threads: int | None = None,
               backend: str = "auto") -> torch.Tensor:
        """Sketch ``x`` of shape ``(..., n_params)`` into float32 ``(..., dim)``.

        ``x`` is cast to float32 first; ``threads`` (CPU, numba backend) defaults to
        ``torch.get_num_threads()``; ``backend`` is one of ``"auto"``, ``"numba"``, ``"torch"``
        (module docstring). The result lies on ``x``'s device.
        """
        if x.shape[-1] != self.n_params:
            raise ValueError(
                f"last dimension of x is {x.shape[-1]}, expected n_params={self.n_params}; "
                "flatten the full gradient in named_parameters() order (flatten_grads), or pass "
                "the per-parameter gradients to sketch_params"
            )
        lead = x.shape[:-1]
        flat = x.detach().reshape(-1, self.n_params)
        out = self._sketch_parts([flat], flat.shape[0], flat.device, threads, backend)
        return out.reshape(*lead, self.dim)

    def sketch_params(self, grads: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] |
                      torch.Tensor, *, threads: int | None = None,
                      backend: str = "auto") -> torch.Tensor:
        """Sketch a batch of gradients given per parameter, without concatenating them.

        Args:
            grads: the ``{name: (B, *param.shape)}`` dict that ``torch.func.vmap(grad(f))``
                returns, or a list of such tensors, in ``model.named_parameters()`` order (a dict
                is read in its insertion order, its names are not looked up); together they must
                hold exactly ``n_params`` values per row. A ``(B, n_params)`` tensor is sketched
                as by :meth:`sketch`.
            threads: CPU threads (numba backend); default ``torch.get_num_threads()``.
            backend: ``"auto"``, ``"numba"`` or ``"torch"`` (module docstring).

        Returns:
            float32 ``(B, dim)`` on the gradients' device, equal to ``sketch`` of the
            concatenated rows (bit for bit on the CPU).
        """
        if isinstance(grads, torch.Tensor):
            if grads.dim() != 2:
                raise ValueError(f"a tensor passed to sketch_params must be (B, n_params), got "
                                 f"shape {tuple(grads.shape)}; pass per-parameter gradients as "
                                 "a dict or list of (B, *param.shape) tensors")
            return self.sketch(grads, threads=threads, backend=backend)
        parts = list(grads.values()) if isinstance(grads, Mapping) else list(grads)
        if not parts:
            raise ValueError("sketch_params got no gradients; pass the dict that "
                             "vmap(grad(...)) returns, in named_parameters() order")
        for k, p in enumerate(parts):
            if not isinstance(p, torch.Tensor) or p.dim() < 1:
                raise ValueError(f"gradient {k} is {type(p).__name__} "
                                 f"{tuple(getattr(p, 'shape', ()))}; expected a tensor of shape "
                                 "(B, *param.shape) (a parameter without gradient: pass zeros)")
        rows = parts[0].shape[0]
        device = parts[0].device
        for k, p in enumerate(parts):
            if p.shape[0] != rows or p.device != device:
                raise ValueError(
                    f"gradient {k} has shape {tuple(p.shape)} on {p.device}, expected a leading "
                    f"batch dimension of {rows} on {device} like gradient 0; every tensor must be "
                    "(B, *param.shape) on one device")
        flat = [p.detach().reshape(rows, math.prod(p.shape[1:])) for p in parts]
        total = sum(p.shape[1] for p in flat)
        if total != self.n_params:
            raise ValueError(f"the gradients hold {total} values per row, expected "
                             f"n_params={self.n_params}; pass every parameter in "
                             "named_parameters() order (zeros for one without gradient)")
        return self._sketch_parts(flat, rows, device, threads, backend)

    def _sketch_parts(self, parts: list[torch.Tensor], rows: int, device: torch.device,
                      threads: int | None, backend: str) -> torch.Tensor:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        threads = _threads(threads)
        if rows == 0:
            return torch.zeros(0, self.dim, dtype=torch.float32, device=device)
        nb = _numba() if device.type == "cpu" and backend != "torch" else None
        if backend == "numba" and nb is None:
            raise RuntimeError(
                "backend='numba' needs numba and CPU tensors (numba installed: "
                f"{_load_numba() is not None}, device: {device}); install it with "
                "pip install 'bt-bench[fast]' or use backend='auto'")
        if nb is not None:
            return self._sketch_numba(nb, parts, rows, threads)
        return self._sketch_torch(parts, rows, device)

    def _sketch_numba(self, nb: SimpleNamespace, parts: list[torch.Tensor], rows: int,
                      threads: int) -> torch.Tensor:
        d = self.dim
        groups, r = [], 0  # groups of rows sketched together, then single rows
        for w in sorted(nb.widths, reverse=True):
            while rows - r >= w:
                groups.append((r, w))
                r += w
        out = torch.empty(rows, d, dtype=torch.float32)  # finish() writes the grouped rows
        out[r:] = 0.0
        out_np = out.numpy()
        arrays, offsets, off = [], [], 0
        for p in parts:
            if p.shape[1]:
                arrays.append(p.to(torch.float32).contiguous().resolve_neg().numpy())
                offsets.append(off)
            off += p.shape[1]
        codes = self.codes
        # work items: contiguous runs of groups, and the leftover rows (fewer than 8)
        n_items = max(1, min(threads, len(groups) + (rows > r)))
        bounds = np.linspace(0, len(groups), n_items + 1).round().astype(int)
        items = [(groups[bounds[k]:bounds[k + 1]], k == n_items - 1) for k in range(n_items)]

        def work(item: tuple[list[tuple[int, int]], bool]) -> None:
            mine, tail = item
            for r0, w in mine:  # group by group: its accumulator stays in cache across parts
                buf = _BUFFERS.take(d * w)
                kernel = nb.acc(w, d * w * 4 > _PREFETCH_FROM_BYTES)
                for a, o in zip(arrays, offsets, strict=True):
                    kernel(a, codes[o : o + a.shape[1]], buf, r0)
                nb.finish[w](buf, out_np, r0)
                _BUFFERS.give(buf)
            if tail and rows > r:
                for a, o in zip(arrays, offsets, strict=True):
                    nb.rows1(a, codes[o : o + a.shape[1]], out_np, r, rows)

        _run_threads(work, items, threads)
        return out

    def _sketch_torch(self, parts: list[torch.Tensor], rows: int,
                      device: torch.device) -> torch.Tensor:
        out = torch.zeros(rows, self.dim, dtype=torch.float32, device=device)
        if device.type == "cpu":
            bucket, sign = self.bucket, self.sign
            off = 0
            for p in parts:
                k = p.shape[1]
                if k:
                    out.index_add_(1, bucket[off : off + k],
                                   p.to(torch.float32) * sign[off : off + k])
                off += k
            return out
        codes = self._device_codes.get(device)
        if codes is None:
            codes = self._device_codes[device] = self._codes_tensor().to(device)
        _index_add_codes(out, parts, codes, max(1, _DEVICE_CHUNK_ELEMS // rows))
        return out

    def _codes_tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.codes)  # shares the cache: only ever read

    def sketch_sparse_mm(self, x: torch.Tensor) -> torch.Tensor:
        """Same sketch as a sparse-dense product (alternative kept for the throughput script)."""
        if self._matrix_t is None:
            n = self.n_params
            idx = torch.stack([self.bucket, torch.arange(n, dtype=torch.int64)])
            self._matrix_t = torch.sparse_coo_tensor(
                idx, self.sign, (self.dim, n), check_invariants=True
            ).coalesce()
        lead = x.shape[:-1]
        flat = x.detach().reshape(-1, self.n_params).to(torch.float32)
        out = torch.sparse.mm(self._matrix_t, flat.t().contiguous()).t()
        return out.reshape(*lead, self.dim).contiguous()


def _index_add_codes(out: torch.Tensor, parts: list[torch.Tensor], codes: torch.Tensor,
                     step: int) -> None:
    """``out[:, bucket] += sign * part`` over column chunks of ``step``, codes on ``out``'s device.

    Two kernels per chunk: one elementwise product (bf16/fp16 promote to float32) and one
    ``index_add_`` (atomic adds on CUDA). On the CPU the sums keep the documented order.
    """
    off = 0
    for p in parts:
        k = p.shape[1]
        for s in range(0, k, step):
            e = min(s + step, k)
            c = codes[off + s : off + e]
            neg = c >> 31
            vals = torch.mul(p[:, s:e], (neg | 1).to(torch.float32))  # exact: sign is +-1
            out.index_add_(1, c ^ neg, vals.to(torch.float32))  # no-op unless float64 input
        off += k


def flatten_grads(model: torch.nn.Module) -> torch.Tensor:
    """Concatenate every parameter's ``.grad`` in ``named_parameters()`` order (None -> zeros)."""
    parts = []
    for _, p in model.named_parameters():
        if p.grad is None:
            parts.append(torch.zeros(p.numel(), dtype=torch.float32))
        else:
            parts.append(p.grad.detach().reshape(-1).to(torch.float32))
    return torch.cat(parts)


def parameter_layout(model: torch.nn.Module) -> list[dict]:
    """Return ``[{"name", "shape", "offset", "numel"}]`` in sketch order (recorded in releases)."""
    out, off = [], 0
    for name, p in model.named_parameters():
        out.append({"name": name, "shape": list(p.shape), "offset": off, "numel": p.numel()})
        off += p.numel()
    return out
