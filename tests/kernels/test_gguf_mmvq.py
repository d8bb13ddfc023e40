"""GGUF decode with int8 activations and __dp4a (cuda/gguf_mmvq.cu) against its NumPy
reference, on random blocks of every format (every bit of every field), odd N,
K of odd numbers of blocks, and 1..8 tokens."""

import re

import numpy as np
import pytest

from rawpage.ops.gemv import GEMV_MAX_TOKENS
from rawpage.ops.gguf_linear import gguf_linear_ref
from rawpage.ops.gguf_mmvq import gguf_mmvq_ref, launch_gguf_mmvq, launch_quantize_q8, quantize_q8_ref
from rawpage.ops.launch import cuda_source_dir
from tests.kernels.conftest import DTYPES, assert_close
from tests.kernels.test_gguf_linear import CASES, random_blocks

MMVQ_CASES = CASES + [("Q4_K", GEMV_MAX_TOKENS, 9, 512), ("Q8_0", GEMV_MAX_TOKENS, 5, 64)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,K", [(1, 32), (3, 96), (5, 576)])
def test_quantize_q8_is_exact(device, dtype, T, K):
    rng = np.random.default_rng(T * K)
    x = device.rounded(rng.standard_normal((T, K)) * 3, dtype)
    x[0, :32] = 0.0  # an all-zero chunk gets scale 0 and zeros
    xq, dx = launch_quantize_q8(device.xp, device.loader, device.put(x, dtype))
    want_q, want_d = quantize_q8_ref(x)
    np.testing.assert_array_equal(device.get(xq), want_q)
    np.testing.assert_array_equal(device.get(dx), want_d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qtype,T,N,K", MMVQ_CASES)
def test_mmvq_matches_reference(device, dtype, qtype, T, N, K):
    rng = np.random.default_rng(K + N + T + 1)
    data = random_blocks(rng, qtype, N, K)
    x = device.rounded(rng.standard_normal((T, K)), dtype)
    bias = device.rounded(rng.standard_normal(N), dtype)
    want = gguf_mmvq_ref(x, data, qtype, (N, K), bias)
    xd, bd = device.put(x, dtype), device.put(bias, dtype)
    got = launch_gguf_mmvq(device.xp, device.loader, xd, device.put_raw(data), qtype, (N, K), bd)
    scale = np.abs(want).max()  # relative to the output's size: K terms of either sign
    assert_close(device.get(got) / scale, want / scale, dtype)
    got = launch_gguf_mmvq(device.xp, device.loader, xd, device.put_raw(data), qtype, (N, K))
    assert_close(device.get(got) / scale, (want - bias) / scale, dtype, "no bias")


def test_activation_rounding_stays_small():
    """What int8 activations cost against the exact product: about 1% of the output's
    scale on random data (llama.cpp makes the same trade)."""
    rng = np.random.default_rng(0)
    data = random_blocks(rng, "Q4_K", 16, 1024)
    x = rng.standard_normal((2, 1024)).astype(np.float32)
    exact, approx = gguf_linear_ref(x, data, "Q4_K", (16, 1024)), gguf_mmvq_ref(x, data, "Q4_K", (16, 1024))
    assert np.abs(approx - exact).max() / np.abs(exact).max() < 2e-2


def test_refuses_more_tokens_than_it_holds(device):
    rng = np.random.default_rng(1)
    data = random_blocks(rng, "Q8_0", 4, 32)
    x = device.put(np.zeros((GEMV_MAX_TOKENS + 1, 32)), "float32")
    with pytest.raises(ValueError, match="at most"):
        launch_gguf_mmvq(device.xp, device.loader, x, device.put_raw(data), "Q8_0", (4, 32))


def test_the_gemv_header_holds_as_many_tokens_as_the_crossover_sends():
    """cuda/gemv.cuh's kMaxTokens (the kernels' accumulators) is GEMV_MAX_TOKENS (what the launch code sends)."""
    header = (cuda_source_dir() / "gemv.cuh").read_text()
    assert int(re.search(r"constexpr int kMaxTokens = (\d+);", header).group(1)) == GEMV_MAX_TOKENS


@pytest.mark.parametrize("source", ["gguf_mmvq.cu", "int4_linear.cu", "fp8_linear.cu"])
def test_each_multi_token_gemv_takes_its_limit_from_the_header(source):
    text = (cuda_source_dir() / source).read_text()
    assert '#include "gemv.cuh"' in text and "kMaxTokens =" not in text
