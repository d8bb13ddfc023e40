"""The CUDA-on-CPU simulator behind `--device sim`.

The kernels in cuda/ compile unchanged with g++ against include/cuda_sim.h and
run on the CPU: every CUDA thread is a fiber, blocks run on a few worker
threads, and __syncthreads, warp shuffles and votes, WMMA and the PTX of
cuda/mma.cuh (mma.sync, ldmatrix: include/ptx_emu.h) are cooperative
barriers (runtime/). build.py compiles and caches; launcher.py loads kernels
by file and name (SimKernelLoader) and calls them with CuPy's RawKernel
convention on NumPy arrays; traffic.py counts what a launch reads from and
writes to global memory (SimKernelLoader(traffic=True)).

    loader = SimKernelLoader()
    kernel = loader.get_function("rms_norm.cu", "rms_norm_f16")
    kernel((T,), (256,), (out, x, w, np.float32(1e-5), np.int32(dim)))
"""

from __future__ import annotations

from rawpage.sim.build import SimCompileError
from rawpage.sim.launcher import DEFAULT_SM_COUNT, SimFunction, SimKernelLoader, SimLaunchError, SimModule
from rawpage.sim.traffic import LaunchTraffic

__all__ = [
    "DEFAULT_SM_COUNT",
    "LaunchTraffic",
    "SimCompileError",
    "SimFunction",
    "SimKernelLoader",
    "SimLaunchError",
    "SimModule",
]
