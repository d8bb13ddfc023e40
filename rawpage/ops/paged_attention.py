"""Paged attention: variable-length causal queries against K/V held in blocks.

One call covers a whole batch: prefill chunks (many query tokens) and decodes
(one query token) alike. Sequence i owns query rows
q[query_start_loc[i] : query_start_loc[i+1]], which are the LAST n_i tokens of
its seq_lens[i]-token context; their K/V were already written to the cache.
Its context lives in blocks block_tables[i, 0], block_tables[i, 1], ...: token
j of the context sits at block_tables[i, j // BS], offset j % BS.

    S = Q K^T * scale,  causal: query at position p sees keys 0..p
    O = softmax(S) V

Two options some families need, in the reference below, the cpu backend and
both kernels:
    sliding window W: query at position p sees keys p-W+1..p only (blocks
                      wholly older than that are never read: the block manager
                      may have freed them, and their table entries are stale)
    soft cap c:       S = c * tanh(S / c) before the mask
and an FP8 (e4m3) cache, uint8 arrays with per-tensor kv_scales (see
rawpage/ops/kv_cache_fp8.py): the kernels convert on load and compute in float32.
A step with images adds meta.key_end (T,): an image's rows see up to its last
token, both ways (Gemma 3), every other row (-1) stays causal; the prefill
kernels take it, the cpu backend's causal C kernel leaves it to image_rows_ref.

With GQA, query head h reads KV head h // (H / Hkv). Every implementation takes
(q, k_cache, v_cache, meta, opts): the batch's block_tables, seq_lens and
query_start_loc in an AttentionMetadata, scale, W and c in an AttentionOptions
(rawpage/ops/attention_metadata.py).

A vision encoder's attention (encoder_attention_ref, launch_encoder_attention) has no
cache: an image's patches, or each of its windows (cu_seqlens), see all of their own
keys. On the GPU it is the prefill kernel over the rows themselves as the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from rawpage.dtypes import bf16_from_f32, bf16_to_f32
from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.launch import (
    NULL_POINTER,
    KernelLoader,
    ceil_div,
    dtype_suffix,
    int32_array,
    require_aligned,
    same_dtype,
    token_stride,
)
from rawpage.quantization.fp8 import e4m3_to_f32


def gather_kv(cache: np.ndarray, block_table: np.ndarray, seq_len: int, first: int = 0) -> np.ndarray:
    """Rows first .. seq_len-1 of one sequence's context: (seq_len - first, Hkv, D).
    Blocks wholly before `first` are not read (a sliding window may have freed them)."""
    bs = cache.shape[1]
    blocks = block_table[first // bs : (seq_len + bs - 1) // bs]
    return cache[blocks].reshape(-1, *cache.shape[2:])[first % bs : seq_len - first // bs * bs]


def paged_attention_ref(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    meta: AttentionMetadata,
    opts: AttentionOptions,
    kv_scales: np.ndarray | None = None,
) -> np.ndarray:
    """q: (T, H, D); caches: (NB, BS, Hkv, D); meta's arrays on the host. Returns (T, H, D),
    softmax in float32. kv_scales ((2,) float32: k_scale, v_scale): the caches are uint8 e4m3
    codes, converted as read. With meta.key_end (T,), a row at position p sees keys up to
    max(p, key_end[row]): the tokens of an image see their whole image."""
    block_tables, seq_lens, query_start_loc = meta.block_tables, meta.seq_lens, meta.query_start_loc
    key_end = meta.key_end
    scale, sliding_window, soft_cap = opts.scale, opts.sliding_window, opts.soft_cap
    T, H, D = q.shape
    Hkv = k_cache.shape[2]
    G = H // Hkv  # query heads per KV head
    out = np.zeros((T, H, D), dtype=q.dtype)
    for i in range(len(seq_lens)):
        s, e, L = int(query_start_loc[i]), int(query_start_loc[i + 1]), int(seq_lens[i])
        n = e - s
        if n == 0:
            continue
        first = max(0, L - n - sliding_window + 1) if sliding_window else 0  # oldest key any query sees
        k = gather_kv(k_cache, block_tables[i], L, first)  # (L', Hkv, D)
        v = gather_kv(v_cache, block_tables[i], L, first)
        if kv_scales is not None:
            k, v = e4m3_to_f32(k) * kv_scales[0], e4m3_to_f32(v) * kv_scales[1]
        k, v = k.astype(np.float32), v.astype(np.float32)
        # One GEMM per KV head, its G query heads' n rows stacked: (Hkv, G*n, D) x (Hkv, D, L').
        # (An einsum here runs no BLAS: 3x slower at batch-32 decode, 6x at prefill, and
        # this is what the CPU backend runs for an FP8 KV cache and --cpu-kernels numpy.)
        qi = q[s:e].astype(np.float32).reshape(n, Hkv, G, D).transpose(1, 2, 0, 3).reshape(Hkv, G * n, D)
        scores = (np.matmul(qi, k.transpose(1, 2, 0)) * scale).reshape(Hkv, G, n, -1)  # (Hkv, G, n, L')
        if soft_cap:
            scores = soft_cap * np.tanh(scores / soft_cap)
        q_pos = np.arange(L - n, L)[:, None]  # (n, 1)
        key_pos = np.arange(first, L)[None, :]  # (1, L')
        last = q_pos if key_end is None else np.maximum(q_pos, key_end[s:e, None])  # (n, 1)
        visible = key_pos <= last  # (n, L')
        if sliding_window:
            visible &= key_pos > q_pos - sliding_window
        scores = np.where(visible, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.matmul(p.reshape(Hkv, G * n, -1), v.transpose(1, 0, 2))  # (Hkv, G*n, D)
        out[s:e] = o.reshape(Hkv, G, n, D).transpose(2, 0, 1, 3).reshape(n, H, D).astype(q.dtype)
    return out


def image_rows_ref(
    out: np.ndarray,
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    meta: AttentionMetadata,
    opts: AttentionOptions,
    kv_scales: np.ndarray | None = None,
) -> np.ndarray:
    """out (T, H, D), computed causally by a kernel that has no image rows (the CPU's): the
    sequences that hold image rows (meta.key_end >= 0) are redone by the reference, in place.
    The scheduler never splits an image across steps, so its last token's K/V are in the
    cache when its first is computed."""
    qsl = np.asarray(meta.query_start_loc)
    seq_of_row = np.repeat(np.arange(len(qsl) - 1), np.diff(qsl))  # (T,)
    seqs = np.unique(seq_of_row[np.asarray(meta.key_end) >= 0])  # (B',)
    if seqs.size == 0:
        return out
    rows = np.concatenate([np.arange(qsl[i], qsl[i + 1]) for i in seqs])
    sub_qsl = np.zeros(len(seqs) + 1, np.int32)
    np.cumsum(qsl[seqs + 1] - qsl[seqs], out=sub_qsl[1:])
    tables, lens = np.asarray(meta.block_tables)[seqs], np.asarray(meta.seq_lens)[seqs]
    sub = AttentionMetadata.from_host(tables, lens, sub_qsl, np.asarray(meta.key_end)[rows])
    out[rows] = paged_attention_ref(q[rows], k_cache, v_cache, sub, opts, kv_scales)
    return out


ENCODER_ATTENTION_ROWS = 4096  # queries of one head whose scores are held at once (64 MB for 4096 keys)


def softmax_rows_ref(x: np.ndarray) -> np.ndarray:
    """Each row of x (T, n) float32 replaced by its softmax, in place; returns x."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def encoder_attention_ref(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    softmax_rows: Callable[[np.ndarray], np.ndarray] = softmax_rows_ref,
    cu_seqlens: np.ndarray | None = None,
) -> np.ndarray:
    """A vision encoder's attention: q, k, v (N, H, D) of one image's patches -> (N, H, D),
    softmax in float32. cu_seqlens (B+1,) host int, 0 .. N: the rows are B sequences, rows
    cu_seqlens[i] .. cu_seqlens[i+1] (Qwen2.5-VL's windows), each row seeing every key of its
    own sequence and no other; None: one sequence (SigLIP), every row seeing every key.
    A sequence, one head and up to ENCODER_ATTENTION_ROWS queries at a time: their scores
    against the sequence's keys, (rows, n), in one buffer, softmaxed in place (softmax_rows:
    the CPU backend passes its C kernel), then times v; never the (H, N, N) scores at once
    (1 GB for SigLIP at 896 px). (All heads at once in blocks of 128 queries, as one batched
    matmul, measured 3-4x the CPU time: each small GEMM packs the whole of k again.)"""
    N, H, D = q.shape
    bounds = [0, N] if cu_seqlens is None else [int(r) for r in cu_seqlens]
    longest = max((b - a for a, b in zip(bounds, bounds[1:])), default=0)
    out = np.empty((N, H, D), np.float32)
    scores = np.empty((min(longest, ENCODER_ATTENTION_ROWS), longest), np.float32)
    for a, b in zip(bounds, bounds[1:]):
        for h in range(H):
            qh = q[a:b, h].astype(np.float32) * np.float32(scale)  # (n, D)
            kT = np.ascontiguousarray(k[a:b, h].T, np.float32)  # (D, n)
            vh = np.ascontiguousarray(v[a:b, h], np.float32)  # (n, D)
            for r in range(0, b - a, ENCODER_ATTENTION_ROWS):
                s = scores[: min(ENCODER_ATTENTION_ROWS, b - a - r), : b - a]  # (rows, n)
                np.matmul(qh[r : r + len(s)], kT, out=s)
                out[a + r : a + r + len(s), h] = softmax_rows(s) @ vh
    return out.astype(q.dtype, copy=False)


