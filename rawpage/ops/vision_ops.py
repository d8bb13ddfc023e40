"""A vision tower's ops between its GEMMs (models/siglip.py), as NumPy references, and
VisionOps, which runs them: the backend gives the encoder one (Backend.vision_ops), the
CPU backend with its C kernels a subclass that runs native/vision_ops.c instead."""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.layer_ops import gelu_tanh_and_mul_ref


def layer_norm(x: np.ndarray, wb: tuple[np.ndarray, np.ndarray], eps: float) -> np.ndarray:
    """x (n, Dv): (x - mean) / sqrt(var + eps) * w + b over the last axis."""
    mu = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mu).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + np.float32(eps)) * wb[0] + wb[1]


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """gelu with the tanh approximation: the decoder's gated one, with a gate of ones."""
    return gelu_tanh_and_mul_ref(np.concatenate([x, np.ones_like(x)], axis=-1))


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """Each row of x (T, n) replaced by its softmax, in place."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


class VisionOps:
    """The ops on the host in NumPy; `threads` (the CPU backend's CpuThreads, or None) sets
    each image's thread count, BLAS's included, as the decoder's passes take theirs."""

    def __init__(self, threads: Any = None) -> None:
        self.threads = threads
        self.n = 1

    def begin(self, rows: int) -> None:
        """Before an image of `rows` patches."""
        if self.threads is not None:
            self.n = self.threads.set_for(rows)

    def layer_norm(self, x: np.ndarray, wb: tuple[np.ndarray, np.ndarray], eps: float) -> np.ndarray:
        return layer_norm(x, wb, eps)

    def bias_gelu(self, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
        """gelu_tanh(x + bias), in place."""
        x[...] = gelu_tanh(x + bias)
        return x

    def softmax(self, x: np.ndarray) -> np.ndarray:
        """Each row's softmax, in place."""
        return softmax_rows(x)
