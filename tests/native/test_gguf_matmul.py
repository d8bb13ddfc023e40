"""GGUF GEMV/GEMM on the CPU (rawpage/native/gguf_matmul.c) on every instruction-set path
this machine runs, against the MMVQ reference: x rounded to int8 per 32-value chunk
(quantize_q8_ref), times the `gguf` package's dequantized weights, in float64.

The integer parts are exact, so the only differences are float32 rounding of the
per-lane scales and sums: 1e-5 of the output's scale. Blocks are random bits in
every field (tests/kernels random_blocks), and for the formats `gguf` can quantize,
real quantized Gaussian weights too."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from rawpage.native.gguf import NATIVE_GGUF, gguf_matmul, gguf_rows, quantize_q8
from rawpage.ops.gguf_mmvq import quantize_q8_ref
from rawpage.quantization.gguf import GGUF_BLOCKS, gguf_dequantize_ref
from tests.kernels.test_gguf_linear import random_blocks

TOKENS = [1, 2, 3, 5, 8, 17, 64]
# (N, K): N odd and not a multiple of the 16-row split; K one block, and several
# (for the 32-blocks an odd number of chunks too: the zmm path's half pair)
SHAPES = {32: [(7, 32), (37, 96), (19, 576)], 256: [(5, 256), (21, 768)]}
CASES = [(q, N, K) for q in sorted(NATIVE_GGUF) for N, K in SHAPES[GGUF_BLOCKS[q][0]]]


@functools.cache
def weight(qtype: str, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(blocks (N, row_bytes) uint8, their dequantized (N, K) float64), made once."""
    data = random_blocks(np.random.default_rng(N * K), qtype, N, K)
    return data, gguf_dequantize_ref(data, qtype, (N, K)).astype(np.float64)


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (T, K) float32, w (N, K) -> (T, N) float64: the product with x as dx * xq."""
    xq, dx = quantize_q8_ref(x)
    T, K = x.shape
    return (xq.reshape(T, K // 32, 32) * dx[..., None].astype(np.float64)).reshape(T, K) @ w.T


def assert_close(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    scale = np.abs(want).max()  # K terms of either sign: compare at the output's size
    np.testing.assert_allclose(got / scale, want / scale, rtol=0, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("qtype,N,K", CASES)
def test_matmul_matches_reference(lib, qtype, N, K, T):
    data, w = weight(qtype, N, K)
    x = np.random.default_rng(T + K).standard_normal((T, K)).astype(np.float32)
    got = gguf_matmul(lib, x, data, qtype, (N, K), nthreads=2)
    assert got.shape == (T, N) and got.dtype == np.float32 and got.flags.c_contiguous
    assert_close(got, reference(x, w))


@pytest.mark.parametrize("T", [1, 2, 6])  # the zmm path's 4 rows x 1 token, 2 x 2, 1 x 4 tiles
@pytest.mark.parametrize("qtype", sorted(NATIVE_GGUF))
def test_threads_and_bias(lib, qtype, T):
    """1, 2 and 3 threads split the rows differently and give the same y; bias adds."""
    K = GGUF_BLOCKS[qtype][0] * 3
    N = 53  # 4 parts of 16 rows, the last short
    data, w = weight(qtype, N, K)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    one = gguf_matmul(lib, x, data, qtype, (N, K), nthreads=1)
    for nth in (2, 3):
        np.testing.assert_array_equal(gguf_matmul(lib, x, data, qtype, (N, K), nthreads=nth), one)
    with_bias = gguf_matmul(lib, x, data, qtype, (N, K), nthreads=2, bias=bias)
    np.testing.assert_array_equal(with_bias, one + bias)
    assert_close(with_bias, reference(x, w) + bias)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_real_quantized_weights(lib, qtype):
    """Blocks as a model file has them (gguf.quants.quantize of Gaussian weights)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    rng = np.random.default_rng(11)
    N, K = 45, 576
    data = quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, GGMLQuantizationType[qtype])
    x = rng.standard_normal((3, K)).astype(np.float32)
    want = reference(x, gguf_dequantize_ref(data, qtype, (N, K)).astype(np.float64))
    assert_close(gguf_matmul(lib, x, data, qtype, (N, K), nthreads=2), want)


