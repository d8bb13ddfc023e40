"""The NumPy backend: float32 on the CPU, BLAS for the GEMMs.

Most ops are the references from rawpage/ops. Attention gets a batched decode
path, because a Python loop over 32 decoding sequences x 30 layers costs more
than the math: all one-token queries go through a handful of batched GEMMs
over block tables padded to the longest context.

An FP8 KV cache (--kv-cache-dtype fp8) is real 1-byte storage here too: uint8
e4m3 codes, written by write_kv_fp8_ref and dequantized to float32 as attention
gathers each sequence's blocks.
"""

from __future__ import annotations

import logging
import mmap
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from rawpage._blas_env import spin_is_short
from rawpage.backends.base import Backend
from rawpage.backends.cpu_malloc import keep_freed_memory
from rawpage.backends.cpu_threads import CpuThreads
from rawpage.ops.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from rawpage.ops.attention_metadata import AttentionOptions
from rawpage.ops.cache_ops import copy_blocks_ref, swap_blocks_ref
from rawpage.ops.kv_cache_fp8 import dequantize_kv, write_kv_fp8_ref
from rawpage.ops.paged_attention import gather_kv
from rawpage.ops.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from rawpage.ops.rope import rope_ref
from rawpage.ops.write_kv import write_kv_ref
from rawpage.quantization.weight import QuantizedWeight, dequantize

