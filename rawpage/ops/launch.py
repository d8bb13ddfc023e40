"""How the ops' launch code talks to kernels, on the GPU and in the simulator.

Each op module (rawpage/ops/<op>.py) holds its NumPy reference and a launch
function that computes the grid and block, checks layouts, packs arguments and
picks the kernel for the dtype. A launch function takes an array module `xp`
(numpy or cupy) and a KernelLoader, so the same code runs under `sim` (NumPy
arrays, kernels compiled for the CPU) and `cuda` (CuPy arrays, NVRTC).

A loader turns (file in cuda/, kernel name) into a callable with CuPy's
RawKernel convention:  kernel(grid, block, args, shared_mem=0).  Scalars are
always passed as NumPy scalars of the kernel's parameter type; the simulator
checks that against the kernel's real signature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rawpage.dtypes import BFLOAT16

DTYPE_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", BFLOAT16: "bf16"}


class KernelFunction(Protocol):
    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0) -> None: ...


class KernelLoader(Protocol):
    def get_function(self, module: str, name: str, defines: tuple[str, ...] = ()) -> KernelFunction:
        """module: a file in cuda/ such as 'rms_norm.cu'; name: an extern "C" kernel in it;
        defines: NAME=VALUE macros for the module's build. A loader builds and caches a
        module once per distinct defines: decode attention passes RP_ONE_HEAD_SIZE, so a
        build instantiates one head size's 24 kernels, not all 168 (over a minute of NVRTC)."""
        ...


# An optional pointer argument left out: an 8-byte zero, which CuPy passes by value, so the
# kernel sees nullptr (CuPy's None would be a null address for the parameter itself); the
# simulator takes the same value.
NULL_POINTER = np.uint64(0)


def cuda_source_dir() -> Path:
    """The kernel sources: cuda/ in a checkout, rawpage/cuda/ in an installed wheel.

    cuda/ has no __init__.py on purpose. With the repository root on sys.path
    (PYTHONPATH=., pytest's rootdir), a regular package named `cuda` would shadow
    NVIDIA's `cuda` namespace (cuda.pathfinder, cuda.bindings) and CuPy 14 would
    fail to import. As a namespace portion it merges with NVIDIA's instead, and
    rawpage.cuda is a namespace package too: it has a __path__ but no __file__.
    """
    import rawpage.cuda

    for entry in rawpage.cuda.__path__:
        if (Path(entry) / "common.cuh").is_file():
            return Path(entry).resolve()
    raise FileNotFoundError(f"no kernel sources (common.cuh) in rawpage.cuda's path {list(rawpage.cuda.__path__)}")


def dtype_suffix(x: Any) -> str:
    """The kernel name suffix for an activation array's dtype: f32, f16 or bf16."""
    try:
        return DTYPE_SUFFIX[np.dtype(x.dtype)]
    except KeyError:
        raise TypeError(f"kernels take float32, float16 or bfloat16 (stored as uint16), not {x.dtype}") from None


def same_dtype(*arrays: Any) -> None:
    dtypes = {np.dtype(a.dtype) for a in arrays}
    if len(dtypes) > 1:
        raise TypeError(f"arrays must share one dtype, got {sorted(map(str, dtypes))}")


def data_ptr(x: Any) -> int:
    if hasattr(x, "__cuda_array_interface__"):
        return int(x.__cuda_array_interface__["data"][0])
    return int(x.__array_interface__["data"][0])


def token_stride(x: Any) -> int | None:
    """Elements between consecutive tokens of a (T, ...) array whose rows are
    contiguous (a view into a wider buffer, like q inside qkv); None otherwise."""
    inner = x.itemsize
    for n, s in zip(reversed(x.shape[1:]), reversed(x.strides[1:])):
        if n > 1 and s != inner:
            return None
        inner *= n
    if x.shape[0] > 1 and x.strides[0] % x.itemsize:
        return None
    return x.strides[0] // x.itemsize if x.shape[0] > 1 else inner // x.itemsize


def require_aligned(what: str, x: Any, stride_bytes: int = 0, alignment: int = 16) -> None:
    """Kernels read these arrays in 16-byte vectors: the start and the token stride must align."""
    if data_ptr(x) % alignment or stride_bytes % alignment:
        raise ValueError(
            f"{what} must start on a {alignment}-byte boundary with a token stride that is a "
            f"multiple of {alignment} bytes (pointer {data_ptr(x):#x}, stride {stride_bytes} bytes)"
        )


def int32_array(xp: Any, a: Any) -> Any:
    """An index array on the device, contiguous int32 (a no-op if it already is)."""
    return xp.ascontiguousarray(xp.asarray(a), dtype=xp.int32)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def threads_for(n: int, max_threads: int = 1024) -> int:
    """Threads for a block that strides over n items: n rounded up to a warp, capped."""
    return max(32, min(max_threads, ceil_div(n, 32) * 32))
