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
    ceil_div,
    data_ptr,
    dtype_suffix,
    int32_array,
    same_dtype,
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
# Grid: flat over (token, group of 8 heads, 16-byte chunk of a head vector), 128
# threads a block. A thread reads its chunk's cos/sin once and rotates that
# chunk of each of the group's heads, as 16-byte vectors.

ROPE_THREADS = 128
ROPE_HEAD_GROUP = 8  # heads that share one read of a chunk's cos/sin, as compiled


def _vector_width(q: Any, k: Any, cos_sin: Any, is_neox: bool) -> tuple[bool, int]:
    """(16-byte loads?, rotation pairs one thread takes per head). Vector loads need
    16-byte aligned rows and a head size that splits into whole vectors."""
    D = q.shape[-1]
    pairs = 16 // q.itemsize if is_neox else 16 // q.itemsize // 2
    aligned = all(data_ptr(a) % 16 == 0 for a in (q, k, cos_sin)) and all(
        (token_stride(a) * a.itemsize) % 16 == 0 for a in (q, k)
    )
    if aligned and (D // 2) % pairs == 0 and (D * 4) % 16 == 0:
        return True, pairs
    return False, 2 if is_neox else 1


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
    Hkv = k.shape[1]
    if cos_sin.dtype != np.float32 or cos_sin.shape[1] != D:
        raise ValueError(f"cos_sin must be float32 (max_pos, {D}), got {cos_sin.dtype} {cos_sin.shape}")
    if D % 4:
        raise ValueError(f"rope needs a head size that is a multiple of 4, got {D}")
    if T == 0:
        return
    # Rows must be contiguous; otherwise rotate a contiguous copy and write it back.
    q_work = q if token_stride(q) is not None else xp.ascontiguousarray(q)
    k_work = k if token_stride(k) is not None else xp.ascontiguousarray(k)
    cos_sin = xp.ascontiguousarray(xp.asarray(cos_sin))
    vector, pairs = _vector_width(q_work, k_work, cos_sin, is_neox)
    style = "neox" if is_neox else "gptj"
    kernel = loader.get_function("rope.cu", f"rope_{dtype_suffix(q)}_{style}{'' if vector else '_scalar'}")
    threads = T * ceil_div(H + Hkv, ROPE_HEAD_GROUP) * (D // 2 // pairs)
    args = (
        int32_array(xp, positions),
        q_work,
        k_work,
        cos_sin,
        np.int32(D),
        np.int32(H),
        np.int32(Hkv),
        np.int32(token_stride(q_work)),
        np.int32(token_stride(k_work)),
        np.int32(T),
    )
    kernel((ceil_div(threads, ROPE_THREADS),), (ROPE_THREADS,), args)
    if q_work is not q:
        q[...] = q_work
    if k_work is not k:
        k[...] = k_work