def encoder_attention_bf16_ref(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, cu_seqlens: np.ndarray | None = None
) -> np.ndarray:
    """encoder_attention_ref in bfloat16, as rawpage/native/bf16_gemm.c computes it: the
    scores bf16(scale q) bf16(k)^T, their float32 softmax rounded to bf16, times bf16(v);
    the products in float64 here, float32 sums there."""

    def bf16(a: np.ndarray) -> np.ndarray:
        return bf16_to_f32(bf16_from_f32(a))

    def softmax_bf16(s: np.ndarray) -> np.ndarray:
        return bf16(softmax_rows_ref(s))

    return encoder_attention_ref(bf16(q * np.float32(scale)), bf16(k), bf16(v), 1.0, softmax_bf16, cu_seqlens)


# --- launch (cuda/paged_attention_decode.cu, cuda/paged_attention_prefill{,_f32}.cu) ---

HEAD_SIZES = (16, 32, 64, 80, 96, 128, 256)  # compiled into both kernels
DECODE_THREADS = 128
DECODE_GROUPS = (1, 2, 4, 8)  # query heads one decode block serves, as compiled
# Split-K: enough blocks for DECODE_BLOCKS_PER_SM on every SM, but partitions
# of at least DECODE_MIN_PARTITION tokens (each partition costs a write and a
# read of its partial output in float32: G * D * 8 bytes against the
# 4 * D * min_partition bytes of its 16-bit K/V: 12% for a group of 4 at 64).
DECODE_BLOCKS_PER_SM = 4
DECODE_MIN_PARTITION = 64
PREFILL_THREADS = 128
PREFILL_ROWS = 64  # query rows per block (Br): 4 warps of 16


