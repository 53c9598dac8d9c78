"""Fixed-order float64 dot products and norms: the same bits on every CPU, any thread count.

The view's reductions (:class:`benchmark.view.SketchRows`: ``sketch_dot``, ``sketch_norms``,
``sketch_dot_norms``) and :func:`estimators.base.cosine` sum in the order written down here, so
a score, and therefore a ranking, never depends on the machine's SIMD width, BLAS or threads.

The order (``L = LANES = 32``)
------------------------------
A *unit* is a sequence of stored rows (one row in the rollout view, a step's rollouts in the step
view). Its vector ``u`` (length ``d``) is the float64 value of its first row, then each further
row added in order (``u = x_0``, ``u = u + x_1``, ...). float16 and float32 values convert to
float64 exactly, and sums of float16 values are exact too (float16 spans 40 bits; 2**12 rows of
them fit float64's 53), so for float16 storage ``u`` is exact whatever the order.

``<u, t>`` and ``||u||^2`` are then summed in ``L`` interleaved lanes: lane ``k`` accumulates,
starting from ``0.0``, the products ``u[i] * t[i]`` (or ``u[i] * u[i]``) for
``i = k, k + L, k + 2L, ...`` in increasing ``i`` (``u`` is zero-padded to a multiple of ``L``);
then the lanes are combined in a fixed tree, ``s[k] = s[k] + s[k + h]`` for ``h = 16, 8, 4, 2, 1``.
Every product is rounded to float64 on its own and every addition is one IEEE addition (no
fused multiply-add, no reassociation). The product of a float16 (11 significant bits) or float32
(24) value and a float32 target (24) is exact in float64 (53 bits), so for the usual targets only
the order of additions matters, and that order is the one above.

Backends
--------
* ``"numba"`` (``pip install "bt-bench[fast]"``): the lanes are four LLVM vectors of 8 doubles,
  written out in LLVM IR (a numba intrinsic) with plain ``fmul`` / ``fadd`` and no fast-math
  flags: LLVM may split the vectors over whatever registers the CPU has (2, 4 or 8 doubles), but
  it may not reorder, reassociate or fuse. Rows are read in place (a float16 memory map is read
  as its bits) and converted, multiplied and accumulated in one pass. float16 is converted by
  ``vcvtph2ps`` where the target has F16C and by integer bit operations elsewhere (both exact).
  Units are split over Python threads (the kernels release the GIL); each unit is summed by one
  thread.
* ``"numpy"``: the same order with numpy array operations (one ``+=`` of an ``(n, L)`` slice per
  group of ``L`` columns); bit-identical to ``"numba"``, slower at paper scale.

``"auto"`` uses numba when it is installed and its kernels build, and ``d`` is a multiple of ``L``
(every sketch dimension is, being a power of two of at least 32). Callers pick a backend per
pass with :func:`choose_backend`: numpy for small passes (no compile time), numba for large
ones; the environment variable ``BT_BENCH_REDUCE_BACKEND`` (``numpy`` or ``numba``) overrides.
"""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache
from types import SimpleNamespace

import numpy as np

LANES = 32
_IR_WIDTH = 8  # doubles per LLVM vector in the kernels (4 vectors of lanes)
BACKENDS = ("auto", "numba", "numpy")
#: float64 bytes of one block of the numpy backend
_NUMPY_BLOCK_BYTES = 8 << 20
#: callers pick numba only for passes over at least this many stored values: below it, numpy
#: finishes before numba would have compiled its kernels (same bits either way)
NUMBA_MIN_VALUES = 1 << 26


class ReduceBackendError(RuntimeError):
    """The requested backend cannot run here (numba missing or unusable for the input)."""


# ----------------------------------------------------------------------------------------------
# numpy: the reference order


