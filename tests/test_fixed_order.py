"""Fixed-order float64 reductions: the documented order, bit for bit on any CPU and thread count.

``benchmark.fixed_order`` promises the same bits from its numba kernels (LLVM vectors, any SIMD
width) and its numpy reference; these tests check that promise against an independent plain
Python loop, under emulated CPUs (numba compiled for other instruction sets in a subprocess), at
several thread counts, and against exact sums within a bound derived from the order.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from benchmark import fixed_order as F
from benchmark.view import SketchRows

REPO = Path(__file__).resolve().parents[1]
needs_numba = pytest.mark.skipif(not F.numba_available(), reason="numba not installed")
EPS = 2.0**-53  # unit roundoff of float64


def _bits(a: np.ndarray) -> list[str]:
    return [x.hex() for x in np.asarray(a, np.float64).ravel().tolist()]


def _python_order(u: list[float], t: list[float]) -> float:
    """The documented order with Python floats: lanes of stride 32 from 0.0, then the tree."""
    lanes = [0.0] * F.LANES
    for i, (a, b) in enumerate(zip(u, t, strict=True)):
        lanes[i % F.LANES] = lanes[i % F.LANES] + a * b
    h = F.LANES
    while h > 1:
        h //= 2
        lanes = [lanes[k] + lanes[k + h] for k in range(h)]
    return lanes[0]


def _case(seed: int, dtype, d: int = 96):
    """Stored rows of mixed magnitudes (zeros, -0, subnormal halves), units of 0/1/3/5 rows."""
    rng = np.random.default_rng(seed)
    m = 23
    x = rng.standard_normal((m, d)) * 10.0 ** rng.integers(-3, 4, (m, 1))
    x[2, :7] = [0.0, -0.0, 3e-7, -5e-8, 6e-5, 1e4, -2.5e-6]  # subnormal float16 values too
    stored = x.astype(dtype)
    rows = rng.permutation(m)[:17].astype(np.int64)
    starts = np.array([0, 1, 1, 4, 9, 10, 11, 16, 17], np.int64)  # units of 1, 0, 3, 5, 1, ...
    t32 = rng.standard_normal((2, d)).astype(np.float32).astype(np.float64)  # exact products
    t64 = rng.standard_normal((1, d)) * 1e3  # inexact products: any fused multiply-add shows
    return stored, rows, starts, np.concatenate([t32, t64])


def test_lane_sum_is_the_documented_order():
    rng = np.random.default_rng(0)
    for d in (1, 31, 32, 100, 257):
        a = rng.standard_normal((3, d)) * 10.0 ** rng.integers(-8, 8, (3, d))
        b = rng.standard_normal(d)
        got = F.lane_sum(a, b)
        want = [_python_order(a[r].tolist(), b.tolist()) for r in range(3)]
        assert _bits(got) == _bits(want), d


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_numpy_backend_is_the_documented_order(dtype):
    stored, rows, starts, T = _case(1, dtype)
    dots, sq = F.reduce_units(stored, rows, starts, T, True, backend="numpy")
    x = stored.astype(np.float64)
    for k in range(starts.size - 1):
        members = rows[starts[k]:starts[k + 1]]
        u = np.zeros(x.shape[1])
        if members.size:
            u = x[members[0]].copy()
            for r in members[1:]:
                u = u + x[r]
        assert sq[k].hex() == _python_order(u.tolist(), u.tolist()).hex()
        for c in range(T.shape[0]):
            assert dots[k, c].hex() == _python_order(u.tolist(), T[c].tolist()).hex()


@needs_numba
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("want_sq", [True, False])
def test_numba_equals_numpy_bit_for_bit(dtype, want_sq):
    stored, rows, starts, T = _case(2, dtype)
    ref = F.reduce_units(stored, rows, starts, T, want_sq, backend="numpy")
    for threads in (1, 2, 5):
        for targets in (T, T[:1], None):
            got = F.reduce_units(stored, rows, starts, targets, want_sq, backend="numba",
                                 threads=threads)
            c = 0 if targets is None else targets.shape[0]
            assert _bits(got[0]) == _bits(ref[0][:, :c])
            if want_sq:
                assert _bits(got[1]) == _bits(ref[1])
    # a range of units fills only its rows, and the same bits
    out = (np.full((starts.size - 1, T.shape[0]), 7.0), np.full(starts.size - 1, 7.0))
    F.reduce_units(stored, rows, starts, T, True, 3, 6, backend="numba", out=out)
    assert _bits(out[0][3:6]) == _bits(ref[0][3:6]) and (out[0][:3] == 7.0).all()


@needs_numba
def test_half_conversion_is_exact_for_every_bit_pattern():
    """A dot with a one-hot target returns the stored value: all 65,536 float16 patterns."""
    stored = np.zeros((1 << 16, 32), np.float16)
    stored[:, 0] = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    n = stored.shape[0]
    dots, _ = F.reduce_units(stored, np.arange(n), np.arange(n + 1), np.eye(32)[:1], False,
                             backend="numba")
    got, want = dots[:, 0], stored[:, 0].astype(np.float64)
    finite = np.isfinite(want)  # equal values (a sum from +0.0 turns -0.0 into +0.0)
    assert np.array_equal(got[finite], want[finite])
    assert np.array_equal(got[~finite], want[~finite], equal_nan=True)  # inf, -inf and NaN


def test_sums_are_within_the_bound_of_their_order():
    """|fixed-order sum - exact| <= (K + log2 L) * eps * sum |products| (K = d / L additions
    per lane, then 5 tree levels; every product of float16 x float32 values is exact)."""
    rng = np.random.default_rng(3)
    d = 4096
    stored = (rng.standard_normal((4, d)) * 100).astype(np.float16)
    t = rng.standard_normal(d).astype(np.float32).astype(np.float64)
    dots, sq = F.reduce_units(stored, np.arange(4), np.arange(5), t[None], True)
    bound_factor = (d // F.LANES + 5) * EPS
    for r in range(4):
        x = stored[r].astype(np.float64)
        exact = sum(Fraction(a) * Fraction(b) for a, b in zip(x.tolist(), t.tolist(), strict=True))
        assert abs(Fraction(dots[r, 0]) - exact) <= bound_factor * float(np.abs(x * t).sum())
        exact_sq = sum(Fraction(a) ** 2 for a in x.tolist())
        assert abs(Fraction(sq[r]) - exact_sq) <= bound_factor * float(exact_sq)


def test_bad_arguments_name_the_problem():
    stored = np.zeros((2, 16), np.float32)
    with pytest.raises(ValueError, match="backend must be one of"):
        F.reduce_units(stored, np.arange(2), np.arange(3), None, backend="fast")
    with pytest.raises(ValueError, match=r"targets have shape \(1, 8\), expected \(C, 16\)"):
        F.reduce_units(stored, np.arange(2), np.arange(3), np.zeros((1, 8)))
    with pytest.raises(F.ReduceBackendError, match="divisible by 32 \\(got 16\\)"):
        F.reduce_units(stored, np.arange(2), np.arange(3), None, backend="numba")
    with pytest.raises(ValueError, match=r"target has shape \(8,\), expected \(16,\)"):
        F.dot_norms(stored, np.zeros(8))


@needs_numba
def test_sketch_rows_use_the_same_bits_with_either_backend(tmp_path):
    rng = np.random.default_rng(4)
    arr = (rng.standard_normal((40, 64)) * 1000).astype(np.float16)
    np.save(tmp_path / "sk.npy", arr)
    mm = np.load(tmp_path / "sk.npy", mmap_mode="r")
    rows = np.full(48, -1)
    rows[np.sort(rng.choice(48, 40, replace=False))] = np.arange(40)
    t = rng.standard_normal((64, 3)).astype(np.float32)
    x = np.zeros((48, 64))
    x[rows >= 0] = arr[rows[rows >= 0]].astype(np.float64) / 256.0  # exact
    for seg in (None, np.arange(0, 49, 8)):
        sr = SketchRows(mm, rows, scale=256.0, segments=seg)
        a = sr._dot_norms_fixed(t, True, backend="numpy")
        b = sr._dot_norms_fixed(t, True, backend="numba", threads=2)
        assert _bits(a[0]) == _bits(b[0]) and _bits(a[1]) == _bits(b[1])
        units = x if seg is None else x.reshape(6, 8, 64).sum(1)  # exact sums of float16
        # both sums are within d * eps * sum|products| of the exact value (d = 64 additions at
        # most; the lane order needs 64 / 32 + 5), so within twice that of each other
        tol = 2 * 64 * EPS * (np.abs(units) @ np.abs(t.astype(np.float64)))
        assert np.all(np.abs(a[0] - units @ t.astype(np.float64)) <= tol)
        np.testing.assert_allclose(a[1], np.linalg.norm(units, axis=1), rtol=2 * 64 * EPS)


_EMULATED = {  # numba's target CPU in a subprocess: what another machine would compile
    "generic x86-64 (SSE2, no F16C)": {"NUMBA_CPU_NAME": "generic"},
    "haswell (AVX2, F16C, FMA)": {
        "NUMBA_CPU_NAME": "haswell",
        "NUMBA_CPU_FEATURES": "+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+fxsr,+lzcnt,"
                              "+mmx,+movbe,+popcnt,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave"},
}

_CHILD = """
import json, sys
import numpy as np
sys.path.insert(0, {repo!r})
from benchmark import fixed_order as F
sys.path.insert(0, {tests!r})
from test_fixed_order import _bits, _case
out = {{"f16c": F._load_numba().f16c}}
for name, dtype in (("f16", np.float16), ("f32", np.float32), ("f64", np.float64)):
    stored, rows, starts, T = _case(5, dtype)
    dots, sq = F.reduce_units(stored, rows, starts, T, True, backend="numba", threads=2)
    out[name] = _bits(dots) + _bits(sq)
