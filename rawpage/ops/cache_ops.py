"""Whole-block KV moves: copy_blocks for copy-on-write, swap_blocks for swapping to CPU memory."""

from __future__ import annotations

import numpy as np


def copy_blocks_ref(k_caches: list[np.ndarray], v_caches: list[np.ndarray], block_mapping: np.ndarray) -> None:
    """Per layer caches (NB, BS, Hkv, D); block_mapping: (N, 2) of [src, dst]. In place."""
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for k_cache, v_cache in zip(k_caches, v_caches):
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]


def swap_blocks_ref(src: np.ndarray, dst: np.ndarray, block_mapping: np.ndarray) -> None:
    """One layer's cache to another pool: dst[m[:, 1]] = src[m[:, 0]] for (NB, BS, Hkv, D) pools."""
    dst[block_mapping[:, 1]] = src[block_mapping[:, 0]]
