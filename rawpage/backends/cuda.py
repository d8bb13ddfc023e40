"""`--device cuda`: CuPy arrays, our kernels as RawModules compiled by NVRTC,
and cuBLAS GEMMs through CuPy's matmul.

Only the loader and the GEMM are GPU-specific; every op's launch code is the
one in rawpage/ops that the `sim` backend runs and the kernel tests check.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from rawpage.backends.kernel_backend import KernelBackend
from rawpage.dtypes import BFLOAT16
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
    """The `cuda` backend's KernelLoader: one cupy.RawModule per file in cuda/."""

    def __init__(self, source_dir: Path | None = None) -> None:
        self.source_dir = Path(source_dir) if source_dir else cuda_source_dir()
        self.options = nvrtc_options(self.source_dir)
        self._modules: dict[str, Any] = {}
        self._functions: dict[tuple[str, str], _CupyKernel] = {}

    def get_function(self, module: str, name: str) -> _CupyKernel:
        import cupy

        key = (module, name)
        if key not in self._functions:
            if module not in self._modules:
                code = (self.source_dir / module).read_text()
                self._modules[module] = cupy.RawModule(code=code, options=self.options)
            self._functions[key] = _CupyKernel(self._modules[module].get_function(name))
        return self._functions[key]


class CudaBackend(KernelBackend):
    name = "cuda"

    def __init__(self, dtype: str = "float16") -> None:
        import cupy

        super().__init__(cupy, CupyKernelLoader(), dtype)

    def matmul(self, x: Any, w: Any, bias: Any | None = None) -> Any:
        if self.dtype == BFLOAT16:  # CuPy has no bfloat16 GEMM: go through float32
            return super().matmul(x, w, bias)
        y = x @ w.T  # cuBLAS; float16 accumulates in float32
        if bias is not None:
            y += bias
        return y
