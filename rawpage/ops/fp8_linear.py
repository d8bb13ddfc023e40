"""Linear layers on FP8 e4m3 weights with per-row scales: y = x @ (s * e4m3(W)).T (+ bias).

Decode batches (T <= GEMV_MAX_TOKENS) run the GEMV on the e4m3 bytes. Above that:
- with an FP8 GEMM (cuBLASLt on sm_89 / sm_90, rawpage/backends/cublaslt_fp8.py):
  x is quantized to e4m3 with a scale per token, multiplied in FP8 to a float32 D,
  and D is scaled per token and per channel: y = D sx[t] s[n] (+ bias);
- elsewhere: W dequantized to a dense scratch and the backend's GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rawpage.ops.gemv import GEMV_MAX_TOKENS, GEMV_WARPS, gemv_buffers
from rawpage.ops.launch import KernelLoader, ceil_div, dtype_suffix, require_aligned
from rawpage.quantization.fp8 import E4M3_MAX, e4m3_from_f32, e4m3_to_f32, fp8_dequantize_ref
from rawpage.quantization.weight import QuantizedWeight


def check_fp8(w: QuantizedWeight) -> None:
    N, K = w.shape
    if K % 16 or tuple(w.data.shape) != (N, K) or tuple(w.scales.shape) != (N,):
        raise ValueError(
            f"fp8 weight {w.shape}: want (N, K) e4m3 bits with K a multiple of 16 and (N,) "
            f"scales; got {w.data.shape} and {w.scales.shape}"
        )
    require_aligned("fp8 weight", w.data)  # the GEMV reads rows in 16-byte vectors


# --- launch (cuda/fp8_linear.cu) ---------------------------------------------------------
# fp8_gemv: grid ceil(N / 8); a block is 8 warps, a warp computes y[:, n] for all T <= 8 tokens.
# fp8_dequantize: grid (N); a block's 256 threads stride over the row.


# Fp8Gemm(N, T, K, w, xq, d): d (T, N) float32 = xq (T, K) e4m3 @ w (N, K) e4m3 ^T, on arrays.
Fp8Gemm = Callable[[int, int, int, Any, Any, Any], None]


def launch_fp8_linear(
    xp: Any,
    loader: KernelLoader,
    x: Any,
    w: QuantizedWeight,
    bias: Any,
    matmul: Callable[[Any, Any, Any], Any],
    fp8_gemm: Fp8Gemm | None = None,
) -> Any:
    """x: (T, K) in the activation dtype -> (T, N). fp8_gemm: the backend's FP8 GEMM
    for prefill batches, or None (dequantize and `matmul`)."""
    check_fp8(w)
    if x.shape[0] > GEMV_MAX_TOKENS:
        if fp8_gemm is not None and w.shape[0] % 16 == 0:  # cuBLASLt wants ld = N a multiple of 16
            return launch_fp8_gemm_linear(xp, loader, x, w, bias, fp8_gemm)
        return matmul(x, launch_fp8_dequantize(xp, loader, w, x.dtype), bias)
    N, K = w.shape
    x, out = gemv_buffers(xp, x, N, K)
    if x.shape[0]:
        kernel = loader.get_function("fp8_linear.cu", f"fp8_gemv_{dtype_suffix(x)}")
        has_bias = bias is not None
        T = x.shape[0]  # <= GEMV_MAX_TOKENS: the kernel's per-token accumulators
        args = (
            out,
            x,
            w.data,
            w.scales,
            bias if has_bias else x,
            np.int32(has_bias),
            np.int32(T),
            np.int32(N),
            np.int32(K),
        )
        kernel((ceil_div(N, GEMV_WARPS),), (32 * GEMV_WARPS,), args)
    return out


def launch_fp8_dequantize(xp: Any, loader: KernelLoader, w: QuantizedWeight, dtype: Any) -> Any:
    check_fp8(w)
    N, K = w.shape
    out = xp.empty((N, K), dtype=dtype)
    kernel = loader.get_function("fp8_linear.cu", f"fp8_dequantize_{dtype_suffix(out)}")
    kernel((N,), (256,), (out, w.data, w.scales, np.int32(K)))
    return out


# --- the FP8 GEMM path -------------------------------------------------------------------
# fp8_quantize_rows: grid (T); a block's 256 threads stride over one token's row.
# fp8_scale_output:  grid flat over T N, at most 4096 blocks of 256 threads (they stride).


def fp8_quantize_rows_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x: (T, K) -> (xq (T, K) e4m3 bits, sx (T,) float32), sx = max|x[t]| / 448."""
    x = x.astype(np.float32)
    sx = np.abs(x).max(axis=1) / np.float32(E4M3_MAX)
    inv = np.where(sx > 0, np.float32(1) / np.where(sx > 0, sx, 1), 0).astype(np.float32)
    return e4m3_from_f32(x * inv[:, None]), sx.astype(np.float32)


def fp8_gemm_linear_ref(x: np.ndarray, w: QuantizedWeight, bias: np.ndarray | None = None) -> np.ndarray:
    """What the FP8 GEMM path computes: the product with x rounded to e4m3 per token."""
    xq, sx = fp8_quantize_rows_ref(x)
    y = (e4m3_to_f32(xq) * sx[:, None]) @ fp8_dequantize_ref(w.data, w.scales).T
    return y + bias if bias is not None else y


def launch_fp8_gemm_linear(
    xp: Any, loader: KernelLoader, x: Any, w: QuantizedWeight, bias: Any, fp8_gemm: Fp8Gemm
) -> Any:
    """x: (T, K) -> (T, N): quantize rows, FP8 GEMM to float32, scale (+ bias) to x's dtype."""
    x = xp.ascontiguousarray(x)
    (T, K), N = x.shape, w.shape[0]
    out = xp.empty((T, N), dtype=x.dtype)
    if T == 0:
        return out
    suffix = dtype_suffix(x)
    xq, sx = xp.empty((T, K), dtype=np.uint8), xp.empty(T, dtype=np.float32)
    loader.get_function("fp8_linear.cu", f"fp8_quantize_rows_{suffix}")((T,), (256,), (xq, sx, x, np.int32(K)))
    d = xp.empty((T, N), dtype=np.float32)
    fp8_gemm(N, T, K, w.data, xq, d)
    has_bias = bias is not None
    blocks = min(ceil_div(T * N, 256), 4096)
    args = (out, d, sx, w.scales, bias if has_bias else out, np.int32(has_bias), np.int32(T), np.int32(N))
    loader.get_function("fp8_linear.cu", f"fp8_scale_output_{suffix}")((blocks,), (256,), args)
    return out
