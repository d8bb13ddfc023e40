"""Load and launch simulated kernels with CuPy's RawKernel calling convention.

    loader = SimKernelLoader()  # the sim backend's KernelLoader: one SimModule per file in cuda/
    kernel = loader.get_function("rms_norm.cu", "rms_norm_f16")  # SimModule(path).get_function(name)
    kernel((num_tokens,), (256,), (out, x, weight, np.float32(eps), np.int32(dim)), shared_mem=0)

Arrays are NumPy arrays (their data pointer is passed, as CuPy passes a device
pointer); scalars must be NumPy scalars of exactly the parameter's type, which
is checked against the kernel's real signature. A Python float would reach a
GPU kernel as 8 bytes of double, so it is refused here rather than garbled there.

Environment:
    RAWPAGE_SIM_THREADS  worker threads (default: the CPUs this process may use, at most 8)
    RAWPAGE_SIM_DEBUG=1  copy every array argument into a buffer fenced by
                         inaccessible pages, so out-of-bounds accesses fault and
                         are reported against the argument; poison dynamic shared
                         memory and catch writes past its end
    RAWPAGE_SIM_TRACE=1  print each launch and how long it took
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rawpage.sim.build import build_module, build_runtime
from rawpage.sim.guard import GuardedArgs
from rawpage.sim.traffic import LaunchTraffic, TrafficCounter

_KIND_NAMES = {0: "pointer", 1: "signed integer", 2: "unsigned integer", 3: "float", 4: "bool"}
_NUMPY_KINDS = {1: "i", 2: "u", 3: "f", 4: "b"}
_MAX_PARAMS = 64


class SimLaunchError(RuntimeError):
    """A simulated kernel failed: bad configuration, fault, deadlock or divergence."""


def default_workers() -> int:
    if os.environ.get("RAWPAGE_SIM_THREADS"):
        return max(1, int(os.environ["RAWPAGE_SIM_THREADS"]))
    return max(1, min(8, len(os.sched_getaffinity(0))))


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def _dims(d: Any, what: str) -> tuple[int, int, int]:
    t = (d,) if isinstance(d, (int, np.integer)) else tuple(d)
    if not 1 <= len(t) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {d!r}")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))  # type: ignore[return-value]


class SimFunction:
    """One kernel of a SimModule, callable like cupy.RawKernel."""

    def __init__(self, module: SimModule, name: str) -> None:
        self.module, self.name = module, name
        lib = module.lib
        self._entry = getattr(lib, f"rp_sim_entry_{name}")
        self._entry.restype = ctypes.c_int
        self._entry.argtypes = [
            ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(ctypes.c_uint),
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ]
        kinds = (ctypes.c_int * _MAX_PARAMS)()
        sizes = (ctypes.c_int * _MAX_PARAMS)()
        n = getattr(lib, f"rp_sim_signature_{name}")(kinds, sizes, _MAX_PARAMS)
        self.param_kinds = tuple(kinds[:n])
        self.param_sizes = tuple(sizes[:n])
        self.last_seconds = 0.0
        self.last_traffic: LaunchTraffic | None = None  # set by each launch of a traffic=True module

    def __repr__(self) -> str:
        return f"<SimFunction {self.name} of {self.module.source.name}>"

    def _scalar(self, i: int, a: Any, kind: int, size: int) -> ctypes.Array:
        where = f"argument {i} of {self.name}"
        if isinstance(a, np.ndarray):
            raise TypeError(f"{where} is a {_KIND_NAMES.get(kind, 'value')}, got an array")
        if not isinstance(a, np.generic):
            raise TypeError(
                f"{where}: pass a NumPy scalar such as np.int32 or np.float32, not "
                f"{type(a).__name__}; CuPy would pass a Python number as 8 bytes"
            )
        want = _NUMPY_KINDS.get(kind)
        if a.dtype.itemsize != size or (want and a.dtype.kind != want):
            raise TypeError(f"{where} is a {size}-byte {_KIND_NAMES.get(kind, 'value')}, got {a.dtype}")
        return ctypes.create_string_buffer(a.tobytes(), size)

    def _cell(self, i: int, a: Any, kind: int, size: int) -> Any:
        """ctypes storage for one argument (pointers hold the array's own address)."""
        if kind != 0:
            return self._scalar(i, a, kind, size)
        if isinstance(a, np.ndarray):
            return ctypes.c_void_p(a.ctypes.data)
        if a is None or (isinstance(a, np.uint64) and a == 0):  # ops/launch.py NULL_POINTER
            return ctypes.c_void_p(0)
        raise TypeError(f"argument {i} of {self.name} is a pointer: pass a NumPy array, not {type(a).__name__}")

    def _fence(self, args: tuple | list, cells: list) -> GuardedArgs:
        """Debug mode: point the kernel at fenced copies of its array arguments."""
        guards = GuardedArgs(self.module.runtime)
        arrays = [(i, a) for i, a in enumerate(args) if self.param_kinds[i] == 0 and isinstance(a, np.ndarray)]
        for i, a in arrays:
            guards.add(i, a)
        guards.allocate()
        for i, a in arrays:
            cells[i].value = guards.pointer(i, a)
        return guards

    def __call__(self, grid: Any, block: Any, args: tuple | list, shared_mem: int = 0) -> None:
        if len(args) != len(self.param_kinds):
            raise TypeError(f"{self.name} takes {len(self.param_kinds)} arguments, got {len(args)}")
        g, b = _dims(grid, "grid"), _dims(block, "block")
        cells = [self._cell(i, a, *spec) for i, (a, *spec) in enumerate(zip(args, self.param_kinds, self.param_sizes))]
        argv = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.cast(ctypes.pointer(c), ctypes.c_void_p) for c in cells])
        guards = self._fence(args, cells) if self.module.debug else None

        counter = TrafficCounter(self.module.runtime) if self.module.traffic else None
        if counter:
            counter.begin(
                {
                    i: (a, cells[i].value or 0)
                    for i, a in enumerate(args)
                    if self.param_kinds[i] == 0 and isinstance(a, np.ndarray)
                }
            )
        err = ctypes.create_string_buffer(2048)
        fault = ctypes.c_size_t(0)
        start = time.perf_counter()
        try:
            rc = self._entry(
                (ctypes.c_uint * 3)(*g),
                (ctypes.c_uint * 3)(*b),
                int(shared_mem),
                self.module.workers,
                int(self.module.debug),
                argv,
                err,
                len(err),
                ctypes.byref(fault),
            )
            self.last_seconds = time.perf_counter() - start
            message = err.value.decode(errors="replace") if rc else ""
            if guards and rc and fault.value:
                message += guards.explain(fault.value)
        finally:
            if counter:
                self.last_traffic = counter.end(self.name, g, b)
                self.module.traffic_log.append(self.last_traffic)
            if guards:
                guards.copy_out_and_free()
        if self.module.trace:
            print(
                f"sim: {self.name} grid={g} block={b} smem={shared_mem} {self.last_seconds * 1e3:.2f} ms",
                file=sys.stderr,
            )
        if rc != 0:
            raise SimLaunchError(message)