def lane_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sum(a * b, axis=1)`` of ``(n, d)`` rows in the documented lane order; ``(n,)`` float64.

    The reference for the numba kernels: every product rounded on its own, ``L`` interleaved
    lanes each summed in increasing index from ``0.0`` (one elementwise ``+=`` of an ``(n, L)``
    slab per group of ``L`` columns), combined by the fixed tree. ``b`` may be one ``(d,)`` row.
    """
    a = np.asarray(a, dtype=np.float64)
    n, d = a.shape
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), (n, d))
    pad = (-d) % LANES
    if pad:
        a = np.concatenate([a, np.zeros((n, pad))], axis=1)
        b = np.concatenate([b, np.zeros((n, pad))], axis=1)
    k = a.shape[1] // LANES
    slabs = np.empty((k, n, LANES))  # the products, group-major: each slab is contiguous
    np.multiply(a.reshape(n, k, LANES).transpose(1, 0, 2),
                b.reshape(n, k, LANES).transpose(1, 0, 2), out=slabs)
    acc = np.zeros((n, LANES))
    for slab in slabs:
        np.add(acc, slab, out=acc)
    h = LANES
    while h > 1:
        h //= 2
        acc = acc[:, :h] + acc[:, h:2 * h]
    return acc[:, 0]


def _units_numpy(stored, rows, starts, T, want_sq, k0, k1, dots, sq) -> None:
    """The numpy backend of :func:`reduce_units` for units ``k0:k1`` (writes ``dots``, ``sq``)."""
    d = stored.shape[1]
    per = max(1, _NUMPY_BLOCK_BYTES // (8 * d))
    for b0 in range(k0, k1, per):
        b1 = min(b0 + per, k1)
        a, b = int(starts[b0]), int(starts[b1])
        counts = np.diff(starts[b0:b1 + 1])
        first = starts[b0:b1] - a
        x = np.asarray(stored[rows[a:b]]).astype(np.float64)  # exact
        u = np.zeros((b1 - b0, d))
        has = counts > 0
        u[has] = x[first[has]]
        for j in range(1, int(counts.max(initial=0))):
            m = counts > j
            u[m] += x[first[m] + j]
        for c in range(T.shape[0]):
            dots[b0:b1, c] = np.where(has, lane_sum(u, T[c]), 0.0)
        if want_sq:
            sq[b0:b1] = np.where(has, lane_sum(u, u), 0.0)


# ----------------------------------------------------------------------------------------------
# numba: the same order as LLVM vectors


def _target_has_f16c() -> bool:
    """Whether numba compiles for a target with F16C (else half floats convert by bit ops)."""
    try:
        from numba.core.registry import cpu_target

        feats = cpu_target.target_context.codegen()._tm_features
        return "+f16c" in str(feats).split(",")
    except Exception:  # noqa: BLE001 - private API moved: the bit conversion is always right
        return False


def build_numba_kernels(compile_kernels, what: str, fallback: str):
    """``compile_kernels(numba)``, or None without numba (or with a warning if it fails).

    Shared by the compiled backends of this module and :mod:`benchmark.sketch`: an incompatible
    numba must never break scoring or sketching, only slow it down.
    """
    try:
        import numba
    except ImportError:
        return None
    try:
        return compile_kernels(numba)
    except Exception as e:  # noqa: BLE001 - fall back loudly
        warnings.warn(f"bt-bench: the compiled {what} kernels failed to build ({e!r}); "
                      f"falling back to {fallback} (slower, same result)", stacklevel=4)
        return None


@lru_cache(maxsize=1)
def _load_numba() -> SimpleNamespace | None:
    return build_numba_kernels(lambda numba: _compile_kernels(numba, _target_has_f16c()),
                               "fixed-order", "numpy")


def _numba() -> SimpleNamespace | None:
    if os.environ.get("BT_BENCH_REDUCE_BACKEND", "auto") == "numpy":
        return None
    return _load_numba()


def choose_backend(n_values: int) -> str:
    """The backend for a pass over ``n_values`` stored values.

    ``BT_BENCH_REDUCE_BACKEND`` (``numpy`` or ``numba``) decides if set; else numba from
    :data:`NUMBA_MIN_VALUES` values on ("auto": numpy where numba is missing), numpy below
    (it finishes before numba would have built its kernels). Same bits either way.
    """
    env = os.environ.get("BT_BENCH_REDUCE_BACKEND", "auto")
    if env in ("numpy", "numba"):
        return env
    return "auto" if n_values >= NUMBA_MIN_VALUES else "numpy"


def numba_available() -> bool:
    """Whether the compiled backend can be used in this process."""
    return _numba() is not None


def _compile_kernels(numba, f16c: bool) -> SimpleNamespace:  # noqa: C901 - one place
    """Build the intrinsics and the unit kernel (compiled lazily, per input type, on first use)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    L = LANES
    W = _IR_WIDTH  # doubles per LLVM vector; L // W vectors hold the L lanes
    i16, i32, f32, f64 = ir.IntType(16), ir.IntType(32), ir.FloatType(), ir.DoubleType()
    v64 = ir.VectorType(f64, W)

    def splat(ty, value):
        return ir.Constant(ir.VectorType(ty, W), [ir.Constant(ty, value)] * W)

    def half_to_f32(b, h16):
        """``<W x i16>`` IEEE half bits -> ``<W x float>``, exactly (integer/float32 ops only)."""
        if f16c:  # vcvtph2ps
            return b.fpext(b.bitcast(h16, ir.VectorType(ir.HalfType(), W)), ir.VectorType(f32, W))
        vi = ir.VectorType(i32, W)
        h = b.zext(h16, vi)
        o = b.shl(b.and_(h, splat(i32, 0x7FFF)), splat(i32, 13))  # exponent and mantissa
        e = b.and_(o, splat(i32, 0x7C00 << 13))
        o = b.add(o, splat(i32, (127 - 15) << 23))  # rebias the exponent
        inf_nan = b.icmp_unsigned("==", e, splat(i32, 0x7C00 << 13))
        sub = b.icmp_unsigned("==", e, splat(i32, 0))
        o = b.select(inf_nan, b.add(o, splat(i32, (128 - 16) << 23)),
                     b.select(sub, b.add(o, splat(i32, 1 << 23)), o))
        vf = ir.VectorType(f32, W)
        f = b.bitcast(o, vf)
        # a subnormal half m * 2**-24 is now 2**-14 * (1 + m / 1024): subtract 2**-14 (exact)
        f = b.select(sub, b.fsub(f, splat(f32, 2.0 ** -14)), f)
        sign = b.shl(b.and_(h, splat(i32, 0x8000)), splat(i32, 16))
        return b.bitcast(b.or_(b.bitcast(f, vi), sign), vf)

    def load_f64(b, data, off, dtype):
        """The ``L`` values of an array from element ``off``, as ``L // W`` ``<W x double>``."""
        elt, align = {"uint16": (i16, 2), "float32": (f32, 4), "float64": (f64, 8)}[dtype]
        out = []
        for j in range(L // W):
            at = b.add(off, ir.Constant(off.type, j * W))
            raw = b.load(b.bitcast(b.gep(data, [at]), ir.VectorType(elt, W).as_pointer()),
                         align=align)
            if dtype == "uint16":
                raw = b.fpext(half_to_f32(b, raw), v64)
            elif dtype == "float32":
                raw = b.fpext(raw, v64)
            out.append(raw)
        return out

    def tree(b, vecs):
        """The lane tree ``s[k] + s[k + h]``, h = L/2 ... 1; lane k is ``vecs[k // W][k % W]``."""
        vecs = list(vecs)
        while len(vecs) > 1:
            h = len(vecs) // 2
            vecs = [b.fadd(vecs[j], vecs[j + h]) for j in range(h)]
        acc, n = vecs[0], W
        while n > 1:
            h = n // 2
            lo = b.shuffle_vector(acc, acc, ir.Constant(ir.VectorType(i32, h), list(range(h))))
            hi = b.shuffle_vector(acc, acc, ir.Constant(ir.VectorType(i32, h),
                                                        list(range(h, n))))
            acc = b.fadd(lo, hi)
            n = h
        return b.extract_element(acc, ir.Constant(i32, 0))

    @contextmanager
    def over_groups(context, builder, sig, args):
        """Loop over the ``L``-value groups of row ``args[0]``.

        Yields both array structs and the index of the group's first element.
        """
        xa = context.make_array(sig.args[0])(context, builder, args[0])
        ya = context.make_array(sig.args[1])(context, builder, args[1])
        groups = builder.udiv(xa.nitems, ir.Constant(xa.nitems.type, L))
        with cgutils.for_range(builder, groups) as loop:
            yield xa, ya, builder.mul(loop.index, ir.Constant(loop.index.type, L))

    def check_row(x):
        if not (isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C"
                and str(x.dtype) in ("uint16", "float32", "float64")):
            raise numba.core.errors.TypingError(f"fixed_order: unsupported row {x}")
        return str(x.dtype)

    def lanes(with_dot: bool, with_sq: bool):
        """The intrinsic ``(x, t) -> (dot, sq)``: the lane sums over ``len(x) // L`` groups."""

        @intrinsic
        def kernel(typingctx, x, t):
            dtype = check_row(x)

            def codegen(context, builder, sig, args):
                zero = ir.Constant(v64, [ir.Constant(f64, 0.0)] * W)
                acc_d = [cgutils.alloca_once_value(builder, zero) for _ in range(L // W)]
                acc_q = [cgutils.alloca_once_value(builder, zero) for _ in range(L // W)]

                def update(acc, prod):
                    builder.store(builder.fadd(builder.load(acc), prod), acc)

                with over_groups(context, builder, sig, args) as (xa, ta, off):
                    vs = load_f64(builder, xa.data, off, dtype)
                    ts = load_f64(builder, ta.data, off, "float64") if with_dot else vs
                    for j, v in enumerate(vs):
                        if with_dot:
                            update(acc_d[j], builder.fmul(v, ts[j]))
                        if with_sq:
                            update(acc_q[j], builder.fmul(v, v))
                out = [tree(builder, [builder.load(a) for a in acc_d]),
                       tree(builder, [builder.load(a) for a in acc_q])]
                return context.make_tuple(builder, sig.return_type, out)

            return types.UniTuple(types.float64, 2)(x, t), codegen

        return kernel

    def to_f64(add: bool):
        """The intrinsic ``(x, u)``: ``u = float64(x)`` or ``u += float64(x)``, elementwise."""

        @intrinsic
        def kernel(typingctx, x, u):
            dtype = check_row(x)

            def codegen(context, builder, sig, args):
                with over_groups(context, builder, sig, args) as (xa, ua, off):
                    for j, v in enumerate(load_f64(builder, xa.data, off, dtype)):
                        at = builder.add(off, ir.Constant(off.type, j * W))
                        ptr = builder.bitcast(builder.gep(ua.data, [at]), v64.as_pointer())
                        if add:
                            v = builder.fadd(builder.load(ptr, align=8), v)
                        builder.store(v, ptr, align=8)
                return context.get_dummy_value()

            return types.void(x, u), codegen

        return kernel

    lanes_dq, lanes_q = lanes(True, True), lanes(False, True)
    set_f64, add_f64 = to_f64(False), to_f64(True)
    jit = numba.njit(nogil=True, boundscheck=False)

    @numba.njit(nogil=True, boundscheck=False, inline="always")
    def one(x, T, want_sq, dots, sq, k):
        c0 = 0
        if want_sq:
            if T.shape[0] > 0:
                dq = lanes_dq(x, T[0])
                dots[k, 0] = dq[0]
                sq[k] = dq[1]
                c0 = 1
            else:
                sq[k] = lanes_q(x, x)[1]
        for c in range(c0, T.shape[0]):
            dots[k, c] = lanes_dq(x, T[c])[0]

    @jit
    def units(stored, rows, starts, T, want_sq, u, dots, sq, k0, k1):
        for k in range(k0, k1):
            a, b = starts[k], starts[k + 1]
            if b == a:
                for c in range(T.shape[0]):
                    dots[k, c] = 0.0
                sq[k] = 0.0
            elif b == a + 1:
                one(stored[rows[a]], T, want_sq, dots, sq, k)
            else:
                set_f64(stored[rows[a]], u)
                for j in range(a + 1, b):
                    add_f64(stored[rows[j]], u)
                one(u, T, want_sq, dots, sq, k)

    return SimpleNamespace(units=units, one=one, f16c=f16c)


# ----------------------------------------------------------------------------------------------


def _threads(threads: int | None) -> int:
    if threads is None:
        import torch

        return max(1, torch.get_num_threads())
    t = int(threads)
    if t < 1:
        raise ValueError(f"threads must be at least 1, got {threads}; pass None for "
                         "torch.get_num_threads()")
    return t


def _kernel_input(stored: np.ndarray) -> np.ndarray | None:
    """``stored`` as the compiled kernel reads it (float16 as its bits), or None if unsupported."""
    a = np.asarray(stored)
    if not a.flags.c_contiguous or a.ndim != 2:
        return None
    if a.dtype == np.float16:
        a = a.view(np.uint16)
    elif a.dtype in (np.float32, np.float64):
        a = a.view()
    else:
        return None
    a.flags.writeable = False  # one compiled signature per dtype (memory maps are read-only)
    return a


def reduce_units(stored: np.ndarray, rows: np.ndarray, starts: np.ndarray,
                 targets: np.ndarray | None, want_sq: bool = True, k0: int = 0,
                 k1: int | None = None, *, threads: int | None = None, backend: str = "auto",
                 out: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-order dots with ``targets`` and squared norms of units ``k0:k1``.

    Args:
        stored: ``(m, d)`` float16, float32 or float64 rows (a memory map is read in place).
        rows: ``(r,)`` int64 stored row of each summand, units' summands contiguous, in order.
        starts: ``(n_units + 1,)`` int64 offsets into ``rows``: unit ``k`` sums
            ``stored[rows[starts[k]:starts[k + 1]]]`` (an empty unit is all-zero).
        targets: ``(C, d)`` float64 (one target per row; ``C`` may be 0), or None.
        want_sq: also compute ``||u||^2``.
        k0, k1: the units to compute (default all).
        threads: Python threads over units (default ``torch.get_num_threads()``); results do
            not depend on it.
        backend: ``"auto"``, ``"numba"`` or ``"numpy"`` (module docstring).
        out: ``(dots (n_units, C), sq (n_units,))`` float64 arrays to fill (else allocated).

    Returns:
        ``(dots, sq)``: ``(n_units, C)`` and ``(n_units,)`` float64, rows ``k0:k1`` filled, in
        the units of ``stored`` (apply any scale afterwards).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    d = int(stored.shape[1])
    n_units = int(starts.shape[0]) - 1
    k1 = n_units if k1 is None else int(k1)
    T = np.zeros((0, d)) if targets is None else np.array(targets, dtype=np.float64, order="C")
    if T.ndim != 2 or T.shape[1] != d:
        raise ValueError(f"targets have shape {T.shape}, expected (C, {d}): one row per target "
                         "of the sketch dimension")
    if out is None:
        out = (np.zeros((n_units, T.shape[0])), np.zeros(n_units))
    dots, sq = out
    if k1 <= k0:
        return dots, sq
    nb = _numba() if backend != "numpy" else None
    x = _kernel_input(stored) if nb is not None else None
    usable = nb is not None and x is not None and d % LANES == 0
    if backend == "numba" and not usable:
        raise ReduceBackendError(
            f"backend='numba' needs numba (installed and built: {_load_numba() is not None}), "
            f"a C-contiguous float16/float32/float64 store (got {np.asarray(stored).dtype}) and "
            f"a dimension divisible by {LANES} (got {d}); use backend='auto'")
    if not usable:
        _units_numpy(stored, rows, starts, T, want_sq, k0, k1, dots, sq)
        return dots, sq
    rows = np.array(rows, dtype=np.int64)  # writable copies: one compiled signature
    starts = np.array(starts, dtype=np.int64)
    n_threads = min(_threads(threads), k1 - k0)
    bounds = np.linspace(k0, k1, n_threads + 1).round().astype(np.int64)

    def work(i: int) -> None:
        u = np.empty(d)
        nb.units(x, rows, starts, T, bool(want_sq), u, dots, sq, int(bounds[i]),
                 int(bounds[i + 1]))

    if n_threads <= 1:
        work(0)
    else:
        with ThreadPoolExecutor(n_threads) as ex:
            list(ex.map(work, range(n_threads)))
    return dots, sq


def dot_norms(rows: np.ndarray, target: np.ndarray, backend: str = "auto"
              ) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-order ``rows @ target`` and row norms of a dense array, float64.

    Args:
        rows: ``(n, d)`` float array.
        target: ``(d,)`` or ``(d, C)``.
        backend: ``"auto"`` (:func:`choose_backend`), ``"numba"`` or ``"numpy"``.

    Returns:
        ``(dots, norms)``: ``(n,)`` (or ``(n, C)``) and ``(n,)`` float64.
    """
    rows = np.asarray(rows)
    if rows.dtype not in (np.float16, np.float32, np.float64):
        rows = rows.astype(np.float64)
    rows = np.ascontiguousarray(rows)
    n, d = rows.shape
    t = np.asarray(target, dtype=np.float64)
    if t.shape[0] != d or t.ndim not in (1, 2):
        raise ValueError(f"target has shape {t.shape}, expected ({d},) or ({d}, C) for rows of "
                         f"shape {rows.shape}")
    T = t.reshape(d, -1).T
    if backend == "auto":
        backend = choose_backend(rows.size)
    idx = np.arange(n, dtype=np.int64)
    dots, sq = reduce_units(rows, idx, np.arange(n + 1, dtype=np.int64), T, True,
                            backend=backend, threads=1)
    return (dots[:, 0] if t.ndim == 1 else dots), np.sqrt(sq)
