"""Paged attention: variable-length causal queries against K/V held in blocks.

One call covers a whole batch: prefill chunks (many query tokens) and decodes
(one query token) alike. Sequence i owns query rows
q[query_start_loc[i] : query_start_loc[i+1]], which are the LAST n_i tokens of
its seq_lens[i]-token context; their K/V were already written to the cache.
Its context lives in blocks block_tables[i, 0], block_tables[i, 1], ...: token
j of the context sits at block_tables[i, j // BS], offset j % BS.

    S = Q K^T * scale,  causal: query at position p sees keys 0..p
    O = softmax(S) V

With GQA, query head h reads KV head h // (H / Hkv).
"""

from __future__ import annotations

import numpy as np


def gather_kv(cache: np.ndarray, block_table: np.ndarray, seq_len: int) -> np.ndarray:
    """The first seq_len rows of one sequence's context: (seq_len, Hkv, D)."""
    bs = cache.shape[1]
    blocks = block_table[: (seq_len + bs - 1) // bs]
    return cache[blocks].reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention_ref(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    query_start_loc: np.ndarray,
    scale: float,
) -> np.ndarray:
    """q: (T, H, D); caches: (NB, BS, Hkv, D); block_tables: (B, max_blocks) int;
    seq_lens: (B,) context length incl. new tokens; query_start_loc: (B+1,).
    Returns (T, H, D). Softmax in float32."""
    T, H, D = q.shape
    Hkv = k_cache.shape[2]
    G = H // Hkv  # query heads per KV head
    out = np.zeros((T, H, D), dtype=q.dtype)
    for i in range(len(seq_lens)):
        s, e, L = int(query_start_loc[i]), int(query_start_loc[i + 1]), int(seq_lens[i])
        n = e - s
        if n == 0:
            continue
        k = gather_kv(k_cache, block_tables[i], L).astype(np.float32)  # (L, Hkv, D)
        v = gather_kv(v_cache, block_tables[i], L).astype(np.float32)
        qi = q[s:e].astype(np.float32).reshape(n, Hkv, G, D)
        scores = np.einsum("nkgd,lkd->kgnl", qi, k) * scale  # (Hkv, G, n, L)
        q_pos = np.arange(L - n, L)[:, None]  # (n, 1)
        scores = np.where(np.arange(L)[None, :] <= q_pos, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.einsum("kgnl,lkd->nkgd", p, v)  # (n, Hkv, G, D)
        out[s:e] = o.reshape(n, H, D).astype(q.dtype)
    return out
