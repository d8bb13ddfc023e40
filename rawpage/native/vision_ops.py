"""vision_ops.c from Python: a vision tower's residual add + layer norm, GELUs and row
softmax, each matching its NumPy reference (ops/layer_ops.py, ops/paged_attention.py;
tests/native/test_vision_ops.py)."""

from __future__ import annotations

import numpy as np

from rawpage.native.layer_ops import fused_add_norm
from rawpage.native.library import NativeLibrary, addr, empty, float_rows


def fused_add_layer_norm(
    lib: NativeLibrary,
    x: np.ndarray,
    residual: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    eps: float,
    nthreads: int,
) -> tuple[np.ndarray, np.ndarray]:
    """x, residual: (T, dim) -> (layer_norm(x + residual) * weight + bias, x + residual),
    float32; as fused_add_rms_norm, the sum goes into residual's memory and the normed rows
    into x's where those are C-contiguous float32 (else into new arrays)."""
    return fused_add_norm(lib, "rp_fused_add_layer_norm", x, residual, eps, nthreads, weight=weight, bias=bias)


def _elementwise(lib: NativeLibrary, entry: str, x: np.ndarray, nthreads: int) -> np.ndarray:
    """x (T, n) -> entry's function of each element, (T, n) float32, a new array."""
    x, stride = float_rows(x)
    T, n = x.shape
    out = empty((T, n))
    if T:
        lib.call(entry, out=addr(out), x=addr(x), x_stride=stride, T=T, n=n, nthreads=nthreads)
    return out


def gelu_tanh(lib: NativeLibrary, x: np.ndarray, nthreads: int) -> np.ndarray:
    """x (T, n) -> gelu_tanh(x), (T, n) float32, a new array."""
    return _elementwise(lib, "rp_gelu_tanh", x, nthreads)


def gelu_erf(lib: NativeLibrary, x: np.ndarray, nthreads: int) -> np.ndarray:
    """x (T, n) -> gelu_erf(x) (the exact GELU), (T, n) float32, a new array."""
    return _elementwise(lib, "rp_gelu_erf", x, nthreads)


def softmax_rows(lib: NativeLibrary, x: np.ndarray, nthreads: int) -> np.ndarray:
    """Each row of x (T, n), float32 with contiguous rows, replaced by its softmax, in
    place; returns x."""
    if x.dtype != np.float32 or x.ndim != 2 or x.strides[1] != 4 or not x.flags.writeable:
        raise ValueError("softmax_rows: expected writable (T, n) float32 rows, each contiguous")
    if x.shape[0]:
        lib.call(
            "rp_softmax_rows", x=addr(x), x_stride=x.strides[0] // 4, T=x.shape[0], n=x.shape[1], nthreads=nthreads
        )
    return x
