"""Gated MLP activations on [gate | up]:
SwiGLU  silu_and_mul(x)      = silu(g) * u,  silu(g) = g * sigmoid(g)
GeGLU   gelu_tanh_and_mul(x) = gelu(g) * u,  gelu's tanh approximation (Gemma)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.launch import KernelLoader, dtype_suffix, threads_for

# --- launch (cuda/activation.cu) -----------------------------------------------------
# Grid: one block per token. Block: up to 1024 threads striding over the I outputs.


def launch_silu_and_mul(xp: Any, loader: KernelLoader, x: Any) -> Any:
    """x: (T, 2I) holding [gate | up] -> (T, I)."""
    x = xp.ascontiguousarray(x)
    T, d = x.shape[0], x.shape[1] // 2
    out = xp.empty((T, d), dtype=x.dtype)
    if T:
        kernel = loader.get_function("activation.cu", f"silu_and_mul_{dtype_suffix(x)}")
        kernel((T,), (threads_for(d),), (out, x, np.int32(d)))
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
