"""The one int4 layout AWQ and GPTQ 4-bit checkpoints become at load, in NumPy.

The internal layout (kind "int4"), chosen for a kernel that walks a weight row
32 values at a time (cuda/int4_linear.cu):

    data   (N, K/8) uint32   nibble i of word j of row n = q[n, 8j + i], 0..15
    scales (N, K/G) float16  s[n, g]
    zeros  (N, K/G) float16  z[n, g], an integer 0..15
    W[n, c] = s[n, c // G] * (q[n, c] - z[n, c // G])      G = group size (K for "-1")
    perm   (K,) int32 or None: with GPTQ act-order the columns are stored sorted by
           group, column c being the checkpoint's input perm[c]; then
           y = x[:, perm] @ W.T, and each group is again G adjacent columns.

The checkpoint layouts, and their conversion to this one at load: loader/quantized_checkpoint.py.
"""

from __future__ import annotations

import numpy as np

AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # nibble i holds column 8j + AWQ_ORDER[i]
SHIFTS = np.arange(8, dtype=np.uint32) * 4


def unpack_nibbles(words: np.ndarray, axis: int) -> np.ndarray:
    """int32 words -> their 8 nibbles, low first, spread along `axis` (8x longer)."""
    w = words.view(np.uint32)
    nib = np.expand_dims(w, axis + 1) >> np.expand_dims(SHIFTS, tuple(i for i in range(w.ndim) if i != axis))
    nib = nib & 15  # (..., n, 8, ...) along axis
    shape = list(w.shape)
    shape[axis] *= 8
    return nib.reshape(shape).astype(np.uint8)


def pack_nibbles(q: np.ndarray, axis: int) -> np.ndarray:
    """Inverse of unpack_nibbles: values 0..15, 8 per int32 along `axis`, low nibble first."""
    q = np.moveaxis(q.astype(np.uint32), axis, -1)
    q = q.reshape(*q.shape[:-1], -1, 8)
    words = (q << SHIFTS).sum(axis=-1, dtype=np.uint32)
    return np.moveaxis(words, -1, axis).view(np.int32)


def int4_dequantize_ref(data: np.ndarray, scales: np.ndarray, zeros: np.ndarray, perm: np.ndarray | None) -> np.ndarray:
    """data (N, K/8), scales and zeros (N, K/G), perm (K,) or None, as drawn above ->
    float32 (N, K) in the checkpoint's column order."""
    q = unpack_nibbles(np.asarray(data).view(np.int32), axis=1).astype(np.float32)
    g = np.arange(q.shape[1]) // (q.shape[1] // scales.shape[1])
    dense = np.asarray(scales, np.float32)[:, g] * (q - np.asarray(zeros, np.float32)[:, g])
    if perm is not None:
        out = np.empty_like(dense)
        out[:, np.asarray(perm)] = dense
        return out
    return dense