class SimModule:
    """One .cu file compiled for the simulator; like cupy.RawModule."""

    def __init__(
        self,
        source: Path,
        debug: bool | None = None,
        workers: int | None = None,
        include_dirs: tuple[Path, ...] = (),
        traffic: bool = False,
        traffic_log: list[LaunchTraffic] | None = None,
        defines: tuple[str, ...] = (),
    ) -> None:
        """traffic=True: count every launch's global-memory traffic (a slower,
        instrumented build), appending a LaunchTraffic to traffic_log per launch.
        defines: NAME=VALUE macros for the build (see RP_ONE_HEAD_SIZE in cuda/)."""
        self.source = Path(source)
        self.runtime = ctypes.CDLL(str(build_runtime()))
        built = build_module(self.source, include_dirs, defines, traffic=traffic)
        self.traffic = traffic
        self.traffic_log = traffic_log if traffic_log is not None else []
        self.lib = ctypes.CDLL(str(built.path))
        self.kernels = built.kernels
        self.debug = _env_flag("RAWPAGE_SIM_DEBUG") if debug is None else debug
        self.trace = _env_flag("RAWPAGE_SIM_TRACE")
        self.workers = workers or default_workers()
        self._functions: dict[str, SimFunction] = {}

    def get_function(self, name: str) -> SimFunction:
        if name not in self._functions:
            if name not in self.kernels:
                raise AttributeError(f"{self.source.name} has no kernel {name!r}; it has {', '.join(self.kernels)}")
            self._functions[name] = SimFunction(self, name)
        return self._functions[name]


# The simulated GPU's multiprocessor count, which launch code reads to size grids
# (decode attention's split-K); $RAWPAGE_SIM_SMS overrides it.
DEFAULT_SM_COUNT = 16


class SimKernelLoader:
    """The `sim` backend's KernelLoader: one SimModule per file in cuda/ and defines, built
    on first use. traffic=True counts every launch's global-memory traffic into traffic_log
    (rawpage/sim/traffic.py); defines go to every module's build, before a call's own."""

    def __init__(
        self,
        debug: bool | None = None,
        workers: int | None = None,
        source_dir: Path | None = None,
        traffic: bool = False,
        sm_count: int | None = None,
        defines: tuple[str, ...] = (),
    ) -> None:
        from rawpage.ops.launch import cuda_source_dir

        self.debug, self.workers, self.traffic, self.defines = debug, workers, traffic, defines
        self.sm_count = sm_count or int(os.environ.get("RAWPAGE_SIM_SMS", DEFAULT_SM_COUNT))
        self.source_dir = Path(source_dir) if source_dir else cuda_source_dir()
        self._modules: dict[tuple[str, tuple[str, ...]], SimModule] = {}
        self.traffic_log: list[LaunchTraffic] = []

    def module(self, name: str, defines: tuple[str, ...] = ()) -> SimModule:
        if (name, defines) not in self._modules:
            self._modules[name, defines] = SimModule(
                self.source_dir / name,
                self.debug,
                self.workers,
                traffic=self.traffic,
                traffic_log=self.traffic_log,
                defines=self.defines + defines,
            )
        return self._modules[name, defines]

    def get_function(self, module: str, name: str, defines: tuple[str, ...] = ()) -> SimFunction:
        return self.module(module, defines).get_function(name)
