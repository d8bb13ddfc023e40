"""Debug mode's fenced argument buffers.

Every array argument is copied into memory that ends right before an
inaccessible page and starts right after another (rawpage/sim/runtime/launch.cpp,
rp_sim_guarded_alloc). A kernel that indexes past either end faults; the runtime
catches the fault and we name the argument it came from. Arguments that share
memory (q and k as views into one qkv buffer) share one fenced copy, so that
writes through either are kept.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

PAGE = 4096


def memory_span(a: np.ndarray) -> tuple[int, int]:
    """[lo, hi) byte addresses that array `a` (any strides) can touch."""
    lo = hi = a.ctypes.data
    for n, s in zip(a.shape, a.strides):
        if s >= 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi + a.itemsize


@dataclass
class _Region:
    lo: int
    hi: int
    args: list[int] = field(default_factory=list)
    writeable: bool = False
    addr: int = 0


class GuardedArgs:
    def __init__(self, runtime: ctypes.CDLL) -> None:
        self._alloc = runtime.rp_sim_guarded_alloc
        self._alloc.restype = ctypes.c_void_p
        self._alloc.argtypes = [ctypes.c_size_t]
        self._free = runtime.rp_sim_guarded_free
        self._free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._spans: dict[int, tuple[np.ndarray, int, int]] = {}
        self._regions: list[_Region] = []
        self._region_of: dict[int, _Region] = {}

    def add(self, i: int, a: np.ndarray) -> None:
        if a.size:
            self._spans[i] = (a, *memory_span(a))

    def allocate(self) -> None:
        """Merge overlapping spans, then copy each merged span into a fenced buffer."""
        for i, (a, lo, hi) in sorted(self._spans.items(), key=lambda kv: kv[1][1]):
            r = self._regions[-1] if self._regions else None
            if r is None or lo >= r.hi:
                r = _Region(lo, hi)
                self._regions.append(r)
            r.hi = max(r.hi, hi)
            r.args.append(i)
            r.writeable |= bool(a.flags.writeable)
            self._region_of[i] = r
        for r in self._regions:
            r.addr = self._alloc(r.hi - r.lo)
            if not r.addr:
                raise MemoryError("could not map a guarded buffer for RAWPAGE_SIM_DEBUG")
            ctypes.memmove(r.addr, r.lo, r.hi - r.lo)

    def pointer(self, i: int, a: np.ndarray) -> int:
        r = self._region_of.get(i)
        return a.ctypes.data if r is None else r.addr + (a.ctypes.data - r.lo)

    def copy_out_and_free(self) -> None:
        for r in self._regions:
            if r.writeable:
                ctypes.memmove(r.lo, r.addr, r.hi - r.lo)
            self._free(r.addr, r.hi - r.lo)
        self._regions.clear()

    def explain(self, fault: int) -> str:
        """Which argument's fence a faulting address hit, as a sentence (or "")."""
        for r in self._regions:
            size = r.hi - r.lo
            end = r.addr + (size + 15) // 16 * 16  # the trailing fence page starts here
            names = ", ".join(f"#{i}" for i in r.args)
            if end <= fault < end + PAGE:
                beyond = fault - (r.addr + size) + 1
                return f"\nThe address is {beyond} byte(s) past the end of argument {names} ({size} bytes)."
            if r.addr - PAGE <= fault < r.addr:
                return f"\nThe address is {r.addr - fault} byte(s) before the start of argument {names}."
        return ""
