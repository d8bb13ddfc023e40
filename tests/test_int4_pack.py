"""AWQ and GPTQ: our packer writes each format's layout, and the loader's conversion
to the internal int4 layout gives back exactly what was quantized."""

import numpy as np
import pytest

from rawpage.loader.quantized_checkpoint import awq_to_int4, gptq_to_int4
from rawpage.quantization.int4 import unpack_nibbles
from rawpage.quantization.weight import dequantize
from tools.int4_pack import dequantize_packed, pack_awq, pack_gptq


def weight(N=24, K=256, seed=0):
    return np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32)


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_round_trip(group_size, sym, act_order):
    w = weight()
    t = pack_gptq(w, group_size, sym, act_order)
    K, N = 256, 24
    G = K if group_size == -1 else group_size
    assert t["qweight"].shape == (K // 8, N) and t["qweight"].dtype == np.int32
    assert t["qzeros"].shape == (K // G, N // 8) and t["scales"].shape == (K // G, N)
    if sym:  # v1 format: zero point 8 stored as 7 in every nibble
        assert (t["qzeros"].view(np.uint32) == 0x77777777).all()
    reordered = act_order and group_size != -1  # with one group, act-order changes nothing
    assert reordered != np.array_equal(t["g_idx"], np.arange(K) // G)
    iw = gptq_to_int4(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], group_size)
    assert (iw.perm is not None) == reordered
    want = dequantize_packed(w, t["g_idx"], sym)
    np.testing.assert_array_equal(dequantize(iw), want)
    # within half a step (sym: step = max|w| / 7), or one step when the zero point is rounded too
    step = np.abs(w).max() * (1 / 7 if sym else 2 / 15)
    assert np.abs(want - w).max() <= step * (0.5 if sym else 1.0) * 1.01


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_awq_round_trip(group_size):
    w = weight(seed=1)
    t = pack_awq(w, group_size)
    assert t["qweight"].shape == (256, 3) and t["qzeros"].shape == (256 // group_size, 3)
    iw = awq_to_int4(t["qweight"], t["qzeros"], t["scales"])
    np.testing.assert_array_equal(dequantize(iw), dequantize_packed(w, np.arange(256) // group_size, False))


def test_awq_interleaves_columns_in_each_word():
    """Column 8j + 1 sits in nibble 4 of word j (AutoAWQ's order 0 2 4 6 1 3 5 7)."""
    w = np.zeros((8, 32), np.float32)
    w[1, :] = 1.0  # output column 1 gets the group maximum: q = 15; all others q = zero point
    t = pack_awq(w, 32)
    nibbles = unpack_nibbles(t["qweight"], axis=1)[0]  # input row 0, the 8 nibbles of word 0
    zero = unpack_nibbles(t["qzeros"], axis=1)[0]
    assert nibbles[4] == 15 and zero[4] == 0
    assert list(np.flatnonzero(nibbles != zero)) == [4]
