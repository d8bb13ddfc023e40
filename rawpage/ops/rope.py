"""Rotary position embedding (RoPE), applied to q and k in place.

For each head vector x of size D and position p, pairs of lanes (a, b) are
rotated by the angle p * inv_freq[j]:
    a' = a cos - b sin,   b' = b cos + a sin
NeoX style pairs lane j with j + D/2 (Hugging Face's Llama); GPT-J style pairs
lanes 2j and 2j + 1 (llama.cpp's native layout).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.launch import (
    KernelLoader,
    dtype_suffix,
    int32_array,
    same_dtype,
    threads_for,
    token_stride,
)


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


# --- launch (cuda/rope.cu) -----------------------------------------------------------
# Grid: one block per token. Block: threads striding over that token's
# (H + Hkv) * D/2 rotation pairs.


def launch_rope(
    xp: Any,
    loader: KernelLoader,
    positions: Any,
    q: Any,
    k: Any,
    cos_sin: Any,
    is_neox: bool = True,
) -> None:
    """positions: (T,) int32, q: (T, H, D), k: (T, Hkv, D), cos_sin: (max_pos, D) float32.
    In place; q and k may be views into a wider buffer (the fused qkv output)."""
    same_dtype(q, k)
    T, H, D = q.shape
    if cos_sin.dtype != np.float32 or cos_sin.shape[1] != D:
        raise ValueError(f"cos_sin must be float32 (max_pos, {D}), got {cos_sin.dtype} {cos_sin.shape}")
    if T == 0:
        return
    # Rows must be contiguous; otherwise rotate a contiguous copy and write it back.
    q_work = q if token_stride(q) is not None else xp.ascontiguousarray(q)
    k_work = k if token_stride(k) is not None else xp.ascontiguousarray(k)
    kernel = loader.get_function("rope.cu", f"rope_{dtype_suffix(q)}")
    args = (
        int32_array(xp, positions),
        q_work,
        k_work,
        xp.ascontiguousarray(xp.asarray(cos_sin)),
        np.int32(D),
        np.int32(H),
        np.int32(k.shape[1]),
        np.int32(token_stride(q_work)),
        np.int32(token_stride(k_work)),
        np.int32(bool(is_neox)),
    )
    kernel((T,), (threads_for((H + k.shape[1]) * D // 2, 512),), args)
    if q_work is not q:
        q[...] = q_work
    if k_work is not k:
        k[...] = k_work
