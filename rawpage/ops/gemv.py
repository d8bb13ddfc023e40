"""What the GEMV kernels of the quantized Linear layers share (gguf_linear, gguf_mmvq,
int4_linear, fp8_linear): how many tokens one launch holds, the rows of y a block
computes, and their checked input and output buffers."""

from __future__ import annotations

from typing import Any

from rawpage.ops.launch import require_aligned

# The crossover: tokens up to which the GEMV kernels run, above which the weight is
# dequantized to a scratch and multiplied by cuBLAS. Not measured yet (no GPU in the
# task that set it): the GEMV's cost grows with T (its math, and for the float kernel
# W read T times, mostly from L2); the scratch path costs a write and a read of a
# dense W plus a GEMM that is flat in T up to ~64. tools/gpu_check/quant.py times
# both paths at T = 1, 2, 4, 8, 16 and records where they cross. The multi-token
# kernels hold at most this many (kMaxTokens in cuda/gemv.cuh, which they include;
# the launch code reads this one).
GEMV_MAX_TOKENS = 8
GEMV_WARPS = 8  # output rows per block of the GEMV kernels


def gemv_buffers(xp: Any, x: Any, N: int, K: int) -> tuple[Any, Any]:
    """The GEMV kernels' input, checked (T, K), contiguous, rows 16-byte aligned, and output (T, N)."""
    x = xp.ascontiguousarray(x)
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"x has shape {x.shape}, the weight wants (T, {K})")
    require_aligned("x", x, K * x.itemsize)
    return x, xp.empty((x.shape[0], N), dtype=x.dtype)
