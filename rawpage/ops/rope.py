"""Rotary position embedding (RoPE), applied to q and k in place.

For each head vector x of size D and position p, pairs of lanes (a, b) are
rotated by the angle p * inv_freq[j]:
    a' = a cos - b sin,   b' = b cos + a sin
NeoX style pairs lane j with j + D/2 (Hugging Face's Llama); GPT-J style pairs
lanes 2j and 2j + 1 (llama.cpp's native layout).
"""

from __future__ import annotations

import numpy as np


def cos_sin_cache(inv_freq: np.ndarray, max_position: int) -> np.ndarray:
    """(max_position, D) float32: row p is [cos(p f_0..f_{D/2-1}) | sin(...)]."""
    angles = np.outer(np.arange(max_position, dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def rope_ref(positions: np.ndarray, q: np.ndarray, k: np.ndarray, cos_sin: np.ndarray, is_neox: bool = True) -> None:
    """positions: (T,), q: (T, H, D), k: (T, Hkv, D), cos_sin: (max_pos, D). In place."""
    half = cos_sin.shape[1] // 2
    cos = cos_sin[positions, :half][:, None, :]  # (T, 1, D/2)
    sin = cos_sin[positions, half:][:, None, :]
    for x in (q, k):
        if is_neox:
            a, b = x[..., :half], x[..., half:]
        else:
            a, b = x[..., 0::2], x[..., 1::2]
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        a[...] = a32 * cos - b32 * sin
        b[...] = b32 * cos + a32 * sin
