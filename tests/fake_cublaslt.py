"""A libcublasLt stand-in for CPU tests of the FP8 GEMM binding (rawpage/backends/cublaslt_fp8.py).

Its functions behave like ctypes functions (argtypes, restype, checked argument
count, via tests/fake_cublas.py's FakeFunction). It records every descriptor,
attribute and layout it is given, and cublasLtMatmul really computes:
D = alpha op(A) op(B) + beta C, reading the host buffers its pointers name, with
e4m3 inputs decoded by NumPy, exactly as cuBLASLt defines the operation on
column-major matrices."""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass, field

import numpy as np

from rawpage.backends.cublaslt_fp8 import (
    CUBLAS_OP_T,
    CUBLASLT_MATMUL_DESC_TRANSA,
    CUBLASLT_MATMUL_DESC_TRANSB,
    CUDA_R_8F_E4M3,
    CUDA_R_32F,
)
from rawpage.quantization.fp8 import e4m3_to_f32
from tests.fake_cublas import FakeFunction

ELEMENT = {CUDA_R_32F: np.float32, CUDA_R_8F_E4M3: np.uint8}


@dataclass
class Layout:
    dtype: int
    rows: int
    cols: int
    ld: int

    def view(self, ptr: int) -> np.ndarray:
        """The column-major (rows, cols) matrix at ptr, as a writable NumPy view."""
        n = (self.cols - 1) * self.ld + self.rows
        itemsize = np.dtype(ELEMENT[self.dtype]).itemsize
        flat = np.frombuffer((ctypes.c_char * (n * itemsize)).from_address(ptr), ELEMENT[self.dtype])
        return np.lib.stride_tricks.as_strided(flat, (self.rows, self.cols), (itemsize, self.ld * itemsize))

    def values(self, ptr: int) -> np.ndarray:
        m = self.view(ptr)
        return (e4m3_to_f32(m) if self.dtype == CUDA_R_8F_E4M3 else m).astype(np.float64)


@dataclass
class FakeCublasLt:
    descs: dict[int, dict] = field(default_factory=dict)  # id -> compute, scale, attrs {attr: value}
    layouts: dict[int, Layout] = field(default_factory=dict)
    matmuls: list[dict] = field(default_factory=list)  # one record per cublasLtMatmul
    status: int = 0
    _ids: itertools.count = field(default_factory=lambda: itertools.count(0x1000))

    def __post_init__(self) -> None:
        for name in ("cublasLtCreate", "cublasLtMatmulDescCreate", "cublasLtMatmulDescSetAttribute"):
            setattr(self, name, FakeFunction(getattr(self, "_" + name[8:])))
        self.cublasLtMatrixLayoutCreate = FakeFunction(self._MatrixLayoutCreate)
        self.cublasLtMatmul = FakeFunction(self._Matmul)

    def _new(self, out_ptr: int) -> int:
        ctypes.c_void_p.from_address(out_ptr).value = i = next(self._ids)
        return i

    def _Create(self, out_ptr):
        self.handle = self._new(out_ptr)
        return 0

    def _MatmulDescCreate(self, out_ptr, compute, scale):
        self.descs[self._new(out_ptr)] = {"compute": compute, "scale": scale, "attrs": {}}
        return 0

    def _MatmulDescSetAttribute(self, desc, attr, buf, size):
        assert size == 4, "the attributes we set are 32-bit enums"
        self.descs[desc]["attrs"][attr] = ctypes.c_int32.from_address(buf).value
        return 0

    def _MatrixLayoutCreate(self, out_ptr, dtype, rows, cols, ld):
        assert ld >= rows, f"ld {ld} < rows {rows}"
        self.layouts[self._new(out_ptr)] = Layout(dtype, rows, cols, ld)
        return 0

    def _Matmul(self, handle, desc, alpha, a, adesc, b, bdesc, beta, c, cdesc, d, ddesc, algo, ws, ws_size, stream):
        assert handle == self.handle
        attrs = self.descs[desc]["attrs"]
        la, lb, lc, ld = (self.layouts[x] for x in (adesc, bdesc, cdesc, ddesc))
        self.matmuls.append({"attrs": dict(attrs), "a": la, "b": lb, "d": ld, "algo": algo, "stream": stream})
        if self.status:
            return self.status
        A, B = la.values(a), lb.values(b)
        A = A.T if attrs.get(CUBLASLT_MATMUL_DESC_TRANSA, 0) == CUBLAS_OP_T else A
        B = B.T if attrs.get(CUBLASLT_MATMUL_DESC_TRANSB, 0) == CUBLAS_OP_T else B
        result = ctypes.c_float.from_address(alpha).value * (A @ B)
        if ctypes.c_float.from_address(beta).value != 0:
            result += ctypes.c_float.from_address(beta).value * lc.values(c)
        ld.view(d)[...] = result.astype(ELEMENT[ld.dtype])
        return 0
