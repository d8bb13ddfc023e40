"""layer_ops.c on every instruction-set path against the NumPy references in
rawpage/ops, on contiguous inputs and on the views the model passes (q, k, v as
column slices of the fused qkv output, Fortran-order matmul outputs). Row counts
go past the point where the rows are split over threads; 1 and 2 threads agree
bit for bit (each row is computed the same way on whichever thread takes it).
"""

from __future__ import annotations

import numpy as np
import pytest

from rawpage.native import layer_ops
from rawpage.ops.layer_ops import (
    cos_sin_cache,
    fused_add_rms_norm_ref,
    gelu_tanh_and_mul_ref,
    rms_norm_ref,
    rope_ref,
    silu_and_mul_ref,
    write_kv_ref,
)

ROWS = [1, 7, 300]  # 300 rows of 576: more than 16K elements a thread, so split
RTOL, ATOL = 1e-5, 1e-6


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("dim", [64, 576, 1001])
@pytest.mark.parametrize("T", ROWS)
def test_rms_norm(lib, T, dim):
    rng = np.random.default_rng(T + dim)
    x, w = randn(rng, T, dim), randn(rng, dim)
    ref = rms_norm_ref(x, w, 1e-5)
    np.testing.assert_allclose(layer_ops.rms_norm(lib, x, w, 1e-5, 1), ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(layer_ops.rms_norm(lib, x, w, 1e-5, 1), layer_ops.rms_norm(lib, x, w, 1e-5, 2))
    wide = np.zeros((T, dim + 40), np.float32)  # a row view with a wider stride
    wide[:, 3 : 3 + dim] = x
    np.testing.assert_array_equal(
        layer_ops.rms_norm(lib, wide[:, 3 : 3 + dim], w, 1e-5, 2), layer_ops.rms_norm(lib, x, w, 1e-5, 2)
    )


@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("dim", [64, 576, 1001])
@pytest.mark.parametrize("T", ROWS)
def test_fused_add_rms_norm(lib, T, dim, layout):
    rng = np.random.default_rng(T * dim)
    x, residual, w = randn(rng, T, dim), randn(rng, T, dim), randn(rng, dim)
    ref_normed, ref_sum = fused_add_rms_norm_ref(x, residual, w, 1e-6)
    results = []
    for nthreads in (1, 2):
        xi, ri = np.array(x, order=layout), residual.copy()  # "F": a matmul output, (W x^T)^T
        normed, summed = layer_ops.fused_add_rms_norm(lib, xi, ri, w, 1e-6, nthreads)
        np.testing.assert_allclose(normed, ref_normed, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(summed, ref_sum, rtol=RTOL, atol=ATOL)
        assert summed is ri  # the sum lands in the residual's memory
        assert (normed is xi) == (layout == "C" or T == 1)  # and the normed rows in x's when it has C rows
        results.append((normed, summed))
    np.testing.assert_array_equal(results[0][0], results[1][0])


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("D", [64, 80, 96, 128])
@pytest.mark.parametrize("T", ROWS)
def test_rope_on_views_into_qkv(lib, T, D, is_neox):
    rng = np.random.default_rng(T + D + is_neox)
    H, Hkv = 9, 3
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, D, 2) / D))
    cos_sin = cos_sin_cache(inv_freq, 2048)
    positions = rng.integers(0, 2048, T).astype(np.int32)
    qkv = randn(rng, T, (H + 2 * Hkv) * D)
    ref = qkv.copy()
    rope_ref(
        positions, ref[:, : H * D].reshape(T, H, D), ref[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D), cos_sin, is_neox
    )
    for nthreads in (1, 2):
        got = qkv.copy()
        q = got[:, : H * D].reshape(T, H, D)  # row stride (H + 2 Hkv) D: rotated in place, no copy
        k = got[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D)
        layer_ops.rope(lib, positions, q, k, cos_sin, is_neox, nthreads)
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)  # v untouched too


