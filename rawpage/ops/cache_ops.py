"""Whole-block KV moves: copy_blocks for copy-on-write, swap_blocks for CPU swap."""

from __future__ import annotations

import numpy as np


def copy_blocks_ref(
    k_caches: list[np.ndarray], v_caches: list[np.ndarray], block_mapping: np.ndarray
) -> None:
    """Per layer caches (NB, BS, Hkv, D); block_mapping: (N, 2) of [src, dst]. In place."""
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for k_cache, v_cache in zip(k_caches, v_caches):
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]
