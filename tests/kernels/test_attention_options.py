"""Sliding window and soft cap in the decode and prefill kernels, against
paged_attention_ref.

The blocks that lie wholly before every query's window are "freed" the way the
block manager frees them: their table entries become a sentinel far outside the
cache and their slots hold NaN, so a kernel that reads one faults under the
simulator's fences or returns NaN.
"""

import numpy as np
import pytest

from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.paged_attention import launch_paged_attention, paged_attention_ref
from tests.kernels.conftest import DTYPES, assert_close
from tests.kernels.test_paged_attention import UNUSED_BLOCK, paged_batch


def free_out_of_window(host, dev, device, dtype, q_lens, window):
    """Poison every block no query of its sequence can see (as if freed); returns new dev arrays."""
    q, kc, vc, tables, seq_lens, qsl = host
    tables, kc, vc = tables.copy(), kc.copy(), vc.copy()
    bs = kc.shape[1]
    for i, (n, L) in enumerate(zip(q_lens, seq_lens)):
        first = max(0, int(L) - n - window + 1)  # oldest key the chunk's first query sees
        for j in range(first // bs):
            kc[tables[i, j]] = vc[tables[i, j]] = np.nan
            tables[i, j] = UNUSED_BLOCK
    host = (q, kc, vc, tables, seq_lens, qsl)
    return host, (dev[0], device.put(kc, dtype), device.put(vc, dtype), device.put_raw(tables), *dev[4:])


def check(device, dtype, rng, q_lens, ctx, H, Hkv, D, BS, window, cap, partitions=None):
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx, H, Hkv, D, BS)
    if window:
        host, dev = free_out_of_window(host, dev, device, dtype, q_lens, window)
    q, kc, vc, *arrays = host
    opts = AttentionOptions(D**-0.5, sliding_window=window, soft_cap=cap)
    want = paged_attention_ref(q, np.nan_to_num(kc), np.nan_to_num(vc), AttentionMetadata.from_host(*arrays), opts)
    meta = AttentionMetadata(*dev[3:], max_query_len=max(q_lens), max_seq_len=max(ctx))
    got = launch_paged_attention(
        device.xp, device.loader, *dev[:3], meta, opts, partitions=partitions, min_partition=16
    )
    assert_close(device.get(got), want, dtype, f"window {window} cap {cap}")


# Windows: none; 5 (inside one 16-token block); 20 and 37 (crossing block boundaries).
WINDOWS = [None, 5, 20, 37]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("cap", [None, 2.0])
@pytest.mark.parametrize("D,H,Hkv", [(64, 8, 2), (128, 4, 4), (256, 8, 1)])
def test_decode_window_and_cap(device, dtype, window, cap, D, H, Hkv):
    """Contexts shorter than, equal to and longer than the window; one partition
    and split-K (partitions then cover only the window)."""
    rng = np.random.default_rng(D + H + (window or 0))
    ctx = [3, 20, 37, 100]
    check(device, dtype, rng, [1] * 4, ctx, H, Hkv, D, 16, window, cap, partitions=1)
    check(device, dtype, rng, [1] * 4, ctx, H, Hkv, D, 16, window, cap, partitions=3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("cap", [None, 2.0])
@pytest.mark.parametrize("D,H,Hkv", [(64, 8, 2), (128, 4, 4), (256, 4, 2)])
def test_prefill_window_and_cap(device, dtype, window, cap, D, H, Hkv):
    """A whole prompt longer than one query tile (rows whose windows start in
    different key tiles), a chunk over a cached prefix, a decode row in a prefill
    batch, a sequence with no new tokens."""
    rng = np.random.default_rng(D + H + (window or 0) + 1)
    check(device, dtype, rng, [70, 9, 1, 0], [70, 60, 50, 20], H, Hkv, D, 16, window, cap)


def test_options_are_checked(device):
    rng = np.random.default_rng(0)
    host, dev = paged_batch(device, "float16", rng, [1], [4], 2, 2, 64, 16)
    meta = AttentionMetadata(*dev[3:], max_query_len=1, max_seq_len=4)
    with pytest.raises(ValueError, match="sliding_window must be a positive"):
        launch_paged_attention(device.xp, device.loader, *dev[:3], meta, AttentionOptions(0.1, sliding_window=0))
    with pytest.raises(ValueError, match="soft_cap must be positive"):
        launch_paged_attention(device.xp, device.loader, *dev[:3], meta, AttentionOptions(0.1, soft_cap=-1.0))
