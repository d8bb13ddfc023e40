"""Image rows in the prefill kernels (AttentionMetadata.key_end), against
paged_attention_ref: the tokens of an image attend to each other both ways
(Gemma 3), every other row stays causal. The NaN-poisoned paged batches of
test_paged_attention.py: a kernel that reads a key past the context faults or
returns NaN."""

import numpy as np
import pytest

from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.paged_attention import launch_paged_attention, paged_attention_ref
from tests.kernels.conftest import DTYPES, assert_close
from tests.kernels.test_paged_attention import paged_batch


def key_ends(q_lens, ctx_lens, images):
    """(T,) int32: for each (sequence, first position, length) image, its rows see up to
    its last position; -1 elsewhere."""
    qsl = np.concatenate([[0], np.cumsum(q_lens)])
    key_end = np.full(int(qsl[-1]), -1, np.int32)
    for i, first, n in images:
        row = qsl[i] + first - (ctx_lens[i] - q_lens[i])  # the batch row of position `first`
        key_end[row : row + n] = first + n - 1
    return key_end


def check(device, dtype, rng, q_lens, ctx_lens, images, H, Hkv, D, window=None) -> float:
    """The kernel against the reference; returns how far the image rows moved the reference
    from causal attention (a case where they do not would test nothing)."""
    host, dev = paged_batch(device, dtype, rng, q_lens, ctx_lens, H, Hkv, D, 16)
    q, kc, vc, *arrays = host
    kc, vc = np.nan_to_num(kc), np.nan_to_num(vc)
    key_end = key_ends(q_lens, ctx_lens, images)
    opts = AttentionOptions(D**-0.5, sliding_window=window)
    want = paged_attention_ref(q, kc, vc, AttentionMetadata.from_host(*arrays, key_end), opts)
    meta = AttentionMetadata(*dev[3:], max(q_lens), max(ctx_lens), key_end=device.put_raw(key_end))
    got = device.get(launch_paged_attention(device.xp, device.loader, *dev[:3], meta, opts))
    assert_close(got, want, dtype, f"images {images}, window {window}")
    causal = paged_attention_ref(q, kc, vc, AttentionMetadata.from_host(*arrays), opts)
    return float(np.abs(want - causal).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("D,H,Hkv", [(64, 8, 2), (256, 4, 4)])
def test_prefill_with_image_rows(device, dtype, window, D, H, Hkv):
    """Sequence 0: a 90-token prompt with an image across the first query tile's last
    rows and the second's first (rows 50..63 see keys past their tile's last row, into
    another key tile), and one image inside a key tile. Sequence 1: a chunk over a
    cached prefix with an image in it. Sequence 2: a decode row; sequence 3: text only."""
    rng = np.random.default_rng(D + H + (window or 0))
    images = [(0, 50, 24), (0, 5, 10), (1, 45, 11)]
    assert check(device, dtype, rng, [90, 20, 1, 9], [90, 60, 50, 40], images, H, Hkv, D, window) > 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
def test_whole_sequence_one_image_is_full_attention(device, dtype):
    """Every row sees every key (the vision encoder's attention): 70 rows, one image."""
    rng = np.random.default_rng(7)
    assert check(device, dtype, rng, [70], [70], [(0, 0, 70)], 2, 2, 64) > 1e-2


def test_decode_rows_with_key_end_go_to_the_prefill_kernel(device):
    """A one-token image (max_query_len 1) with key_end still means its own position."""
    rng = np.random.default_rng(3)
    check(device, "float16", rng, [1, 1], [5, 30], [(1, 29, 1)], 4, 2, 64)
