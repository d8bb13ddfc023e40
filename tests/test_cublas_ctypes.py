"""cuBLAS through ctypes on CuPy's handle (rawpage/backends/cublas_ctypes.py) and the
cuda backend's matmul on top of it, without a GPU: a fake libcublas on host memory
(tests/fake_cublas.py) checks the signatures, the argument plan, the values written
and where, and that the handle's stream is set outside a capture and never inside."""

import ctypes
import os
import re

import numpy as np
import pytest

from rawpage.backends.base import Graph
from rawpage.backends.cublas_ctypes import SIGNATURES, CublasGemm, loaded_library, open_loaded
from rawpage.backends.cublas_gemm import CUBLAS_GEMM_DEFAULT, gemm_matmul, plan_gemm
from rawpage.dtypes import from_float32, storage_dtype, to_float32
from tests.fake_cublas import FakeCublas, FakeStream

# From cuBLAS's documentation (cublas_api.h), parameter names and types as declared.
DECLARATIONS = {
    "cublasSetStream_v2": "cublasHandle_t handle, cudaStream_t streamId",
    "cublasGemmEx": "cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, "
    "int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B, cudaDataType_t Btype, "
    "int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType, "
    "cublasGemmAlgo_t algo",
}
HANDLE = 0xC0B1A5
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def ctype_of(param: str):
    """Pointers, handles and streams are pointer-sized; enums and ints are C ints."""
    return ctypes.c_void_p if "*" in param or param.split()[0] in ("cublasHandle_t", "cudaStream_t") else ctypes.c_int


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_signatures_match_the_c_declarations(name):
    lib = FakeCublas()
    CublasGemm(lib)
    fn = getattr(lib, name)
    assert fn.argtypes == [ctype_of(p) for p in DECLARATIONS[name].split(", ")]
    assert fn.restype is ctypes.c_int and SIGNATURES[name] is fn.argtypes


def _matmul(dtype, T, K, N, bias=False, seed=0):
    """gemm_matmul on NumPy arrays through the fake library; returns (y, x, w, b, lib)."""
    rng = np.random.default_rng(seed)
    st = storage_dtype(dtype)
    x, w = from_float32(rng.standard_normal((T, K)), st), from_float32(rng.standard_normal((N, K)), st)
    b = from_float32(rng.standard_normal(N), st) if bias else None
    stream = FakeStream(ptr=0x5EA)
    lib = FakeCublas(streams={stream.ptr: stream})
    y = gemm_matmul(np, CublasGemm(lib), HANDLE, stream, x, w, b, None)
    return y, x, w, b, lib


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("T", [1, 2, 9])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_matmul_through_the_binding_computes_x_w_transposed_plus_bias(dtype, T, bias):
    y, x, w, b, lib = _matmul(dtype, T, 24, 10, bias, seed=T)
    want = to_float32(x).astype(np.float64) @ to_float32(w).astype(np.float64).T
    if bias:
        want += to_float32(b)
    np.testing.assert_allclose(to_float32(y), want, rtol=TOL[dtype], atol=4 * TOL[dtype])
    assert lib.last_call == plan_gemm(x, w, x.dtype) and lib.last_call.algo == CUBLAS_GEMM_DEFAULT


