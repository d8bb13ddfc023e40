"""Linear layers on bfloat16 weights kept as stored (uint16 bits): the reference.

    bf16_linear_ref(x, w, round_x=False)   y (T, N) = x (T, K) W (N, K)^T

W is a bf16 checkpoint's tensor as its raw bits; widening it is exact (rawpage/dtypes.py
bf16_to_f32), so the reference is a float32 product on the widened weights. round_x
rounds x to bf16 first, as vdpbf16ps needs (rawpage/native/half_matmul.c; bf16_gemm.c for the GEMM below).
"""

from __future__ import annotations

import numpy as np

from rawpage.dtypes import bf16_from_f32, bf16_to_f32


def bf16_linear_ref(x: np.ndarray, w: np.ndarray, round_x: bool = False) -> np.ndarray:
    """x (T, K) float, w (N, K) uint16 bf16 bits -> (T, N) float64, summed in float64."""
    if round_x:
        x = bf16_to_f32(bf16_from_f32(x))
    return np.asarray(x, np.float64) @ bf16_to_f32(w).astype(np.float64).T


def bf16_gemm_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """A vision tower's bf16 GEMM (rawpage/native/bf16_gemm.c): x (T, K) and w (N, K) float,
    both rounded to bf16, -> (T, N) float64 (+ bias), summed in float64. The kernel's
    float32 chain differs from it by float32 summation rounding only: every product of
    two bf16 values is exact."""
    y = bf16_linear_ref(x, bf16_from_f32(np.asarray(w, np.float32)), round_x=True)
    return y if bias is None else y + np.asarray(bias, np.float64)