def prefill_key_tile(suffix: str, head_size: int) -> int:
    """Keys per tile (Bc) for a dtype and head size, as instantiated in the kernels."""
    if suffix == "f32":
        return 32
    return 32 if head_size == 256 else 64


def prefill_smem_bytes(head_size: int, key_tile: int, itemsize: int) -> int:
    """Dynamic shared memory of one prefill block; mirrors PrefillSmem (16-bit) and
    PrefillF32Smem in the kernels (which trap if given less), each region 128-byte
    aligned. 16-bit: Q (Br x D+8) and two stages each of K and V (Bc x D+8).
    float32: Q (up to D = 128; at 256 it is read from global memory), K, V (rows
    of D+4), S (Br x Bc+4) and O (Br x D+4). An FP8 cache is converted into the
    same tiles, so it needs the same."""

    def region(n: int) -> int:
        return ceil_div(n, 128) * 128

    br, bc = PREFILL_ROWS, key_tile
    if itemsize == 4:
        ld = head_size + 4
        q_tile = region(br * ld * 4) if head_size <= 128 else 0
        return q_tile + 2 * region(bc * ld * 4) + region(br * (bc + 4) * 4) + region(br * ld * 4)
    ld = head_size + 8
    return region(br * ld * itemsize) + 4 * region(bc * ld * itemsize)


