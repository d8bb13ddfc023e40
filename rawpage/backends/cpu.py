"""The NumPy backend: float32 on the CPU, BLAS for the GEMMs.

Most ops are the references from rawpage/ops. Attention gets a batched decode
path, because a Python loop over 32 decoding sequences x 30 layers costs more
than the math: all one-token queries go through a handful of batched GEMMs
over block tables padded to the longest context.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.backends.base import Backend
from rawpage.ops.activation import silu_and_mul_ref
from rawpage.ops.cache_ops import copy_blocks_ref
from rawpage.ops.paged_attention import paged_attention_ref
from rawpage.ops.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from rawpage.ops.rope import rope_ref
from rawpage.ops.write_kv import write_kv_ref


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self) -> None:
        self.dtype = np.dtype(np.float32)

    def asarray(self, x: np.ndarray, dtype: Any = None) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=dtype or self.dtype)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return x

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> np.ndarray:
        return np.zeros(shape, dtype=dtype or self.dtype)

    def embedding(self, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        return table[ids]

    def matmul(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        y = x @ w.T
        if bias is not None:
            y += bias
        return y

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        return rms_norm_ref(x, weight, eps)

    def fused_add_rms_norm(self, x, residual, weight, eps):
        return fused_add_rms_norm_ref(x, residual, weight, eps)

    def rope(self, positions, q, k, cos_sin, is_neox):
        rope_ref(positions, q, k, cos_sin, is_neox)

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        write_kv_ref(k, v, k_cache, v_cache, slot_mapping)

    def silu_and_mul(self, x):
        return silu_and_mul_ref(x)

    def copy_blocks(self, k_caches, v_caches, block_mapping):
        copy_blocks_ref(k_caches, v_caches, block_mapping)

    def paged_attention(
        self, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, meta=None
    ):
        q_lens = np.diff(query_start_loc)
        decode = q_lens == 1
        if decode.sum() < 2:
            return paged_attention_ref(
                q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale
            )
        out = np.empty_like(q)
        rows = query_start_loc[:-1][decode]
        out[rows] = decode_attention(
            q[rows], k_cache, v_cache, block_tables[decode], seq_lens[decode], scale
        )
        if not decode.all():
            rest = ~decode
            qsl = np.concatenate([[0], np.cumsum(q_lens[rest])])
            idx = np.concatenate(
                [np.arange(s, s + n) for s, n in zip(query_start_loc[:-1][rest], q_lens[rest])]
            )
            out[idx] = paged_attention_ref(
                q[idx], k_cache, v_cache, block_tables[rest], seq_lens[rest], qsl, scale
            )
        return out


def decode_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
) -> np.ndarray:
    """One query token per sequence. q: (B, H, D) -> (B, H, D).

    Gathers every sequence's blocks into (B, L_max, Hkv, D), padding short
    contexts, and masks the padding before the softmax.
    """
    B, H, D = q.shape
    bs, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = H // Hkv
    n_blocks = int(-(-seq_lens.max() // bs))
    table = block_tables[:, :n_blocks]  # (B, nb); entries past a sequence's end are masked
    k = k_cache[table].reshape(B, n_blocks * bs, Hkv, D).transpose(0, 2, 3, 1)  # (B, Hkv, D, L)
    v = v_cache[table].reshape(B, n_blocks * bs, Hkv, D).transpose(0, 2, 1, 3)  # (B, Hkv, L, D)
    qg = q.reshape(B, Hkv, G, D)
    scores = np.matmul(qg, k) * scale  # (B, Hkv, G, L)
    pad = np.arange(n_blocks * bs)[None, :] >= seq_lens[:, None]  # (B, L)
    scores[np.broadcast_to(pad[:, None, None, :], scores.shape)] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return np.matmul(scores, v).reshape(B, H, D)  # (B, Hkv, G, D) -> (B, H, D)
