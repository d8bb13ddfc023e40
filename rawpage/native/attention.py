"""Paged attention on the CPU kernels (paged_attention.c): a whole batch of decodes
and prefill chunks in one call, K/V read through the block table, float32 or
float16 caches. Same contract as rawpage.ops.paged_attention.paged_attention_ref.
"""

from __future__ import annotations

import numpy as np

from rawpage.native.library import NativeLibrary, addr, empty, float_rows, int32_rows
from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions

KV_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}  # the kernel's kv_dtype
MAX_HEAD_SIZE = 256  # the kernel's per-tile buffers (RP_ATTN_MAX_D)


def check_caches(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray) -> int:
    """The kernel's kv_dtype for these caches, or an error saying what does not fit."""
    kv_dtype = KV_DTYPES.get(k_cache.dtype)
    if kv_dtype is None or v_cache.dtype != k_cache.dtype:
        raise TypeError(
            f"the CPU attention kernel reads float32 or float16 caches, got {k_cache.dtype}/{v_cache.dtype}"
        )
    H, D, Hkv = q.shape[1], q.shape[2], k_cache.shape[2]
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != D or H % Hkv or D > MAX_HEAD_SIZE:
        raise ValueError(
            f"q {q.shape} does not fit the caches {k_cache.shape} (H a multiple of Hkv, D up to {MAX_HEAD_SIZE})"
        )
    if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous):
        raise ValueError("the KV caches must be C-contiguous (NB, BS, Hkv, D) arrays")
    return kv_dtype


def paged_attention(
    lib: NativeLibrary,
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    meta: AttentionMetadata,
    opts: AttentionOptions,
    nthreads: int,
) -> np.ndarray:
    """q: (T, H, D) float32, its rows may be a view into a wider buffer (q inside the
    fused qkv output: row stride (H + 2 Hkv) D); caches: (NB, BS, Hkv, D) float32 or
    float16, C-contiguous; meta's arrays on the host, query_start_loc covering rows
    0..T. Returns (T, H, D) float32."""
    T, H, D = q.shape
    BS, Hkv = k_cache.shape[1:3]
    kv_dtype = check_caches(q, k_cache, v_cache)
    q, stride = float_rows(q)
    tables, lens, starts = int32_rows(meta.block_tables), int32_rows(meta.seq_lens), int32_rows(meta.query_start_loc)
    out = empty((T, H, D))
    if T:
        lib.call(
            "rp_paged_attention",
            out=addr(out),
            q=addr(q),
            q_stride=stride,
            k_cache=addr(k_cache),
            v_cache=addr(v_cache),
            kv_dtype=kv_dtype,
            block_tables=addr(tables),
            max_blocks=tables.shape[1],
            seq_lens=addr(lens),
            query_start_loc=addr(starts),
            B=len(lens),
            H=H,
            Hkv=Hkv,
            D=D,
            BS=BS,
            scale=opts.scale,
            sliding_window=opts.sliding_window or 0,  # 0 = off
            soft_cap=opts.soft_cap or 0.0,  # 0 = off
            nthreads=nthreads,
        )
    return out