def launch_paged_attention(
    xp: Any,
    loader: KernelLoader,
    q: Any,
    k_cache: Any,
    v_cache: Any,
    meta: AttentionMetadata,
    opts: AttentionOptions,
    partitions: int | None = None,
    sm_count: int | None = None,
    min_partition: int = DECODE_MIN_PARTITION,
    kv_scales: Any = None,
) -> Any:
    """Same contract as paged_attention_ref, meta's arrays on the device; q may be a view
    with contiguous rows. With kv_scales ((2,) float32 on the device: k_scale, v_scale)
    the caches are uint8 e4m3 (paged_attention_fp8_ref's contract). A batch in which
    every sequence decodes (meta.max_query_len 1) goes to the decode kernel, split into
    `partitions` per sequence when given, else as decode_partitions() picks for
    `sm_count` SMs (default: the loader's), with partitions of at least `min_partition`
    tokens (a multiple of 16); any other batch, and any with image rows (meta.key_end),
    goes to the prefill kernel."""
    _check_shapes(q, k_cache, v_cache, kv_scales)
    window, _ = _kernel_options(opts)
    (T, H, D), Hkv = q.shape, k_cache.shape[2]
    out = xp.empty((T, H, D), dtype=q.dtype)
    if T == 0:
        return out
    q = q if token_stride(q) is not None else xp.ascontiguousarray(q)
    for name, a, stride in (("q", q, token_stride(q) * q.itemsize), ("k_cache", k_cache, 0), ("v_cache", v_cache, 0)):
        require_aligned(name, a, stride)
    meta = replace(
        meta,
        block_tables=int32_array(xp, meta.block_tables),
        seq_lens=int32_array(xp, meta.seq_lens),
        query_start_loc=int32_array(xp, meta.query_start_loc),
        key_end=None if meta.key_end is None else int32_array(xp, meta.key_end),
    )
    if meta.max_query_len == 1 and meta.key_end is None:
        if k_cache.shape[1] & (k_cache.shape[1] - 1):
            raise ValueError(f"decode attention needs a power-of-two block size, got {k_cache.shape[1]}")
        if partitions is None:
            sms = sm_count or int(getattr(loader, "sm_count", 132))
            visible = min(meta.max_seq_len, window) if window else meta.max_seq_len  # keys a query reads
            partitions = decode_partitions(meta.block_tables.shape[0], _decode_blocks_per_seq(H, Hkv), visible, sms)
        _launch_decode(xp, loader, out, q, k_cache, v_cache, meta, opts, kv_scales, partitions, min_partition)
    else:
        _launch_prefill(loader, out, q, k_cache, v_cache, meta, opts, kv_scales)
    return out


def _check_shapes(q: Any, k_cache: Any, v_cache: Any, kv_scales: Any) -> None:
    fp8 = kv_scales is not None
    if fp8 and (k_cache.dtype != np.uint8 or v_cache.dtype != np.uint8):
        raise ValueError(f"kv_scales go with an FP8 (uint8) cache, got {k_cache.dtype}")
    same_dtype(q, *(() if fp8 else (k_cache, v_cache)))
    H, D, Hkv = q.shape[1], q.shape[2], k_cache.shape[2]
    if D not in HEAD_SIZES:
        raise ValueError(f"head size {D} has no attention kernel; compiled sizes: {HEAD_SIZES}")
    if H % Hkv or k_cache.shape[3] != D or k_cache.shape != v_cache.shape:
        raise ValueError(f"q {q.shape} does not match the caches {k_cache.shape}")


def _kernel_options(opts: AttentionOptions) -> tuple[np.int32, np.float32]:
    """The kernels' (window, cap) arguments; 0 means off."""
    if opts.sliding_window is not None and opts.sliding_window < 1:
        raise ValueError(f"sliding_window must be a positive number of tokens, got {opts.sliding_window}")
    if opts.soft_cap is not None and not opts.soft_cap > 0:
        raise ValueError(f"soft_cap must be positive, got {opts.soft_cap}")
    return np.int32(opts.sliding_window or 0), np.float32(opts.soft_cap or 0.0)


