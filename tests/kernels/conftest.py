"""Every kernel's real .cu source against its NumPy reference.

Each test runs once per device in $RAWPAGE_KERNEL_DEVICES (default "sim,cuda"):
`sim` is the CUDA-on-CPU simulator in debug mode (every array argument fenced
by inaccessible pages); `cuda` is a GPU through CuPy, and skips where there is
none. The launch code under test is the same for both.

Comparisons convert the inputs to the kernel's dtype first, run the reference
in float32 on exactly those values, and compare the kernel's output with the
tolerance of its dtype (TOLERANCE): the error is then the kernel's own
rounding, not the inputs'.
"""

from __future__ import annotations

import os
import threading
import types
from typing import Any

import numpy as np
import pytest

from rawpage.dtypes import BFLOAT16, from_float32, storage_dtype, to_float32

DTYPES = ["float32", "float16", "bfloat16"]

# Per dtype: roughly a few units in the last place of the output after float32
# accumulation (float16 keeps 11 significant bits, bfloat16 8).
TOLERANCE = {
    "float32": dict(rtol=1e-5, atol=1e-5),
    "float16": dict(rtol=2e-3, atol=2e-3),
    "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2),
}


def _poisoned_numpy() -> Any:
    """numpy, except that empty() is filled with NaN (all-ones bits for bfloat16
    and integers), so an output element a kernel forgets to write cannot pass as
    a leftover zero."""

    def fill(a: np.ndarray) -> np.ndarray:
        if a.dtype.kind == "f":
            a.fill(np.nan)
        else:
            a.fill(-1 if a.dtype.kind == "i" else np.iinfo(a.dtype).max)
        return a

    mod = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    mod.empty = lambda *a, **k: fill(np.empty(*a, **k))
    mod.empty_like = lambda *a, **k: fill(np.empty_like(*a, **k))
    return mod


class Device:
    """An array module and a kernel loader to launch with, and host <-> device copies."""

    def __init__(self, name: str, xp: Any, loader: Any) -> None:
        self.name, self.xp, self.loader = name, xp, loader

    def put(self, host: np.ndarray, dtype: str) -> Any:
        """float data -> a fresh device array in `dtype` (bfloat16 as uint16 bits)."""
        return self.xp.asarray(from_float32(np.array(host, dtype=np.float32), storage_dtype(dtype)))

    def put_raw(self, host: np.ndarray) -> Any:
        return self.xp.array(host)

    def get(self, a: Any) -> np.ndarray:
        """device array -> float32 host copy."""
        host = a if isinstance(a, np.ndarray) else a.get()
        return np.array(to_float32(host) if host.dtype == BFLOAT16 or host.dtype.kind == "f" else host)

    def rounded(self, host: np.ndarray, dtype: str) -> np.ndarray:
        """What `host` becomes in `dtype`, back as float32: the reference's input."""
        return np.array(to_float32(from_float32(np.asarray(host, np.float32), storage_dtype(dtype))))


def devices() -> list[str]:
    return [d for d in os.environ.get("RAWPAGE_KERNEL_DEVICES", "sim,cuda").split(",") if d]


@pytest.fixture(scope="session", autouse=True)
def prebuild_sim_modules(request: pytest.FixtureRequest) -> None:
    """On a cold cache the simulator compiles ~40 modules, each when a test first needs
    it, one at a time while the second core idles (~4 of the suite's minutes on a fresh
    2-core machine). When many kernel tests run, a background thread compiles every file
    (and decode attention per head size) beside them, last file first, so that it meets
    the tests' own first-use order half-way; rawpage/sim/build.py locks each output, so
    a test that needs a module being built waits for it instead of compiling it again."""
    kernel_tests = [i for i in request.session.items if "tests/kernels/" in str(i.path).replace(os.sep, "/")]
    if "sim" not in devices() or len(kernel_tests) < 100:
        return
    from rawpage.ops.launch import cuda_source_dir
    from rawpage.sim.build import build_module
    from tools.gpu_check.warm import builds

    def build_all() -> None:
        for name, defines in reversed(builds()):
            try:
                build_module(cuda_source_dir() / name, defines=defines)
            except Exception:  # noqa: BLE001 - the test that needs the module reports its error
                pass

    threading.Thread(target=build_all, name="sim-prebuild", daemon=True).start()


@pytest.fixture(scope="session", params=devices())
def device(request: pytest.FixtureRequest) -> Device:
    if request.param == "sim":
        from rawpage.sim import SimKernelLoader

        return Device("sim", _poisoned_numpy(), SimKernelLoader(debug=True))
    if request.param == "cuda":
        from tests.gpu_required import skip_without_cuda

        skip_without_cuda()
        import cupy

        from rawpage.backends.cuda import CupyKernelLoader

        if os.environ.get("RAWPAGE_CUDA_NO_POOL"):
            # Under compute-sanitizer: every array its own cudaMalloc, so that a read
            # past an array's end cannot land, unnoticed, in a neighbour from the pool.
            cupy.cuda.set_allocator(None)
        return Device("cuda", cupy, CupyKernelLoader())
    raise ValueError(f"unknown kernel test device {request.param!r}")


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str, what: str = "") -> None:
    np.testing.assert_allclose(got, want, err_msg=what, **TOLERANCE[dtype])
