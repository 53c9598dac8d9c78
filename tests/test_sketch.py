import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import benchmark.sketch as S
from benchmark.sketch import (
    CountSketch,
    flatten_grads,
    hash_codes,
    hash_coordinates,
    numba_available,
    splitmix64,
)


def test_splitmix64_known_values():
    # splitmix64 finalizer of 0 is 0; reference value of the standard generator's first output:
    # state 0 -> z = 0x9E3779B97F4A7C15 -> 0xE220A8397B1DCDAF
    out = splitmix64(np.array([0, 0x9E3779B97F4A7C15], dtype=np.uint64))
    assert int(out[0]) == 0
    assert int(out[1]) == 0xE220A8397B1DCDAF


def test_hash_matches_scalar_definition():
    b, s = hash_coordinates(50, 64, 7)
    for i in (0, 1, 49):
        z = splitmix64(np.array([(i + 7 + 0x9E3779B97F4A7C15) % 2**64], dtype=np.uint64))[0]
        assert b[i] == int(z) % 64
        z2 = splitmix64(np.array([(i + 7 + 6971419160186945601) % 2**64], dtype=np.uint64))[0]
        assert s[i] == (1.0 if int(z2) % 2 == 0 else -1.0)


def test_dim_must_be_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        CountSketch(10, 12, 0)


def test_sketch_matches_explicit_loop_and_is_linear():
    torch.manual_seed(0)
    cs = CountSketch(1000, 64, 3)
    x, y = torch.randn(1000), torch.randn(1000)
    ref = torch.zeros(64)
    for i in range(1000):
        ref[cs.bucket[i]] += cs.sign[i] * x[i]
    # float32 bucket sums of ~16 (at most ~40) terms |x| ~ 1 in two orders: within
    # 2 * 40 * 2**-24 * sum|terms| (~1.5e-4 for a bucket's ~30 of mass) of each other in the
    # worst case, typically sqrt(terms) ulps; torch.allclose adds rtol 1e-5 |ref|. Measured: the
    # same bits (loop and kernel add in row order) here and in the sparse product below, and
    # 7.6e-6 (avx2) / 5.7e-6 (default) for linearity, at most 2.8% of its bound
    assert torch.allclose(cs.sketch(x), ref, atol=1e-5)
    assert torch.allclose(cs.sketch(2 * x - 3 * y), 2 * cs.sketch(x) - 3 * cs.sketch(y), atol=1e-4)
    batch = torch.stack([x, y])
    assert torch.allclose(cs.sketch(batch)[1], cs.sketch(y))
    assert torch.allclose(cs.sketch_sparse_mm(batch), cs.sketch(batch), atol=1e-5)


def test_inner_products_unbiased():
    """Mean over independent hash seeds of <Sx,Sy> - <x,y> stays within 4 standard errors.

    For CountSketch, Var<Sx,Sy> = (1/d) * (|x|^2 |y|^2 + <x,y>^2 - 2 sum_i x_i^2 y_i^2).
    """
    rng = np.random.default_rng(0)
    n, d, reps = 2000, 32, 300
    x = torch.tensor(rng.normal(size=n), dtype=torch.float32)
    y = (0.5 * x + torch.tensor(rng.normal(size=n), dtype=torch.float32))
    exact = float(x @ y)
    est = np.array([float(CountSketch(n, d, seed * 7919).sketch(x) @
                          CountSketch(n, d, seed * 7919).sketch(y)) for seed in range(reps)])
    xx, yy = float(x @ x), float(y @ y)
    var = (xx * yy + exact**2 - 2 * float(((x**2) * (y**2)).sum())) / d
    se = math.sqrt(var / reps)
    assert abs(est.mean() - exact) < 4 * se
    # the spread matches theory within 20% (an older multiplicative hash sat at ~1.4x)
    assert 0.8 < est.std() / math.sqrt(var) < 1.2


def test_flatten_grads_counts_none_as_zeros():
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    m[1](torch.ones(2)).sum().backward()  # first layer gets no grad
    g = flatten_grads(m)
    assert g.shape == (3 * 2 + 2 + 2 + 1,)
    assert torch.all(g[:8] == 0) and torch.any(g[8:] != 0)


# ---------------------------------------------------------------------------------------------
# Backends, the per-parameter entry point, and the documented summation order.


@pytest.fixture
def need_numba():
    """The compiled backend; CI installs it (.[test]), so there a missing one fails."""
    if not numba_available():
        if os.environ.get("CI"):
            pytest.fail("numba kernels unavailable in CI; pip install -e '.[test]' installs numba")
        pytest.skip("numba is not installed (pip install 'bt-bench[fast]')")


