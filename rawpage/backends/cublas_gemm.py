"""y = x @ w.T (+ bias) on cuBLAS's gemmEx, with float32 accumulation, for every dtype.

CuPy has no bfloat16 dtype, so rawpage stores bfloat16 as its uint16 bits (see
rawpage/dtypes.py), and CuPy's own matmul would multiply those as integers.
gemmEx takes the element type of each operand separately, so we call it
directly, telling cuBLAS what the bits are: CUDA_R_16BF for uint16 arrays,
CUDA_R_16F for float16, CUDA_R_32F for float32, always with
CUBLAS_COMPUTE_32F (float32 accumulation, and no TF32 for float32 inputs).

The layout argument. cuBLAS is column-major; our arrays are row-major. A
row-major (R, C) matrix with row stride ld is, to cuBLAS, the column-major
(C, R) matrix with leading dimension ld: its transpose. So for x (T, K),
w (N, K) and y (T, N), all row-major:

    y^T (N x T, column-major) = w x^T = op_T(W) op_N(X)
    where W = w^T as cuBLAS sees it (K x N, ld = w's row stride)
    and   X = x^T as cuBLAS sees it (K x T, ld = x's row stride)

    gemmEx(transa=T, transb=N, m=N, n=T, k=K, A=w, lda, B=x, ldb, C=y, ldc=N)

This "TN" form is also cuBLAS's fastest for tensor cores. `plan_gemm` computes
the call from shapes and dtypes alone, and `gemm_ref` replays a call on flat
NumPy buffers exactly as cuBLAS defines it, so the tests check the layout and
dtype mapping without a GPU.

A bias rides on beta: y starts as a copy of the bias broadcast over the rows,
and the GEMM adds to it (beta = 1), so the sum is formed in float32 and rounded
once. y is always a fresh array: for T = 1, `ascontiguousarray(broadcast_to(bias,
(1, N)))` is the bias itself, and the GEMM would write into the weight.

This module is the plan only (pure, no CuPy). The call itself goes through ctypes
on CuPy's handle (cublas_ctypes.py, which imports this one, and has cublas_matmul),
so that CUDA graphs can capture it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rawpage.dtypes import BFLOAT16, bf16_from_f32, bf16_to_f32

# library_types.h (cudaDataType) and cublas_api.h; checked against CuPy's own
# constants when the cuda backend starts (CudaBackend._check_cublas_constants).
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1

DATA_TYPE = {np.dtype(np.float32): CUDA_R_32F, np.dtype(np.float16): CUDA_R_16F, BFLOAT16: CUDA_R_16BF}

# alpha and beta are read from host memory (CUBLAS_POINTER_MODE_HOST) as float32,
# the compute type's scalar type, before gemmEx returns; a captured graph keeps the values.
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)


@dataclass(frozen=True)
class GemmCall:
    """The arguments of one cublasGemmEx call, but the pointers."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    a_type: int
    b_type: int
    c_type: int
    compute_type: int = CUBLAS_COMPUTE_32F
    algo: int = CUBLAS_GEMM_DEFAULT


def row_stride(x: Any) -> int:
    """Elements between rows of a 2-D array whose rows are contiguous."""
    if x.ndim == 2 and x.size == 0:
        return max(1, x.shape[1])  # CuPy gives empty arrays strides (0, 0); cuBLAS wants ld >= 1
    if x.ndim != 2 or (x.shape[1] > 1 and x.strides[1] != x.itemsize):
        raise ValueError(f"GEMM operands need contiguous rows, got shape {x.shape} strides {x.strides}")
    return x.strides[0] // x.itemsize if x.shape[0] > 1 else x.shape[1]


