"""GGUF decode with integer dot products (cuda/gguf_mmvq.cu, llama.cpp's MMVQ idea).

x (T, K) is quantized to int8 per 32-value chunk, xq = round(x / dx) with
dx = max|x| / 127 over the chunk; then y = (dx xq) @ W.T (+ bias), each chunk's
dot product done in integers with __dp4a. The only difference from the exact
product is the activation's rounding (at most dx / 2 per value, about 0.4% of
the chunk's largest value), as in llama.cpp.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.gemv import GEMV_MAX_TOKENS, GEMV_WARPS
from rawpage.ops.launch import KernelLoader, ceil_div, dtype_suffix, require_aligned
from rawpage.quantization.gguf import check_gguf_shape, gguf_dequantize_ref


def quantize_q8_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x: (T, K), K a multiple of 32 -> (xq (T, K) int8, dx (T, K / 32) float32),
    with the kernel's float32 arithmetic (round half to even, as rintf)."""
    T, K = x.shape
    chunks = x.astype(np.float32).reshape(T, K // 32, 32)
    dx = np.abs(chunks).max(axis=2) / np.float32(127)  # (T, K / 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(dx[..., None] > 0, np.rint(chunks / dx[..., None]), 0)
    return q.astype(np.int8).reshape(T, K), dx.astype(np.float32)


def gguf_mmvq_ref(
    x: np.ndarray, data: np.ndarray, qtype: str, shape: tuple[int, int], bias: np.ndarray | None = None
) -> np.ndarray:
    """x: (T, K) float32 -> (T, N): the exact product with x replaced by dx * xq."""
    xq, dx = quantize_q8_ref(x)
    T, K = x.shape
    x_rounded = (xq.reshape(T, K // 32, 32).astype(np.float32) * dx[..., None]).reshape(T, K)
    y = x_rounded @ gguf_dequantize_ref(data, qtype, shape).T
    return y + bias if bias is not None else y


# --- launch ------------------------------------------------------------------------------
# quantize_q8: grid ceil(T K / 32 / 8); a warp quantizes one 32-value chunk, a lane one value.
# gguf_mmvq:   grid ceil(N / 8); a block is 8 warps, a warp computes y[:, n] for all T tokens.


def launch_quantize_q8(xp: Any, loader: KernelLoader, x: Any) -> tuple[Any, Any]:
    """x: (T, K) activation dtype, K % 32 == 0 -> (xq (T, K) int8, dx (T, K / 32) float32)."""
    x = xp.ascontiguousarray(x)
    T, K = x.shape
    if K % 32:
        raise ValueError(f"activation quantization works on 32-value chunks; K = {K} is not a multiple of 32")
    xq = xp.empty((T, K), dtype=np.int8)
    dx = xp.empty((T, K // 32), dtype=np.float32)
    chunks = T * K // 32
    if chunks:
        kernel = loader.get_function("gguf_mmvq.cu", f"quantize_q8_{dtype_suffix(x)}")
        kernel((ceil_div(chunks, GEMV_WARPS),), (32 * GEMV_WARPS,), (xq, dx, x, np.int32(chunks)))
    return xq, dx


def launch_gguf_mmvq(
    xp: Any, loader: KernelLoader, x: Any, data: Any, qtype: str, shape: tuple[int, int], bias: Any = None
) -> Any:
    """x: (T, K), T <= GEMV_MAX_TOKENS -> (T, N) in x's dtype."""
    check_gguf_shape(qtype, shape, data)
    N, K = shape
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"x has shape {x.shape}, the weight wants (T, {K})")
    T = x.shape[0]
    if T > GEMV_MAX_TOKENS:
        raise ValueError(f"gguf_mmvq takes at most {GEMV_MAX_TOKENS} tokens, got {T}")
    out = xp.empty((T, N), dtype=x.dtype)
    if T:
        xq, dx = launch_quantize_q8(xp, loader, x)
        require_aligned("xq", xq, K)  # a lane reads its chunk's 32 int8 as two 16-byte vectors
        kernel = loader.get_function("gguf_mmvq.cu", f"gguf_mmvq_{qtype}_{dtype_suffix(x)}")
        has_bias = bias is not None
        args = (out, xq, dx, data, bias if has_bias else out, np.int32(has_bias), np.int32(T), np.int32(N), np.int32(K))
        kernel((ceil_div(N, GEMV_WARPS),), (32 * GEMV_WARPS,), args)
    return out
