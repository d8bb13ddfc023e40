"""cuda/lora.cu's shrink and expand kernels against the NumPy references in
rawpage/ops/lora.py: ranks 8, 16 and 64 (and a fused q/k/v's stacked 3 x 16), ragged
segments, segments without an adapter, and every dtype."""

import numpy as np
import pytest

from rawpage.ops.lora import launch_lora_expand, launch_lora_shrink, lora_expand_ref, lora_shrink_ref
from tests.kernels.conftest import DTYPES, assert_close

# (query lengths of the segments, their slots: -1 = no adapter)
SEGMENTS = [
    ([1], [0]),
    ([1, 1, 1, 1], [2, -1, 0, 2]),  # a decode batch: one token per segment
    ([5, 1, 3, 7], [1, 0, -1, 1]),  # ragged: prefill chunks and decodes together
    ([3, 2], [-1, -1]),  # no adapter at all: y is left as it was
]


def _segments(lens, slots):
    starts = np.zeros(len(lens) + 1, np.int32)
    np.cumsum(lens, out=starts[1:])
    return starts, np.array(slots, np.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rank", [8, 16, 48, 64])
@pytest.mark.parametrize("case", range(len(SEGMENTS)))
def test_lora_shrink_and_expand(device, dtype, rank, case):
    lens, slots = SEGMENTS[case]
    starts, seg_slots = _segments(lens, slots)
    T, n_in, n_out, S = int(starts[-1]), 96, 200, 3  # 200: the last expand block is partly idle
    rng = np.random.default_rng(rank + case)
    x = device.rounded(rng.standard_normal((T, n_in)), dtype)
    a = device.rounded(rng.standard_normal((S, rank, n_in)) / np.sqrt(n_in), dtype)
    b = device.rounded(rng.standard_normal((S, rank, n_out)) / np.sqrt(rank), dtype)
    y = device.rounded(rng.standard_normal((T, n_out)), dtype)
    xp, loader = device.xp, device.loader
    d_starts, d_slots = device.put_raw(starts), device.put_raw(seg_slots)

    v = launch_lora_shrink(xp, loader, device.put(x, dtype), device.put(a, dtype), d_starts, d_slots)
    want_v = lora_shrink_ref(x, a, starts, seg_slots)
    used = np.repeat(seg_slots, lens) >= 0  # rows of segments without an adapter are never read
    assert_close(device.get(v)[used], want_v[used], "float32", "shrink")

    d_y = device.put(y, dtype)
    v_in = np.where(used[:, None], want_v, 0).astype(np.float32)
    launch_lora_expand(xp, loader, d_y, device.put_raw(v_in), device.put(b, dtype), d_starts, d_slots)
    assert_close(device.get(d_y), lora_expand_ref(y, v_in, b, starts, seg_slots), dtype, "expand")


def test_lora_shrink_refuses_a_mismatched_adapter(device):
    x = device.put(np.zeros((2, 64)), "float32")
    a = device.put(np.zeros((1, 8, 32)), "float32")
    starts, slots = device.put_raw(np.array([0, 2], np.int32)), device.put_raw(np.array([0], np.int32))
    with pytest.raises(ValueError, match="does not fit"):
        launch_lora_shrink(device.xp, device.loader, x, a, starts, slots)
