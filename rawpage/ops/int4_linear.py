"""Linear layers on int4 weights (AWQ / GPTQ in the layout of quantization/int4.py):
y = x @ W.T (+ bias). As for GGUF (gguf_linear.py): the GEMV kernel for decode
batches, dequantize-to-scratch plus the backend's GEMM above GEMV_MAX_TOKENS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rawpage.ops.gemv import GEMV_MAX_TOKENS, GEMV_WARPS, gemv_buffers
from rawpage.ops.launch import KernelLoader, ceil_div, dtype_suffix, require_aligned
from rawpage.quantization.weight import QuantizedWeight, dequantize


def int4_linear_ref(x: np.ndarray, w: QuantizedWeight, bias: np.ndarray | None = None) -> np.ndarray:
    """x: (T, K) float32, in the checkpoint's column order -> (T, N)."""
    y = x @ dequantize(w).T
    return y + bias if bias is not None else y


def check_int4(w: QuantizedWeight) -> None:
    N, K = w.shape
    if K % 32 or w.group_size % 32 or K % w.group_size:
        raise ValueError(
            f"int4 weight {w.shape}, group size {w.group_size}: the kernels need K and the group "
            "size to be multiples of 32, and K a multiple of the group size"
        )
    if tuple(w.data.shape) != (N, K // 8) or tuple(w.scales.shape) != (N, K // w.group_size):
        raise ValueError(f"int4 weight {w.shape}: data {w.data.shape}, scales {w.scales.shape} do not match")
    require_aligned("int4 weight", w.data)  # the kernels read rows in 16-byte vectors


# --- launch (cuda/int4_linear.cu) --------------------------------------------------------
# int4_gemv: grid ceil(N / 8); a block is 8 warps, a warp computes y[:, n] for all T <= 8 tokens.
# int4_dequantize: grid (N); a block's 256 threads take the row's 32-value chunks in turn.


def launch_int4_linear(
    xp: Any, loader: KernelLoader, x: Any, w: QuantizedWeight, bias: Any, matmul: Callable[[Any, Any, Any], Any]
) -> Any:
    """x: (T, K) in the activation dtype -> (T, N)."""
    check_int4(w)
    if w.perm is not None:  # act-order: the columns are stored sorted by group
        x = xp.take(x, w.perm, axis=1)
    if x.shape[0] > GEMV_MAX_TOKENS:
        return matmul(x, launch_int4_dequantize(xp, loader, w, x.dtype), bias)
    return launch_int4_gemv(xp, loader, x, w, bias)


def launch_int4_gemv(xp: Any, loader: KernelLoader, x: Any, w: QuantizedWeight, bias: Any = None) -> Any:
    """x: (T, K) with columns in stored order (x[:, perm] for act-order) -> (T, N)."""
    check_int4(w)
    N, K = w.shape
    x, out = gemv_buffers(xp, x, N, K)
    T = x.shape[0]
    if T > GEMV_MAX_TOKENS:
        raise ValueError(f"int4_gemv takes at most {GEMV_MAX_TOKENS} tokens, got {T}")
    if T:
        kernel = loader.get_function("int4_linear.cu", f"int4_gemv_{dtype_suffix(x)}")
        has_bias = bias is not None
        args = (
            out,
            x,
            w.data,
            w.scales,
            w.zeros,
            bias if has_bias else x,
            np.int32(has_bias),
            np.int32(T),
            np.int32(N),
            np.int32(K),
            np.int32(w.group_size),
        )
        kernel((ceil_div(N, GEMV_WARPS),), (32 * GEMV_WARPS,), args)
    return out


def launch_int4_dequantize(xp: Any, loader: KernelLoader, w: QuantizedWeight, dtype: Any) -> Any:
    """-> dense (N, K) in `dtype`, columns in stored order."""
    check_int4(w)
    N, K = w.shape
    out = xp.empty((N, K), dtype=dtype)
    kernel = loader.get_function("int4_linear.cu", f"int4_dequantize_{dtype_suffix(out)}")
    kernel((N,), (256,), (out, w.data, w.scales, w.zeros, np.int32(K), np.int32(w.group_size)))
    return out
