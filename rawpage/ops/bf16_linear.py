"""Linear layers on bfloat16 weights kept as stored (uint16 bits): the reference.

    bf16_linear_ref(x, w, round_x=False)   y (T, N) = x (T, K) W (N, K)^T

W is a bf16 checkpoint's tensor as its raw bits; widening it is exact (rawpage/dtypes.py
bf16_to_f32), so the reference is a float32 product on the widened weights. round_x
rounds x to bf16 first, as vdpbf16ps needs (rawpage/native/bf16_matmul.c).
"""

from __future__ import annotations

import numpy as np

from rawpage.dtypes import bf16_from_f32, bf16_to_f32


def bf16_linear_ref(x: np.ndarray, w: np.ndarray, round_x: bool = False) -> np.ndarray:
    """x (T, K) float, w (N, K) uint16 bf16 bits -> (T, N) float64, summed in float64."""
    if round_x:
        x = bf16_to_f32(bf16_from_f32(x))
    return np.asarray(x, np.float64) @ bf16_to_f32(w).astype(np.float64).T
