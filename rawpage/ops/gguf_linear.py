"""Linear layers on GGUF weights kept quantized: y = x @ W.T (+ bias).

W (N, K) is stored as in the .gguf file (the formats: quantization/gguf.py).
Decode batches (T <= GEMV_MAX_TOKENS) run a GEMV kernel that reads the blocks as
stored: by default the integer one (ops/gguf_mmvq.py: int8 activations, __dp4a,
each block read once for all T tokens); DECODE_KERNEL = "float" picks the float
dequantize-and-dot one below (exact activations, W read once per token). Larger
batches dequantize W into a dense scratch and run the backend's GEMM, which reads
it once for all T tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rawpage.ops.gemv import GEMV_MAX_TOKENS, GEMV_WARPS, gemv_buffers
from rawpage.ops.gguf_mmvq import launch_gguf_mmvq
from rawpage.ops.launch import KernelLoader, ceil_div, dtype_suffix
from rawpage.quantization.gguf import check_gguf_shape, gguf_dequantize_ref

DECODE_KERNEL = "mmvq"  # "mmvq" (int8 activations, __dp4a) or "float" (gguf_gemv below)


def gguf_linear_ref(
    x: np.ndarray, data: np.ndarray, qtype: str, shape: tuple[int, int], bias: np.ndarray | None = None
) -> np.ndarray:
    """x: (T, K) float32 -> (T, N)."""
    y = x @ gguf_dequantize_ref(data, qtype, shape).T
    return y + bias if bias is not None else y


# --- launch (cuda/gguf_linear.cu) --------------------------------------------------------
# gguf_gemv: grid (ceil(N / 8), T); a block is 8 warps, a warp computes one y[t, n].
# gguf_dequantize: grid (N); a block's 256 threads take the row's 32-value chunks in turn.


def launch_gguf_linear(
    xp: Any,
    loader: KernelLoader,
    x: Any,
    data: Any,
    qtype: str,
    shape: tuple[int, int],
    bias: Any,
    matmul: Callable[[Any, Any, Any], Any],
) -> Any:
    """x: (T, K) in the activation dtype -> (T, N). `matmul(x, w_dense, bias)` is the
    backend's dense GEMM, for batches past GEMV_MAX_TOKENS."""
    T = x.shape[0]
    if T > GEMV_MAX_TOKENS:
        return matmul(x, launch_gguf_dequantize(xp, loader, data, qtype, shape, x.dtype), bias)
    if DECODE_KERNEL == "mmvq":
        return launch_gguf_mmvq(xp, loader, x, data, qtype, shape, bias)
    if DECODE_KERNEL != "float":
        raise ValueError(f"DECODE_KERNEL is {DECODE_KERNEL!r}; it must be 'mmvq' or 'float'")
    return launch_gguf_gemv(xp, loader, x, data, qtype, shape, bias)


def launch_gguf_gemv(
    xp: Any, loader: KernelLoader, x: Any, data: Any, qtype: str, shape: tuple[int, int], bias: Any = None
) -> Any:
    """x: (T, K) -> (T, N), one warp per output value."""
    check_gguf_shape(qtype, shape, data)
    N, K = shape
    x, out = gemv_buffers(xp, x, N, K)
    if x.shape[0]:
        kernel = loader.get_function("gguf_linear.cu", f"gguf_gemv_{qtype}_{dtype_suffix(x)}")
        has_bias = bias is not None
        kernel(
            gemv_grid(N, x.shape[0]),
            (32 * GEMV_WARPS,),
            (out, x, data, bias if has_bias else x, np.int32(has_bias), np.int32(N), np.int32(K)),
        )
    return out


def gemv_grid(N: int, T: int) -> tuple[int, int]:
    """One warp per output value: GEMV_WARPS rows of y per block, a grid row per token."""
    return (ceil_div(N, GEMV_WARPS), T)


def launch_gguf_dequantize(
    xp: Any, loader: KernelLoader, data: Any, qtype: str, shape: tuple[int, int], dtype: Any
) -> Any:
    """(N, row_bytes) blocks -> a dense (N, K) weight in `dtype` (an activation dtype)."""
    check_gguf_shape(qtype, shape, data)
    N, K = shape
    out = xp.empty((N, K), dtype=dtype)
    kernel = loader.get_function("gguf_linear.cu", f"gguf_dequantize_{qtype}_{dtype_suffix(out)}")
    kernel((N,), (256,), (out, data, np.int32(K)))
    return out
