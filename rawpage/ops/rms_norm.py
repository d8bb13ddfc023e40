"""RMSNorm, optionally fused with the residual add (Llama's pre-norm blocks).

rms_norm(x)            = x / sqrt(mean(x^2) + eps) * w
fused_add_rms_norm     : residual = x + residual; x = rms_norm(residual)
"""

from __future__ import annotations

import numpy as np


def rms_norm_ref(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (T, dim), weight: (dim,) -> (T, dim), computed in float32."""
    xf = x.astype(np.float32, copy=False)
    inv_rms = 1.0 / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return ((xf * inv_rms) * weight.astype(np.float32, copy=False)).astype(x.dtype, copy=False)


def fused_add_rms_norm_ref(
    x: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """x, residual: (T, dim) -> (normed, new residual = x + residual)."""
    residual = (x.astype(np.float32) + residual.astype(np.float32)).astype(x.dtype)
    return rms_norm_ref(residual, weight, eps), residual