def _float32_sequential(x: np.ndarray, bucket: np.ndarray, sign: np.ndarray, dim: int):
    """The documented order: per row and bucket, float32 sums over increasing coordinates."""
    out = np.zeros((x.shape[0], dim), dtype=np.float32)
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[r, bucket[i]] = np.float32(out[r, bucket[i]] + np.float32(sign[i] * x[r, i]))
    return out


@pytest.mark.parametrize("seed", [0, 7, 2**64 - 3])
def test_hash_codes_fold_bucket_and_sign(seed, monkeypatch):
    monkeypatch.setattr(S, "_HASH_CHUNK", 1000)  # several chunks, one partial
    n, dim = 4321, 256
    b, s = hash_coordinates(n, dim, seed)
    codes = hash_codes(n, dim, seed, threads=3)
    assert codes.dtype == np.int32
    np.testing.assert_array_equal(codes ^ (codes >> 31), b)
    np.testing.assert_array_equal(np.where(codes < 0, -1.0, 1.0), s)
    monkeypatch.setenv("BT_BENCH_SKETCH_BACKEND", "torch")  # the numpy evaluation
    np.testing.assert_array_equal(hash_codes(n, dim, seed), codes)


def test_sketch_follows_documented_summation_order_exactly(need_numba):
    rng = np.random.default_rng(1)
    n, dim = 1500, 16
    x = rng.normal(size=(3, n)).astype(np.float32) * np.float32(1e3) ** rng.integers(
        -2, 3, size=(3, n)).astype(np.float32)  # mixed magnitudes: the order matters
    cs = CountSketch(n, dim, 5)
    ref = _float32_sequential(x, cs.bucket.numpy(), cs.sign.numpy(), dim)
    for backend in ("numba", "torch"):
        np.testing.assert_array_equal(cs.sketch(torch.from_numpy(x), backend=backend).numpy(), ref)


@pytest.mark.parametrize("rows", [1, 3, 4, 9, 13, 24, 32])
@pytest.mark.parametrize("dim", [64, 8192, 16384])  # groups of 8 rows up to 8192, then 16 and 8
def test_numba_and_index_add_backends_are_bit_identical(need_numba, rows, dim):
    g = torch.Generator().manual_seed(rows * dim)
    n = 20011
    x = torch.randn(rows, n, generator=g) * torch.exp(2 * torch.randn(rows, n, generator=g))
    cs = CountSketch(n, dim, 3)
    ref = cs.sketch(x, backend="torch")
    for threads in (1, 2, 5):
        assert torch.equal(cs.sketch(x, threads=threads, backend="numba"), ref)


def test_sketch_matches_float64_reference_within_float32_error(need_numba):
    g = torch.Generator().manual_seed(0)
    n, dim = 50000, 1024
    x = torch.randn(6, n, generator=g) * torch.exp(3 * torch.randn(6, n, generator=g))
    cs = CountSketch(n, dim, 11)
    bucket = cs.bucket.numpy()
    signed = x.double().numpy() * cs.sign.double().numpy()
    ref, mass = np.zeros((6, dim)), np.zeros((6, dim))
    for r in range(6):
        np.add.at(ref[r], bucket, signed[r])
        np.add.at(mass[r], bucket, np.abs(signed[r]))
    # sequential float32 summation of k terms: |error| <= (k - 1) * 2**-24 * sum |terms|
    bound = (np.bincount(bucket, minlength=dim) - 1) * 2.0**-24 * mass
    for backend in ("numba", "torch"):
        err = np.abs(cs.sketch(x, backend=backend).double().numpy() - ref)
        assert (err <= bound).all()
        assert err.max() > 0  # float32 accumulation, not float64


def _vmap_grads(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi):
        return functional_call(model, p, (xi[None],)).pow(2).sum()

    return vmap(grad(loss), in_dims=(None, 0))(params, x)


def test_per_parameter_sketch_equals_flat_sketch_exactly():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 33), torch.nn.Tanh(), torch.nn.Linear(33, 5))
    grads = _vmap_grads(model, torch.randn(6, 7))  # {name: (6, *param.shape)}
    flat = torch.cat([g.reshape(6, -1) for g in grads.values()], 1)
    n = flat.shape[1]
    cs = CountSketch(n, 64, 2)
    ref = cs.sketch(flat)
    backends = ("auto", "torch") + (("numba",) if numba_available() else ())
    for backend in backends:
        assert torch.equal(cs.sketch_params(grads, backend=backend), ref)
        assert torch.equal(cs.sketch_params(list(grads.values()), backend=backend), ref)
        assert torch.equal(cs.sketch_params(flat, backend=backend), ref)
    # bf16 gradients are widened to float32 first, exactly as the flat path does
    half = {k: v.bfloat16() for k, v in grads.items()}
    assert torch.equal(cs.sketch_params(half),
                       cs.sketch(torch.cat([v.reshape(6, -1) for v in half.values()], 1)))


