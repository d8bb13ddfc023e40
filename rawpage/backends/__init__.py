"""Backends: one implementation of every op per device.

    cpu   float32 activations on the host (backends/cpu.py): our C kernels
          (rawpage/native) where they build, else each op's NumPy reference.
    sim   the CUDA kernels in cuda/ compiled for the CPU by our simulator.
    cuda  CuPy arrays, our kernels as RawModules, cuBLAS GEMMs.

`get_backend(name)` returns one; the model only ever talks to that interface.
"""

from __future__ import annotations

import logging

from rawpage.backends.base import Backend
from rawpage.backends.gpu_probe import cupy_problem, require_cuda, visible_gpus

logger = logging.getLogger(__name__)


def get_backend(
    device: str = "cpu", dtype: str | None = None, cpu_threads: int | None = None, cpu_kernels: str = "auto"
) -> Backend:
    """device: cpu, sim, cuda or auto (cuda if a GPU is visible, else cpu).
    dtype: float32, float16 or bfloat16; None means float32 on cpu and sim,
    float16 on cuda. The cpu backend computes in float32 (vision towers bf16: cpu.py says where).
    cpu_kernels (cpu only): native, numpy, or auto = native where it builds."""
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
        if device == "cpu" and (gpus := visible_gpus()):
            # not an error (the CPU path works), but never a silent one
            logger.warning(
                "--device auto: %s is visible but CuPy cannot use it (%s); running on the CPU", gpus[0], cupy_problem()
            )
    if device == "cpu":
        if dtype not in (None, "float32"):
            raise ValueError(f"--device cpu computes in float32; for --dtype {dtype} use --device sim or cuda")
        return cpu_backend(cpu_threads, cpu_kernels, float32_tower=dtype == "float32")
    if device == "sim":
        from rawpage.backends.sim import SimBackend

        return SimBackend(dtype or "float32")
    if device == "cuda":
        require_cuda()  # raises with CuPy's own error when a GPU is visible but unusable
        from rawpage.backends.cuda import CudaBackend

        return CudaBackend(dtype or "float16")
    raise ValueError(f"unknown --device {device!r}; choose cpu, sim, cuda or auto")


def cpu_backend(cpu_threads: int | None, cpu_kernels: str, float32_tower: bool = False) -> Backend:
    """The CPU backend on the C kernels where they build (or --cpu-kernels native demands
    them), else on the NumPy references; the log says which, and why."""
    from rawpage.backends.cpu import CPUBackend
    from rawpage.native.library import native_kernels

    if cpu_kernels == "numpy":
        logger.info("CPU kernels: numpy (--cpu-kernels numpy: the float32 NumPy reference path)")
        return CPUBackend(None, cpu_threads)
    lib = native_kernels()
    if lib is None and cpu_kernels == "native":
        raise ValueError(
            "--cpu-kernels native: the CPU kernels did not build (the log line above says why); "
            "install a C compiler (cc) or use --cpu-kernels numpy"
        )
    return CPUBackend(lib, cpu_threads, bf16_tower=False if float32_tower else None)


def cuda_available() -> bool:
    """CuPy imports and sees a GPU. Why not, if not: gpu_probe.cupy_problem()."""
    return cupy_problem() is None
