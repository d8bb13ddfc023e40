"""vision_ops.c from Python: a vision tower's layer norm, bias + GELU and row softmax,
each matching its NumPy reference in ops/vision_ops.py (tests/native/test_vision_ops.py),
and NativeVisionOps, the VisionOps of the CPU backend with its kernels loaded."""

from __future__ import annotations

import numpy as np

from rawpage.native.layer_ops import _weight as _vector
from rawpage.native.library import NativeLibrary, addr, empty, float_rows
from rawpage.ops.vision_ops import VisionOps


def _in_place_rows(x: np.ndarray) -> int:
    """The row stride of x, which a kernel writes in place: float32 rows, each contiguous."""
    if x.dtype != np.float32 or x.ndim != 2 or x.strides[1] != 4 or not x.flags.writeable:
        raise ValueError("expected writable (T, n) float32 rows, each contiguous")
    return x.strides[0] // 4


def layer_norm(lib: NativeLibrary, x: np.ndarray, wb: tuple[np.ndarray, np.ndarray], eps: float, nthreads: int):
    """x (T, n) -> (x - mean) / sqrt(var + eps) * w + b over each row, (T, n) float32, a new array."""
    x, stride = float_rows(x)
    T, n = x.shape
    out = empty((T, n))
    if T:
        w, b = _vector(wb[0]), _vector(wb[1])
        lib.call(
            "rp_layer_norm",
            out=addr(out),
            x=addr(x),
            x_stride=stride,
            weight=addr(w),
            bias=addr(b),
            T=T,
            n=n,
            eps=eps,
            nthreads=nthreads,
        )
    return out


def bias_gelu_tanh(lib: NativeLibrary, x: np.ndarray, bias: np.ndarray, nthreads: int) -> np.ndarray:
    """x (T, n) = gelu_tanh(x + bias), in place; returns x."""
    stride = _in_place_rows(x)
    if x.shape[0]:
        b = _vector(bias)
        lib.call(
            "rp_bias_gelu_tanh", x=addr(x), x_stride=stride, bias=addr(b), T=x.shape[0], n=x.shape[1], nthreads=nthreads
        )
    return x


def softmax_rows(lib: NativeLibrary, x: np.ndarray, nthreads: int) -> np.ndarray:
    """Each row of x (T, n) replaced by its softmax, in place; returns x."""
    stride = _in_place_rows(x)
    if x.shape[0]:
        lib.call("rp_softmax_rows", x=addr(x), x_stride=stride, T=x.shape[0], n=x.shape[1], nthreads=nthreads)
    return x


class NativeVisionOps(VisionOps):
    """The encoder's ops on the C kernels, on the image's thread count."""

    def __init__(self, lib: NativeLibrary, threads) -> None:
        super().__init__(threads)
        self.lib = lib

    def layer_norm(self, x: np.ndarray, wb: tuple[np.ndarray, np.ndarray], eps: float) -> np.ndarray:
        return layer_norm(self.lib, x, wb, eps, self.n)

    def bias_gelu(self, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
        return bias_gelu_tanh(self.lib, x, bias, self.n)

    def softmax(self, x: np.ndarray) -> np.ndarray:
        return softmax_rows(self.lib, x, self.n)
