"""An FP8 (e4m3) KV cache, --kv-cache-dtype fp8: half the bytes of a 16-bit cache,
so twice the tokens fit and decode attention reads half as much.

    cache = e4m3(k * (1 / k_scale)),   k ~ k_scale * cache   (the same for V; float32)

k_scale and v_scale are per-tensor float32, held as a (2,) device array. The
cache arrays are uint8 (e4m3 bits), shaped (NB, BS, Hkv, D) as for 16-bit caches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.launch import (
    KernelLoader,
    dtype_suffix,
    int32_array,
    require_aligned,
    same_dtype,
    threads_for,
    token_stride,
)
from rawpage.ops.paged_attention import paged_attention_ref
from rawpage.quantization.fp8 import E4M3_MAX, e4m3_from_f32


def kv_scales_from_amax(k_amax: float, v_amax: float) -> np.ndarray:
    """Scales that map the largest |K| and |V| expected onto e4m3's largest value."""
    return np.array([max(k_amax, 1e-6) / E4M3_MAX, max(v_amax, 1e-6) / E4M3_MAX], np.float32)


def write_kv_fp8_ref(
    k: np.ndarray,
    v: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slot_mapping: np.ndarray,
    kv_scales: np.ndarray,
) -> None:
    """k, v: (T, Hkv, D) float; caches (NB, BS, Hkv, D) uint8; in place."""
    nb, bs = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    # times the float32 reciprocal, as the kernel does (a division rounds ties differently)
    inv = np.float32(1) / kv_scales.astype(np.float32)
    k_cache.reshape(nb * bs, *k_cache.shape[2:])[slots] = e4m3_from_f32(k[keep].astype(np.float32) * inv[0])
    v_cache.reshape(nb * bs, *v_cache.shape[2:])[slots] = e4m3_from_f32(v[keep].astype(np.float32) * inv[1])


def paged_attention_fp8_ref(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    kv_scales: np.ndarray,
    meta: AttentionMetadata,
    opts: AttentionOptions,
) -> np.ndarray:
    """paged_attention_ref on the dequantized cache: what both attention kernels must
    compute when they convert on load. kv_scales: (2,) float32, k_scale and v_scale."""
    return paged_attention_ref(q, k_cache, v_cache, meta, opts, kv_scales)


# --- launch (cuda/write_kv_fp8.cu) -----------------------------------------------------
# Grid: one block per token. Block: threads striding over the token's K/V row in
# groups of 8 elements (16 bytes of float16 in, 8 bytes of e4m3 out).


def launch_write_kv_fp8(
    xp: Any, loader: KernelLoader, k: Any, v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any, kv_scales: Any
) -> None:
    """k, v: (T, Hkv, D) in the model dtype, rows contiguous (views into qkv are fine);
    caches (NB, BS, Hkv, D) uint8; kv_scales (2,) float32 on the device. In place."""
    same_dtype(k, v)
    T, row = k.shape[0], k.shape[1] * k.shape[2]
    if k_cache.dtype != np.uint8 or v_cache.dtype != np.uint8 or k_cache.shape[2:] != k.shape[1:] or row % 8:
        raise ValueError(
            f"fp8 KV cache: want uint8 caches of rows {k.shape[1:]} (Hkv * D a multiple of 8), "
            f"got {k_cache.dtype} {k_cache.shape}"
        )
    if T == 0:
        return
    k = k if token_stride(k) is not None else xp.ascontiguousarray(k)
    v = v if token_stride(v) is not None else xp.ascontiguousarray(v)
    k_stride, v_stride = token_stride(k), token_stride(v)
    require_aligned("k", k, k_stride * k.itemsize)
    require_aligned("v", v, v_stride * v.itemsize)
    require_aligned("k_cache", k_cache, alignment=8)
    require_aligned("v_cache", v_cache, alignment=8)
    kernel = loader.get_function("write_kv_fp8.cu", f"write_kv_fp8_{dtype_suffix(k)}")
    args = (
        k,
        v,
        k_cache,
        v_cache,
        int32_array(xp, slot_mapping),
        kv_scales,
        np.int32(row),
        np.int32(k_stride),
        np.int32(v_stride),
    )
    kernel((T,), (threads_for(row // 8, 256),), args)