def test_device_algorithm_keeps_the_order_on_cpu():
    """The chunked index_add_ used on GPUs gives the exact CPU result when run on the CPU."""
    g = torch.Generator().manual_seed(4)
    n = 3001
    parts = [torch.randn(5, k, generator=g) for k in (1000, 1, 2000)]
    cs = CountSketch(n, 128, 9)
    ref = cs.sketch(torch.cat(parts, 1), backend="torch")
    for dtype in (torch.float32, torch.float64):
        out = torch.zeros(5, 128)
        S._index_add_codes(out, [p.to(dtype) for p in parts], cs._codes_tensor(), step=97)
        assert torch.equal(out, ref)


def test_sketch_shapes_and_empty_batch():
    cs = CountSketch(10, 4, 0)
    assert cs.sketch(torch.ones(10)).shape == (4,)
    assert cs.sketch(torch.ones(2, 3, 10)).shape == (2, 3, 4)
    assert cs.sketch(torch.ones(0, 10)).shape == (0, 4)
    assert cs.sketch(torch.ones(2, 10, dtype=torch.float64)).dtype == torch.float32


def test_sketch_params_rejects_bad_input():
    cs = CountSketch(10, 4, 0)
    with pytest.raises(ValueError, match=r"hold 9 values per row, expected n_params=10"):
        cs.sketch_params([torch.ones(2, 3, 3)])
    with pytest.raises(ValueError, match=r"leading batch dimension of 2"):
        cs.sketch_params([torch.ones(2, 5), torch.ones(3, 5)])
    with pytest.raises(ValueError, match=r"got no gradients"):
        cs.sketch_params({})
    with pytest.raises(ValueError, match=r"gradient 1 is NoneType"):
        cs.sketch_params([torch.ones(2, 5), None])
    with pytest.raises(ValueError, match=r"must be \(B, n_params\)"):
        cs.sketch_params(torch.ones(10))
    with pytest.raises(ValueError, match=r"backend must be one of"):
        cs.sketch(torch.ones(10), backend="cuda")
    with pytest.raises(ValueError, match=r"threads must be at least 1"):
        cs.sketch(torch.ones(10), threads=0)
    with pytest.raises(ValueError, match=r"expected n_params=10.*sketch_params"):
        cs.sketch(torch.ones(2, 9))


def test_torch_fallback_when_compiled_backend_is_off(monkeypatch):
    x = torch.randn(3, 100)
    cs = CountSketch(100, 16, 1)
    ref = cs.sketch(x)
    monkeypatch.setenv("BT_BENCH_SKETCH_BACKEND", "torch")
    assert not numba_available()
    assert torch.equal(cs.sketch(x), ref)
    with pytest.raises(RuntimeError, match=r"backend='numba' needs numba.*bt-bench\[fast\]"):
        cs.sketch(x, backend="numba")


def test_gpu_check_smoke_runs_end_to_end(tmp_path):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    threads = torch.get_num_threads()
    out = tmp_path / "report.json"
    mod.main(["--smoke", "--out", str(out)])
    assert torch.get_num_threads() == threads  # restored
    report = json.loads(out.read_text())
    assert report["smoke"] and report["rollouts"] == 4 and report["n_params"] > 0
    assert report["per_rollout_grad"] == "benchmark.build.grpo.PerRolloutGrad"
    for key in ("step_without_capture_s", "step_with_capture_s", "step_with_capture_flat_s"):
        assert report[key] > 0
    assert report["throughput"]["ratio_sketch_to_copy"] > 0
    assert report["correctness"]["within_float32_bound"]
    assert report["correctness"]["max_abs_diff_vs_cpu"] == 0.0
    assert report["correctness"]["max_abs_diff_per_parameter_vs_flat"] == 0.0
    # the release model's architecture as written in the script: Qwen2.5-1.5B's parameter count
    from transformers import AutoModelForCausalLM, Qwen2Config

    with torch.device("meta"):
        big = AutoModelForCausalLM.from_config(Qwen2Config(**mod.QWEN25_15B))
    assert sum(p.numel() for p in big.parameters()) == 1_543_714_304
