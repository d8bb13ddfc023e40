"""The LM head kernel (float activations on Q8_0 blocks) against x @ dequantized W.T."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from rawpage.native.lm_head import lm_head_q8_0
from rawpage.ops.gguf_linear import gguf_linear_ref


@pytest.mark.parametrize("T,N,K", [(1, 1, 32), (1, 37, 64), (3, 50, 96), (4, 16, 576), (5, 33, 128), (9, 70, 32)])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_lm_head_matches_the_dequantized_product(lib, T, N, K, nthreads):
    rng = np.random.default_rng(T * N + K)
    data = quantize(rng.standard_normal((N, K)).astype(np.float32), GGMLQuantizationType.Q8_0)
    x = rng.standard_normal((T, K)).astype(np.float32)
    want = gguf_linear_ref(x.astype(np.float64), data, "Q8_0", (N, K))
    got = lm_head_q8_0(lib, x, data, (N, K), nthreads)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_lm_head_refuses_a_mismatched_weight(lib):
    data = np.zeros((4, 34), np.uint8)
    with pytest.raises(ValueError, match="do not make"):
        lm_head_q8_0(lib, np.zeros((1, 64), np.float32), data, (4, 64), 1)
