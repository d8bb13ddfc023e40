"""Repacked weights in 2 MiB pages: every weight's panels are taken, one after another,
from large anonymous maps advised MADV_HUGEPAGE.

    panels(shape) -> uint8 array (shape), 64-byte aligned, in huge pages where the kernel allows

Why: a decode step reads every weight once from memory (0.6 GB at Llama-3.2-1B Q4_K_M),
and in 4 KiB pages that is 150,000 page-table entries a step for the TLB to miss on,
each miss a walk the weight stream waits for. NumPy advises huge pages itself, but only
for arrays of 4 MiB and more and only in their 2 MiB-aligned interior: none of a
layer's q|k|v (3.5 MB) or o (2.4 MB) panels at 1B, none of the default model's, and
26% of 1B's panels in all (AnonHugePages after load: 480 of 650 MiB). Here they are
all in huge pages but the last 2 MiB of each map. Measured: docs/benchmarks.md,
"Weights in huge pages".

Memory: a map reserves address space only (MAP_NORESERVE), and a page counts once it
is written. What is written past the last weight is at most the rest of one 2 MiB page
per map. A map is referenced by the arrays in it only (the module keeps a weak
reference to the one it fills), so it is unmapped with the last weight that lives in
it: a model's weights leave with the model.

Where the system has no transparent huge pages (not Linux, or an mmap that fails), the
arrays are plain NumPy ones, as before.
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

HUGE_PAGE = 2 << 20
MAP_BYTES = 1 << 30  # address space a map reserves; a larger weight gets a map of its own size
ALIGN = 64
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # (Python < 3.13 does not name it; Linux's value)

_lock = threading.Lock()
_current: weakref.ref | None = None  # the map being filled
_used = 0  # its bytes handed out


def _new_map(nbytes: int) -> mmap.mmap | None:
    """An anonymous private map of nbytes (+ a huge page, to align its start), advised huge."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
        m.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return None
    return m


def panels(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialized uint8 array of `shape` for a weight's panels, placed after the
    previous weight's in the current map (a new map when it does not fit)."""
    global _current, _used
    nbytes = int(np.prod(shape))
    with _lock:
        m = _current() if _current is not None else None
        if m is None or _used + nbytes > len(m):
            m = _new_map(max(MAP_BYTES, nbytes))
            if m is None:
                return np.empty(shape, np.uint8)
            _current = weakref.ref(m)
            base = np.frombuffer(m, np.uint8, count=1).ctypes.data
            _used = (-base) % HUGE_PAGE  # the map's first 2 MiB boundary
        offset = _used
        _used = -(-(offset + nbytes) // ALIGN) * ALIGN
    return np.frombuffer(m, np.uint8, count=nbytes, offset=offset).reshape(shape)
