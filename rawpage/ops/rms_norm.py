"""RMSNorm, optionally fused with the residual add (Llama's pre-norm blocks).

rms_norm(x)            = x / sqrt(mean(x^2) + eps) * w
fused_add_rms_norm     : residual = x + residual; x = rms_norm(residual)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.launch import KernelLoader, ceil_div, data_ptr, dtype_suffix, same_dtype, threads_for


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
# Grid: min(T, resident blocks); each block walks rows T strided by the grid and
# keeps its slice of the weight in registers. Block: one thread per 16-byte
# chunk of a row (512 threads at dim 4096 in 16-bit), up to 1024; past that each
# thread holds N = 2 chunks (rows that are not 16-byte aligned go element by
# element, up to 8 a thread). The row stays in registers between its read and
# its write, so each byte moves once.

CHUNKS_PER_THREAD = {True: (1, 2), False: (1, 2, 4, 8)}  # as compiled, by vectorized
THREADS_PER_SM = 2048  # resident threads per SM on sm_80 and sm_90


def norm_launch(loader: KernelLoader, kernel: str, x: Any, *arrays: Any) -> tuple[Any, tuple[int], tuple[int]]:
    """(kernel function, grid, block) for a norm over the rows of contiguous x (T, dim)
    that also reads or writes `arrays` (the weight, the residual) in chunks."""
    T, dim = x.shape
    vec = 16 // x.itemsize
    if dim % vec or any(data_ptr(a) % 16 for a in (x, *arrays)):
        vec = 1  # rows not in 16-byte chunks: element by element
    chunks = dim // vec
    per_thread = CHUNKS_PER_THREAD[vec > 1]
    n = next((n for n in per_thread if chunks <= n * 1024), None)
    if n is None:
        longest = per_thread[-1] * 1024 * vec
        raise ValueError(f"rms_norm supports rows of up to {longest} elements of {x.dtype}, got {dim}")
    threads = threads_for(ceil_div(chunks, n))
    resident = int(getattr(loader, "sm_count", 132)) * max(1, THREADS_PER_SM // threads)
    fn = loader.get_function("rms_norm.cu", f"{kernel}_{dtype_suffix(x)}_v{vec}_n{n}")
    return fn, (min(T, resident),), (threads,)


def launch_rms_norm(xp: Any, loader: KernelLoader, x: Any, weight: Any, eps: float) -> Any:
    """x: (T, dim), weight: (dim,) -> (T, dim)."""
    same_dtype(x, weight)
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    T, dim = x.shape
    if T:
        kernel, grid, block = norm_launch(loader, "rms_norm", x, out, weight)
        kernel(grid, block, (out, x, weight, np.float32(eps), np.int32(dim), np.int32(T)))
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
        kernel, grid, block = norm_launch(loader, "fused_add_rms_norm", x, residual, weight)
        kernel(grid, block, (x, residual, weight, np.float32(eps), np.int32(dim), np.int32(T)))
    return x, residual
