"""Scatter this step's new K and V rows into the paged KV cache.

slot_mapping[t] = block_id * BS + offset is where token t's K/V live; -1 means
"do not store" (padding tokens).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.launch import (
    KernelLoader,
    int32_array,
    require_aligned,
    same_dtype,
    threads_for,
    token_stride,
)


def write_kv_ref(
    k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slot_mapping: np.ndarray
) -> None:
    """k, v: (T, Hkv, D); k_cache, v_cache: (NB, BS, Hkv, D); slot_mapping: (T,) int. In place."""
    nb, bs = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.reshape(nb * bs, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.reshape(nb * bs, *v_cache.shape[2:])[slots] = v[keep]


# --- launch (cuda/write_kv.cu) -------------------------------------------------------
# Grid: one block per token. Block: threads striding over the token's K/V row
# (Hkv * D elements) in 16-byte chunks; the kernel moves bytes, so it has no
# dtype variants.


def launch_write_kv(
    xp: Any, loader: KernelLoader, k: Any, v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any
) -> None:
    """k, v: (T, Hkv, D), rows contiguous (views into qkv are fine);
    k_cache, v_cache: (NB, BS, Hkv, D); slot_mapping: (T,) int, -1 = skip. In place."""
    same_dtype(k, v, k_cache, v_cache)
    T = k.shape[0]
    row_bytes = k.shape[1] * k.shape[2] * k.itemsize
    if T == 0:
        return
    if row_bytes % 16 or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"K/V rows {k.shape[1:]} do not fit the cache {k_cache.shape}")
    k = k if token_stride(k) is not None else xp.ascontiguousarray(k)
    v = v if token_stride(v) is not None else xp.ascontiguousarray(v)
    k_stride, v_stride = token_stride(k) * k.itemsize, token_stride(v) * v.itemsize
    require_aligned("k", k, k_stride)
    require_aligned("v", v, v_stride)
    require_aligned("k_cache", k_cache)
    require_aligned("v_cache", v_cache)
    chunks = row_bytes // 16
    kernel = loader.get_function("write_kv.cu", "write_kv")
    args = (
        k,
        v,
        k_cache,
        v_cache,
        int32_array(xp, slot_mapping),
        np.int32(chunks),
        np.int32(k_stride // 16),
        np.int32(v_stride // 16),
    )
    kernel((T,), (threads_for(chunks, 256),), args)
