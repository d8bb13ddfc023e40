"""The bf16-weight kernel (bf16_matmul.c) against its NumPy reference, on every path:
exact weights with float32 x, and the vdpbf16ps variant with x rounded to bf16."""

from __future__ import annotations

import numpy as np
import pytest

from rawpage.dtypes import bf16_from_f32
from rawpage.native.bf16 import bf16_matmul
from rawpage.ops.bf16_linear import bf16_linear_ref

# (T, N, K): decode and prefill row counts, row tails (N % 4), K tails past 8/16/32
SHAPES = [(1, 1, 1), (1, 37, 64), (2, 50, 96), (3, 16, 576), (5, 33, 100), (9, 70, 32), (17, 21, 1536)]


@pytest.mark.parametrize("T,N,K", SHAPES)
@pytest.mark.parametrize("nthreads", [1, 3])
@pytest.mark.parametrize("round_x", [False, True])
def test_bf16_matmul_matches_the_reference(lib, T, N, K, nthreads, round_x):
    rng = np.random.default_rng(T * N + K)
    w = bf16_from_f32(rng.standard_normal((N, K)))  # (N, K) uint16
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    want = bf16_linear_ref(x, w, round_x) + bias
    got = bf16_matmul(lib, x, w, nthreads, bias, round_x)
    # float32 summation of K products of unit size: a few ulps of sqrt(K)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.sqrt(K) * 4)


def test_exact_weights_beat_rounded_activations(lib):
    """What round_x costs: on K = 576 the exact kernel is float32-close to the float64
    product; rounding x to bf16 moves y by ~2^-9 relative per term."""
    rng = np.random.default_rng(7)
    w = bf16_from_f32(rng.standard_normal((64, 576)))
    x = rng.standard_normal((4, 576)).astype(np.float32)
    exact = bf16_linear_ref(x, w)
    err = [np.abs(bf16_matmul(lib, x, w, 2, round_x=r) - exact).max() for r in (False, True)]
    assert err[0] < 1e-4 < err[1] < 0.2, err


def test_bf16_matmul_refuses_a_mismatched_weight(lib):
    with pytest.raises(ValueError, match="do not make"):
        bf16_matmul(lib, np.zeros((1, 64), np.float32), np.zeros((4, 32), np.uint16), 1)
