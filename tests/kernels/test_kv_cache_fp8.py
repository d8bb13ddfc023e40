"""FP8 KV cache: write_kv_fp8.cu converts on store exactly as the NumPy reference,
attention on the dequantized cache stays close to attention on the 16-bit one, and
both attention kernels, converting on load, match that reference."""

import numpy as np
import pytest

from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.kv_cache_fp8 import (
    kv_scales_from_amax,
    launch_write_kv_fp8,
    paged_attention_fp8_ref,
    write_kv_fp8_ref,
)
from rawpage.ops.paged_attention import launch_paged_attention, paged_attention_ref
from rawpage.quantization.fp8 import e4m3_from_f32
from tests.kernels.conftest import DTYPES, assert_close
from tests.kernels.test_paged_attention import paged_batch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hkv,D,BS", [(2, 64, 16), (1, 128, 8), (3, 80, 32)])
def test_write_kv_fp8_matches_reference(device, dtype, Hkv, D, BS):
    rng = np.random.default_rng(Hkv * D)
    T, NB, H = 7, 6, 2 * Hkv
    qkv = device.rounded(rng.standard_normal((T, (H + 2 * Hkv) * D)) * 3, dtype)
    k = qkv[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D)
    v = qkv[:, (H + Hkv) * D :].reshape(T, Hkv, D)
    slots = rng.permutation(NB * BS)[:T].astype(np.int32)
    slots[2] = -1  # a padding token: stores nothing
    scales = kv_scales_from_amax(np.abs(k).max(), np.abs(v).max() * 2)
    want_k = np.full((NB, BS, Hkv, D), 0x11, np.uint8)
    want_v = want_k.copy()
    write_kv_fp8_ref(k, v, want_k, want_v, slots, scales)
    dev = device.put(qkv, dtype)  # k and v as strided views into qkv, as in the model
    kd = dev[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D)
    vd = dev[:, (H + Hkv) * D :].reshape(T, Hkv, D)
    kc, vc = device.put_raw(np.full_like(want_k, 0x11)), device.put_raw(np.full_like(want_v, 0x11))
    launch_write_kv_fp8(device.xp, device.loader, kd, vd, kc, vc, device.put_raw(slots), device.put_raw(scales))
    np.testing.assert_array_equal(device.get(kc), want_k)
    np.testing.assert_array_equal(device.get(vc), want_v)


