"""Backends: one implementation of every op per device.

    cpu   NumPy, float32. The reference, and a real CPU serving path.
    sim   the CUDA kernels in cuda/ compiled for the CPU by our simulator.
    cuda  CuPy arrays, our kernels as RawModules, cuBLAS GEMMs.

`get_backend(name)` returns one; the model only ever talks to that interface.
"""

from __future__ import annotations

from rawpage.backends.base import Backend


def get_backend(device: str = "cpu", dtype: str | None = None) -> Backend:
    """device: cpu, sim, cuda or auto (cuda if a GPU is visible, else cpu).
    dtype: float32, float16 or bfloat16; None means float32 on cpu and sim,
    float16 on cuda. The cpu backend computes in float32 only."""
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    if device == "cpu":
        from rawpage.backends.cpu import CPUBackend

        if dtype not in (None, "float32"):
            raise ValueError(f"--device cpu computes in float32; for --dtype {dtype} use --device sim or cuda")
        return CPUBackend()
    if device == "sim":
        from rawpage.backends.sim import SimBackend

        return SimBackend(dtype or "float32")
    if device == "cuda":
        if not cuda_available():
            raise ValueError("--device cuda needs CuPy and a visible GPU; try --device cpu or sim")
        from rawpage.backends.cuda import CudaBackend

        return CudaBackend(dtype or "float16")
    raise ValueError(f"unknown --device {device!r}; choose cpu, sim, cuda or auto")


def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False
