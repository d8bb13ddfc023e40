"""The FP8 GEMM on cuBLASLt through ctypes (rawpage/backends/cublaslt_fp8.py), without a
GPU: a fake libcublasLt (tests/fake_cublaslt.py) records the descriptors and computes
the product, and the whole FP8 prefill path (quantize rows, GEMM, scale) runs with our
real kernels under sim against the NumPy reference."""

import ctypes

import numpy as np
import pytest

from rawpage.backends.cublaslt_fp8 import (
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUBLASLT_MATMUL_DESC_TRANSA,
    CUBLASLT_MATMUL_DESC_TRANSB,
    CUDA_R_8F_E4M3,
    CUDA_R_32F,
    SIGNATURES,
    CublasLtFp8Gemm,
    fp8_gemm_supported,
)
from rawpage.ops.fp8_linear import fp8_gemm_linear_ref, fp8_quantize_rows_ref, launch_fp8_linear
from rawpage.quantization.fp8 import e4m3_to_f32, quantize_fp8
from rawpage.quantization.weight import QuantizedWeight
from tests.fake_cublaslt import FakeCublasLt
from tests.kernels.conftest import DTYPES, TOLERANCE


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def test_signatures_are_declared_with_pointer_sized_handles():
    lib = FakeCublasLt()
    CublasLtFp8Gemm(lib)
    for name, argtypes in SIGNATURES.items():
        assert getattr(lib, name).argtypes == argtypes and getattr(lib, name).restype is ctypes.c_int
    assert SIGNATURES["cublasLtMatmul"][14] is ctypes.c_size_t  # the workspace size; every other one a pointer


def test_gemm_plans_tn_e4m3_into_float32_and_computes_the_product():
    rng = np.random.default_rng(0)
    N, T, K = 32, 5, 48
    w = rng.integers(0, 256, (N, K), dtype=np.uint8)
    xq = rng.integers(0, 256, (T, K), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 0  # no NaN codes
    xq[(xq & 0x7F) == 0x7F] = 0
    d = np.full((T, N), np.nan, np.float32)
    lib = FakeCublasLt()
    gemm = CublasLtFp8Gemm(lib)
    gemm(N, T, K, _ptr(w), _ptr(xq), _ptr(d), 0, 0x5EA)
    want = e4m3_to_f32(xq).astype(np.float64) @ e4m3_to_f32(w).astype(np.float64).T
    np.testing.assert_allclose(d, want, rtol=1e-6)
    call = lib.matmuls[-1]
    assert call["attrs"] == {CUBLASLT_MATMUL_DESC_TRANSA: CUBLAS_OP_T, CUBLASLT_MATMUL_DESC_TRANSB: CUBLAS_OP_N}
    assert (call["a"].dtype, call["a"].rows, call["a"].cols, call["a"].ld) == (CUDA_R_8F_E4M3, K, N, K)
    assert (call["b"].dtype, call["b"].rows, call["b"].cols) == (CUDA_R_8F_E4M3, K, T)
    assert (call["d"].dtype, call["d"].rows, call["d"].cols, call["d"].ld) == (CUDA_R_32F, N, T, N)
    assert call["stream"] == 0x5EA and call["algo"] is None
    gemm(N, T, K, _ptr(w), _ptr(xq), _ptr(d), 0, 0x5EA)
    assert len(lib.descs) == 1  # the plan is cached per shape


def test_failed_status_and_bad_shapes_raise():
    lib = FakeCublasLt(status=15)
    gemm = CublasLtFp8Gemm(lib)
    a = np.zeros((16, 16), np.uint8)
    d = np.zeros((16, 16), np.float32)
    with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):
        gemm(16, 16, 16, _ptr(a), _ptr(a), _ptr(d), 0, 0)
    with pytest.raises(ValueError, match="multiples of 16"):
        gemm(16, 16, 24, _ptr(a), _ptr(a), _ptr(d), 0, 0)


