"""Gated MLP activations on [gate | up]:
SwiGLU  silu_and_mul(x)      = silu(g) * u,  silu(g) = g * sigmoid(g)
GeGLU   gelu_tanh_and_mul(x) = gelu(g) * u,  gelu's tanh approximation (Gemma)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.launch import KernelLoader, ceil_div, data_ptr, dtype_suffix

# --- launch (cuda/activation.cu) -----------------------------------------------------
# Grid: flat over the output's 16-byte chunks, capped at the blocks the GPU holds
# at once (threads then stride by the grid). Block: 256 threads, one chunk each.

SILU_THREADS = 256
SILU_BLOCKS_PER_SM = 8  # 2048 resident threads per SM on sm_80 and sm_90


def launch_silu_and_mul(xp: Any, loader: KernelLoader, x: Any) -> Any:
    """x: (T, 2I) holding [gate | up] -> (T, I)."""
    x = xp.ascontiguousarray(x)
    T, d = x.shape[0], x.shape[1] // 2
    out = xp.empty((T, d), dtype=x.dtype)
    if T:
        vec = 16 // x.itemsize
        if d % vec or data_ptr(x) % 16 or data_ptr(out) % 16:
            vec = 1
        kernel = loader.get_function("activation.cu", f"silu_and_mul_{dtype_suffix(x)}_v{vec}")
        blocks = min(ceil_div(T * d // vec, SILU_THREADS), int(getattr(loader, "sm_count", 132)) * SILU_BLOCKS_PER_SM)
        kernel((blocks,), (SILU_THREADS,), (out, x, np.int32(d), np.int32(T)))
    return out


def silu_and_mul_ref(x: np.ndarray) -> np.ndarray:
    """x: (T, 2I) holding [gate | up] -> (T, I)."""
    d = x.shape[-1] // 2
    g = x[..., :d].astype(np.float32)  # a copy, in float32
    u = x[..., d:]
    # silu(g) * u = g / (1 + exp(-g)) * u, in place on one buffer (this op is hot on the CPU path).
    # exp(-g) -> inf for very negative g gives silu = -0, which is right.
    with np.errstate(over="ignore"):
        s = np.negative(g)
        np.exp(s, out=s)
        s += 1.0
        np.divide(g, s, out=s)
        s *= u
    return s.astype(x.dtype, copy=False)


def gelu_tanh_and_mul_ref(x: np.ndarray) -> np.ndarray:
    """x: (T, 2I) holding [gate | up] -> (T, I).
    gelu(g) ~= g/2 * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3)))"""
    d = x.shape[-1] // 2
    g = x[..., :d].astype(np.float32)
    inner = np.float32(np.sqrt(2.0 / np.pi)) * (g + np.float32(0.044715) * g * g * g)
    return (0.5 * g * (1.0 + np.tanh(inner)) * x[..., d:]).astype(x.dtype, copy=False)