logger = logging.getLogger("rawpage")


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self, cpu_threads: int | None = None) -> None:
        self.dtype = np.dtype(np.float32)
        self.threads = CpuThreads(cpu_threads)
        keep_freed_memory()  # each layer's temporaries reuse the last layer's pages (cpu_malloc.py)
        # What BLAS does not thread, or threads badly, runs on threads of our own: decode
        # attention's chunks (GEMMs too small for BLAS to split; a second core nearly
        # halves the gather), prefill attention's sequences, the element-wise ops of a
        # pass with many rows, and GEMMs of a few rows by a big W. Only while OpenBLAS's
        # idle workers sleep soon after each call (rawpage/_blas_env.py): while they
        # spin, they hold the cores these threads need.
        self.pool = (
            ThreadPoolExecutor(self.threads.usable - 1, thread_name_prefix="rawpage-cpu")
            if self.threads.usable > 1 and spin_is_short()
            else None
        )
        logger.info("%s", self.threads.describe())
        if self.threads.usable > 1:
            logger.info(
                "decode attention and element-wise ops: %s",
                "on as many threads as BLAS"
                if self.pool
                else "on one thread (OpenBLAS's workers spin: NumPy was imported before rawpage, "
                "or OPENBLAS_THREAD_TIMEOUT is above 20)",
            )

    def asarray(self, x: np.ndarray, dtype: Any = None) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=dtype or self.dtype)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return x

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> np.ndarray:
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if nbytes >= _LAZY_ZEROS_BYTES:
            # An anonymous mapping: the kernel hands out zeroed pages as they are first
            # written, so the KV pool holds only the blocks in use. (np.zeros would take
            # a block this size from the heap, where cpu_malloc.py keeps them, and calloc
            # writes every page at once: 2 GiB resident for the default pool.)
            return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)
        return np.zeros(shape, dtype=dtype)

    def embedding(self, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        """ids: (T,) -> (T, dim). The first op of every forward pass, so the thread count for
        this pass's GEMMs (T rows each) is set here."""
        self.threads.set_for(len(ids))
        return table[ids]

    def prepare_linear(self, w: np.ndarray | QuantizedWeight) -> np.ndarray:
        if isinstance(w, QuantizedWeight):  # every format runs here, dequantized at load
            w = dequantize(w)
        # Kept (out, in), as checkpoints store it: a tied LM head is the embedding table
        # itself, with no transposed copy. See matmul for why this layout.
        return np.ascontiguousarray(w)

    def matmul(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        # y = (W · xᵀ)ᵀ, W (out, in) C-contiguous: OpenBLAS walks W's rows once. For a few
        # rows (speculative verification, small batches) this is 1.3-1.5x faster than
        # x @ Wᵀ with W stored (in, out), whose packing dominates at M = 2..64 (measured,
        # docs/benchmarks.md); at M = 1 both are one GEMV. y is a Fortran-order view.
        n = self.own_threads()
        if n > 1 and splits_by_rows(len(x), w.nbytes):
            with self.threads.blas_on_one_thread():
                y = self._matmul_by_rows(x, w, n)
        else:
            y = (w @ x.T).T
        if bias is not None:
            y += bias
        return y

    def _matmul_by_rows(self, x: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
        """(W · xᵀ)ᵀ on n threads, W's rows cut in chunks of about 384, at most 4 per
        thread: each thread takes the next chunk left (one BLAS thread each), so a thread
        the OS slows down takes fewer."""
        out = w.shape[0]
        chunks = max(n, min(4 * n, out // 384))
        bounds = [out * i // chunks for i in range(chunks + 1)]
        yT = np.empty((out, len(x)), dtype=np.result_type(x, w))
        left = iter(zip(bounds, bounds[1:]))  # shared: next() under the GIL hands each chunk out once

        def take(_: Any) -> None:
            for a, b in left:
                np.matmul(w[a:b], x.T, out=yT[a:b])

        run_in_parts(self.pool, [None] * n, take)
        return yT.T

    def own_threads(self) -> int:
        """The threads this pass may split rawpage's own work over: the pass's count,
        or 1 without a pool (OpenBLAS's workers spin; see __init__)."""
        return (self.threads.current or 1) if self.pool is not None else 1

    def row_parts(self, rows: int) -> list[slice]:
        """The rows of an element-wise op, one part per thread of this pass, or one part
        when there are too few rows to pay for handing half to another thread."""
        n = self.own_threads()
        if n < 2 or rows < _ROWS_TO_SPLIT:
            return [slice(0, rows)]
        bounds = [rows * i // n for i in range(n + 1)]
        return [slice(a, b) for a, b in zip(bounds, bounds[1:])]

    def in_parts(self, parts: list[slice], fn: Any) -> None:
        run_in_parts(self.pool, parts, fn)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        return rms_norm_ref(x, weight, eps)

    def fused_add_rms_norm(self, x, residual, weight, eps):
        parts = self.row_parts(len(x))
        if len(parts) == 1:
            return fused_add_rms_norm_ref(x, residual, weight, eps)
        normed, summed = np.empty_like(x), np.empty_like(x)

        def part(s: slice) -> None:
            normed[s], summed[s] = fused_add_rms_norm_ref(x[s], residual[s], weight, eps)

        self.in_parts(parts, part)
        return normed, summed

    def rope(self, positions, q, k, cos_sin, is_neox):
        self.in_parts(self.row_parts(len(q)), lambda s: rope_ref(positions[s], q[s], k[s], cos_sin, is_neox))

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        if k_cache.dtype == np.uint8:
            write_kv_fp8_ref(k, v, k_cache, v_cache, slot_mapping, self.fp8_scales())
        else:
            write_kv_ref(k, v, k_cache, v_cache, slot_mapping)

    def silu_and_mul(self, x):
        return self._gated(silu_and_mul_ref, x)

    def gelu_tanh_and_mul(self, x):
        return self._gated(gelu_tanh_and_mul_ref, x)

    def _gated(self, ref: Any, x: np.ndarray) -> np.ndarray:
        """x (T, 2I) -> ref(x) (T, I), its rows in parts."""
        parts = self.row_parts(len(x))
        if len(parts) == 1:
            return ref(x)
        out = np.empty_like(x[:, : x.shape[1] // 2])  # in x's layout (matmul's outputs are Fortran-order)

        def part(s: slice) -> None:
            out[s] = ref(x[s])

        self.in_parts(parts, part)
        return out

    def copy_blocks(self, k_caches, v_caches, block_mapping):
        copy_blocks_ref(k_caches, v_caches, block_mapping)

    def swap_blocks(self, src, dst, block_mapping):
        swap_blocks_ref(src, dst, block_mapping)

    def paged_attention(self, q, k_cache, v_cache, meta, opts):
        block_tables, seq_lens, query_start_loc = meta.block_tables, meta.seq_lens, meta.query_start_loc
        window = opts.sliding_window
        out = np.empty_like(q)
        q_lens = np.diff(query_start_loc)
        # Decoding sequences go through decode_attention's batched GEMMs, unless there is
        # one: then, like a prefill chunk, it reads its own keys, with no padding to mask.
        batched = q_lens == 1
        if batched.sum() == 1:
            batched[:] = False
        scales = self.fp8_scales() if k_cache.dtype == np.uint8 else None
        if batched.any():
            rows = query_start_loc[:-1][batched]
            out[rows] = decode_attention(
                q[rows],
                k_cache,
                v_cache,
                block_tables[batched],
                seq_lens[batched],
                opts,
                scales,
                self.pool,
                self.own_threads(),
            )

        def attend(seqs: list[int]) -> None:
            for i in seqs:
                s, e, L = int(query_start_loc[i]), int(query_start_loc[i + 1]), int(seq_lens[i])
                # Keys older than the window of the chunk's first query are never seen: skip them.
                first = max(0, L - (e - s) - window + 1) if window else 0
                k = dequantize_kv(gather_kv(k_cache, block_tables[i], L, first), scales, 0)
                v = dequantize_kv(gather_kv(v_cache, block_tables[i], L, first), scales, 1)
                out[s:e] = prefill_attention(q[s:e], k, v, opts)

        own = np.flatnonzero(~batched).tolist()
        costs = (q_lens * seq_lens)[own].tolist()  # score entries: queries x keys
        parts = deal_by_cost(own, costs, self.own_threads())
        if len(parts) > 1:
            with self.threads.blas_on_one_thread():
                run_in_parts(self.pool, parts, attend)
        else:
            attend(own)
        return out


def prefill_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, opts: AttentionOptions) -> np.ndarray:
    """Causal attention of the last n positions of a context (or of its last L keys).
    q: (n, H, D), k and v: (L, Hkv, D) -> (n, H, D). Batched GEMMs over KV heads."""
    scale, sliding_window, soft_cap = opts.scale, opts.sliding_window, opts.soft_cap
    n, H, D = q.shape
    L, Hkv = k.shape[:2]
    G = H // Hkv
    qh = q.reshape(n, Hkv, G, D).transpose(1, 2, 0, 3).reshape(Hkv, G * n, D)  # rows: (g, query)
    scores = np.matmul(qh, k.transpose(1, 2, 0)) * scale  # (Hkv, G*n, L)
    scores = scores.reshape(Hkv, G, n, L)
    if soft_cap:
        scores = soft_cap * np.tanh(scores / soft_cap)
    if n > 1 or sliding_window:  # (one query at the end of the context sees every key)
        key, query = np.arange(L)[None, :], np.arange(L - n, L)[:, None]
        hidden = key > query  # (n, L): key after query
        if sliding_window:
            hidden |= key <= query - sliding_window  # key older than the window
        scores += np.where(hidden, -np.inf, 0.0).astype(np.float32)  # (adding a mask beats boolean assignment)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    o = np.matmul(scores.reshape(Hkv, G * n, L), v.transpose(1, 0, 2))  # (Hkv, G*n, D)
    return o.reshape(Hkv, G, n, D).transpose(2, 0, 1, 3).reshape(n, H, D)


# The GEMMs that matmul splits by W's rows over the backend's threads instead of letting
# OpenBLAS thread them: a few rows of x (2-64: small-batch decode, a speculative
# verification) by a large W. There OpenBLAS's GEMM runs at half its GEMV's speed
# though both read W once, and its threads gain little (tools/bench_gemm_split.py, on
# the 2-core development machine: SmolLM2's 113 MB LM head at 2 rows 12.7 ms on
# OpenBLAS's 2 threads, 9.4 ms by rows; at 8 rows 14.1 and 10.5). On a small W the
# handoff to the other thread (0.1-0.2 ms) costs more than it saves.
_BY_ROWS_W_BYTES = 24 << 20  # W this large, at 2-64 rows
_BY_ROWS_W_BYTES_AT_2 = 4 << 20  # ... and from this size at exactly 2 rows


def splits_by_rows(rows: int, w_bytes: int) -> bool:
    """Whether matmul splits x (rows, in) by W (out, in) itself (see above)."""
    return 2 <= rows <= 64 and (w_bytes >= _BY_ROWS_W_BYTES or (rows == 2 and w_bytes >= _BY_ROWS_W_BYTES_AT_2))


# Arrays this large (the KV pool's layers, the swap space) are mapped zero pages.
_LAZY_ZEROS_BYTES = 16 << 20

# Rows below which an element-wise op stays on one thread: handing half of it to another
# thread costs 0.1-0.2 ms, more than it saved below 512 rows on the 2-core development
# machine (fused_add_rms_norm and rope on 576-wide rows; at 2048 rows 1.5-1.9x faster).
_ROWS_TO_SPLIT = 512

# Sequences per decode-attention chunk. Gathering the K/V of the whole batch at once
# (tens of MB) runs out of cache; chunks of 8 similar-length sequences measured ~2.5x
# faster on this 2-core machine (B=32, 350-token contexts: 5.5 ms -> 2.0 ms a layer).
_DECODE_CHUNK = 8


def decode_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    opts: AttentionOptions,
    kv_scales: np.ndarray | None = None,
    pool: ThreadPoolExecutor | None = None,
    threads: int = 1,
) -> np.ndarray:
    """One query token per sequence. q: (B, H, D) -> (B, H, D). kv_scales: those
    of an FP8 (uint8) cache.

    Sequences are sorted by length and taken a few at a time, so that padding is
    small and each chunk's gathered K/V stays in cache. With a pool, the chunks are
    dealt round-robin to `threads` threads (this one and threads - 1 of the pool's):
    NumPy lets go of the GIL in the gathers and GEMMs, which are most of the time.
    """
    out = np.empty_like(q)
    order = np.argsort(seq_lens, kind="stable")
    chunks = [order[i : i + _DECODE_CHUNK] for i in range(0, len(order), _DECODE_CHUNK)]
    # Up to 8 sequences stay on one thread: splitting them measured no faster (batch 8)
    # or slower (batch 2 and 4), the handoff costing what the second core saves.
    threads = min(threads, len(chunks)) if pool is not None else 1

    def run(part: list[np.ndarray]) -> None:
        for idx in part:
            out[idx] = _decode_chunk(q[idx], k_cache, v_cache, block_tables[idx], seq_lens[idx], opts, kv_scales)

    run_in_parts(pool, [chunks[t::threads] for t in range(threads)], run)
    return out


def deal_by_cost(items: list[Any], costs: list[float], n: int) -> list[list[Any]]:
    """items dealt to at most n parts of about equal cost, the costliest first, each to
    the part with the least so far (no empty parts; [[]] for no items)."""
    parts: list[list[Any]] = [[] for _ in range(max(1, min(n, len(items))))]
    load = [0.0] * len(parts)
    for cost, item in sorted(zip(costs, items), key=lambda ci: -ci[0]):
        j = load.index(min(load))
        parts[j].append(item)
        load[j] += cost
    return parts


def run_in_parts(pool: ThreadPoolExecutor | None, parts: list[Any], fn: Any) -> None:
    """fn(part) for each part: the first on this thread, the others on the pool's
    (a pool is needed only for more than one part)."""
    others = [pool.submit(fn, part) for part in parts[1:]]
    fn(parts[0])
    for f in others:
        f.result()


def _decode_chunk(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    opts: AttentionOptions,
    kv_scales: np.ndarray | None = None,
) -> np.ndarray:
    """Gathers the chunk's blocks into (B, L_max, Hkv, D), padding short contexts, and
    masks the padding before the softmax: a few batched GEMMs, no loop over sequences.
    With a sliding window, only the blocks from the oldest visible key on are gathered."""
    scale, sliding_window, soft_cap = opts.scale, opts.sliding_window, opts.soft_cap
    B, H, D = q.shape
    bs, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = H // Hkv
    start = np.maximum(seq_lens - sliding_window, 0) if sliding_window else np.zeros_like(seq_lens)  # (B,)
    first_block = start // bs  # (B,) the first block holding a visible key
    n_blocks = int((-(-seq_lens // bs) - first_block).max())
    cols = np.minimum(first_block[:, None] + np.arange(n_blocks)[None, :], block_tables.shape[1] - 1)
    table = np.take_along_axis(block_tables, cols, axis=1)  # (B, nb); entries past the end are masked
    Lp = n_blocks * bs
    k = dequantize_kv(np.take(k_cache, table, axis=0), kv_scales, 0)
    v = dequantize_kv(np.take(v_cache, table, axis=0), kv_scales, 1)
    k = k.reshape(B, Lp, Hkv, D).transpose(0, 2, 3, 1)  # (B, Hkv, D, Lp)
    v = v.reshape(B, Lp, Hkv, D).transpose(0, 2, 1, 3)  # (B, Hkv, Lp, D)
    scores = np.matmul(q.reshape(B, Hkv, G, D), k) * scale  # (B, Hkv, G, Lp)
    if soft_cap:
        scores = soft_cap * np.tanh(scores / soft_cap)
    pos = (first_block * bs)[:, None] + np.arange(Lp)[None, :]  # (B, Lp) position of each gathered key
    pad = (pos >= seq_lens[:, None]) | (pos < start[:, None])  # (B, Lp) past the end or out of the window
    scores += np.where(pad, -np.inf, 0.0).astype(np.float32)[:, None, None, :]
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return np.matmul(scores, v).reshape(B, H, D)  # (B, Hkv, G, D) -> (B, H, D)
