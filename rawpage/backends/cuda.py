"""`--device cuda`: CuPy arrays, our kernels as RawModules compiled by NVRTC,
and GEMMs on cuBLAS's gemmEx with float32 accumulation, called through ctypes
so that CUDA graphs can capture them (cublas_ctypes.py).

Only the loader, the GEMM, memory accounting and graph capture are
GPU-specific; every op's launch code is the one in rawpage/ops that the `sim`
backend runs and the kernel tests check.

bfloat16 is stored as uint16 bits, as everywhere in rawpage: CuPy has no
bfloat16 dtype (checked on CuPy 14), and nothing here needs one, because our
kernels read the bits as __nv_bfloat16 and cuBLAS is told the element type
explicitly (rawpage/backends/cublas_gemm.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from rawpage.backends.base import Array
from rawpage.backends.cublas_ctypes import cublas_matmul, default_gemm
from rawpage.backends.cublaslt_fp8 import CupyFp8Gemm, fp8_gemm_supported
from rawpage.backends.kernel_backend import KernelBackend
from rawpage.dtypes import BFLOAT16, from_float32
from rawpage.ops.launch import cuda_source_dir

DEFAULT_SMEM_LIMIT = 48 * 1024  # dynamic shared memory a launch gets without opting in


def nvrtc_options(source_dir: Path) -> tuple[str, ...]:
    """NVRTC options for every module: C++17, cuda/ (for common.cuh) and the CUDA
    headers (for mma.h) on the include path, and a hash of the headers in cuda/,
    because CuPy's kernel cache is keyed by the source text and options only."""
    headers = sorted(source_dir.glob("*.cuh"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in headers)).hexdigest()[:16]
    options = ["-std=c++17", f"-I{source_dir}", f"-DRAWPAGE_HEADERS_{digest}"]
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.path.isdir(os.path.join(root, "include")):
            options.append(f"-I{os.path.join(root, 'include')}")
            break
    return tuple(options)


class _CupyKernel:
    """cupy.RawKernel with the opt-in for more than 48 KiB of dynamic shared memory."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.smem_limit = DEFAULT_SMEM_LIMIT

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        if shared_mem > self.smem_limit:
            self.fn.max_dynamic_shared_size_bytes = shared_mem
            self.smem_limit = shared_mem
        self.fn(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)


class CupyKernelLoader:
    """The `cuda` backend's KernelLoader: one cupy.RawModule per file in cuda/ and
    defines, compiled on first use and cached (in memory here, on disk by CuPy)."""

    def __init__(self, source_dir: Path | None = None) -> None:
        self.source_dir = Path(source_dir) if source_dir else cuda_source_dir()
        self.options = nvrtc_options(self.source_dir)
        self._modules: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._functions: dict[tuple[str, str, tuple[str, ...]], _CupyKernel] = {}
        self._sm_count: int | None = None

    @property
    def sm_count(self) -> int:
        """The current GPU's multiprocessor count (launch code sizes grids by it)."""
        if self._sm_count is None:
            import cupy

            self._sm_count = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
        return self._sm_count

    def module(self, name: str, defines: tuple[str, ...] = ()) -> Any:
        """The cupy.RawModule of one file and defines (NVRTC runs at its first kernel lookup)."""
        import cupy

        if (name, defines) not in self._modules:
            code = (self.source_dir / name).read_text()
            options = self.options + tuple(f"-D{d}" for d in defines)
            self._modules[name, defines] = cupy.RawModule(code=code, options=options)
        return self._modules[name, defines]

    def get_function(self, module: str, name: str, defines: tuple[str, ...] = ()) -> _CupyKernel:
        key = (module, name, defines)
        if key not in self._functions:
            self._functions[key] = _CupyKernel(self.module(module, defines).get_function(name))
        return self._functions[key]


