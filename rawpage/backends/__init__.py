"""Backends: one implementation of every op per device.

    cpu   NumPy, float32. The reference, and a real CPU serving path.
    sim   the CUDA kernels in cuda/ compiled for the CPU by our simulator.
    cuda  CuPy arrays, our kernels as RawModules, cuBLAS GEMMs.

`get_backend(name)` returns one; the model only ever talks to that interface.
"""

from __future__ import annotations

from rawpage.backends.base import Backend


def get_backend(device: str = "cpu") -> Backend:
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    if device == "cpu":
        from rawpage.backends.cpu import CPUBackend

        return CPUBackend()
    raise ValueError(f"unknown --device {device!r}; choose cpu or auto")


def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False
