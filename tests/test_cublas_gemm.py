"""The cuBLAS gemmEx call the cuda backend makes, checked without a GPU: plan_gemm's
layout and dtype arguments, replayed on flat host buffers by gemm_ref (cuBLAS's
column-major definition), must give x @ w.T for every dtype, with a bias, and
for an x whose rows sit further apart than their length."""

import numpy as np
import pytest

from rawpage.backends.cublas_gemm import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUDA_R_16BF,
    CUDA_R_16F,
    CUDA_R_32F,
    gemm_ref,
    plan_gemm,
)
from rawpage.dtypes import bf16_to_f32, from_float32, storage_dtype, to_float32

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def _ravel_view(a: np.ndarray) -> np.ndarray:
    """The output buffer as gemm_ref writes it: flat, and the same memory."""
    v = a.reshape(-1)
    assert np.shares_memory(v, a)
    return v


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("T,K,N", [(1, 8, 5), (7, 64, 48), (33, 40, 3)])
def test_planned_call_computes_x_times_w_transposed(dtype, T, K, N):
    rng = np.random.default_rng(T * K + N)
    st = storage_dtype(dtype)
    x, w = from_float32(rng.standard_normal((T, K)), st), from_float32(rng.standard_normal((N, K)), st)
    call = plan_gemm(x, w, st)
    y = np.zeros((T, N), st)
    gemm_ref(call, w.reshape(-1), x.reshape(-1), _ravel_view(y), 1.0, 0.0)
    want = to_float32(x).astype(np.float64) @ to_float32(w).astype(np.float64).T
    np.testing.assert_allclose(to_float32(y), want, rtol=TOL[dtype], atol=TOL[dtype])


def test_call_arguments_are_the_tn_form_with_float32_compute():
    x, w = np.zeros((7, 64), np.uint16), np.zeros((48, 64), np.uint16)
    call = plan_gemm(x, w, np.uint16)
    assert (call.transa, call.transb) == (CUBLAS_OP_T, CUBLAS_OP_N)
    assert (call.m, call.n, call.k, call.lda, call.ldb, call.ldc) == (48, 7, 64, 64, 64, 48)
    assert (call.a_type, call.b_type, call.c_type) == (CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF)
    assert call.compute_type == CUBLAS_COMPUTE_32F
    assert plan_gemm(x.view(np.float16), w.view(np.float16), np.float32).c_type == CUDA_R_32F
    assert plan_gemm(x.view(np.float16), w.view(np.float16), np.float16).a_type == CUDA_R_16F


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_bias_rides_on_beta(dtype):
    rng = np.random.default_rng(1)
    st = storage_dtype(dtype)
    x, w = from_float32(rng.standard_normal((5, 32)), st), from_float32(rng.standard_normal((12, 32)), st)
    bias = from_float32(rng.standard_normal(12), st)
    call = plan_gemm(x, w, st)
    y = np.broadcast_to(bias, (5, 12)).copy()  # what cublas_matmul starts from
    gemm_ref(call, w.reshape(-1), x.reshape(-1), _ravel_view(y), 1.0, 1.0)
    want = to_float32(x) @ to_float32(w).T + to_float32(bias)
    np.testing.assert_allclose(to_float32(y), want, rtol=TOL[dtype], atol=4 * TOL[dtype])


def test_rows_of_a_wider_buffer_use_its_stride_as_leading_dimension():
    """q inside the fused qkv output: rows of K elements, row_stride apart."""
    rng = np.random.default_rng(2)
    wide = rng.standard_normal((6, 50)).astype(np.float32)
    x = wide[:, 8:24]  # (6, 16), 50 elements between rows
    w = rng.standard_normal((9, 16)).astype(np.float32)
    call = plan_gemm(x, w, np.float32)
    assert call.ldb == 50 and call.lda == 16
    y = np.zeros((6, 9), np.float32)
    gemm_ref(call, w.reshape(-1), wide.reshape(-1)[8:], _ravel_view(y), 1.0, 0.0)
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)


def test_bfloat16_output_is_accumulated_in_float32_then_rounded_to_nearest_even():
    x = from_float32(np.array([[1.0, 1.0]]), np.uint16)
    w = from_float32(np.array([[1.0, 2**-8]]), np.uint16)  # 1 + 2^-8: halfway between two bfloat16 values
    y = np.zeros((1, 1), np.uint16)
    gemm_ref(plan_gemm(x, w, np.uint16), w.reshape(-1), x.reshape(-1), _ravel_view(y), 1.0, 0.0)
    assert bf16_to_f32(y)[0, 0] == 1.0  # the tie goes to the even mantissa
    y32 = np.zeros((1, 1), np.float32)
    gemm_ref(plan_gemm(x, w, np.float32), w.reshape(-1), x.reshape(-1), _ravel_view(y32), 1.0, 0.0)
    assert y32[0, 0] == np.float32(1.0 + 2**-8)  # a float32 output keeps the exact sum


def test_mismatched_shapes_and_dtypes_are_refused():
    with pytest.raises(ValueError, match="cannot multiply"):
        plan_gemm(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32), np.float32)
    with pytest.raises(TypeError, match="share a dtype"):
        plan_gemm(np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float16), np.float32)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        plan_gemm(np.zeros((2, 3), np.int32), np.zeros((4, 3), np.int32), np.int32)
    with pytest.raises(ValueError, match="contiguous rows"):
        plan_gemm(np.zeros((2, 6), np.float32)[:, ::2], np.zeros((4, 3), np.float32), np.float32)