class CupyMemory:
    """memory.DeviceMemory for the current GPU and CuPy's default memory pool."""

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy
        self.pool = cupy.get_default_memory_pool()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.cupy.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def pool_held_bytes(self) -> int:
        return int(self.pool.total_bytes())

    def release_cached(self) -> None:
        self.pool.free_all_blocks()

    def synchronize(self) -> None:
        self.cupy.cuda.Device().synchronize()


class CudaBackend(KernelBackend):
    name = "cuda"
    supports_graphs = True

    def __init__(self, dtype: str = "float16") -> None:
        import cupy

        super().__init__(cupy, CupyKernelLoader(), dtype)
        self.memory = CupyMemory()
        self._graph_memory = None  # created with the first capture
        _check_cublas_constants()
        default_gemm()  # finds libcublas now, so that a problem shows at startup, not in the first step
        cc = cupy.cuda.Device().compute_capability  # e.g. "90"
        if fp8_gemm_supported((int(cc[:-1]), int(cc[-1]))) and os.environ.get("RAWPAGE_FP8_GEMM", "1") != "0":
            self.fp8_gemm = CupyFp8Gemm()  # FP8 weights multiply in FP8 on tensor cores in prefill

    # --- arrays -----------------------------------------------------------
    def asarray(self, x: np.ndarray, dtype: Any = None) -> Array:
        """Host array -> GPU. float32 data headed for float16 or bfloat16 is copied as
        float32 and rounded on the GPU: the host-side bfloat16 rounding of a 16 GB
        model would take longer than the copy."""
        target = self.dtype if dtype is None else np.dtype(dtype)
        host = np.asarray(x)
        if host.dtype.kind == "f" and target in (np.float16, BFLOAT16):
            return self.xp.ascontiguousarray(from_float32(self.xp.asarray(host, dtype=np.float32), target))
        return self.xp.ascontiguousarray(self.xp.asarray(host, dtype=target))

    def copy_from_host(self, dst: Array, src: np.ndarray) -> None:
        # A pageable host buffer on purpose: cudaMemcpyAsync stages pageable memory
        # before it returns, so the caller may refill `src` at once even while the
        # GPU is still busy with the previous step (a pinned buffer would need an
        # event wait first). The metadata of one step is a few KB.
        dst.set(np.ascontiguousarray(src))

    def uniform(self, shape: tuple[int, ...], bound: float, seed: int, offset: float = 0.0) -> Array:
        rng = self.xp.random.default_rng(seed)
        x = rng.random(shape, dtype=np.float32)  # U[0, 1) on the GPU
        x *= np.float32(2 * bound)
        x += np.float32(offset - bound)
        return from_float32(x, self.dtype)

    def synchronize(self) -> None:
        self.xp.cuda.Device().synchronize()

    # --- GEMMs ------------------------------------------------------------
    def matmul(self, x: Array, w: Array, bias: Array | None = None) -> Array:
        """x (T, in) @ w (out, in).T + bias -> (T, out) in the model dtype, float32 accumulation."""
        return cublas_matmul(x, w, bias)

    # --- graphs -------------------------------------------------------------
    def capture_graph(self, fn):
        from rawpage.backends.cuda_graph_capture import CudaGraph, GraphMemory

        if self._graph_memory is None:
            self._graph_memory = GraphMemory()
        return CudaGraph(fn, self._graph_memory)

    def graph_memory_bytes(self) -> int:
        return self._graph_memory.held_bytes() if self._graph_memory is not None else 0


def _check_cublas_constants() -> None:
    """cublas_gemm hard-codes CUDA's enum values so that it can be tested without CuPy;
    make sure they are the ones this CuPy was built against."""
    from cupy_backends.cuda.libs import cublas

    from rawpage.backends import cublas_gemm as g

    for name in ("CUBLAS_OP_N", "CUBLAS_OP_T", "CUBLAS_COMPUTE_32F", "CUBLAS_GEMM_DEFAULT"):
        if hasattr(cublas, name) and getattr(cublas, name) != getattr(g, name):
            raise RuntimeError(f"{name} is {getattr(cublas, name)} in CuPy but {getattr(g, name)} in cublas_gemm")
