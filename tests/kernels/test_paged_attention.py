"""The decode and prefill attention kernels against paged_attention_ref.

Every batch has scattered block tables whose entries past a sequence's end
point far outside the cache, and every cache slot that no sequence owns (whole
blocks, and the tail of a partly filled last block) holds NaN: a kernel that
reads anything it should not either faults (caught by the simulator's fences)
or returns NaN.
"""

import numpy as np
import pytest

from rawpage.ops.paged_attention import (
    PREFILL_ROWS,
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


def run(device, dev, scale, q_lens, ctx_lens, partition_size=None):
    return device.get(
        launch_paged_attention(
            device.xp,
            device.loader,
            *dev,
            scale,
            max_query_len=max(q_lens),
            max_seq_len=max(ctx_lens),
            partition_size=partition_size,
        )
    )


def reference(host, scale):
    q, kc, vc, tables, seq_lens, qsl = host
    # The reference may read the NaN padding of the last block, then slice it off.
    return paged_attention_ref(q, np.nan_to_num(kc), np.nan_to_num(vc), tables, seq_lens, qsl, scale)


# ---- decode ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("H,Hkv", GQA)
@pytest.mark.parametrize("BS", [16, 32])
def test_decode(device, dtype, D, H, Hkv, BS):
    """Contexts that fill their last block exactly (BS, 2 BS) and ones that do
    not; one partition, and split-K with partitions of 32 tokens (some partial)."""
    rng = np.random.default_rng(D * 100 + H * 10 + BS)
    ctx = [1, BS, 2 * BS, 3 * BS - 5, 77]
    q_lens = [1] * len(ctx)
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, H, Hkv, D, BS)
    want = reference(host, D**-0.5)
    assert_close(run(device, dev, D**-0.5, q_lens, ctx), want, dtype, "one partition")
    assert_close(run(device, dev, D**-0.5, q_lens, ctx, 32), want, dtype, "split-K")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [16, 32, 80, 96, 256])
def test_decode_other_head_sizes(device, dtype, D):
    rng = np.random.default_rng(D)
    ctx, q_lens = [5, 40, 17], [1, 1, 1]
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, 6, 2, D, 16)
    want = reference(host, 0.3)
    assert_close(run(device, dev, 0.3, q_lens, ctx), want, dtype)
    assert_close(run(device, dev, 0.3, q_lens, ctx, 16), want, dtype, "split-K")


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_long_context_splits_by_default(device, dtype):
    """Past 512 tokens the launch code splits on its own (P = 3 here)."""
    rng = np.random.default_rng(11)
    ctx, q_lens = [1100, 300], [1, 1]
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, 4, 2, 64, 16)
    assert_close(run(device, dev, 0.125, q_lens, ctx), reference(host, 0.125), dtype)


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
    if dtype == "float32" and D > 128:
        pytest.skip("float32 prefill stops at head size 128 (tested above)")
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
    if dtype == "float32" and D > 128:
        with pytest.raises(ValueError, match="up to 128"):
            run(device, dev, 0.2, q_lens, ctx)
        return
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
    with pytest.raises(SimLaunchError, match="__trap"):
        kernel((1, 2, 1), (128,), args, shared_mem=smem)
    assert PREFILL_ROWS == 64


def test_unsupported_head_size_says_which_are(device):
    rng = np.random.default_rng(0)
    host, dev = paged_batch(device, "float16", rng, [1], [4], 2, 2, 48, 16)
    with pytest.raises(ValueError, match="head size 48"):
        run(device, dev, 0.1, [1], [4])


def test_prefill_shared_memory_fits_sm80():
    """Every compiled (dtype, head size) needs at most sm_80's 163 KiB per block."""
    for suffix, itemsize in (("f32", 4), ("f16", 2), ("bf16", 2)):
        for D in (16, 32, 64, 80, 96, 128, 256):
            if suffix == "f32" and D > 128:
                continue
            assert prefill_smem_bytes(D, prefill_key_tile(suffix, D), itemsize) <= 163 * 1024
