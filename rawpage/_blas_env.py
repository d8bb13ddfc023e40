"""How long OpenBLAS's idle worker threads spin, set before NumPy loads OpenBLAS.

After each call, OpenBLAS's workers spin for 2**OPENBLAS_THREAD_TIMEOUT CPU cycles
before they sleep; the default, 2**28 cycles, is about 0.1 s. The CPU backend runs
decode attention's chunks on threads of its own, between the GEMMs of a layer
(rawpage/backends/cpu.py), and a worker still spinning from the last GEMM holds the
core one of those threads needs: two threads then made a batch-32 step slower, not
faster. At 2**20 cycles (about 0.4 ms at 2.8 GHz) the workers still spin across the
few microseconds between one layer's GEMMs, and are asleep soon after the attention
starts. Measured on the 2-core development machine (docs/benchmarks.md): a batch-32
decode step 230 -> 210 ms with attention on two threads; batch 1 unchanged, while
2**4 (sleep at once) cost batch 1 about 8%.

OpenBLAS reads the variable once, when it is loaded, so this module runs before
anything in rawpage imports NumPy. A value the user set is kept. If NumPy was
imported before rawpage, with no value set, the workers spin as long as they always
did, and the CPU backend keeps attention on one thread.
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