def test_rope_on_a_layout_without_contiguous_rows(lib):
    rng = np.random.default_rng(3)
    T, H, D = 5, 4, 64
    cos_sin = cos_sin_cache(1.0 / (10000.0 ** (np.arange(0, D, 2) / D)), 64)
    positions = np.arange(T, dtype=np.int64)
    q, k = np.asfortranarray(randn(rng, T, H, D)), randn(rng, T, 2, D)
    q_ref, k_ref = q.copy(), k.copy()
    rope_ref(positions, q_ref, k_ref, cos_sin, True)
    layer_ops.rope(lib, positions, q, k, cos_sin, True, 1)
    np.testing.assert_allclose(q, q_ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(k, k_ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op, ref", [("silu_and_mul", silu_and_mul_ref), ("gelu_tanh_and_mul", gelu_tanh_and_mul_ref)])
@pytest.mark.parametrize("I", [100, 1536])
@pytest.mark.parametrize("T", ROWS)
def test_gated_activations(lib, T, I, op, ref):
    rng = np.random.default_rng(T + I)
    x = randn(rng, T, 2 * I) * 4  # gates out to +-16: exp and tanh near saturation
    x[0, :4] = [-100.0, 100.0, -1e-4, 0.0]
    fn = getattr(layer_ops, op)
    one, two = fn(lib, x, 1), fn(lib, np.asfortranarray(x), 2)
    # The reference's own float32 rounding of 1 + tanh (and 1 + exp) is relative to
    # the gate's size: hold the error to |g u| (an output of about 0 may miss by that much).
    g_u = np.abs(x[:, :I] * x[:, I:])
    assert np.all(np.abs(one - ref(x)) <= RTOL * np.abs(ref(x)) + 1e-6 * g_u + ATOL)
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("T", ROWS)
def test_write_kv_from_qkv_views(lib, T, kv_dtype):
    rng = np.random.default_rng(T)
    H, Hkv, D, NB, BS = 9, 3, 64, 40, 16
    qkv = randn(rng, T, (H + 2 * Hkv) * D)
    k = qkv[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D)
    v = qkv[:, (H + Hkv) * D :].reshape(T, Hkv, D)
    slots = rng.permutation(NB * BS)[:T].astype(np.int32)
    slots[::3] = -1  # padding tokens are not stored
    for nthreads in (1, 2):
        kc, vc = randn(rng, NB, BS, Hkv, D).astype(kv_dtype), randn(rng, NB, BS, Hkv, D).astype(kv_dtype)
        kc_ref, vc_ref = kc.copy(), vc.copy()
        write_kv_ref(k, v, kc_ref, vc_ref, slots)  # (NumPy's float16 cast rounds to nearest even too)
        layer_ops.write_kv(lib, k, v, kc, vc, slots, nthreads)
        np.testing.assert_array_equal(kc, kc_ref)
        np.testing.assert_array_equal(vc, vc_ref)


def test_write_kv_refuses_other_caches(lib):
    k = np.zeros((2, 3, 64), np.float32)
    with pytest.raises(TypeError, match="float32 or float16"):
        layer_ops.write_kv(
            lib, k, k, np.zeros((4, 16, 3, 64), np.uint8), np.zeros((4, 16, 3, 64), np.uint8), np.zeros(2, np.int32), 1
        )
    with pytest.raises(ValueError, match="do not fit"):
        cache = np.zeros((4, 16, 2, 64), np.float32)
        layer_ops.write_kv(lib, k, k, cache, cache.copy(), np.zeros(2, np.int32), 1)


@pytest.mark.parametrize("T", [1, 5, 300])
def test_embedding_rows(lib, T):
    rng = np.random.default_rng(T)
    table = rng.standard_normal((1000, 72)).astype(np.float32)
    ids = rng.integers(0, 1000, T).astype(np.int32)
    np.testing.assert_array_equal(layer_ops.embedding_rows(lib, table, ids, 2), table[ids])
    with pytest.raises(ValueError, match="token ids must be in 0 .. 999"):
        layer_ops.embedding_rows(lib, table, np.array([3, 1000], np.int32), 1)