def plan_gemm(x: Any, w: Any, out_dtype: Any) -> GemmCall:
    """The gemmEx call for y (T, N) = x (T, K) @ w (N, K).T, from shapes, strides and dtypes."""
    (T, K), (N, K2) = x.shape, w.shape
    if K != K2:
        raise ValueError(f"cannot multiply x {x.shape} by w.T for w {w.shape}")
    if np.dtype(x.dtype) != np.dtype(w.dtype):
        raise TypeError(f"x and w must share a dtype, got {x.dtype} and {w.dtype}")
    try:
        in_type, out_type = DATA_TYPE[np.dtype(x.dtype)], DATA_TYPE[np.dtype(out_dtype)]
    except KeyError:
        raise TypeError(f"GEMMs take float32, float16 or bfloat16 (uint16), not {x.dtype} -> {out_dtype}") from None
    return GemmCall(CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, row_stride(w), row_stride(x), N, in_type, in_type, out_type)


def gemm_ref(call: GemmCall, a: np.ndarray, b: np.ndarray, c: np.ndarray, alpha: float, beta: float) -> None:
    """cublasGemmEx on flat host buffers, by its definition:
    C = alpha op(A) op(B) + beta C, column-major, element (i, j) of a matrix with
    leading dimension ld at flat index i + j * ld. In place on c; float64 math."""

    def as_float(buf: np.ndarray, dtype: int) -> np.ndarray:
        return bf16_to_f32(buf).astype(np.float64) if dtype == CUDA_R_16BF else buf.astype(np.float64)

    def matrix(buf: np.ndarray, rows: int, cols: int, ld: int, dtype: int) -> np.ndarray:
        flat = as_float(buf, dtype)
        i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        return flat[i + j * ld]

    m, n, k = call.m, call.n, call.k
    # op(A) is m x k: A itself is m x k (N) or k x m (T); likewise op(B) is k x n.
    A = matrix(a, *((k, m) if call.transa == CUBLAS_OP_T else (m, k)), call.lda, call.a_type)
    B = matrix(b, *((n, k) if call.transb == CUBLAS_OP_T else (k, n)), call.ldb, call.b_type)
    A = A.T if call.transa == CUBLAS_OP_T else A
    B = B.T if call.transb == CUBLAS_OP_T else B
    result = alpha * (A @ B)
    if beta != 0:  # cuBLAS does not read C when beta is 0: it may hold anything, NaN included
        result += beta * matrix(c, m, n, call.ldc, call.c_type)
    i, j = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
    flat = result.astype(np.float32)
    if call.c_type == CUDA_R_16BF:
        c[i + j * call.ldc] = bf16_from_f32(flat)
    else:
        c[i + j * call.ldc] = flat.astype(c.dtype)


def gemm_matmul(xp: Any, gemm: Any, handle: int, stream: Any, x: Any, w: Any, bias: Any | None, out_dtype: Any) -> Any:
    """cublas_matmul (cublas_ctypes.py) with its array module, CublasGemm, handle and stream passed in:
    the tests run it on NumPy arrays with a fake library that replays gemm_ref."""
    out_dtype = np.dtype(out_dtype or x.dtype)
    if not x.flags.c_contiguous:
        x = xp.ascontiguousarray(x)
    call = plan_gemm(x, w, out_dtype)
    T, N = x.shape[0], w.shape[0]
    y = xp.empty((T, N), dtype=out_dtype)  # (T, N); fresh, so never an alias of the bias, x or w
    beta = _ZERO
    if bias is not None:
        if np.dtype(bias.dtype) != out_dtype:
            raise TypeError(f"bias dtype {bias.dtype} must be the output dtype {out_dtype}")
        y[...] = bias  # a copy broadcast over the rows, which the GEMM adds to
        beta = _ONE
    if T == 0 or N == 0:
        return y
    gemm(handle, stream, call, _ONE.ctypes.data, _pointer(w), _pointer(x), beta.ctypes.data, _pointer(y))
    return y


def _pointer(a: Any) -> int:
    """The address of a CuPy array's data, or of a NumPy array's in the tests."""
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr
