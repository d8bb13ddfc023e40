"""GGUF Q8_0 blocks from float weights: llama.cpp's quantize step, in NumPy.

    quantize_q8_0(w)  w (N, K) float, K % 32 == 0 -> (N, K / 32 * 34) uint8 blocks

Per block of 32 consecutive values of a row:

    d = max_i |w_i| / 127          stored as float16 (2 bytes, little-endian)
    q_i = round(w_i * (1 / d))     int8, half away from zero; 0 where d = 0

so a block is 34 bytes, 1.0625 bytes a weight, and value i reads back as
f16(d) q_i (quantization/gguf.py gguf_dequantize_ref). Every step is float32 and
in the order of ggml's quantize_row_q8_0_ref (multiply by 1 / d, not divide by
d), so the bytes equal `gguf.quants.quantize(w, Q8_0)`'s bit for bit
(tests/test_q8_0.py). d is rounded to float16 after q is chosen from the float32
d, as ggml does: the stored values may differ from w by a little more than d / 2.
"""

from __future__ import annotations

import numpy as np

Q8_0_BLOCK, Q8_0_BYTES = 32, 34  # values and bytes per block


def quantize_q8_0(w: np.ndarray) -> np.ndarray:
    """w (N, K) float, K a multiple of 32 -> (N, K / 32 * 34) uint8 Q8_0 blocks."""
    N, K = w.shape
    if K % Q8_0_BLOCK:
        raise ValueError(f"Q8_0 quantizes whole 32-value blocks; a row of {K} values is not a multiple of 32")
    blocks = np.asarray(w, np.float32).reshape(N * K // Q8_0_BLOCK, Q8_0_BLOCK)  # (blocks, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)  # (blocks, 1)
    with np.errstate(divide="ignore"):
        inv_d = np.where(d == 0, np.float32(0), np.float32(1) / d)
    q = _round_half_away(blocks * inv_d).astype(np.int8)  # (blocks, 32), |q| <= 127
    out = np.empty((blocks.shape[0], Q8_0_BYTES), np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(N, K // Q8_0_BLOCK * Q8_0_BYTES)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: to nearest, halves away from zero (np.round rounds them to even).
    Exact in float32: the fraction a - floor(a) needs no rounding."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= 0.5), x)
