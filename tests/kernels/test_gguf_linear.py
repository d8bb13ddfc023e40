"""GGUF weights kept quantized: cuda/gguf_linear.cu against the `gguf` package's
dequantizers (llama.cpp's Python port), on random blocks of every format."""

import numpy as np
import pytest

from rawpage.ops.gguf_linear import gguf_linear_ref, launch_gguf_dequantize, launch_gguf_gemv, launch_gguf_linear
from rawpage.quantization.gguf import GGUF_BLOCKS, gguf_dequantize_ref
from tests.kernels.conftest import DTYPES, assert_close

# Byte offsets of each format's float16 fields in a block (the rest is random bits).
_F16_FIELDS = {
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def random_blocks(rng: np.random.Generator, qtype: str, N: int, K: int) -> np.ndarray:
    """(N, K / block * bytes) uint8: uniformly random quants and scales, with finite,
    small float16 scales, so every bit of every field is exercised."""
    block, size = GGUF_BLOCKS[qtype]
    raw = rng.integers(0, 256, (N, K // block, size), dtype=np.uint8)
    for off in _F16_FIELDS[qtype]:
        scale = (rng.uniform(0.002, 0.02, (N, K // block)) * rng.choice([-1, 1], (N, K // block))).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(N, K // block, 2)
    return raw.reshape(N, -1)


# K: a multiple of the block, odd numbers of blocks; N: not a multiple of the 8 warps.
SHAPES = {32: [(1, 3, 32), (3, 13, 96), (2, 37, 576)], 256: [(1, 5, 256), (2, 11, 768)]}
CASES = [(q, *s) for q, (block, _) in GGUF_BLOCKS.items() for s in SHAPES[block]]


@pytest.mark.parametrize("qtype,T,N,K", CASES)
def test_dequantize_matches_gguf_package(device, qtype, T, N, K):
    rng = np.random.default_rng(K + N)
    data = random_blocks(rng, qtype, N, K)
    got = launch_gguf_dequantize(device.xp, device.loader, device.put_raw(data), qtype, (N, K), np.float32)
    np.testing.assert_allclose(device.get(got), gguf_dequantize_ref(data, qtype, (N, K)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qtype,T,N,K", CASES)
def test_gemv_matches_reference(device, dtype, qtype, T, N, K):
    rng = np.random.default_rng(K + N + T)
    data = random_blocks(rng, qtype, N, K)
    x = device.rounded(rng.standard_normal((T, K)), dtype)
    bias = device.rounded(rng.standard_normal(N), dtype)
    want = gguf_linear_ref(x, data, qtype, (N, K), bias)
    xd, bd = device.put(x, dtype), device.put(bias, dtype)
    got = launch_gguf_gemv(device.xp, device.loader, xd, device.put_raw(data), qtype, (N, K), bd)
    scale = np.abs(want).max()  # compare relative to the output's size: K terms of either sign
    assert_close(device.get(got) / scale, want / scale, dtype)
    got = launch_gguf_gemv(device.xp, device.loader, xd, device.put_raw(data), qtype, (N, K))
    assert_close(device.get(got) / scale, (want - bias) / scale, dtype, "no bias")


def test_prefill_path_dequantizes_then_calls_the_gemm(device):
    """Past GEMV_MAX_TOKENS the weight goes dense into a scratch and to the backend's GEMM."""
    rng = np.random.default_rng(3)
    N, K, T = 9, 256, 12
    data = random_blocks(rng, "Q6_K", N, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    calls = []

    def matmul(a, w, bias):
        calls.append(w.shape)
        return a @ w.T

    got = launch_gguf_linear(
        device.xp, device.loader, device.put(x, "float32"), device.put_raw(data), "Q6_K", (N, K), None, matmul
    )
    assert calls == [(N, K)]
    np.testing.assert_allclose(device.get(got), gguf_linear_ref(x, data, "Q6_K", (N, K)), rtol=1e-4, atol=1e-4)


def test_rejects_k_that_is_not_whole_blocks(device):
    data = np.zeros((2, 144), np.uint8)
    with pytest.raises(ValueError, match="multiple of 256"):
        launch_gguf_gemv(device.xp, device.loader, device.put(np.zeros((1, 288)), "float32"), data, "Q4_K", (2, 288))