@pytest.mark.parametrize("T", [1, 4])
def test_output_never_aliases_an_input_and_the_bias_weight_is_untouched(T):
    """The first H200 run: for T = 1 the output was the bias array itself, and every
    single-token step wrote x @ w.T + b into the weight."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((T, 16)).astype(np.float32), rng.standard_normal((6, 16)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    saved = bias.copy()
    stream = FakeStream(ptr=1)
    gemm = CublasGemm(FakeCublas(streams={1: stream}))
    for _ in range(2):  # a second step must see the same bias
        y = gemm_matmul(np, gemm, HANDLE, stream, x, w, bias, None)
        assert not any(np.shares_memory(y, a) for a in (x, w, bias))
        np.testing.assert_array_equal(bias, saved)
        np.testing.assert_allclose(y, x @ w.T + saved, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_an_empty_batch_gives_an_empty_output_without_a_gemm(bias):
    # CuPy gives an empty (0, K) array strides (0, 0); the first H200 run refused it.
    x = np.lib.stride_tricks.as_strided(np.zeros(1, np.float16), (0, 64), (0, 0))
    w = np.ones((8, 64), np.float16)
    b = np.ones(8, np.float16) if bias else None
    stream = FakeStream(ptr=1)
    lib = FakeCublas(streams={1: stream})
    y = gemm_matmul(np, CublasGemm(lib), HANDLE, stream, x, w, b, None)
    assert y.shape == (0, 8) and y.dtype == np.float16
    assert not [c for c in lib.calls if c[0] == "gemmEx"]
    assert plan_gemm(x, w, np.float16).ldb == 64


def test_stream_is_set_outside_capture_and_never_inside():
    eager, capture = FakeStream(ptr=0x100), FakeStream(ptr=0x200)
    lib = FakeCublas(streams={eager.ptr: eager, capture.ptr: capture})
    gemm = CublasGemm(lib)
    x, w = np.ones((2, 8), np.float32), np.ones((3, 8), np.float32)

    gemm_matmul(np, gemm, HANDLE, eager, x, w, None, None)  # eager: bound to its stream first
    gemm_matmul(np, gemm, HANDLE, capture, x, w, None, None)  # the warm-up on the capture stream
    gemm.ensure_bound(HANDLE, capture)  # what CudaGraph does just before begin_capture: bound already
    capture.capturing = True
    for _ in range(3):
        gemm_matmul(np, gemm, HANDLE, capture, x, w, None, None)
    capture.capturing = False
    gemm_matmul(np, gemm, HANDLE, eager, x, w, None, None)

    assert [c[0] for c in lib.calls if not c[3]].count("setStream") == 3
    assert not [c for c in lib.calls if c[0] == "setStream" and c[3]], "setStream inside a capture"
    captured = [c for c in lib.calls if c[0] == "gemmEx" and c[3]]
    assert len(captured) == 3 and all(c[2] == capture.ptr for c in captured)
    assert lib.calls[0] == ("setStream", HANDLE, eager.ptr, False) and lib.calls[-1][2] == eager.ptr


def test_capture_on_a_stream_the_handle_is_not_bound_to_is_refused():
    other, capture = FakeStream(ptr=0x100), FakeStream(ptr=0x200)
    lib = FakeCublas(streams={other.ptr: other, capture.ptr: capture})
    gemm = CublasGemm(lib)
    x, w = np.ones((2, 8), np.float32), np.ones((3, 8), np.float32)
    gemm_matmul(np, gemm, HANDLE, other, x, w, None, None)
    capture.capturing = True
    with pytest.raises(RuntimeError, match="not bound to"):
        gemm_matmul(np, gemm, HANDLE, capture, x, w, None, None)
    with pytest.raises(RuntimeError, match="while the stream is capturing"):
        gemm.bind_stream(HANDLE, capture)
    assert not [c for c in lib.calls if c[3]], "no cuBLAS call may reach the library during a refused capture"


def test_a_failed_status_raises_with_its_name():
    stream = FakeStream(ptr=1)
    lib = FakeCublas(streams={1: stream}, status=7)
    with pytest.raises(RuntimeError, match="cublasSetStream_v2 failed: CUBLAS_STATUS_INVALID_VALUE"):
        gemm_matmul(
            np, CublasGemm(lib), HANDLE, stream, np.ones((1, 4), np.float32), np.ones((2, 4), np.float32), None, None
        )


MAPS = """\
7f0000000000-7f0000001000 r-xp 00000000 08:01 123 /usr/lib/libcublasLt.so.13.0.0
7f0000002000-7f0000003000 r-xp 00000000 08:01 124 /opt/venv/nvidia/cu13/lib/libcublas.so.13
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
7f0000006000-7f0000007000 rw-p 00000000 00:00 0 [heap]
"""


def test_the_loaded_libcublas_is_found_in_the_process_maps():
    from rawpage.backends.cublas_ctypes import _LIBCUBLAS

    assert loaded_library(_LIBCUBLAS, MAPS) == "/opt/venv/nvidia/cu13/lib/libcublas.so.13"
    with pytest.raises(FileNotFoundError):
        loaded_library(_LIBCUBLAS, MAPS.splitlines()[0])
    # and on this process's real maps, with the C library, which is always loaded
    libc = re.compile(r"^libc(\.so|-[\d.]+\.so)")
    assert re.search(r"libc[.-]", loaded_library(libc))
    assert open_loaded(libc).getpid() == os.getpid()


class _CaptureStream(FakeStream):
    """A cupy.cuda.Stream for CudaGraph: current inside `with`, captures between begin and end."""

    def __init__(self, cupy_ns, ptr):
        super().__init__(ptr)
        self.cupy = cupy_ns

    def __enter__(self):
        self.previous, self.cupy.current = self.cupy.current, self
        return self

    def __exit__(self, *exc):
        self.cupy.current = self.previous

    def synchronize(self):
        pass

    def begin_capture(self):
        self.capturing = True

    def end_capture(self):
        self.capturing = False
        return type("Graph", (), {"upload": lambda self, s: None, "launch": lambda self, s: None})()


def test_cuda_graph_binds_the_stream_before_capture_and_captures_gemms_without_set_stream(monkeypatch):
    """rawpage/backends/cuda_graph_capture.py against a fake cupy: the real capture sequence."""
    import contextlib
    import sys
    import types

    from rawpage.backends import cuda_graph_capture as cuda_graph

    ns = types.SimpleNamespace(current=FakeStream(ptr=0))  # the legacy default stream
    lib = FakeCublas(streams={0: ns.current})
    cuda = types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(synchronize=lambda: None),
        MemoryPool=lambda: types.SimpleNamespace(malloc=None, total_bytes=lambda: 0),
        Stream=lambda non_blocking: lib.streams.setdefault(0x77, _CaptureStream(ns, 0x77)),
        using_allocator=lambda malloc: contextlib.nullcontext(),
        get_current_stream=lambda: ns.current,
        device=types.SimpleNamespace(get_cublas_handle=lambda: HANDLE),
    )
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    gemm = CublasGemm(lib)
    monkeypatch.setattr(cuda_graph, "default_gemm", lambda: gemm)
    x, w = np.ones((2, 8), np.float32), np.ones((3, 8), np.float32)

    def forward():  # two GEMMs per "step", like q and o projections
        y = gemm_matmul(np, gemm, HANDLE, ns.current, x, w, None, None)
        return gemm_matmul(np, gemm, HANDLE, ns.current, y[:, :3].copy(), np.ones((4, 3), np.float32), None, None)

    graph = cuda_graph.CudaGraph(forward, cuda_graph.GraphMemory())
    # DecodeGraphs asks every backend's graph whether to check it (an H200 run of 9678a22 failed there)
    assert isinstance(graph, Graph) and graph.needs_check is False
    np.testing.assert_allclose(graph.replay(), np.full((2, 4), 24.0))
    inside = [c for c in lib.calls if c[3]]
    assert [c[0] for c in inside] == ["gemmEx", "gemmEx"] and all(c[2] == 0x77 for c in inside)
    last_before = [c for c in lib.calls[: lib.calls.index(inside[0])] if c[0] == "setStream"][-1]
    assert last_before == ("setStream", HANDLE, 0x77, False)


def test_ensure_bound_binds_only_a_handle_bound_elsewhere():
    a, b = FakeStream(ptr=0x100), FakeStream(ptr=0x200)
    lib = FakeCublas(streams={a.ptr: a, b.ptr: b})
    gemm = CublasGemm(lib)
    gemm.ensure_bound(HANDLE, a)
    gemm.ensure_bound(HANDLE, a)
    gemm.ensure_bound(HANDLE, b)
    assert [c[:3] for c in lib.calls] == [("setStream", HANDLE, a.ptr), ("setStream", HANDLE, b.ptr)]
