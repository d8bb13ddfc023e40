"""A libcublas stand-in for CPU tests of the ctypes binding (rawpage/backends/cublas_ctypes.py).

Its two functions behave like ctypes functions (argtypes, restype, checked
argument count), record every call with whether the stream was capturing, and
cublasGemmEx really computes: it reads the host buffers its pointers name and
replays cuBLAS's definition (gemm_ref) in place, so a test sees what the GPU
would have written, and where."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

from rawpage.backends.cublas_gemm import CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F, GemmCall, gemm_ref

ELEMENT = {CUDA_R_32F: np.float32, CUDA_R_16F: np.float16, CUDA_R_16BF: np.uint16}


@dataclass
class FakeStream:
    """cupy.cuda.Stream as CublasGemm sees it."""

    ptr: int
    capturing: bool = False

    def is_capturing(self) -> bool:
        return self.capturing


class FakeFunction:
    def __init__(self, impl) -> None:
        self.impl, self.argtypes, self.restype = impl, None, None

    def __call__(self, *args):
        assert self.argtypes is not None and self.restype is ctypes.c_int, "call before declare()"
        assert len(args) == len(self.argtypes), f"{len(args)} arguments for {len(self.argtypes)} argtypes"
        return self.impl(*args)


def host_buffer(ptr: int, dtype: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The flat host memory a column-major (rows, cols) matrix with leading dimension ld spans."""
    n = (cols - 1) * ld + rows
    itemsize = np.dtype(ELEMENT[dtype]).itemsize
    return np.frombuffer((ctypes.c_char * (n * itemsize)).from_address(ptr), ELEMENT[dtype])


@dataclass
class FakeCublas:
    streams: dict[int, FakeStream] = field(default_factory=dict)  # stream ptr -> stream, to see capture state
    calls: list[tuple] = field(default_factory=list)  # (name, handle, stream ptr, capturing)
    handle_stream: dict[int, int] = field(default_factory=dict)
    status: int = 0  # what every call returns

    def __post_init__(self) -> None:
        self.cublasSetStream_v2 = FakeFunction(self._set_stream)
        self.cublasGemmEx = FakeFunction(self._gemm_ex)

    def capturing(self) -> bool:
        return any(s.capturing for s in self.streams.values())

    def _set_stream(self, handle, stream):
        self.calls.append(("setStream", handle, stream, self.capturing()))
        self.handle_stream[handle] = stream
        return self.status

    def _gemm_ex(
        self,
        handle,
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        a,
        a_type,
        lda,
        b,
        b_type,
        ldb,
        beta,
        c,
        c_type,
        ldc,
        compute_type,
        algo,
    ):
        self.calls.append(("gemmEx", handle, self.handle_stream.get(handle), self.capturing()))
        call = GemmCall(transa, transb, m, n, k, lda, ldb, ldc, a_type, b_type, c_type, compute_type, algo)
        self.last_call = call
        if self.status:
            return self.status
        A = host_buffer(a, a_type, *((k, m) if transa == CUBLAS_OP_T else (m, k)), lda)
        B = host_buffer(b, b_type, *((n, k) if transb == CUBLAS_OP_T else (k, n)), ldb)
        C = host_buffer(c, c_type, m, n, ldc)
        scalar = ctypes.c_float * 1
        gemm_ref(call, A, B, C, scalar.from_address(alpha)[0], scalar.from_address(beta)[0])
        return 0
