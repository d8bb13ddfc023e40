"""Scatter this step's new K and V rows into the paged KV cache.

slot_mapping[t] = block_id * BS + offset is where token t's K/V live; -1 means
"do not store" (padding tokens).
"""

from __future__ import annotations

import numpy as np


def write_kv_ref(
    k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slot_mapping: np.ndarray
) -> None:
    """k, v: (T, Hkv, D); k_cache, v_cache: (NB, BS, Hkv, D); slot_mapping: (T,) int. In place."""
    nb, bs = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.reshape(nb * bs, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.reshape(nb * bs, *v_cache.shape[2:])[slots] = v[keep]
