"""FP8 (e4m3) GEMMs on cuBLASLt, through ctypes, for sm_89 and sm_90.

    D (T, N) float32 = xq (T, K) e4m3  @  W (N, K) e4m3 ^T

cuBLAS's plain gemmEx has no FP8; cuBLASLt's matmul does, on Ada and Hopper
tensor cores, in one layout only: A transposed, B not ("TN"), which is the
layout cublas_gemm.py already uses for every GEMM (row-major arrays read as
their column-major transposes):

    D^T (N x T, col-major, ld N) = op_T(A) op_N(B),  A = W as (K x N, ld K), B = xq as (K x T, ld K)

Both scales are applied outside, per token and per output channel
(cuda/fp8_linear.cu fp8_quantize_rows / fp8_scale_output): cuBLASLt's scale
pointers take one scalar per matrix, and per-channel FP8 checkpoints need more.
So D is float32 (C = D, beta = 0), which cuBLASLt allows with e4m3 inputs.

As in cublas_ctypes.py, the library is called through ctypes so that CUDA graphs
can capture the call (nothing here touches the stream but cublasLtMatmul
itself), and `CublasLtFp8Gemm` takes any object with the functions as
attributes, so the tests drive it with a fake library (tests/fake_cublaslt.py)
that records descriptors and attributes and computes the product in NumPy.
Descriptors are made once per (N, T, K) and kept: the hot path is one call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
from dataclasses import dataclass
from typing import Any

from rawpage.backends.cublas_ctypes import check, declare, loaded_library

c_int, c_void_p, c_size_t, c_uint64, c_int64 = (
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_uint64,
    ctypes.c_int64,
)

# library_types.h, cublas_api.h, cublasLt.h
CUDA_R_32F, CUDA_R_8F_E4M3 = 0, 28
CUBLAS_COMPUTE_32F = 68
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB = 3, 4

WORKSPACE_BYTES = 32 << 20  # enough for every FP8 algorithm on Ada / Hopper (NVIDIA's guidance)
MIN_COMPUTE_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (sm_89) and Hopper (sm_90)

SIGNATURES: dict[str, list] = {
    # cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
    "cublasLtCreate": [c_void_p],
    # cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t, cudaDataType_t scaleType)
    "cublasLtMatmulDescCreate": [c_void_p, c_int, c_int],
    # cublasLtMatmulDescSetAttribute(desc, cublasLtMatmulDescAttributes_t attr, const void *buf, size_t sizeInBytes)
    "cublasLtMatmulDescSetAttribute": [c_void_p, c_int, c_void_p, c_size_t],
    # cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType, uint64_t rows, uint64_t cols, int64_t ld)
    "cublasLtMatrixLayoutCreate": [c_void_p, c_int, c_uint64, c_uint64, c_int64],
    # cublasLtMatmul(handle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc,
    #                const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes, cudaStream_t)
    "cublasLtMatmul": [c_void_p] * 14 + [c_size_t, c_void_p],
}


@dataclass(frozen=True)
class Fp8Plan:
    """The descriptors of one (N, T, K) product, as cuBLASLt handles."""

    matmul: int
    a: int  # W:  e4m3, K x N, ld K (op T)
    b: int  # xq: e4m3, K x T, ld K (op N)
    d: int  # D:  float32, N x T, ld N


def fp8_gemm_supported(compute_capability: tuple[int, int]) -> bool:
    return tuple(compute_capability) >= MIN_COMPUTE_CAPABILITY


class CublasLtFp8Gemm:
    """D = xq W^T in FP8 on one cuBLASLt handle, descriptors cached per shape."""

    def __init__(self, lib: Any) -> None:
        self.lib = declare(lib, SIGNATURES)
        handle = c_void_p()
        check(self.lib.cublasLtCreate(ctypes.addressof(handle)), "cublasLtCreate")
        self.handle = handle.value
        self.plans: dict[tuple[int, int, int], Fp8Plan] = {}
        self._alpha = ctypes.c_float(1.0)
        self._beta = ctypes.c_float(0.0)

    def plan(self, N: int, T: int, K: int) -> Fp8Plan:
        key = (N, T, K)
        if key not in self.plans:
            desc = self._create("cublasLtMatmulDescCreate", CUBLAS_COMPUTE_32F, CUDA_R_32F)
            for attr, value in ((CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T), (CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N)):
                v = ctypes.c_int32(value)
                status = self.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.addressof(v), ctypes.sizeof(v))
                check(status, "cublasLtMatmulDescSetAttribute")
            a = self._create("cublasLtMatrixLayoutCreate", CUDA_R_8F_E4M3, K, N, K)
            b = self._create("cublasLtMatrixLayoutCreate", CUDA_R_8F_E4M3, K, T, K)
            d = self._create("cublasLtMatrixLayoutCreate", CUDA_R_32F, N, T, N)
            self.plans[key] = Fp8Plan(desc, a, b, d)
        return self.plans[key]

    def _create(self, fn: str, *args: int) -> int:
        out = c_void_p()
        check(getattr(self.lib, fn)(ctypes.addressof(out), *args), fn)
        return out.value

    def __call__(self, N: int, T: int, K: int, w: int, xq: int, d: int, workspace: int, stream: int) -> None:
        """d (T, N) float32 = xq (T, K) @ w (N, K)^T, all device pointers, on `stream`."""
        if K % 16 or N % 16:
            raise ValueError(f"cuBLASLt FP8 needs K and N multiples of 16 (leading dimensions), got N={N} K={K}")
        p = self.plan(N, T, K)
        alpha, beta = ctypes.addressof(self._alpha), ctypes.addressof(self._beta)
        status = self.lib.cublasLtMatmul(
            self.handle,
            p.matmul,
            alpha,
            w,
            p.a,
            xq,
            p.b,
            beta,
            d,
            p.d,
            d,
            p.d,
            None,
            workspace,
            WORKSPACE_BYTES,
            stream,
        )
        check(status, "cublasLtMatmul")


_LIBCUBLASLT = re.compile(r"libcublasLt\.so(\.\d+)*$")


def open_cublaslt() -> ctypes.CDLL:
    """libcublasLt: the copy CuPy's libcublas already mapped (it links it), else the
    system's. A second copy would be harmless (our handle is our own), but needless."""
    try:
        return ctypes.CDLL(loaded_library(_LIBCUBLASLT))
    except FileNotFoundError:
        path = ctypes.util.find_library("cublasLt")
        if path is None:
            raise RuntimeError("libcublasLt not found: the FP8 GEMM needs the CUDA toolkit's cuBLASLt") from None
        return ctypes.CDLL(path)


class CupyFp8Gemm:
    """The cuda backend's Fp8Gemm (rawpage/ops/fp8_linear.py): CuPy arrays in, on the
    current stream, with one workspace for all calls. The library and the workspace
    are taken at the first FP8 prefill, so models without FP8 weights never touch them."""

    def __init__(self) -> None:
        self.lt: CublasLtFp8Gemm | None = None
        self.workspace = None

    def __call__(self, N: int, T: int, K: int, w: Any, xq: Any, d: Any) -> None:
        import cupy

        if self.lt is None:
            try:
                self.lt = CublasLtFp8Gemm(open_cublaslt())
            except RuntimeError as e:
                raise RuntimeError(f"{e}; set RAWPAGE_FP8_GEMM=0 to dequantize FP8 weights instead") from None
            self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)
        stream = cupy.cuda.get_current_stream().ptr
        self.lt(N, T, K, w.data.ptr, xq.data.ptr, d.data.ptr, self.workspace.data.ptr, stream)
