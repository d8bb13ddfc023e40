"""RMSNorm, optionally fused with the residual add (Llama's pre-norm blocks).

rms_norm(x)            = x / sqrt(mean(x^2) + eps) * w
fused_add_rms_norm     : residual = x + residual; x = rms_norm(residual)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.launch import KernelLoader, dtype_suffix, same_dtype, threads_for


def rms_norm_ref(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (T, dim), weight: (dim,) -> (T, dim), computed in float32."""
    xf = x.astype(np.float32, copy=False)
    inv_rms = 1.0 / np.sqrt(np.einsum("td,td->t", xf, xf)[:, None] / xf.shape[-1] + eps)  # (T, 1)
    out = xf * inv_rms
    out *= weight.astype(np.float32, copy=False)
    return out.astype(x.dtype, copy=False)


def fused_add_rms_norm_ref(
    x: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """x, residual: (T, dim) -> (normed, new residual = x + residual)."""
    residual = (x.astype(np.float32, copy=False) + residual.astype(np.float32, copy=False)).astype(x.dtype, copy=False)
    return rms_norm_ref(residual, weight, eps), residual


# --- launch (cuda/rms_norm.cu) -------------------------------------------------------
# Grid: one block per token row. Block: up to 256 threads striding over dim
# (16 elements each at dim 4096), reducing the sum of squares across the block.
# 256 rather than 1024: a row is only a few KiB, and smaller blocks keep more
# rows in flight when T is large (and cost the simulator 4x fewer fibers).


def launch_rms_norm(xp: Any, loader: KernelLoader, x: Any, weight: Any, eps: float) -> Any:
    """x: (T, dim), weight: (dim,) -> (T, dim)."""
    same_dtype(x, weight)
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    T, dim = x.shape
    if T:
        kernel = loader.get_function("rms_norm.cu", f"rms_norm_{dtype_suffix(x)}")
        kernel((T,), (threads_for(dim, 256),), (out, x, weight, np.float32(eps), np.int32(dim)))
    return out


def launch_fused_add_rms_norm(
    xp: Any, loader: KernelLoader, x: Any, residual: Any, weight: Any, eps: float
) -> tuple[Any, Any]:
    """x, residual: (T, dim) -> (rms_norm(x + residual), x + residual), in x's and
    residual's memory when they are contiguous."""
    same_dtype(x, residual, weight)
    x, residual = xp.ascontiguousarray(x), xp.ascontiguousarray(residual)
    T, dim = x.shape
    if T:
        kernel = loader.get_function("rms_norm.cu", f"fused_add_rms_norm_{dtype_suffix(x)}")
        kernel((T,), (threads_for(dim, 256),), (x, residual, weight, np.float32(eps), np.int32(dim)))
    return x, residual