def test_fp8_attention_reference_is_close_to_16_bit():
    """The reference the kernels are held to: within e4m3's 3-bit mantissa of the exact result."""
    rng = np.random.default_rng(0)
    NB, BS, Hkv, D, H = 8, 16, 2, 64, 4
    k = rng.standard_normal((NB, BS, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((NB, BS, Hkv, D)).astype(np.float32)
    scales = kv_scales_from_amax(np.abs(k).max(), np.abs(v).max())
    slots = np.arange(NB * BS, dtype=np.int32)
    kc, vc = np.zeros(k.shape, np.uint8), np.zeros(v.shape, np.uint8)
    write_kv_fp8_ref(k.reshape(-1, Hkv, D), v.reshape(-1, Hkv, D), kc, vc, slots, scales)
    q = rng.standard_normal((3, H, D)).astype(np.float32)
    tables = rng.permutation(NB).astype(np.int32).reshape(2, 4)
    meta = AttentionMetadata.from_host(tables, np.array([40, 64], np.int32), np.array([0, 1, 3], np.int32))
    opts = AttentionOptions(D**-0.5)
    want = paged_attention_ref(q, k, v, meta, opts)
    got = paged_attention_fp8_ref(q, kc, vc, scales, meta, opts)
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()  # e4m3: a relative step of 1/8 to 1/16


# ---- both attention kernels on an FP8 cache (convert on load, float32 math) ----------

FP8_POISON = 0x7F  # e4m3's NaN code, in every slot no sequence owns (the kernels decode it as 480)


def fp8_batch(device, dtype, rng, q_lens, ctx, H, Hkv, D, BS):
    """paged_batch's batch with its caches written as e4m3 codes; returns host (q, caches,
    tables, seq_lens, qsl, scales) and device arrays (q, caches, tables, seq_lens, qsl), scales."""
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, H, Hkv, D, BS)
    q, kc, vc, tables, seq_lens, qsl = host
    scales = kv_scales_from_amax(np.nanmax(np.abs(kc)), 2 * np.nanmax(np.abs(vc)))
    codes = []
    for cache, s in ((kc, scales[0]), (vc, scales[1])):
        c = np.full(cache.shape, FP8_POISON, np.uint8)
        owned = ~np.isnan(cache)
        c[owned] = e4m3_from_f32(cache[owned] * (np.float32(1) / s))
        codes.append(c)
    host = (q, *codes, tables, seq_lens, qsl)
    dev = (dev[0], device.put_raw(codes[0]), device.put_raw(codes[1]), *dev[3:])
    return host, dev, scales


def fp8_reference(host, scales, scale, window=None, cap=None):
    q, kc, vc, *arrays = host
    k, v = (np.where(c == FP8_POISON, 0, c).astype(np.uint8) for c in (kc, vc))
    opts = AttentionOptions(scale, sliding_window=window, soft_cap=cap)
    return paged_attention_fp8_ref(q, k, v, scales, AttentionMetadata.from_host(*arrays), opts)


def run_fp8(device, dev, scales, scale, q_lens, ctx, partitions=None, window=None, cap=None):
    meta = AttentionMetadata(*dev[3:], max_query_len=max(q_lens), max_seq_len=max(ctx))
    opts = AttentionOptions(scale, sliding_window=window, soft_cap=cap)
    out = launch_paged_attention(
        device.xp,
        device.loader,
        *dev[:3],
        meta,
        opts,
        partitions=partitions,
        min_partition=16,
        kv_scales=device.put_raw(scales),
    )
    return device.get(out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D,H,Hkv", [(64, 8, 2), (128, 4, 4), (256, 8, 1), (80, 6, 2), (16, 4, 2)])
def test_fp8_decode_matches_reference(device, dtype, D, H, Hkv):
    """One partition and split-K; with a sliding window and soft cap too."""
    rng = np.random.default_rng(D + H)
    ctx = [1, 16, 17, 77, 101]
    host, dev, scales = fp8_batch(device, dtype, rng, [1] * 5, ctx, H, Hkv, D, 16)
    want = fp8_reference(host, scales, D**-0.5)
    for P in (1, 3):
        got = run_fp8(device, dev, scales, D**-0.5, [1] * 5, ctx, partitions=P)
        assert_close(got, want, dtype, f"{P} partitions")
    want = fp8_reference(host, scales, D**-0.5, 20, 3.0)
    got = run_fp8(device, dev, scales, D**-0.5, [1] * 5, ctx, partitions=2, window=20, cap=3.0)
    assert_close(got, want, dtype, "window 20, cap 3")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D,H,Hkv", [(64, 8, 2), (128, 4, 4), (256, 4, 2), (80, 6, 2), (16, 4, 2)])
def test_fp8_prefill_matches_reference(device, dtype, D, H, Hkv):
    """A prompt longer than one query tile, a chunk over a cached prefix, a decode row
    in the batch; then the same with a sliding window."""
    rng = np.random.default_rng(D + H + 1)
    q_lens, ctx = [70, 9, 1], [70, 60, 50]
    host, dev, scales = fp8_batch(device, dtype, rng, q_lens, ctx, H, Hkv, D, 16)
    assert_close(run_fp8(device, dev, scales, 0.2, q_lens, ctx), fp8_reference(host, scales, 0.2), dtype)
    got = run_fp8(device, dev, scales, 0.2, q_lens, ctx, window=24)
    assert_close(got, fp8_reference(host, scales, 0.2, 24), dtype, "window 24")


def test_fp8_cache_with_16_bit_kernels_is_refused(device):
    rng = np.random.default_rng(0)
    host, dev, scales = fp8_batch(device, "float16", rng, [1], [4], 2, 2, 64, 16)
    q, kc, vc, *arrays = dev
    meta, opts = AttentionMetadata(*arrays, max_query_len=1, max_seq_len=4), AttentionOptions(0.1)
    with pytest.raises(ValueError, match="kv_scales go with an FP8"):
        launch_paged_attention(device.xp, device.loader, q, q[:0], q[:0], meta, opts, kv_scales=scales)
