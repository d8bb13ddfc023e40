"""Linear layers on FP8 e4m3 weights with per-row scales: y = x @ (s * e4m3(W)).T (+ bias).
The dequantization path (cuda/fp8_linear.cu): GEMV for decode batches,
dequantize-to-scratch plus the backend's GEMM above GEMV_MAX_TOKENS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rawpage.ops.gguf_linear import GEMV_MAX_TOKENS, GEMV_WARPS, gemv_buffers, gemv_grid
from rawpage.ops.launch import KernelLoader, dtype_suffix, require_aligned
from rawpage.quantization.fp8 import e4m3_to_f32
from rawpage.quantization.weight import QuantizedWeight


def fp8_dequantize_ref(w: QuantizedWeight) -> np.ndarray:
    """kind "fp8" -> float32 (N, K)."""
    return e4m3_to_f32(np.asarray(w.data)) * np.asarray(w.scales, np.float32)[:, None]


def check_fp8(w: QuantizedWeight) -> None:
    N, K = w.shape
    if K % 16 or tuple(w.data.shape) != (N, K) or tuple(w.scales.shape) != (N,):
        raise ValueError(
            f"fp8 weight {w.shape}: want (N, K) e4m3 bits with K a multiple of 16 and (N,) "
            f"scales; got {w.data.shape} and {w.scales.shape}"
        )
    require_aligned("fp8 weight", w.data)  # the GEMV reads rows in 16-byte vectors


# --- launch (cuda/fp8_linear.cu) ---------------------------------------------------------
# fp8_gemv: grid (ceil(N / 8), T); a block is 8 warps, a warp computes one y[t, n].
# fp8_dequantize: grid (N); a block's 256 threads stride over the row.


def launch_fp8_linear(
    xp: Any, loader: KernelLoader, x: Any, w: QuantizedWeight, bias: Any, matmul: Callable[[Any, Any, Any], Any]
) -> Any:
    """x: (T, K) in the activation dtype -> (T, N)."""
    check_fp8(w)
    if x.shape[0] > GEMV_MAX_TOKENS:
        return matmul(x, launch_fp8_dequantize(xp, loader, w, x.dtype), bias)
    N, K = w.shape
    x, out = gemv_buffers(xp, x, N, K)
    if x.shape[0]:
        kernel = loader.get_function("fp8_linear.cu", f"fp8_gemv_{dtype_suffix(x)}")
        has_bias = bias is not None
        args = (out, x, w.data, w.scales, bias if has_bias else x, np.int32(has_bias), np.int32(N), np.int32(K))
        kernel(gemv_grid(N, x.shape[0]), (32 * GEMV_WARPS,), args)
    return out


def launch_fp8_dequantize(xp: Any, loader: KernelLoader, w: QuantizedWeight, dtype: Any) -> Any:
    check_fp8(w)
    N, K = w.shape
    out = xp.empty((N, K), dtype=dtype)
    kernel = loader.get_function("fp8_linear.cu", f"fp8_dequantize_{dtype_suffix(out)}")
    kernel((N,), (256,), (out, w.data, w.scales, np.int32(K)))
    return out