def test_only_ada_and_hopper_and_later_take_the_fp8_gemm():
    assert not fp8_gemm_supported((8, 0)) and not fp8_gemm_supported((8, 6))
    assert fp8_gemm_supported((8, 9)) and fp8_gemm_supported((9, 0))


def test_quantize_rows_reference_round_trips_within_e4m3():
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    x[1] = 0.0
    xq, sx = fp8_quantize_rows_ref(x)
    assert sx[1] == 0 and (xq[1] == 0).all()
    back = e4m3_to_f32(xq) * sx[:, None]
    assert np.abs(back - x).max() <= 0.0625 * np.abs(x).max()  # 3 mantissa bits: half an ulp is 1/16


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,N,K,per_channel", [(9, 16, 32, True), (33, 48, 80, False)])
def test_prefill_path_with_real_kernels_and_the_fake_library(dtype, T, N, K, per_channel):
    """fp8_quantize_rows and fp8_scale_output (cuda/fp8_linear.cu) under sim around the
    cuBLASLt call, against the reference of the whole path."""
    from rawpage.sim import SimKernelLoader
    from tests.kernels.conftest import Device

    dev = Device("sim", np, SimKernelLoader(debug=True))
    rng = np.random.default_rng(T + N)
    bits, scales = quantize_fp8(rng.standard_normal((N, K)).astype(np.float32) / np.sqrt(K), per_channel)
    w = QuantizedWeight("fp8", (N, K), bits, scales=scales)
    x = dev.rounded(rng.standard_normal((T, K)), dtype)
    bias = dev.rounded(rng.standard_normal(N) * 0.1, dtype)
    lt = CublasLtFp8Gemm(FakeCublasLt())

    def fp8_gemm(N, T, K, w, xq, d):
        lt(N, T, K, _ptr(w), _ptr(xq), _ptr(d), 0, 0)

    def no_matmul(*_):
        raise AssertionError("with an FP8 GEMM the weight is not dequantized")

    got = launch_fp8_linear(np, dev.loader, dev.put(x, dtype), w, dev.put(bias, dtype), no_matmul, fp8_gemm)
    want = fp8_gemm_linear_ref(x, w, bias)
    np.testing.assert_allclose(dev.get(got), want, **TOLERANCE[dtype])
    # and the path's own rounding (x to e4m3 per token) stays small against the exact product
    assert np.abs(want - (x @ (e4m3_to_f32(w.data) * w.scales[:, None]).T + bias)).max() < 0.1


def test_cuda_backend_multiplies_fp8_prefill_on_cublaslt():
    """On a GPU: sm_89 / sm_90 take the real cuBLASLt FP8 GEMM (and match the reference);
    older GPUs have none and dequantize."""
    from tests.gpu_required import skip_without_cuda

    skip_without_cuda()
    import cupy

    from rawpage.backends.cuda import CudaBackend

    b = CudaBackend("bfloat16")
    cc = cupy.cuda.Device().compute_capability
    if not fp8_gemm_supported((int(cc[:-1]), int(cc[-1]))):
        assert b.fp8_gemm is None
        return
    assert b.fp8_gemm is not None
    rng = np.random.default_rng(0)
    N, K, T = 64, 256, 40
    bits, scales = quantize_fp8(rng.standard_normal((N, K)).astype(np.float32) / 16, per_channel=True)
    w = QuantizedWeight("fp8", (N, K), bits, scales=scales)
    x, bias = b.asarray(rng.standard_normal((T, K))), b.asarray(rng.standard_normal(N) * 0.1)
    got = b.to_numpy(b.linear(x, b.prepare_linear(w), bias))
    want = fp8_gemm_linear_ref(b.to_numpy(x), w, b.to_numpy(bias))
    np.testing.assert_allclose(got, want, **TOLERANCE["bfloat16"])
    assert b.fp8_gemm.lt.plans  # the GEMM went through cuBLASLt
