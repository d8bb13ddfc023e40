"""FP8 e4m3 weights: cuda/fp8_linear.cu (and fp8.cuh's decoder) against NumPy."""

import numpy as np
import pytest

from rawpage.ops.fp8_linear import launch_fp8_dequantize, launch_fp8_linear
from rawpage.quantization.fp8 import fp8_dequantize_ref, quantize_fp8
from rawpage.quantization.weight import QuantizedWeight
from tests.kernels.conftest import DTYPES, assert_close


def fp8_weight(N: int, K: int, per_channel: bool, seed: int = 0) -> QuantizedWeight:
    w = np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32) / np.sqrt(K)
    bits, scales = quantize_fp8(w, per_channel)
    return QuantizedWeight("fp8", (N, K), bits, scales=scales)


def test_dequantize_decodes_every_code(device):
    """All 256 bit patterns but NaN (0x7f, 0xff), subnormals included, exactly."""
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F] * 2, np.uint8)[:496].reshape(2, 248)
    codes = np.concatenate([codes, np.zeros((2, 8), np.uint8)], axis=1)  # K = 256
    w = QuantizedWeight("fp8", (2, 256), codes, scales=np.array([1.0, 0.5], np.float32))
    got = launch_fp8_dequantize(device.xp, device.loader, w.map_arrays(device.put_raw), np.float32)
    np.testing.assert_array_equal(device.get(got), fp8_dequantize_ref(w.data, w.scales))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "T,N,K,per_channel", [(1, 3, 16, True), (3, 37, 592, False), (8, 21, 64, False), (12, 9, 128, True)]
)
def test_linear_matches_reference(device, dtype, T, N, K, per_channel):
    rng = np.random.default_rng(N + K)
    w = fp8_weight(N, K, per_channel)
    x = device.rounded(rng.standard_normal((T, K)), dtype)
    bias = device.rounded(rng.standard_normal(N) * 0.1, dtype)
    want = x @ fp8_dequantize_ref(w.data, w.scales).T + bias

    def matmul(a, dense, b):  # the prefill path (T = 12): dense scratch to the "GEMM"
        return device.put(device.get(a) @ device.get(dense).T + device.get(b), dtype)

    got = launch_fp8_linear(
        device.xp, device.loader, device.put(x, dtype), w.map_arrays(device.put_raw), device.put(bias, dtype), matmul
    )
    scale = np.abs(want).max()
    assert_close(device.get(got) / scale, want / scale, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,K", [(1, 16), (5, 592), (3, 4096)])
def test_quantize_rows_is_exact(device, dtype, T, K):
    """fp8_quantize_rows (the FP8 GEMM path's activation step) bit for bit."""
    from rawpage.ops.fp8_linear import fp8_quantize_rows_ref

    x = device.rounded(np.random.default_rng(T * K).standard_normal((T, K)) * 5, dtype)
    x[0, :] = 0.0  # a zero row: scale 0, codes 0
    xq, sx = device.xp.empty((T, K), dtype=np.uint8), device.xp.empty(T, dtype=np.float32)
    suffix = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
    kernel = device.loader.get_function("fp8_linear.cu", f"fp8_quantize_rows_{suffix}")
    kernel((T,), (256,), (xq, sx, device.put(x, dtype), np.int32(K)))
    want_q, want_s = fp8_quantize_rows_ref(x)
    np.testing.assert_array_equal(device.get(sx), want_s)
    np.testing.assert_array_equal(device.get(xq), want_q)
