"""paged_attention.c on every instruction-set path against paged_attention_ref.

Each batch mixes decodes (q_len 1) with prefill chunks (q_len > 1, some continuing
a context: seq_len > q_len), over scattered block tables. Table entries a sequence
must never read (past its context, or blocks wholly older than a sliding window)
hold an id far outside the pool, so a stray read fails loudly. A float16 cache is
held against the reference on its values cast to float32.
"""

from __future__ import annotations

import numpy as np
import pytest

from rawpage.native.attention import paged_attention
from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.paged_attention import paged_attention_ref

NEVER_READ = 10**9  # a block id outside every pool
# float32 softmax and sums over up to 1,000 keys: a few ulp per term
RTOL, ATOL = 1e-5, 1e-5
ATOL_SOFT_CAP = 2e-5  # tanh's absolute error (~1e-7) times the cap (30)


def make_batch(rng, lens, H, Hkv, D, BS, kv_dtype, window=None):
    """(q, k_cache, v_cache, AttentionMetadata) for sequences of (q_len, seq_len) in
    `lens`, their blocks scattered over the pool."""
    max_blocks = max(-(-L // BS) for _, L in lens) + 2
    NB = sum(-(-L // BS) for _, L in lens) + 7
    free = rng.permutation(NB).tolist()
    tables = np.full((len(lens), max_blocks), NEVER_READ, np.int32)
    for i, (n, L) in enumerate(lens):
        first = max(0, L - n - window + 1) // BS if window else 0  # older blocks may have been freed
        for b in range(first, -(-L // BS)):
            tables[i, b] = free.pop()
    T = sum(n for n, _ in lens)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k_cache = rng.standard_normal((NB, BS, Hkv, D)).astype(kv_dtype)
    v_cache = rng.standard_normal((NB, BS, Hkv, D)).astype(kv_dtype)
    seq_lens = np.array([L for _, L in lens], np.int32)
    qsl = np.concatenate([[0], np.cumsum([n for n, _ in lens])]).astype(np.int32)
    return q, k_cache, v_cache, AttentionMetadata.from_host(tables, seq_lens, qsl)


def check(lib, batch, opts, atol=ATOL):
    """The kernel on 1 and 2 threads against the reference; 1 and 2 threads agree bit for bit."""
    q, kc, vc, meta = batch
    ref = paged_attention_ref(q, kc.astype(np.float32), vc.astype(np.float32), meta, opts)
    one = paged_attention(lib, q, kc, vc, meta, opts, 1)
    two = paged_attention(lib, q, kc, vc, meta, opts, 2)
    np.testing.assert_allclose(one, ref, rtol=RTOL, atol=atol)
    np.testing.assert_array_equal(one, two)


# (q_len, seq_len): decodes, a first prefill chunk, later chunks of long contexts,
# a chunk longer than a 32-row tile and than a 64-key chunk.
MIXED = [(1, 37), (9, 9), (1, 1), (23, 140), (1, 260), (70, 150), (2, 17)]


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("BS", [8, 16])
@pytest.mark.parametrize("G", [1, 3, 4])
@pytest.mark.parametrize("D", [64, 80, 96, 128])
def test_mixed_batch(lib, D, G, BS, kv_dtype):
    rng = np.random.default_rng(D * 100 + G * 10 + BS)
    batch = make_batch(rng, MIXED, 2 * G, 2, D, BS, kv_dtype)
    check(lib, batch, AttentionOptions(D**-0.5))


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("window, cap", [(24, None), (None, 30.0), (7, 30.0), (1, None)])
@pytest.mark.parametrize("G", [1, 4])
@pytest.mark.parametrize("D", [64, 128])
def test_sliding_window_and_soft_cap(lib, D, G, window, cap, kv_dtype):
    rng = np.random.default_rng(D + G + (window or 0))
    batch = make_batch(rng, MIXED, 3 * G, 3, D, 16, kv_dtype, window)
    check(lib, batch, AttentionOptions(D**-0.5, window, cap), ATOL_SOFT_CAP if cap else ATOL)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("seq_len", [1, 255, 1000, 4099])
def test_decode_cut_into_parts(lib, seq_len, kv_dtype):
    # A few long decodes make fewer tiles than the pool wants: their keys are cut
    # into parts merged afterwards (flash-decoding); the default model's shape.
    rng = np.random.default_rng(seq_len)
    batch = make_batch(rng, [(1, seq_len), (1, seq_len // 2 + 1)], 9, 3, 64, 16, kv_dtype)
    check(lib, batch, AttentionOptions(0.125))
    check(lib, batch, AttentionOptions(0.125, sliding_window=300))


@pytest.mark.parametrize("H, Hkv, D", [(40, 1, 64), (4, 4, 256), (6, 2, 32)])
def test_head_groups_beyond_a_tile_and_large_heads(lib, H, Hkv, D):
    # G = 40 splits a KV head's query heads over two tiles; D = 256 is the largest.
    rng = np.random.default_rng(H + D)
    batch = make_batch(rng, [(1, 50), (3, 80), (1, 3)], H, Hkv, D, 16, np.float16)
    check(lib, batch, AttentionOptions(D**-0.5))


def test_q_as_a_view_into_the_fused_qkv(lib):
    rng = np.random.default_rng(1)
    H, Hkv, D = 9, 3, 64
    q, kc, vc, meta = make_batch(rng, MIXED, H, Hkv, D, 16, np.float32)
    qkv = rng.standard_normal((len(q), (H + 2 * Hkv) * D)).astype(np.float32)
    qkv[:, : H * D] = q.reshape(len(q), -1)
    view = qkv[:, : H * D].reshape(len(q), H, D)  # row stride (H + 2 Hkv) D
    opts = AttentionOptions(0.125)
    got = paged_attention(lib, view, kc, vc, meta, opts, 2)
    np.testing.assert_array_equal(got, paged_attention(lib, q, kc, vc, meta, opts, 2))


def test_refuses_what_it_cannot_read(lib):
    rng = np.random.default_rng(2)
    q, kc, vc, meta = make_batch(rng, [(1, 5)], 4, 2, 64, 16, np.float32)
    with pytest.raises(TypeError, match="float32 or float16"):
        paged_attention(lib, q, kc.view(np.uint8), vc.view(np.uint8), meta, AttentionOptions(1.0), 1)
    with pytest.raises(ValueError, match="does not fit"):
        paged_attention(lib, q[:, :3], kc, vc, meta, AttentionOptions(1.0), 1)


def test_a_sequence_attends_the_same_alone_or_batched(lib):
    """A sequence's rows have the same bits whatever else is in the batch, and whichever
    chunk its queries came in: the key cuts sit at fixed positions (paged_attention.c)."""
    rng = np.random.default_rng(11)
    H, Hkv, D, BS, NB = 6, 2, 64, 16, 256
    k_cache = rng.standard_normal((NB, BS, Hkv, D)).astype(np.float32)
    v_cache = rng.standard_normal((NB, BS, Hkv, D)).astype(np.float32)
    lens = np.array([1500, 40, 700, 3], np.int32)
    tables = np.stack([rng.permutation(NB)[:100] for _ in lens]).astype(np.int32)
    q = rng.standard_normal((len(lens), H, D)).astype(np.float32)  # one decode query each

    def run(rows, q_rows, seq_lens, starts):
        meta = AttentionMetadata.from_host(tables[rows], seq_lens, starts)
        return paged_attention(lib, q_rows, k_cache, v_cache, meta, AttentionOptions(0.125), 2)

    batched = run(np.arange(len(lens)), q, lens, np.arange(len(lens) + 1, dtype=np.int32))
    for i in range(len(lens)):
        alone = run(np.array([i]), q[i : i + 1], lens[i : i + 1], np.array([0, 1], np.int32))
        np.testing.assert_array_equal(alone, batched[i : i + 1])


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("seq_len", [100, 128, 129, 200, 256, 300, 385, 511, 513, 700, 1100])
def test_a_query_attends_the_same_decoded_or_in_a_prefill_chunk(lib, seq_len, kv_dtype):
    """The last query of a context gets the same bits decoded alone, decoded beside
    other sequences, or as the last row of a 40-query prefill chunk (whose tiles start
    elsewhere and span the key cuts), on 1 and 2 threads: the keys are cut into parts
    at fixed positions (128, 256, 384, then every 512: paged_attention.c), never where
    a tile or the thread count would put them."""
    rng = np.random.default_rng(seq_len)
    H, Hkv, D, BS = 9, 3, 64, 16  # the default model's attention shape
    q, kc, vc, meta = make_batch(rng, [(40, seq_len), (1, 37), (1, 600)], H, Hkv, D, BS, kv_dtype)
    tables, lens = meta.block_tables, meta.seq_lens
    opts = AttentionOptions(0.125)
    last = q[39:40]

    def decode(rows, q_rows, nthreads):
        m = AttentionMetadata.from_host(tables[rows], lens[rows], np.arange(len(rows) + 1, dtype=np.int32))
        return paged_attention(lib, q_rows, kc, vc, m, opts, nthreads)

    chunk = paged_attention(lib, q, kc, vc, meta, opts, 2)[39]
    others = np.concatenate([last, q[40:]])
    for nthreads in (1, 2):
        np.testing.assert_array_equal(decode(np.array([0]), last, nthreads)[0], chunk)
        np.testing.assert_array_equal(decode(np.array([0, 1, 2]), others, nthreads)[0], chunk)
        np.testing.assert_array_equal(paged_attention(lib, q, kc, vc, meta, opts, nthreads)[39], chunk)
