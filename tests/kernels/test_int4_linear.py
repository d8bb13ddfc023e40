"""int4 weights (AWQ / GPTQ after conversion): cuda/int4_linear.cu against the NumPy
reference, for every group size, act-order, odd N, through the real launch code."""

import numpy as np
import pytest

from rawpage.loader.quantized_checkpoint import awq_to_int4, gptq_to_int4
from rawpage.ops.int4_linear import int4_linear_ref, launch_int4_dequantize, launch_int4_gemv, launch_int4_linear
from rawpage.quantization.weight import dequantize
from tests.kernels.conftest import DTYPES, assert_close
from tools.int4_pack import pack_awq, pack_gptq


def packed(fmt: str, N: int, K: int, group_size: int, seed: int = 0):
    w = np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32) / np.sqrt(K)
    if fmt == "awq":
        t = pack_awq(w, group_size)
        return awq_to_int4(t["qweight"], t["qzeros"], t["scales"])
    t = pack_gptq(w, group_size, sym=fmt == "gptq-sym", act_order=fmt == "gptq-act", seed=seed)
    return gptq_to_int4(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], group_size)


def on_device(device, w):
    return w.map_arrays(device.put_raw)


CASES = [
    ("awq", 1, 8, 128, 32),
    ("awq", 3, 24, 256, 128),
    ("gptq-sym", 2, 40, 192, 64),
    ("gptq-asym", 1, 16, 96, -1),
    ("gptq-act", 4, 24, 256, 32),
    ("gptq-act", 1, 8, 384, 128),
    ("awq", 8, 40, 128, 64),  # GEMV_MAX_TOKENS tokens in one warp
]


@pytest.mark.parametrize("fmt,T,N,K,group_size", CASES)
def test_dequantize_matches_reference(device, fmt, T, N, K, group_size):
    w = packed(fmt, N, K, group_size)
    got = device.get(launch_int4_dequantize(device.xp, device.loader, on_device(device, w), np.float32))
    dense = dequantize(w)
    if w.perm is not None:
        dense = dense[:, w.perm]  # the kernel writes stored column order
    np.testing.assert_allclose(got, dense, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,T,N,K,group_size", CASES)
def test_linear_matches_reference(device, dtype, fmt, T, N, K, group_size):
    """Decode (GEMV) with and without bias, act-order's column permutation included."""
    rng = np.random.default_rng(T + N + K)
    w = packed(fmt, N, K, group_size)
    x = device.rounded(rng.standard_normal((T, K)), dtype)
    bias = device.rounded(rng.standard_normal(N) * 0.1, dtype)
    want = int4_linear_ref(x, w, bias)
    wd = on_device(device, w)

    def unused_matmul(*_):
        raise AssertionError("a decode batch must take the GEMV kernel")

    got = launch_int4_linear(device.xp, device.loader, device.put(x, dtype), wd, device.put(bias, dtype), unused_matmul)
    scale = np.abs(want).max()
    assert_close(device.get(got) / scale, want / scale, dtype)


def test_prefill_dequantizes_then_calls_the_gemm(device):
    rng = np.random.default_rng(5)
    w = packed("gptq-act", 16, 128, 32)
    x = rng.standard_normal((12, 128)).astype(np.float32)
    got = launch_int4_linear(
        device.xp,
        device.loader,
        device.put(x, "float32"),
        on_device(device, w),
        None,
        lambda a, dense, bias: a @ dense.T,
    )
    np.testing.assert_allclose(device.get(got), int4_linear_ref(x, w), rtol=1e-4, atol=1e-4)


def test_rejects_group_size_not_a_multiple_of_32(device):
    w = packed("awq", 8, 64, 32)
    w.group_size = 16
    with pytest.raises(ValueError, match="multiples of 32"):
        launch_int4_gemv(device.xp, device.loader, device.put(np.zeros((1, 64)), "float32"), on_device(device, w))


def test_gemv_refuses_more_tokens_than_it_holds(device):
    from rawpage.ops.gemv import GEMV_MAX_TOKENS

    w = on_device(device, packed("awq", 8, 64, 32))
    with pytest.raises(ValueError, match="at most"):
        launch_int4_gemv(device.xp, device.loader, device.put(np.zeros((GEMV_MAX_TOKENS + 1, 64)), "float32"), w)
