"""Whole-block KV moves: copy_blocks for copy-on-write, swap_blocks for swapping to CPU memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.launch import KernelLoader, int32_array, require_aligned, threads_for


def copy_blocks_ref(k_caches: list[np.ndarray], v_caches: list[np.ndarray], block_mapping: np.ndarray) -> None:
    """Per layer caches (NB, BS, Hkv, D); block_mapping: (N, 2) of [src, dst]. In place."""
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for k_cache, v_cache in zip(k_caches, v_caches):
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]


def swap_blocks_ref(src: np.ndarray, dst: np.ndarray, block_mapping: np.ndarray) -> None:
    """One layer's cache to another pool: dst[m[:, 1]] = src[m[:, 0]] for (NB, BS, Hkv, D) pools."""
    dst[block_mapping[:, 1]] = src[block_mapping[:, 0]]


# --- launch (cuda/cache_ops.cu) ------------------------------------------------------
# One launch per layer. Grid: (N pairs, 2), blockIdx.y picking K or V. Block:
# threads striding over one KV block (BS * Hkv * D elements) in 16-byte chunks.


def launch_copy_blocks(
    xp: Any, loader: KernelLoader, k_caches: list[Any], v_caches: list[Any], block_mapping: Any
) -> None:
    """Per layer caches (NB, BS, Hkv, D); block_mapping: (N, 2) of [src, dst]. In place."""
    mapping = int32_array(xp, block_mapping).reshape(-1, 2)
    n = mapping.shape[0]
    if n == 0:
        return
    kernel = loader.get_function("cache_ops.cu", "copy_blocks")
    for k_cache, v_cache in zip(k_caches, v_caches):
        block_bytes = k_cache[0].size * k_cache.itemsize
        if block_bytes % 16 or k_cache.shape != v_cache.shape:
            raise ValueError(f"cannot copy blocks of caches shaped {k_cache.shape}, {v_cache.shape}")
        require_aligned("k_cache", k_cache)
        require_aligned("v_cache", v_cache)
        chunks = block_bytes // 16
        kernel((n, 2), (threads_for(chunks, 256),), (k_cache, v_cache, mapping, np.int32(chunks)))
