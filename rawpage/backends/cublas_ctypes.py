"""cublasGemmEx and cublasSetStream_v2 through ctypes, on the libcublas CuPy loaded.

Why not CuPy's wrapper: `cupy_backends.cuda.libs.cublas.gemmEx` calls setStream
before every call, and CuPy refuses any cuBLAS call while a stream is capturing
("calling cuBLAS API during stream capture is currently unsupported"), so no
CUDA graph could hold a GEMM. cuBLAS itself captures fine, provided the handle's
stream is not changed inside the capture. So we call it on CuPy's handle
directly:

- outside capture, every call first binds the handle to the current stream
  (cheap, host-only; CuPy's own wrappers may have moved it since);
- inside capture, never: the handle must already be bound to the capture
  stream, which the warm-up run just before the capture (CudaGraph) did.

`CublasGemm` takes any object with the two functions as attributes, so the
tests drive it with a fake library that records the calls. `cublas_matmul` runs
a plan of cublas_gemm.py (pure: shapes and dtypes to a call) on the process's one.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from pathlib import Path
from typing import Any, Protocol

from rawpage.backends.cublas_gemm import GemmCall, gemm_matmul

c_int, c_void_p = ctypes.c_int, ctypes.c_void_p

# cublas_api.h; every enum is an int, every handle and stream a pointer.
SIGNATURES: dict[str, list] = {
    # cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
    "cublasSetStream_v2": [c_void_p, c_void_p],
    # cublasStatus_t cublasGemmEx(...), one line per group of the C declaration
    "cublasGemmEx": [
        c_void_p,
        c_int,
        c_int,  # handle, transa, transb
        c_int,
        c_int,
        c_int,  # m, n, k
        c_void_p,  # alpha (host float32 here)
        c_void_p,
        c_int,
        c_int,  # A, Atype, lda
        c_void_p,
        c_int,
        c_int,  # B, Btype, ldb
        c_void_p,  # beta
        c_void_p,
        c_int,
        c_int,  # C, Ctype, ldc
        c_int,
        c_int,  # computeType, algo
    ],
}

STATUS = {
    0: "SUCCESS",
    1: "NOT_INITIALIZED",
    3: "ALLOC_FAILED",
    7: "INVALID_VALUE",
    8: "ARCH_MISMATCH",
    11: "MAPPING_ERROR",
    13: "EXECUTION_FAILED",
    14: "INTERNAL_ERROR",
    15: "NOT_SUPPORTED",
}


class Stream(Protocol):
    """What a cupy.cuda.Stream offers that we use."""

    ptr: int

    def is_capturing(self) -> bool: ...


def declare(lib: Any, signatures: dict[str, list]) -> Any:
    """Set argtypes and restype of the functions we call, so that ctypes passes 64-bit
    pointers and checks the argument count."""
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, c_int
    return lib


def check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed: CUBLAS_STATUS_{STATUS.get(status, status)}")


class CublasGemm:
    """gemmEx on a cuBLAS handle, safe to capture into a CUDA graph."""

    def __init__(self, lib: Any) -> None:
        self.lib = declare(lib, SIGNATURES)
        self.bound: dict[int, int] = {}  # handle -> the stream we last bound it to

    def bind_stream(self, handle: int, stream: Stream) -> None:
        """Point the handle at the stream. Only outside capture: changing a handle's
        stream while capturing breaks the capture."""
        if stream.is_capturing():
            raise RuntimeError("cublasSetStream must not be called while the stream is capturing a CUDA graph")
        check(self.lib.cublasSetStream_v2(handle, stream.ptr), "cublasSetStream_v2")
        self.bound[handle] = stream.ptr

    def ensure_bound(self, handle: int, stream: Stream) -> None:
        """bind_stream unless our last binding of this handle was to this stream (just
        before a capture, after a warm-up on the capture stream: nothing to do, and
        setStream would reset the handle's workspace for no reason)."""
        if self.bound.get(handle) != stream.ptr:
            self.bind_stream(handle, stream)

    def __call__(
        self, handle: int, stream: Stream, call: GemmCall, alpha: int, a: int, b: int, beta: int, c: int
    ) -> None:
        """C = alpha op(A) op(B) + beta C on `stream`. alpha, beta: host pointers to
        float32; a, b, c: device pointers laid out as `call` says."""
        if not stream.is_capturing():
            self.bind_stream(handle, stream)
        elif self.bound.get(handle) != stream.ptr:
            raise RuntimeError(
                "a GEMM is being captured on a stream its cuBLAS handle is not bound to; run the "
                "function once on the capture stream before capturing (CudaGraph's warm-up does)"
            )
        status = self.lib.cublasGemmEx(
            handle,
            call.transa,
            call.transb,
            call.m,
            call.n,
            call.k,
            alpha,
            a,
            call.a_type,
            call.lda,
            b,
            call.b_type,
            call.ldb,
            beta,
            c,
            call.c_type,
            call.ldc,
            call.compute_type,
            call.algo,
        )
        check(status, "cublasGemmEx")


_LIBCUBLAS = re.compile(r"libcublas\.so(\.\d+)*$")  # not libcublasLt


def loaded_library(pattern: re.Pattern[str], maps: str | None = None) -> str:
    """The path of an already-loaded shared library whose file name matches `pattern`,
    from /proc/self/maps (the text may be passed in, for tests)."""
    if maps is None:
        maps = Path("/proc/self/maps").read_text()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        if len(fields) == 6 and fields[5].startswith("/") and pattern.search(os.path.basename(fields[5])):
            return fields[5]
    raise FileNotFoundError(f"no loaded library matches {pattern.pattern}")


def open_loaded(pattern: re.Pattern[str]) -> ctypes.CDLL:
    """ctypes' handle on an already-loaded library; RTLD_NOLOAD makes sure no second
    copy is ever loaded (its cuBLAS would not know CuPy's handles)."""
    return ctypes.CDLL(loaded_library(pattern), mode=os.RTLD_NOW | os.RTLD_NOLOAD)


@functools.cache
def default_gemm() -> CublasGemm:
    """The process's CublasGemm, on the libcublas that CuPy loaded (loading a second
    copy would give a library whose handles CuPy's are not)."""
    import cupy

    cupy.cuda.device.get_cublas_handle()  # makes CuPy load libcublas if it has not yet
    try:
        lib = open_loaded(_LIBCUBLAS)
    except FileNotFoundError:
        raise RuntimeError("CuPy created a cuBLAS handle but no libcublas.so is mapped in this process") from None
    return CublasGemm(lib)


def cublas_matmul(x: Any, w: Any, bias: Any | None = None, out_dtype: Any = None) -> Any:
    """x (T, K) @ w (N, K).T + bias (N,) -> (T, N) in out_dtype (default: x's), on the
    current CuPy stream. x, w and bias share a dtype; rows must be contiguous."""
    import cupy

    handle, stream = cupy.cuda.device.get_cublas_handle(), cupy.cuda.get_current_stream()
    return gemm_matmul(cupy, default_gemm(), handle, stream, x, w, bias, out_dtype)