def _kernel_suffix(q: Any, kv_scales: Any) -> str:
    """The entry points' dtype part: the activations' dtype, and _fp8 for an e4m3 cache."""
    return dtype_suffix(q) + ("_fp8" if kv_scales is not None else "")


def decode_group(H: int, Hkv: int) -> int:
    """Query heads per decode block: the GQA group, rounded up to a compiled size
    (the padding heads compute nothing that is kept), at most 8."""
    return next((g for g in DECODE_GROUPS if g >= H // Hkv), DECODE_GROUPS[-1])


def _decode_blocks_per_seq(H: int, Hkv: int) -> int:
    """Decode blocks per sequence and partition: one per KV head and chunk of its query heads."""
    return Hkv * ceil_div(H // Hkv, decode_group(H, Hkv))


def decode_partitions(B: int, blocks_per_partition: int, max_seq_len: int, sm_count: int) -> int:
    """How many partitions P to split each sequence's context into: enough blocks
    (B * blocks_per_partition * P) for DECODE_BLOCKS_PER_SM blocks on each SM, but
    no partition shorter than DECODE_MIN_PARTITION tokens at max_seq_len. The
    kernel sizes each sequence's partitions from its own length and P, so a P
    chosen for the longest context stays valid for every shorter one."""
    want = ceil_div(DECODE_BLOCKS_PER_SM * sm_count, max(1, B * blocks_per_partition))
    return max(1, min(want, ceil_div(max_seq_len, DECODE_MIN_PARTITION)))


def _launch_decode(xp, loader, out, q, k_cache, v_cache, meta, opts, kv_scales, P, min_partition) -> None:
    # Grid: (Hkv * chunks, B, P): one block per KV head (and chunk of up to 8 of
    # its query heads), sequence and partition. Block: 4 warps; a warp takes a
    # few consecutive keys per step, each key shared by D*itemsize/16 lanes that
    # load it as 16-byte vectors, and updates every query head of the group.
    # With P > 1 the reduce kernel merges partitions: grid (H, B), threads over D.
    T, H, D = q.shape
    Hkv = k_cache.shape[2]
    B = meta.block_tables.shape[0]
    G = decode_group(H, Hkv)
    chunks = ceil_div(H // Hkv, G)
    part_o = xp.empty((B, H, P, D) if P > 1 else (1,), dtype=np.float32)
    part_ml = xp.empty((B, H, P, 2) if P > 1 else (1,), dtype=np.float32)
    window, cap = _kernel_options(opts)
    one_head_size = (f"RP_ONE_HEAD_SIZE={D}",)  # a build of this head size's kernels alone
    name = f"paged_attention_decode_{_kernel_suffix(q, kv_scales)}_d{D}_g{G}"
    kernel = loader.get_function("paged_attention_decode.cu", name, one_head_size)
    args = (
        out,
        part_o,
        part_ml,
        q,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        np.int32(meta.block_tables.shape[1]),
        np.int32(H),
        np.int32(Hkv),
        np.int32(k_cache.shape[1]),
        np.int32(token_stride(q)),
        np.float32(opts.scale),
        np.int32(min_partition),
        window,
        cap,
    ) + ((kv_scales,) if kv_scales is not None else ())
    kernel((Hkv * chunks, B, P), (DECODE_THREADS,), args)
    if P > 1:
        name = f"paged_attention_decode_reduce_{dtype_suffix(q)}"
        reduce = loader.get_function("paged_attention_decode.cu", name, one_head_size)
        args = (out, part_o, part_ml, meta.seq_lens, meta.query_start_loc, np.int32(D), np.int32(P))
        args += (np.int32(min_partition), window)
        reduce((H, B), (DECODE_THREADS,), args, shared_mem=4 * P)


def _launch_prefill(loader, out, q, k_cache, v_cache, meta, opts, kv_scales) -> None:
    # Grid: (ceil(max_query_len / 64), H, B): one block per 64-row query tile Q_i,
    # head and sequence (x runs backwards in the kernel: heaviest tiles first);
    # tiles past a sequence's chunk exit at once. Block: 4 warps, each owning 16
    # query rows end to end (S, softmax state, O); all share each K/V tile, which
    # float16/bfloat16 double-buffer in shared memory. float32 has its own
    # scalar kernel file with the same arguments.
    T, H, D = q.shape
    B = meta.block_tables.shape[0]
    window, cap = _kernel_options(opts)
    suffix = dtype_suffix(q)
    key_tile = prefill_key_tile(suffix, D)
    smem = prefill_smem_bytes(D, key_tile, q.itemsize)
    source = "paged_attention_prefill_f32.cu" if suffix == "f32" else "paged_attention_prefill.cu"
    name = f"paged_attention_prefill_{_kernel_suffix(q, kv_scales)}_d{D}_bc{key_tile}"
    kernel = loader.get_function(source, name)
    args = (
        out,
        q,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        np.int32(meta.block_tables.shape[1]),
        np.int32(k_cache.shape[2]),
        np.int32(k_cache.shape[1]),
        np.int32(token_stride(q)),
        np.float32(opts.scale),
        np.int32(smem),
        window,
        cap,
        NULL_POINTER if meta.key_end is None else meta.key_end,
    ) + ((kv_scales,) if kv_scales is not None else ())
    kernel((ceil_div(meta.max_query_len, PREFILL_ROWS), H, B), (PREFILL_THREADS,), args, shared_mem=smem)


def encoder_blocks(N: int, cu_seqlens: np.ndarray | None) -> tuple[int, AttentionMetadata]:
    """(BS, meta): the N rows of an encoder's K and V as a cache of N / BS blocks of BS rows
    and, over it, the batch that is cu_seqlens' sequences (or one of N rows), each wholly an
    image (key_end = its last key: every row sees all of its sequence's keys and no other's).
    BS is the gcd of the row starts and N, so that each sequence is whole blocks: N itself
    for one sequence (one block), 4 or more for Qwen's windows (merge groups of 2 x 2)."""
    bounds = np.array([0, N] if cu_seqlens is None else cu_seqlens, np.int32)  # (B+1,)
    lens = np.diff(bounds)  # (B,)
    if bounds[0] != 0 or bounds[-1] != N or (lens < 0).any():
        raise ValueError(f"cu_seqlens must rise from 0 to the {N} rows, got {bounds.tolist()}")
    BS = int(np.gcd.reduce(bounds))
    blocks = lens // BS
    col = np.arange(max(1, int(blocks.max())), dtype=np.int32)
    block_tables = np.where(col < blocks[:, None], bounds[:-1, None] // BS + col, 0).astype(np.int32)  # (B, blocks)
    key_end = np.repeat(lens - 1, lens)  # (N,) the last position of each row's sequence
    return BS, AttentionMetadata.from_host(block_tables, lens, bounds, key_end)


def launch_encoder_attention(
    xp: Any, loader: KernelLoader, q: Any, k: Any, v: Any, scale: float, cu_seqlens: np.ndarray | None = None
) -> Any:
    """encoder_attention_ref's contract on the prefill kernel, which is varlen already: K
    and V are the cache themselves (encoder_blocks), each sequence one of the batch's, so
    one launch covers every window of a layer. A head size without a kernel (SigLIP's 72)
    is zero-padded to the next compiled one: the zero columns add nothing to Q K^T, and
    their output is dropped."""
    N, H, D = q.shape
    padded_d = next((d for d in HEAD_SIZES if d >= D), None)
    if padded_d is None:
        raise ValueError(f"head size {D} is over the largest attention kernel's {HEAD_SIZES[-1]}")
    if N == 0:
        return xp.empty((0, H, D), dtype=q.dtype)

    def padded(a: Any) -> Any:  # (N, H, D) -> contiguous (N, H, padded_d)
        if padded_d == D:
            return xp.ascontiguousarray(a)
        out = xp.zeros((N, H, padded_d), dtype=a.dtype)
        out[:, :, :D] = a
        return out

    BS, meta = encoder_blocks(N, cu_seqlens)
    k_cache, v_cache = (padded(a).reshape(N // BS, BS, H, padded_d) for a in (k, v))
    out = launch_paged_attention(xp, loader, padded(q), k_cache, v_cache, meta, AttentionOptions(scale))
    return out if padded_d == D else xp.ascontiguousarray(out[:, :, :D])  # (N, H, D)
