"""rms_norm, fused_add_rms_norm, rope, write_kv, silu_and_mul and copy_blocks:
the kernels in cuda/ against the NumPy references in rawpage/ops."""

import numpy as np
import pytest

from rawpage.ops.cache_ops import copy_blocks_ref, launch_copy_blocks
from rawpage.ops.layer_ops import (
    cos_sin_cache,
    fused_add_rms_norm_ref,
    launch_fused_add_rms_norm,
    launch_rms_norm,
    launch_rope,
    launch_silu_and_mul,
    launch_write_kv,
    rms_norm_ref,
    rope_ref,
    silu_and_mul_ref,
    write_kv_ref,
)
from tests.kernels.conftest import DTYPES, assert_close


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,dim", [(1, 64), (5, 576), (3, 100), (3, 1000), (2, 4096), (2, 8192)])
def test_rms_norm(device, dtype, T, dim):
    """16-byte chunks, one or two per thread (8192 in float32); dim 100 is not a
    whole number of 16-bit chunks and goes element by element."""
    rng = np.random.default_rng(dim)
    x = device.rounded(rng.standard_normal((T, dim)) * 3, dtype)
    w = device.rounded(rng.standard_normal(dim), dtype)
    got = launch_rms_norm(device.xp, device.loader, device.put(x, dtype), device.put(w, dtype), 1e-5)
    assert_close(device.get(got), rms_norm_ref(x, w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,dim", [(1, 64), (7, 576), (2, 1000)])
def test_fused_add_rms_norm(device, dtype, T, dim):
    rng = np.random.default_rng(dim + 1)
    x = device.rounded(rng.standard_normal((T, dim)), dtype)
    res = device.rounded(rng.standard_normal((T, dim)) * 4, dtype)
    w = device.rounded(rng.standard_normal(dim), dtype)
    x_dev, res_dev = device.put(x, dtype), device.put(res, dtype)
    normed, new_res = launch_fused_add_rms_norm(device.xp, device.loader, x_dev, res_dev, device.put(w, dtype), 1e-5)
    want_normed, want_res = fused_add_rms_norm_ref(x, res, w, 1e-5)
    assert_close(device.get(new_res), want_res, dtype, "residual")
    assert_close(device.get(normed), want_normed, dtype, "normed")
    # In place: the results live in the memory the caller passed.
    assert normed is x_dev and new_res is res_dev


def test_rms_norm_says_how_long_a_row_may_be(device):
    x = device.xp.zeros((1, 32768), np.float16)
    with pytest.raises(ValueError, match="up to 16384 elements"):
        launch_rms_norm(device.xp, device.loader, x, x[0], 1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_norms_walk_rows_and_take_unaligned_rows(device, dtype):
    """On one SM a block walks several rows (8192 float32: 1024 threads, 2 resident
    blocks) with the weight held in registers; a row that starts off a 16-byte
    boundary is read element by element."""
    if device.name != "sim":
        pytest.skip("the SM count is a simulator parameter")
    from rawpage.sim import SimKernelLoader

    loader = SimKernelLoader(debug=True, sm_count=1)
    rng = np.random.default_rng(3)
    T, dim = 5, 8192
    x = device.rounded(rng.standard_normal((T, dim)), dtype)
    res = device.rounded(rng.standard_normal((T, dim)), dtype)
    w = device.rounded(rng.standard_normal(dim), dtype)
    got = launch_rms_norm(np, loader, device.put(x, dtype), device.put(w, dtype), 1e-5)
    assert_close(device.get(got), rms_norm_ref(x, w, 1e-5), dtype, "rows walked")
    x_dev, res_dev = device.put(x, dtype), device.put(res, dtype)
    launch_fused_add_rms_norm(np, loader, x_dev, res_dev, device.put(w, dtype), 1e-5)
    want_normed, want_res = fused_add_rms_norm_ref(x, res, w, 1e-5)
    assert_close(device.get(res_dev), want_res, dtype, "residual, rows walked")
    assert_close(device.get(x_dev), want_normed, dtype, "normed, rows walked")

    dim = 64
    buffer = device.put(rng.standard_normal(T * dim + 1), dtype)
    unaligned = buffer[1:].reshape(T, dim)  # contiguous, one element past a 16-byte boundary
    want = rms_norm_ref(device.get(unaligned), device.get(unaligned[0]), 1e-5)
    assert_close(device.get(launch_rms_norm(np, loader, unaligned, unaligned[0], 1e-5)), want, dtype, "unaligned")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("H,Hkv,D", [(4, 2, 64), (9, 3, 64), (2, 1, 128), (4, 4, 16)])
def test_rope_on_views_into_qkv(device, dtype, is_neox, H, Hkv, D):
    """q and k are views into the fused qkv output, as in the model; v must not
    change. 12 heads make one full group of 8 sharing a cos/sin read and one partial."""
    check_rope(device, dtype, is_neox, H, Hkv, D, lead=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rope_on_rows_off_16_byte_boundaries(device, dtype, is_neox):
    """One element in front of q: no 16-byte vectors, two elements at a time."""
    check_rope(device, dtype, is_neox, 4, 2, 64, lead=1)


def check_rope(device, dtype, is_neox, H, Hkv, D, lead):
    rng = np.random.default_rng(D + H)
    T = 6
    qkv = device.rounded(rng.standard_normal((T, lead + (H + 2 * Hkv) * D)), dtype)
    positions = rng.integers(0, 200, T).astype(np.int32)
    cs = cos_sin_cache(1.0 / (10000.0 ** (np.arange(0, D, 2) / D)), 256)
    dev = device.put(qkv, dtype)
    q_cols, k_cols = slice(lead, lead + H * D), slice(lead + H * D, lead + (H + Hkv) * D)
    q = dev[:, q_cols].reshape(T, H, D)
    k = dev[:, k_cols].reshape(T, Hkv, D)
    launch_rope(device.xp, device.loader, device.put_raw(positions), q, k, device.put_raw(cs), is_neox)
    want_q = qkv[:, q_cols].reshape(T, H, D).copy()
    want_k = qkv[:, k_cols].reshape(T, Hkv, D).copy()
    rope_ref(positions, want_q, want_k, cs, is_neox)
    out = device.get(dev)
    assert_close(out[:, q_cols].reshape(T, H, D), want_q, dtype, "q")
    assert_close(out[:, k_cols].reshape(T, Hkv, D), want_k, dtype, "k")
    np.testing.assert_array_equal(out[:, :lead], qkv[:, :lead])
    np.testing.assert_array_equal(out[:, lead + (H + Hkv) * D :], qkv[:, lead + (H + Hkv) * D :])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("BS,Hkv,D", [(16, 2, 64), (32, 3, 128), (16, 1, 16)])
def test_write_kv_scatters_and_skips_padding(device, dtype, BS, Hkv, D):
    rng = np.random.default_rng(BS + D)
    T, NB, H = 9, 6, 2 * Hkv
    qkv = device.rounded(rng.standard_normal((T, (H + 2 * Hkv) * D)), dtype)
    k = qkv[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D)
    v = qkv[:, (H + Hkv) * D :].reshape(T, Hkv, D)
    slots = rng.permutation(NB * BS)[:T].astype(np.int32)
    slots[[2, 5]] = -1
    slots[0] = NB * BS - 1  # the very last slot of the cache
    k_cache = device.rounded(rng.standard_normal((NB, BS, Hkv, D)), dtype)
    v_cache = device.rounded(rng.standard_normal((NB, BS, Hkv, D)), dtype)
    dev_qkv = device.put(qkv, dtype)
    kc, vc = device.put(k_cache, dtype), device.put(v_cache, dtype)
    launch_write_kv(
        device.xp,
        device.loader,
        dev_qkv[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D),
        dev_qkv[:, (H + Hkv) * D :].reshape(T, Hkv, D),
        kc,
        vc,
        device.put_raw(slots),
    )
    write_kv_ref(k, v, k_cache, v_cache, slots)
    np.testing.assert_array_equal(device.get(kc), k_cache)
    np.testing.assert_array_equal(device.get(vc), v_cache)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,d", [(1, 32), (5, 1536), (3, 100)])
def test_silu_and_mul(device, dtype, T, d):
    rng = np.random.default_rng(d)
    x = device.rounded(rng.standard_normal((T, 2 * d)) * 3, dtype)
    got = launch_silu_and_mul(device.xp, device.loader, device.put(x, dtype))
    assert_close(device.get(got), silu_and_mul_ref(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_blocks_every_layer(device, dtype):
    rng = np.random.default_rng(7)
    shape, layers = (8, 16, 2, 64), 3
    ks = [device.rounded(rng.standard_normal(shape), dtype) for _ in range(layers)]
    vs = [device.rounded(rng.standard_normal(shape), dtype) for _ in range(layers)]
    mapping = np.array([[1, 4], [7, 0], [2, 3]])
    kd = [device.put(a, dtype) for a in ks]
    vd = [device.put(a, dtype) for a in vs]
    launch_copy_blocks(device.xp, device.loader, kd, vd, mapping)
    copy_blocks_ref(ks, vs, mapping)
    for got, want in zip(kd + vd, ks + vs):
        np.testing.assert_array_equal(device.get(got), want)


def test_silu_and_mul_strides_past_the_grid(device):
    """On one SM the grid holds 8 blocks of 256 threads: 3 rows of 8192 in 16-byte
    chunks are 3072 chunks, so threads take a second one."""
    if device.name != "sim":
        pytest.skip("the SM count is a simulator parameter")
    from rawpage.sim import SimKernelLoader

    x = device.rounded(np.random.default_rng(2).standard_normal((3, 2 * 8192)), "bfloat16")
    got = launch_silu_and_mul(np, SimKernelLoader(debug=True, sm_count=1), device.put(x, "bfloat16"))
    assert_close(device.get(got), silu_and_mul_ref(x), "bfloat16")
