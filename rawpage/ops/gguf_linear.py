"""Linear layers on GGUF weights kept quantized: y = x @ W.T (+ bias).

W (N, K) is stored as in the .gguf file: each row a run of blocks of `block`
values in `type_size` bytes (the formats are drawn in cuda/gguf_linear.cu).
Decode batches (T <= GEMV_MAX_TOKENS) run a GEMV kernel that reads the blocks as
stored: by default the integer one (ops/gguf_mmvq.py: int8 activations, __dp4a,
each block read once for all T tokens); DECODE_KERNEL = "float" picks the float
dequantize-and-dot one below (exact activations, W read once per token). Larger
batches dequantize W into a dense scratch and run the backend's GEMM, which reads
it once for all T tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rawpage.ops.launch import KernelLoader, ceil_div, dtype_suffix, require_aligned

# The block formats kept quantized on sim and cuda: name -> (values, bytes) per block.
GGUF_BLOCKS = {
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}

# The crossover: tokens up to which the GEMV kernels run, above which the weight is
# dequantized to a scratch and multiplied by cuBLAS. Not measured yet (no GPU in the
# task that set it): the GEMV's cost grows with T (its math, and for the float kernel
# W read T times, mostly from L2); the scratch path costs a write and a read of a
# dense W plus a GEMM that is flat in T up to ~64. tools/gpu_check/quant.py times
# both paths at T = 1, 2, 4, 8, 16 and records where they cross. The integer
# kernel holds at most this many tokens (cuda/gguf_mmvq.cu kMaxTokens).
GEMV_MAX_TOKENS = 8
GEMV_WARPS = 8  # output rows per block of the GEMV kernels
DECODE_KERNEL = "mmvq"  # "mmvq" (int8 activations, __dp4a) or "float" (gguf_gemv below)


def gguf_dequantize_ref(data: np.ndarray, qtype: str, shape: tuple[int, int]) -> np.ndarray:
    """(N, row_bytes) uint8 blocks -> (N, K) float32, by the `gguf` package (llama.cpp's
    own Python port of its dequantizers), independent of our kernel."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(np.asarray(data), GGMLQuantizationType[qtype]).astype(np.float32).reshape(shape)


def gguf_linear_ref(
    x: np.ndarray, data: np.ndarray, qtype: str, shape: tuple[int, int], bias: np.ndarray | None = None
) -> np.ndarray:
    """x: (T, K) float32 -> (T, N)."""
    y = x @ gguf_dequantize_ref(data, qtype, shape).T
    return y + bias if bias is not None else y


def check_gguf_shape(qtype: str, shape: tuple[int, int], data: Any) -> None:
    if qtype not in GGUF_BLOCKS:
        raise ValueError(f"GGUF type {qtype} is not kept quantized (supported: {', '.join(GGUF_BLOCKS)})")
    block, size = GGUF_BLOCKS[qtype]
    N, K = shape
    if K % block or tuple(data.shape) != (N, K // block * size) or data.dtype != np.uint8:
        raise ValueError(
            f"{qtype} weight {shape}: want ({N}, {K // block * size}) uint8 blocks, "
            f"K a multiple of {block}; got {tuple(data.shape)} {data.dtype}"
        )


# --- launch (cuda/gguf_linear.cu) --------------------------------------------------------
# gguf_gemv: grid (ceil(N / 8), T); a block is 8 warps, a warp computes one y[t, n].
# gguf_dequantize: grid (N); a block's 256 threads take the row's 32-value chunks in turn.


def launch_gguf_linear(
    xp: Any,
    loader: KernelLoader,
    x: Any,
    data: Any,
    qtype: str,
    shape: tuple[int, int],
    bias: Any,
    matmul: Callable[[Any, Any, Any], Any],
) -> Any:
    """x: (T, K) in the activation dtype -> (T, N). `matmul(x, w_dense, bias)` is the
    backend's dense GEMM, for batches past GEMV_MAX_TOKENS."""
    T = x.shape[0]
    if T > GEMV_MAX_TOKENS:
        return matmul(x, launch_gguf_dequantize(xp, loader, data, qtype, shape, x.dtype), bias)
    if DECODE_KERNEL == "mmvq":
        from rawpage.ops.gguf_mmvq import launch_gguf_mmvq  # (it imports this module's checks)

        return launch_gguf_mmvq(xp, loader, x, data, qtype, shape, bias)
    if DECODE_KERNEL != "float":
        raise ValueError(f"DECODE_KERNEL is {DECODE_KERNEL!r}; it must be 'mmvq' or 'float'")
    return launch_gguf_gemv(xp, loader, x, data, qtype, shape, bias)


def launch_gguf_gemv(
    xp: Any, loader: KernelLoader, x: Any, data: Any, qtype: str, shape: tuple[int, int], bias: Any = None
) -> Any:
    """x: (T, K) -> (T, N), one warp per output value."""
    check_gguf_shape(qtype, shape, data)
    N, K = shape
    x, out = gemv_buffers(xp, x, N, K)
    if x.shape[0]:
        kernel = loader.get_function("gguf_linear.cu", f"gguf_gemv_{qtype}_{dtype_suffix(x)}")
        has_bias = bias is not None
        kernel(
            gemv_grid(N, x.shape[0]),
            (32 * GEMV_WARPS,),
            (out, x, data, bias if has_bias else x, np.int32(has_bias), np.int32(N), np.int32(K)),
        )
    return out


def gemv_buffers(xp: Any, x: Any, N: int, K: int) -> tuple[Any, Any]:
    """The GEMV kernels' input, checked (T, K), contiguous, rows 16-byte aligned, and output (T, N)."""
    x = xp.ascontiguousarray(x)
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"x has shape {x.shape}, the weight wants (T, {K})")
    require_aligned("x", x, K * x.itemsize)
    return x, xp.empty((x.shape[0], N), dtype=x.dtype)


def gemv_grid(N: int, T: int) -> tuple[int, int]:
    """One warp per output value: GEMV_WARPS rows of y per block, a grid row per token."""
    return (ceil_div(N, GEMV_WARPS), T)


def launch_gguf_dequantize(
    xp: Any, loader: KernelLoader, data: Any, qtype: str, shape: tuple[int, int], dtype: Any
) -> Any:
    """(N, row_bytes) blocks -> a dense (N, K) weight in `dtype` (an activation dtype)."""
    check_gguf_shape(qtype, shape, data)
    N, K = shape
    out = xp.empty((N, K), dtype=dtype)
    kernel = loader.get_function("gguf_linear.cu", f"gguf_dequantize_{qtype}_{dtype_suffix(out)}")
    kernel((N,), (256,), (out, data, np.int32(K)))
    return out
