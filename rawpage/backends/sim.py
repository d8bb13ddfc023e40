"""`--device sim`: the CUDA kernels in cuda/, compiled for the CPU by our
simulator, on NumPy arrays. Slow by design; it runs the real kernel sources and
the real launch code, so kernel and launch bugs show up without a GPU."""

from __future__ import annotations

import numpy as np

from rawpage.backends.kernel_backend import KernelBackend
from rawpage.sim import SimKernelLoader


class SimBackend(KernelBackend):
    name = "sim"

    def __init__(self, dtype: str = "float32", debug: bool | None = None, workers: int | None = None) -> None:
        """dtype: float32, float16 or bfloat16. debug: fence every kernel argument
        with inaccessible pages (default: $RAWPAGE_SIM_DEBUG). workers: OS threads
        that run blocks (default: $RAWPAGE_SIM_THREADS, else the CPUs available)."""
        super().__init__(np, SimKernelLoader(debug=debug, workers=workers), dtype)
