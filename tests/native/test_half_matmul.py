"""The 16-bit-weight kernel (half_matmul.c) against its NumPy reference, on every path:
exact bf16 or f16 weights with float32 x, and the vdpbf16ps variant with x rounded to bf16."""

from __future__ import annotations

import numpy as np
import pytest

from rawpage.dtypes import bf16_from_f32
from rawpage.native.half import half_matmul, half_rows
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
    got = half_matmul(lib, x, w, nthreads, bias, round_x=round_x)
    # float32 summation of K products of unit size: a few ulps of sqrt(K)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.sqrt(K) * 4)


def test_exact_weights_beat_rounded_activations(lib):
    """What round_x costs: on K = 576 the exact kernel is float32-close to the float64
    product; rounding x to bf16 moves y by ~2^-9 relative per term."""
    rng = np.random.default_rng(7)
    w = bf16_from_f32(rng.standard_normal((64, 576)))
    x = rng.standard_normal((4, 576)).astype(np.float32)
    exact = bf16_linear_ref(x, w)
    err = [np.abs(half_matmul(lib, x, w, 2, round_x=r) - exact).max() for r in (False, True)]
    assert err[0] < 1e-4 < err[1] < 0.2, err


@pytest.mark.parametrize("T,N,K", SHAPES)
def test_f16_weights_widen_exactly(lib, T, N, K):
    """A GGUF's F16 tensor as stored: the product of its exact float32 widening."""
    rng = np.random.default_rng(T + N * K)
    w16 = rng.standard_normal((N, K)).astype(np.float16)
    x = rng.standard_normal((T, K)).astype(np.float32)
    want = x.astype(np.float64) @ w16.astype(np.float64).T
    got = half_matmul(lib, x, w16.view(np.uint16), 3, f16=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.sqrt(K) * 4)


def test_half_matmul_refuses_a_mismatched_weight(lib):
    with pytest.raises(ValueError, match="do not make"):
        half_matmul(lib, np.zeros((1, 64), np.float32), np.zeros((4, 32), np.uint16), 1)
    with pytest.raises(ValueError, match="takes bf16 weights"):
        half_matmul(lib, np.zeros((1, 32), np.float32), np.zeros((4, 32), np.uint16), 1, f16=True, round_x=True)


@pytest.mark.parametrize("f16", [False, True])
def test_rows_widen_exactly(lib, f16):
    """A 16-bit embedding table's rows (a bf16 checkpoint's, a GGUF's F16 / BF16), in C so
    that a decode step replays from its recording."""
    rng = np.random.default_rng(int(f16))
    w = rng.standard_normal((50, 96)).astype(np.float32)
    bits = w.astype(np.float16).view(np.uint16) if f16 else bf16_from_f32(w)
    table = bits.view(np.float16).astype(np.float32) if f16 else (bits.astype(np.uint32) << 16).view(np.float32)
    ids = rng.integers(0, 50, 700)  # enough values to split over threads
    np.testing.assert_array_equal(half_rows(lib, bits, ids, 3, f16=f16), table[ids])
    with pytest.raises(ValueError, match="row ids must be in 0 .. 49"):
        half_rows(lib, bits, np.array([50]), 1, f16=f16)
