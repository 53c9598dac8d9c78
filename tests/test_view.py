"""SketchRows: streamed access equals the dense matrix, in memory and memory-mapped."""

from __future__ import annotations

import numpy as np
import pytest

from benchmark.view import SketchRows


def _stored(tmp_path, rng, m=37, d=16, dtype=np.float16):
    arr = (rng.standard_normal((m, d)) * 100).astype(dtype)
    path = tmp_path / "sk.npy"
    np.save(path, arr)
    return np.load(path, mmap_mode="r"), arr


@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_rollout_rows_stream_like_the_dense_matrix(tmp_path, chunk):
    rng = np.random.default_rng(0)
    mm, arr = _stored(tmp_path, rng)
    rows = np.full(60, -1)
    rows[rng.choice(60, 37, replace=False)] = np.arange(37)  # stored in rollout order
    rows[rows >= 0] = np.arange(37)
    sr = SketchRows(mm, rows, scale=4.0)
    dense = np.zeros((60, 16), np.float32)
    dense[rows >= 0] = arr[rows[rows >= 0]].astype(np.float32) / 4.0
    np.testing.assert_array_equal(sr.dense(), dense)
    got = np.concatenate([b for _, b in sr.iter(chunk)])
    np.testing.assert_array_equal(got, dense)
    t = rng.standard_normal(16)
    # float64 sums in two orders (derivation in test_segments_are_sums_of_their_rollouts)
    np.testing.assert_allclose(sr.dot(t, chunk), dense.astype(np.float64) @ t, rtol=1e-6)
    np.testing.assert_allclose(sr.norms(chunk), np.linalg.norm(dense.astype(np.float64), axis=1),
                               rtol=1e-6)
    np.testing.assert_allclose(sr.gram(chunk), dense.T.astype(np.float64) @ dense, rtol=1e-6)
    T = rng.standard_normal((16, 3))
    np.testing.assert_allclose(sr.dot(T, chunk), dense.astype(np.float64) @ T, rtol=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_segments_are_sums_of_their_rollouts(tmp_path, chunk):
    rng = np.random.default_rng(1)
    mm, arr = _stored(tmp_path, rng, m=20, dtype=np.float32)
    rows = np.full(30, -1)
    keep = np.sort(rng.choice(30, 20, replace=False))
    rows[keep] = np.arange(20)
    seg = np.arange(0, 31, 5)  # 6 units of 5 rollouts
    sr = SketchRows(mm, rows, segments=seg)
    per = np.zeros((30, 16))
    per[keep] = arr
    want = per.reshape(6, 5, 16).sum(axis=1)
    # a unit's float32 row is a float32 sum of its <= 5 rollouts' rows (torch index_add_, in the
    # kernel's order): within 4 * 2**-24 * sum|rows| of the exact sum in any order, and the
    # float64 reference within 4 * 2**-53 of it, so 5 * 2**-24 * sum|rows| bounds the difference
    # (relative to the value itself it is unbounded where rows cancel: measured 3.7e-7 here)
    mass = np.abs(per).reshape(6, 5, 16).sum(axis=1)
    assert np.all(np.abs(sr.dense() - want) <= 5 * 2.0 ** -24 * mass)
    t = rng.standard_normal(16)
    # dot, norms and Gram matrix: float64 sums of 16 products in the fixed order against numpy's
    # (BLAS) order, each within 16 * 2**-53 * sum|products| of the exact value, so within
    # 3.6e-15 * sum|products| of each other: rtol 1e-6 holds unless a value is 3e8 times smaller
    # than its products (measured: at most 1.5e-8 of the tolerance used, here and above)
    np.testing.assert_allclose(sr.dot(t, chunk), want @ t, rtol=1e-6)
    np.testing.assert_allclose(sr.norms(chunk), np.linalg.norm(want, axis=1), rtol=1e-6)
    np.testing.assert_allclose(sr.gram(chunk), want.T @ want, rtol=1e-6)
    assert sr.n == 6


def test_all_zero_units_and_empty_store(tmp_path):
    sr = SketchRows(np.zeros((0, 4), np.float32), np.full(5, -1))
    assert sr.dense().shape == (5, 4) and not sr.dense().any()
    assert not sr.dot(np.ones(4)).any() and not sr.norms().any()