print(json.dumps(out))
"""


@needs_numba
@pytest.mark.parametrize("cpu", sorted(_EMULATED))
def test_results_do_not_depend_on_the_cpu(cpu):
    """Kernels compiled for another instruction set (other vector widths, no F16C) give the
    same bits as this machine's."""
    here = {}
    for name, dtype in (("f16", np.float16), ("f32", np.float32), ("f64", np.float64)):
        stored, rows, starts, T = _case(5, dtype)
        dots, sq = F.reduce_units(stored, rows, starts, T, True, backend="numba", threads=1)
        here[name] = _bits(dots) + _bits(sq)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env.update(_EMULATED[cpu])
    code = _CHILD.format(repo=str(REPO), tests=str(REPO / "tests"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    there = json.loads(p.stdout.strip().splitlines()[-1])
    assert there["f16c"] == ("no F16C" not in cpu)
    for name in ("f16", "f32", "f64"):
        assert there[name] == here[name], name


def test_dense_dot_norms_match_a_direct_sum():
    rng = np.random.default_rng(6)
    rows = rng.standard_normal((5, 70))
    t = rng.standard_normal(70)
    dots, norms = F.dot_norms(rows, t)
    assert _bits(dots) == _bits([_python_order(r.tolist(), t.tolist()) for r in rows])
    assert _bits(norms) == _bits([math.sqrt(_python_order(r.tolist(), r.tolist()))
                                  for r in rows])
    dots2, _ = F.dot_norms(rows, np.stack([t, 2 * t], 1))
    assert dots2.shape == (5, 2) and _bits(dots2[:, 0]) == _bits(dots)


def test_backend_choice_by_size_and_environment(monkeypatch):
    monkeypatch.delenv("BT_BENCH_REDUCE_BACKEND", raising=False)
    assert F.choose_backend(F.NUMBA_MIN_VALUES - 1) == "numpy"  # no compile for small passes
    assert F.choose_backend(F.NUMBA_MIN_VALUES) == "auto"
    monkeypatch.setenv("BT_BENCH_REDUCE_BACKEND", "numba")
    assert F.choose_backend(10) == "numba"
    monkeypatch.setenv("BT_BENCH_REDUCE_BACKEND", "numpy")
    assert F.choose_backend(1 << 40) == "numpy" and not F.numba_available()


@pytest.mark.parametrize("steps", [False, True])
def test_agrees_with_the_previous_float64_path_within_the_derived_bound(tmp_path, steps):
    """The torch/BLAS float64 path (``_dot_norms_torch``) and the fixed order sum the same exact
    products in different orders. Each is within ``(terms - 1) * eps`` times the sum of the
    absolute terms of the exact value (any order of ``terms`` additions; the previous step-view
    dot adds per-rollout dots, so its terms are the products of every rollout), hence within
    the sum of both bounds of each other. Norms: all terms positive."""
    rng = np.random.default_rng(7)
    d, m = 256, 60
    arr = (rng.standard_normal((m, d)) * 10.0 ** rng.integers(-2, 3, (m, 1))).astype(np.float16)
    np.save(tmp_path / "sk.npy", arr)
    mm = np.load(tmp_path / "sk.npy", mmap_mode="r")
    rows = np.arange(m)
    seg = np.arange(0, m + 1, 6) if steps else None
    sr = SketchRows(mm, rows, scale=1024.0, segments=seg)
    t = rng.standard_normal((d, 2)).astype(np.float32).astype(np.float64)
    new_dots, new_norms = sr.dot_norms(t)
    old_dots, old_norms = sr._dot_norms_torch(t, True, "float64")
    x = arr.astype(np.float64) / 1024.0
    per = 6 if steps else 1
    mass = (np.abs(x) @ np.abs(t)).reshape(-1, per, 2).sum(1)  # sum of |products| per unit
    bound = 2 * (d * per) * EPS * mass
    assert np.all(np.abs(new_dots - old_dots) <= bound)
    # squared norms within (d - 1) * eps (relative) of the exact sum; sqrt halves that
    np.testing.assert_allclose(new_norms, old_norms, rtol=d * EPS, atol=0)
