"""A fixed-order "lane" matrix product against torch.mm: the kernel a lane replay engine would need.

Issue 33 asks for replays at >= 0.6 of the float64 ``torch.mm`` rate. ``replay_floor.py`` shows
that the engine's own products (MKL, one call per replay) reach only about 0.59 of that rate
even with nothing else running, so an engine that gets there must compute its products with
another kernel. The design the issue names puts the replay index in the innermost, vectorised
dimension: ``C[m, n, :] = sum_p A[m, p, :] * B[p, n, :]`` with 8 replays (lanes) per vector,
each lane's element the same sequence of fused multiply-adds in increasing ``p`` whatever the
other lanes hold, the tile shape or the CPU (``llvm.fma`` on ``<8 x double>``, no fast-math), so
a replay's bits cannot depend on its batch or on the machine.

This script builds that kernel (a 4 x 4 register tile of 8-lane vectors written in LLVM IR
through numba; ``p`` blocked by ``--kc``, which continues each lane's chain from C and so
changes no bit), checks it against an exact reference (every fused multiply-add computed with
fractions and rounded once), checks that a lane's result does not depend on the other lanes,
and times it at the engine's product shapes against ``torch.mm`` of the same per-replay shapes,
in the same process and thread.

Usage: ``python benchmarks/lane_gemm.py [--kc 64] [--seconds 0.5]``. Timings, not tests.
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np

W = 8  # lanes per vector: 8 doubles (one AVX-512 register, two AVX2 registers)

#: (rows M, contraction P, columns N) of the engine's products on ``tiny``: decoding (32 rows:
#: 4 prompts x 8 samples; the MLP's 128 x 384 and 384 x 128, attention's 128 x 128, logits
#: 128 x 86) and training (about 288 rows per replay step; the weight gradients contract them)
SHAPES = [(32, 128, 384), (32, 384, 128), (32, 128, 128), (32, 128, 88),
          (288, 128, 384), (288, 384, 128), (128, 288, 384)]


def build(kc: int):
    """The kernel ``gemm(A, B, C, M, N, P)``: ``C (M, N, W) = A (M, P, W) x B (N, P, W)``."""
    import numba as nb
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    f64, i64 = ir.DoubleType(), ir.IntType(64)
    vt = ir.VectorType(f64, W)

    def tile(mr: int, nr: int):
        @intrinsic
        def kernel(typingctx, A, B, C, a0, sam, b0, sbn, c0, scm, P, acc):
            def codegen(context, builder, sig, args):
                arrs = [context.make_array(sig.args[j])(context, builder, args[j])
                        for j in range(3)]
                a0, sam, b0, sbn, c0, scm, n_p, accin = args[3:]
                fma = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(vt, [vt, vt, vt]), "llvm.fma.v8f64")

                def at(arr, off):  # off counts W-double vectors
                    ptr = builder.gep(arr.data, [builder.mul(off, ir.Constant(i64, W))])
                    return builder.bitcast(ptr, vt.as_pointer())

                def k(v):
                    return ir.Constant(i64, v)

                zero = ir.Constant(vt, [ir.Constant(f64, 0.0)] * W)
                keep = builder.icmp_signed("!=", accin, k(0))
                accs = []
                for i in range(mr):
                    for j in range(nr):
                        off = builder.add(c0, builder.add(builder.mul(k(i), scm), k(j)))
                        slot = cgutils.alloca_once_value(builder, zero)
                        builder.store(builder.select(keep, builder.load(at(arrs[2], off),
                                                                        align=8), zero), slot)
                        accs.append((slot, off))
                with cgutils.for_range(builder, n_p) as loop:
                    p = loop.index
                    av = [builder.load(at(arrs[0], builder.add(a0, builder.add(
                        builder.mul(k(i), sam), p))), align=8) for i in range(mr)]
                    bv = [builder.load(at(arrs[1], builder.add(b0, builder.add(
                        builder.mul(k(j), sbn), p))), align=8) for j in range(nr)]
                    for i in range(mr):
                        for j in range(nr):
                            slot = accs[i * nr + j][0]
                            builder.store(builder.call(fma, [av[i], bv[j],
                                                             builder.load(slot)]), slot)
                for slot, off in accs:
                    builder.store(builder.load(slot), at(arrs[2], off), align=8)
                return context.get_dummy_value()

            sig = types.void(A, B, C, a0, sam, b0, sbn, c0, scm, P, acc)
            return sig, codegen

        return kernel

    t44, t41, t14, t11 = tile(4, 4), tile(4, 1), tile(1, 4), tile(1, 1)

    @nb.njit(boundscheck=False)
    def gemm(A, B, C, M, N, P):
        m4, n4 = M - M % 4, N - N % 4
        for p0 in range(0, P, kc):
            pp, acc = min(kc, P - p0), 1 if p0 > 0 else 0
            for n in range(0, N, 4):
                for m in range(0, M, 4):
                    a0, b0, c0 = m * P + p0, n * P + p0, m * N + n
                    if m < m4 and n < n4:
                        t44(A, B, C, a0, P, b0, P, c0, N, pp, acc)
                    elif m < m4:
                        for j in range(N - n):
                            t41(A, B, C, a0, P, b0 + j * P, P, c0 + j, N, pp, acc)
                    elif n < n4:
                        for i in range(M - m):
                            t14(A, B, C, a0 + i * P, P, b0, P, c0 + i * N, N, pp, acc)
                    else:
                        for i in range(M - m):
                            for j in range(N - n):
                                t11(A, B, C, a0 + i * P, P, b0 + j * P, P,
                                    c0 + i * N + j, N, pp, acc)

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        gemm(a.reshape(-1), b.reshape(-1), c.reshape(-1), a.shape[0], b.shape[0], a.shape[1])

    return run


def exact_check(run, rng) -> None:
    """Every checked element is the sequence of fmas in increasing p, bit for bit; a lane's
    results do not change when the other lanes change."""
    m, p, n = 5, 37, 6  # remainders in every direction, p not a multiple of the block
    a, b = rng.standard_normal((m, p, W)), rng.standard_normal((n, p, W))
    c = np.empty((m, n, W))
    run(a, b, c)
    for i, j, lane in [(0, 0, 0), (4, 5, 7), (2, 3, 4)]:
        acc = 0.0
        for q in range(p):
            acc = float(Fraction(a[i, q, lane]) * Fraction(b[j, q, lane]) + Fraction(acc))
        assert c[i, j, lane] == acc, (i, j, lane, c[i, j, lane], acc)
    a2, b2 = a.copy(), b.copy()
    a2[..., 1:], b2[..., 1:] = rng.standard_normal(a2[..., 1:].shape), 0.5
    c2 = np.empty_like(c)
    run(a2, b2, c2)
    assert np.array_equal(c2[..., 0], c[..., 0])


def main(argv: list[str] | None = None) -> int:
    import torch
    from tabulate import tabulate

    from benchmark.machine import cpu_name

    ap = argparse.ArgumentParser()
    ap.add_argument("--kc", type=int, default=64, help="contraction block (a chain continues)")
    ap.add_argument("--seconds", type=float, default=0.5, help="timing per shape and kernel")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    run = build(a.kc)
    exact_check(run, rng)
    compile_s = time.perf_counter() - t0

    def rate(fn, flops):
        fn()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < a.seconds:
            fn()
            n += 1
        return flops * n / (time.perf_counter() - t0)

    g = torch.Generator().manual_seed(0)
    big = [torch.rand(512, 128, dtype=torch.float64, generator=g),
           torch.rand(128, 384, dtype=torch.float64, generator=g)]
    machine = rate(lambda: torch.mm(*big), 2 * 512 * 128 * 384)
    rows = []
    for m, p, n in SHAPES:
        x, y = rng.standard_normal((m, p, W)), rng.standard_normal((n, p, W))
        out = np.empty((m, n, W))
        lane = rate(lambda x=x, y=y, out=out: run(x, y, out), 2 * m * p * n * W)
        xs = [torch.rand(m, p, dtype=torch.float64, generator=g) for _ in range(W)]
        ws = [torch.rand(n, p, dtype=torch.float64, generator=g) for _ in range(W)]
        mkl = rate(lambda xs=xs, ws=ws: [torch.mm(u, v.t()) for u, v in zip(xs, ws, strict=True)],
                   2 * m * p * n * W)
        rows.append({"M x P x N": f"{m} x {p} x {n}", "lane kernel GFLOP/s": round(lane / 1e9, 1),
                     "lane / mm rate": round(lane / machine, 2),
                     "8 torch.mm GFLOP/s": round(mkl / 1e9, 1),
                     "torch.mm / mm rate": round(mkl / machine, 2)})
    print(f"{cpu_name()}; one thread; {W} lanes; kc = {a.kc}; kernel built and checked "
          f"(exact fma chains, lane independence) in {compile_s:.1f} s")
    print(f"machine: float64 torch.mm (512 x 128 @ 128 x 384) {machine / 1e9:.1f} GFLOP/s")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
