"""SwiGLU's gate: silu_and_mul([g | u]) = silu(g) * u, with silu(g) = g * sigmoid(g)."""

from __future__ import annotations

import numpy as np


def silu_and_mul_ref(x: np.ndarray) -> np.ndarray:
    """x: (T, 2I) holding [gate | up] -> (T, I)."""
    d = x.shape[-1] // 2
    g = x[..., :d].astype(np.float32)
    u = x[..., d:].astype(np.float32)
    with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g gives silu = -0, correctly
        return (g / (1.0 + np.exp(-g)) * u).astype(x.dtype)
