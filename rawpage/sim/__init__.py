"""The CUDA-on-CPU simulator behind `--device sim`.

The kernels in cuda/ compile unchanged with g++ against include/cuda_sim.h and
run on the CPU: every CUDA thread is a fiber, blocks run on a few worker
threads, and __syncthreads, warp shuffles and votes, WMMA and the PTX of
cuda/mma.cuh (mma.sync, ldmatrix: include/ptx_emu.h) are cooperative
barriers (runtime/). build.py compiles and caches; launcher.py calls kernels
with CuPy's RawKernel convention on NumPy arrays; traffic.py counts what a
launch reads from and writes to global memory (SimKernelLoader(traffic=True)).

    loader = SimKernelLoader()
    kernel = loader.get_function("rms_norm.cu", "rms_norm_f16")
    kernel((T,), (256,), (out, x, w, np.float32(1e-5), np.int32(dim)))
"""

from __future__ import annotations

import os
from pathlib import Path

from rawpage.sim.build import SimCompileError
from rawpage.sim.launcher import SimFunction, SimLaunchError, SimModule
from rawpage.sim.traffic import LaunchTraffic

__all__ = ["LaunchTraffic", "SimCompileError", "SimFunction", "SimKernelLoader", "SimLaunchError", "SimModule"]


# The simulated GPU's multiprocessor count, which launch code reads to size grids
# (decode attention's split-K); $RAWPAGE_SIM_SMS overrides it.
DEFAULT_SM_COUNT = 16


class SimKernelLoader:
    """The `sim` backend's KernelLoader: one SimModule per file in cuda/, built on first use.
    traffic=True counts every launch's global-memory traffic into traffic_log
    (rawpage/sim/traffic.py)."""

    def __init__(
        self,
        debug: bool | None = None,
        workers: int | None = None,
        source_dir: Path | None = None,
        traffic: bool = False,
        sm_count: int | None = None,
    ) -> None:
        from rawpage.ops.launch import cuda_source_dir

        self.debug, self.workers, self.traffic = debug, workers, traffic
        self.sm_count = sm_count or int(os.environ.get("RAWPAGE_SIM_SMS", DEFAULT_SM_COUNT))
        self.source_dir = Path(source_dir) if source_dir else cuda_source_dir()
        self._modules: dict[str, SimModule] = {}
        self.traffic_log: list[LaunchTraffic] = []

    def module(self, name: str) -> SimModule:
        if name not in self._modules:
            self._modules[name] = SimModule(
                self.source_dir / name, self.debug, self.workers, traffic=self.traffic, traffic_log=self.traffic_log
            )
        return self._modules[name]

    def get_function(self, module: str, name: str) -> SimFunction:
        return self.module(module).get_function(name)
