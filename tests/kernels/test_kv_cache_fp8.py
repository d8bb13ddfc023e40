"""FP8 KV cache: write_kv_fp8.cu converts on store exactly as the NumPy reference,
and attention on the dequantized cache stays close to attention on the 16-bit one."""

import numpy as np
import pytest

from rawpage.ops.kv_cache_fp8 import (
    kv_scales_from_amax,
    launch_write_kv_fp8,
    paged_attention_fp8_ref,
    write_kv_fp8_ref,
)
from rawpage.ops.paged_attention import paged_attention_ref
from tests.kernels.conftest import DTYPES


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
    meta = (tables, np.array([40, 64], np.int32), np.array([0, 1, 3], np.int32), D**-0.5)
    want = paged_attention_ref(q, k, v, *meta)
    got = paged_attention_fp8_ref(q, kc, vc, scales, *meta)
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()  # e4m3: a relative step of 1/8 to 1/16
