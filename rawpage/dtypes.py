"""Activation dtypes and how arrays store them.

NumPy and CuPy have no bfloat16, so a bfloat16 array is stored as its raw 16
bits in a uint16 array, which the kernels read as __nv_bfloat16. In rawpage a
uint16 activation, weight or cache array always means bfloat16.

The conversions work on NumPy and CuPy arrays alike (they use only array
methods and operators). float32 -> bfloat16 rounds to nearest even, as
__float2bfloat16_rn does; bfloat16 -> float32 is exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BFLOAT16 = np.dtype(np.uint16)  # the storage of bfloat16
STORAGE = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": BFLOAT16,
}


def storage_dtype(name: str | np.dtype | type) -> np.dtype:
    """'float32' | 'float16' | 'bfloat16' (or a storage dtype) -> the array dtype that holds it."""
    if isinstance(name, str):
        if name not in STORAGE:
            raise ValueError(f"unknown dtype {name!r}; choose float32, float16 or bfloat16")
        return STORAGE[name]
    dt = np.dtype(name)
    if dt not in STORAGE.values():
        raise ValueError(f"{dt} is not an activation dtype (float32, float16, or uint16 = bfloat16)")
    return dt


def dtype_name(storage: np.dtype) -> str:
    return {v: k for k, v in STORAGE.items()}[np.dtype(storage)]


def bf16_from_f32(x: Any) -> Any:
    """float array -> uint16 bfloat16 bits, round to nearest even; NaN stays NaN."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    # np.where rather than a boolean-mask store: on CuPy arrays (through NumPy's
    # __array_function__) it stays one elementwise kernel, with no host sync.
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def bf16_to_f32(b: Any) -> Any:
    """uint16 bfloat16 bits -> float32, exactly."""
    return (b.astype(np.uint32) << 16).view(np.float32)


def to_float32(x: Any) -> Any:
    """Any activation array -> float32 (no copy if it already is)."""
    if x.dtype == BFLOAT16:
        return bf16_to_f32(x)
    return x.astype(np.float32, copy=False)


def from_float32(x: Any, storage: np.dtype) -> Any:
    """float32 array -> the given storage dtype, rounding to nearest even."""
    if np.dtype(storage) == BFLOAT16:
        return bf16_from_f32(x)
    return x.astype(storage, copy=False)