def test_input_layouts_and_edge_values(lib):
    """A strided x is made contiguous; an all-zero chunk gets scale 0 and zeros."""
    data, w = weight("Q4_1", 19, 576)
    x = np.random.default_rng(3).standard_normal((576, 4)).astype(np.float32).T  # (4, 576) F-order
    x[1, 32:64] = 0.0
    x[2, :] = 0.0
    assert_close(gguf_matmul(lib, x, data, "Q4_1", (19, 576), nthreads=2), reference(np.ascontiguousarray(x), w))
    assert gguf_matmul(lib, x[:0], data, "Q4_1", (19, 576), nthreads=2).shape == (0, 19)


@pytest.mark.parametrize("T,K", [(1, 32), (3, 96), (70, 576)])
def test_quantization_is_the_reference(lib, T, K):
    """The kernel's int8 activations are quantize_q8_ref's exactly (the MMVQ scheme)."""
    x = (np.random.default_rng(T).standard_normal((T, K)) * 3).astype(np.float32)
    x[0, :32] = 0.0
    x[-1, -32:] = np.float32(0.5) * np.arange(32, dtype=np.float32)  # exact halves: round to even
    xq, dx, s = quantize_q8(lib, x)
    want_q, want_d = quantize_q8_ref(x)
    np.testing.assert_array_equal(xq, want_q)
    np.testing.assert_array_equal(dx, want_d)
    np.testing.assert_array_equal(s, want_d * xq.reshape(T, K // 32, 32).sum(axis=2).astype(np.float32))


@pytest.mark.parametrize("qtype,N,K", CASES)
def test_rows_match_the_gguf_package(lib, qtype, N, K):
    data, w = weight(qtype, N, K)
    ids = np.array([N - 1, 0, 2, 2, N // 2])
    np.testing.assert_array_equal(gguf_rows(lib, data, qtype, (N, K), ids, nthreads=2), w[ids].astype(np.float32))
    big = np.random.default_rng(1).integers(0, N, 300)  # enough values to split over threads
    np.testing.assert_array_equal(gguf_rows(lib, data, qtype, (N, K), big, nthreads=3), w[big].astype(np.float32))


def test_bad_arguments_say_what_is_wrong(lib):
    data, _ = weight("Q4_K", 5, 256)
    with pytest.raises(ValueError, match="multiple of the 256-value block"):
        gguf_matmul(lib, np.zeros((1, 200), np.float32), data[:, :100], "Q4_K", (5, 200), nthreads=1)
    with pytest.raises(ValueError, match="wants \\(T, 256\\)"):
        gguf_matmul(lib, np.zeros((1, 128), np.float32), data, "Q4_K", (5, 256), nthreads=1)
    with pytest.raises(ValueError, match="uint8 blocks"):
        gguf_matmul(lib, np.zeros((1, 256), np.float32), data[:4], "Q4_K", (5, 256), nthreads=1)
    with pytest.raises(ValueError, match="no native CPU kernel"):
        gguf_matmul(lib, np.zeros((1, 256), np.float32), data, "Q2_K", (5, 256), nthreads=1)
    with pytest.raises(ValueError, match="row ids must be in 0 .. 4"):
        gguf_rows(lib, data, "Q4_K", (5, 256), np.array([5]), nthreads=1)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_a_token_gets_the_same_bits_in_any_batch(lib, qtype):
    """y[t] depends on x[t] alone, bit for bit, whatever T is (the tile shapes differ
    with T): a sequence decodes the same tokens alone or batched."""
    rng = np.random.default_rng(7)
    N, K = 37, 512
    data = random_blocks(rng, qtype, N, K)
    x = rng.standard_normal((9, K)).astype(np.float32)
    alone = np.stack([gguf_matmul(lib, x[t : t + 1], data, qtype, (N, K), 1)[0] for t in range(len(x))])
    for T in (2, 3, 4, 5, 9):
        np.testing.assert_array_equal(gguf_matmul(lib, x[:T], data, qtype, (N, K), 2), alone[:T])
