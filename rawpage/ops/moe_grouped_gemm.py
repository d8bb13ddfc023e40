"""The experts of an MoE layer as one grouped GEMM (cuda/moe_grouped_gemm.cu).

Rows of x are (token, expert) pairs sorted by expert; expert e owns rows
offsets[e] .. offsets[e+1) and multiplies them by its own weight w[e]:

    out[offsets[e]:offsets[e+1]] = x[offsets[e]:offsets[e+1]] @ w[e].T

M = rows (T * top_k), E = experts, N = output features, K = input features.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.ops.launch import KernelLoader, dtype_suffix, same_dtype

BM, BN = 32, 64  # the float32 kernel's tile: rows of x, columns of out
THREADS = 256
MMA_BM, MMA_THREADS = 64, 128  # the tensor-core kernel (float16, bfloat16): 4 warps of 16 rows


def sort_by_expert(experts: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """experts: (T, k) the routing -> (order (T k,), offsets (E + 1,)): order lists the flat
    (token, slot) pairs t * k + j by expert, and expert e's pairs are order[offsets[e]:offsets[e+1]]."""
    flat = experts.ravel()
    order = np.argsort(flat, kind="stable").astype(np.int32)
    offsets = np.zeros(num_experts + 1, np.int32)
    np.cumsum(np.bincount(flat, minlength=num_experts), out=offsets[1:])
    return order, offsets


def grouped_gemm_ref(x: np.ndarray, w: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """x: (M, K), w: (E, N, K), offsets: (E + 1,) -> (M, N) float32."""
    out = np.zeros((x.shape[0], w.shape[1]), np.float32)
    for e in range(w.shape[0]):
        a, b = offsets[e], offsets[e + 1]
        out[a:b] = x[a:b].astype(np.float32) @ w[e].astype(np.float32).T
    return out


def grouped_gemm_flops(offsets: np.ndarray, N: int, K: int) -> int:
    """Multiply-adds x 2 of one grouped GEMM: only routed rows count, whatever E is."""
    return 2 * int(offsets[-1] - offsets[0]) * N * K


def row_tiles(offsets: np.ndarray, bm: int = BM) -> tuple[np.ndarray, np.ndarray]:
    """(tile_expert, tile_row), int32: every non-empty group cut into bm-row tiles."""
    sizes = np.diff(offsets)
    per = -(-sizes // bm)  # tiles per expert; 0 for an idle one
    tile_expert = np.repeat(np.arange(len(sizes), dtype=np.int32), per)
    first = np.repeat(offsets[:-1], per)
    within = np.arange(len(tile_expert)) - np.repeat(np.cumsum(per) - per, per)
    return tile_expert, (first + bm * within).astype(np.int32)


# --- launch ------------------------------------------------------------------------------
# Grid: (tiles, ceil(N / BN)); a block computes a tile of one expert's rows:
# float32: BM x BN on 256 threads; float16 / bfloat16: MMA_BM x BN on 4 warps (tensor cores).


def launch_grouped_gemm(xp: Any, loader: KernelLoader, x: Any, w: Any, offsets: np.ndarray) -> Any:
    """x: (M, K) sorted by expert, w: (E, N, K), offsets: (E + 1,) host int -> (M, N) in x's dtype."""
    x = xp.ascontiguousarray(x)
    same_dtype(x, w)
    (M, K), (E, N, K2) = x.shape, w.shape
    offsets = np.asarray(offsets, np.int32)
    if K != K2 or offsets.shape != (E + 1,) or offsets[0] != 0 or offsets[-1] != M or (np.diff(offsets) < 0).any():
        raise ValueError(f"grouped GEMM: x {x.shape}, w {w.shape} and offsets {offsets.tolist()} do not match")
    if not w.flags.c_contiguous:
        raise ValueError("grouped GEMM: the stacked expert weights must be contiguous (E, N, K)")
    out = xp.empty((M, N), dtype=x.dtype)
    suffix = dtype_suffix(x)
    mma = suffix != "f32"
    tile_expert, tile_row = row_tiles(offsets, MMA_BM if mma else BM)
    if len(tile_expert) and N:
        name = f"moe_grouped_gemm_mma_{suffix}" if mma else "moe_grouped_gemm_f32"
        args = (out, x, w, xp.asarray(tile_expert), xp.asarray(tile_row), xp.asarray(offsets), np.int32(N), np.int32(K))
        kernel = loader.get_function("moe_grouped_gemm.cu", name)
        kernel((len(tile_expert), -(-N // BN)), (MMA_THREADS if mma else THREADS,), args)
    return out
