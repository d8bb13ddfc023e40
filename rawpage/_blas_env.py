"""How long OpenBLAS's idle worker threads spin, set before NumPy loads OpenBLAS.

After each call, OpenBLAS's workers spin for 2**OPENBLAS_THREAD_TIMEOUT CPU cycles
before they sleep; the default, 2**28 cycles, is about 0.1 s. On the CPU backend's
kernels, a layer's dense float weights (a float checkpoint, LoRA's deltas, MoE experts
in a format the kernels do not read) are BLAS GEMMs, and between them run the C
kernels on their own pool's threads (native/pool.c): a worker still spinning from the
last GEMM holds the core one of those threads needs. At 2**20 cycles (about 0.4 ms at
2.8 GHz) the workers still spin across the few microseconds between one layer's GEMMs,
and are asleep soon after the next kernel starts. Measured when the NumPy backend ran
its own threads between the GEMMs in the same way (removed since; docs/benchmarks.md):
a batch-32 decode step 230 -> 210 ms on two threads; batch 1 unchanged, while 2**4
(sleep at once) cost batch 1 about 8%. On --cpu-kernels numpy nothing but BLAS threads,
and the setting changes nothing there.

OpenBLAS reads the variable once, when it is loaded, so this module runs before
anything in rawpage imports NumPy. A value the user set is kept. If NumPy was
imported before rawpage, with no value set, the workers spin as long as they always
did, and the CPU backend on its kernels says so in its log.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "OPENBLAS_THREAD_TIMEOUT"
SPIN_EXPONENT = 20  # 2**20 cycles: what rawpage sets, and the longest spin it calls short

if VARIABLE not in os.environ and "numpy" not in sys.modules:
    os.environ[VARIABLE] = str(SPIN_EXPONENT)
_in_effect = os.environ.get(VARIABLE)  # what OpenBLAS reads, or read when it was loaded


def spin_is_short() -> bool:
    """Whether OpenBLAS's idle workers sleep within about a millisecond of their last
    call: the variable was set, to at most 2**20 cycles, when OpenBLAS was loaded."""
    return is_short(_in_effect)


def is_short(value: str | None) -> bool:
    try:
        return value is not None and int(value) <= SPIN_EXPONENT
    except ValueError:
        return False
