"""The decode and prefill attention kernels against paged_attention_ref.

Every batch has scattered block tables whose entries past a sequence's end
point far outside the cache, and every cache slot that no sequence owns (whole
blocks, and the tail of a partly filled last block) holds NaN: a kernel that
reads anything it should not either faults (caught by the simulator's fences)
or returns NaN.
"""

import numpy as np
import pytest

from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.launch import NULL_POINTER
from rawpage.ops.paged_attention import (
    PREFILL_ROWS,
    decode_group,
    decode_partitions,
    launch_paged_attention,
    paged_attention_ref,
    prefill_key_tile,
    prefill_smem_bytes,
)
from tests.kernels.conftest import DTYPES, assert_close

GQA = [(4, 4), (8, 2), (9, 3)]  # (H, Hkv): MHA, 4 query heads per KV head, SmolLM2's 3
UNUSED_BLOCK = 1 << 29  # table entries past a sequence's end: unusable as a block id


def paged_batch(device, dtype, rng, q_lens, ctx_lens, H, Hkv, D, BS):
    """Host copies (float32, rounded to dtype) and device arrays of a random paged batch."""
    B = len(ctx_lens)
    blocks = [-(-L // BS) for L in ctx_lens]
    NB = sum(blocks) + 3
    k_cache = np.full((NB, BS, Hkv, D), np.nan, np.float32)
    v_cache = np.full((NB, BS, Hkv, D), np.nan, np.float32)
    tables = np.full((B, max(blocks) + 2), UNUSED_BLOCK, np.int32)
    perm = rng.permutation(NB)
    used = 0
    for i, L in enumerate(ctx_lens):
        tables[i, : blocks[i]] = perm[used : used + blocks[i]]
        used += blocks[i]
        for j in range(L):
            b, o = tables[i, j // BS], j % BS
            k_cache[b, o] = rng.standard_normal((Hkv, D))
            v_cache[b, o] = rng.standard_normal((Hkv, D))
    k_cache, v_cache = device.rounded(k_cache, dtype), device.rounded(v_cache, dtype)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = device.rounded(rng.standard_normal((int(qsl[-1]), H, D)), dtype)
    seq_lens = np.array(ctx_lens, np.int32)
    host = (q, k_cache, v_cache, tables, seq_lens, qsl)
    dev = (
        device.put(q, dtype),
        device.put(k_cache, dtype),
        device.put(v_cache, dtype),
        device.put_raw(tables),
        device.put_raw(seq_lens),
        device.put_raw(qsl),
    )
    return host, dev


def run(device, dev, scale, q_lens, ctx_lens, partitions=None):
    q, kc, vc, *arrays = dev
    meta = AttentionMetadata(*arrays, max_query_len=max(q_lens), max_seq_len=max(ctx_lens))
    opts = AttentionOptions(scale)
    return device.get(launch_paged_attention(device.xp, device.loader, q, kc, vc, meta, opts, partitions=partitions))


def reference(host, scale):
    q, kc, vc, *arrays = host
    # The reference may read the NaN padding of the last block, then slice it off.
    meta = AttentionMetadata.from_host(*arrays)
    return paged_attention_ref(q, np.nan_to_num(kc), np.nan_to_num(vc), meta, AttentionOptions(scale))


# ---- decode ------------------------------------------------------------------------

# (H, Hkv): GQA 1, 4 and 8; SmolLM2's 3 (a group padded to the kernel's 4); a
# group of 16, which two blocks per KV head share.
DECODE_GQA = [(2, 2), (8, 2), (8, 1), (9, 3), (16, 1)]


def decode_contexts(BS: int) -> list[int]:
    """The first token of the first block, the last and first token around a
    block boundary, and contexts long enough for more than 2 partitions of 32."""
    return [1, BS, BS + 1, 2 * BS - 1, 77, 3 * 32 + 5]


def run_decode(device, dev, scale, ctx, partitions=None, min_partition=16, max_seq_len=None):
    q, kc, vc, *arrays = dev
    meta = AttentionMetadata(*arrays, max_query_len=1, max_seq_len=max_seq_len or max(ctx))
    out = launch_paged_attention(
        device.xp,
        device.loader,
        q,
        kc,
        vc,
        meta,
        AttentionOptions(scale),
        partitions=partitions,
        min_partition=min_partition,
    )
    return device.get(out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D,BS", [(64, 16), (128, 32), (256, 16)])
@pytest.mark.parametrize("H,Hkv", DECODE_GQA)
def test_decode(device, dtype, D, BS, H, Hkv):
    """A ragged batch, in one partition, and split-K into partitions of 32 tokens
    (max(16, roundup(ceil(L / 4), 16)): up to 4 per sequence, some partial)."""
    rng = np.random.default_rng(D * 100 + H * 10 + BS)
    ctx = decode_contexts(BS)
    host, dev = paged_batch(device, dtype, rng, [1] * len(ctx), ctx, H, Hkv, D, BS)
    want = reference(host, D**-0.5)
    assert_close(run_decode(device, dev, D**-0.5, ctx, partitions=1), want, dtype, "one partition")
    assert_close(run_decode(device, dev, D**-0.5, ctx, partitions=4), want, dtype, "split-K")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [16, 32, 80, 96])
def test_decode_other_head_sizes(device, dtype, D):
    """Also block size 8: a warp step's keys span up to 5 table entries."""
    rng = np.random.default_rng(D)
    ctx = [5, 40, 17]
    host, dev = paged_batch(device, dtype, rng, [1, 1, 1], ctx, 6, 2, D, 8)
    want = reference(host, 0.3)
    assert_close(run_decode(device, dev, 0.3, ctx, partitions=1), want, dtype)
    assert_close(run_decode(device, dev, 0.3, ctx, partitions=3), want, dtype, "split-K")


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_splits_by_default_and_for_a_longer_captured_context(device, dtype):
    """The launch code picks P from the batch and the SM count; a CUDA graph
    captured with max_seq_len = 4096 keeps that P for shorter contexts, which
    the kernel then cuts into (at least 64-token) partitions of their own."""
    rng = np.random.default_rng(11)
    ctx = [1100, 300, 1]
    host, dev = paged_batch(device, dtype, rng, [1, 1, 1], ctx, 4, 2, 64, 16)
    want = reference(host, 0.125)
    assert_close(run_decode(device, dev, 0.125, ctx, min_partition=64), want, dtype, "default split")
    assert_close(run_decode(device, dev, 0.125, ctx, min_partition=64, max_seq_len=4096), want, dtype, "captured")


def test_decode_partition_count():
    # One sequence, 8 KV heads, 132 SMs: P for 4 blocks per SM, capped by 64-token partitions.
    assert decode_partitions(1, 8, 1024, 132) == 16
    assert decode_partitions(1, 8, 8192, 132) == 66
    # A batch that fills the GPU is not split; a short context never is.
    assert decode_partitions(256, 8, 4096, 132) == 1
    assert decode_partitions(1, 8, 64, 132) == 1
    assert decode_partitions(33, 8, 2048, 132) == 2


def test_decode_group_rounds_up_to_a_compiled_size():
    assert [decode_group(H, Hkv) for H, Hkv in [(4, 4), (9, 3), (8, 2), (14, 2), (32, 4), (64, 4)]] == [
        1,
        4,
        4,
        8,
        8,
        8,
    ]


# ---- prefill -----------------------------------------------------------------------

# (query lengths, context lengths): a whole prompt; chunked prefills over a
# cached prefix, one longer than a 64-row query tile; a decode row in the batch;
# a sequence with no new tokens.
PREFILL_BATCH = ([13, 5, 1, 70, 0], [13, 37, 50, 100, 20])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("H,Hkv", GQA)
@pytest.mark.parametrize("BS", [16, 32])
def test_prefill(device, dtype, D, H, Hkv, BS):
    rng = np.random.default_rng(D * 100 + H * 10 + BS + 1)
    q_lens, ctx = PREFILL_BATCH
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, H, Hkv, D, BS)
    assert_close(run(device, dev, D**-0.5, q_lens, ctx), reference(host, D**-0.5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("BS", [16, 32])
def test_prefill_chunks_at_block_edges_and_long_prefixes(device, dtype, D, BS):
    """Chunks that begin on a block's first token and end on a block's last; a
    chunk of one token that is a block's first, and one that is a block's last;
    a prefix of several key tiles, so both shared-memory stages are refilled,
    under a chunk of more than one query tile; GQA 8."""
    rng = np.random.default_rng(D + BS)
    q_lens = [BS, 2 * BS, 1, 1, 100]
    ctx = [2 * BS, 3 * BS, 2 * BS + 1, 2 * BS, 230]
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, 8, 1, D, BS)
    assert_close(run(device, dev, D**-0.5, q_lens, ctx), reference(host, D**-0.5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [16, 32, 80, 96, 256])
def test_prefill_other_head_sizes(device, dtype, D):
    rng = np.random.default_rng(D + 1)
    q_lens, ctx = [9, 66], [30, 66]
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, 4, 2, D, 16)
    assert_close(run(device, dev, 0.2, q_lens, ctx), reference(host, 0.2), dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_prefill_query_as_a_view_into_qkv(device, dtype):
    """The model passes q as a strided view of the fused qkv output."""
    rng = np.random.default_rng(5)
    H, Hkv, D = 4, 2, 64
    q_lens, ctx = [20, 3], [20, 40]
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, H, Hkv, D, 16)
    q = host[0]
    qkv = np.concatenate([q.reshape(len(q), H * D), rng.standard_normal((len(q), 2 * Hkv * D))], 1)
    q_view = device.put(qkv, dtype)[:, : H * D].reshape(-1, H, D)
    got = run(device, (q_view, *dev[1:]), 0.125, q_lens, ctx)
    assert_close(got, reference(host, 0.125), dtype)


@pytest.mark.parametrize(
    "dtype,suffix,source",
    [
        ("float16", "f16", "paged_attention_prefill.cu"),
        ("float32", "f32", "paged_attention_prefill_f32.cu"),
    ],
)
def test_prefill_smem_formula_is_exactly_what_the_kernel_needs(device, dtype, suffix, source):
    """The kernel traps when given less shared memory than its layout: launching
    with 128 bytes less than rawpage computes must fail, so the formula is tight."""
    if device.name != "sim":
        pytest.skip("a trap on a GPU poisons the CUDA context")
    from rawpage.sim import SimLaunchError

    D = 64
    rng = np.random.default_rng(0)
    host, dev = paged_batch(device, dtype, rng, [3], [3], 2, 2, D, 16)
    bc = prefill_key_tile(suffix, D)
    itemsize = np.dtype(dtype).itemsize
    smem = prefill_smem_bytes(D, bc, itemsize) - 128
    kernel = device.loader.get_function(source, f"paged_attention_prefill_{suffix}_d{D}_bc{bc}")
    out = device.xp.empty((3, 2, D), dtype)
    q, kc, vc, tables, seq_lens, qsl = dev
    args = (out, q, kc, vc, tables, seq_lens, qsl, np.int32(tables.shape[1]), np.int32(2))
    args += (np.int32(16), np.int32(2 * D), np.float32(0.1), np.int32(smem))  # q_stride: H * D
    args += (np.int32(0), np.float32(0.0), NULL_POINTER)  # no sliding window, no soft cap, no image rows
    with pytest.raises(SimLaunchError, match="__trap"):
        kernel((1, 2, 1), (128,), args, shared_mem=smem)
    assert PREFILL_ROWS == 64


def test_decode_says_it_needs_a_power_of_two_block_size(device):
    rng = np.random.default_rng(0)
    host, dev = paged_batch(device, "float16", rng, [1], [30], 2, 2, 64, 24)
    with pytest.raises(ValueError, match="power-of-two block size, got 24"):
        run_decode(device, dev, 0.1, [30])


def test_unsupported_head_size_says_which_are(device):
    rng = np.random.default_rng(0)
    host, dev = paged_batch(device, "float16", rng, [1], [4], 2, 2, 48, 16)
    with pytest.raises(ValueError, match="head size 48"):
        run(device, dev, 0.1, [1], [4])


def test_prefill_shared_memory_fits_sm80():
    """Every compiled (dtype, head size) needs at most sm_80's 163 KiB per block."""
    for suffix, itemsize in (("f32", 4), ("f16", 2), ("bf16", 2)):
        for D in (16, 32, 64, 80, 96, 128, 256):
            assert prefill_smem_bytes(D, prefill_key_tile(suffix, D), itemsize) <= 163 * 1024


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,Hkv", [(9, 3), (8, 2)])
@pytest.mark.parametrize("BS", [16, 32])
def test_speculative_verification_shapes(device, dtype, H, Hkv, BS):
    """Speculative decoding's verification step: each sequence brings its last token and
    k drafts (k + 1 query tokens, k <= 4 here, one with none) at the end of a long
    context, across block edges; the batch goes to the prefill kernel."""
    rng = np.random.default_rng(H * 10 + BS)
    q_lens = [5, 5, 1, 3, 5, 2]
    ctx = [70, 2 * BS + 2, 40, BS + 1, 5, 133]
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, H, Hkv, 64, BS)
    assert_close(run(device, dev, 64**-0.5, q_lens, ctx), reference(host, 64**-0.5), dtype)
