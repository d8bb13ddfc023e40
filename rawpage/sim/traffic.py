"""What one simulated launch read from and wrote to global memory.

A module built with traffic=True (build.py) calls runtime/traffic.cpp's hooks
on every load and store; the launcher registers the launch's array arguments
as buffers first and collects the counts after. So a kernel's memory
efficiency is measured without a GPU:

    loader = SimKernelLoader(traffic=True)
    rms_norm(...)                      # any launch code, as usual
    t = loader.traffic_log[-1]         # LaunchTraffic of the last launch
    t.bytes_moved, t.unique_bytes, t.vector_share

`bytes_moved` counts every thread's every access: a byte that 4 blocks each
read counts 4 times, as it costs 4 trips through L2 on a GPU (more when it
falls out of L2). `unique_bytes` counts each byte once, the least DRAM traffic
any cache could give. tools/kernel_report.py --traffic divides them by the
minimum the math needs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

from rawpage.sim.guard import memory_span

_FIELDS = 8  # per buffer, as rp_sim_traffic_end writes them


@dataclass
class BufferTraffic:
    args: tuple[int, ...]  # the kernel arguments (by position) that share this buffer
    size: int  # bytes
    read: int = 0
    written: int = 0
    read_accesses: int = 0
    write_accesses: int = 0
    read_vec16: int = 0  # accesses that moved 16 bytes at once
    write_vec16: int = 0
    unique_read: int = 0  # distinct bytes read
    unique_written: int = 0


@dataclass
class LaunchTraffic:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    buffers: list[BufferTraffic] = field(default_factory=list)

    @property
    def bytes_read(self) -> int:
        return sum(b.read for b in self.buffers)

    @property
    def bytes_written(self) -> int:
        return sum(b.written for b in self.buffers)

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def unique_bytes(self) -> int:
        return sum(b.unique_read + b.unique_written for b in self.buffers)

    @property
    def vector_share(self) -> float:
        """Share of accesses (reads and writes) that were 16-byte vectors."""
        n = sum(b.read_accesses + b.write_accesses for b in self.buffers)
        return sum(b.read_vec16 + b.write_vec16 for b in self.buffers) / n if n else 0.0

    def of_arg(self, i: int) -> BufferTraffic:
        """The buffer that argument i points into."""
        return next(b for b in self.buffers if i in b.args)


class TrafficCounter:
    """Registers a launch's buffers with the runtime, and reads the counts back."""

    def __init__(self, runtime: ctypes.CDLL) -> None:
        self._begin = runtime.rp_sim_traffic_begin
        self._begin.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        self._end = runtime.rp_sim_traffic_end
        self._end.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        self._buffers: list[BufferTraffic] = []
        self._spans: list[tuple[int, int]] = []

    def begin(self, arrays: dict[int, tuple[np.ndarray, int]]) -> None:
        """arrays: argument position -> (array, the address the kernel gets for it).
        Overlapping arguments (q, k, v as views of one qkv) become one buffer."""
        spans = []
        for i, (a, ptr) in arrays.items():
            if a.size:
                lo, hi = memory_span(a)
                shift = ptr - a.ctypes.data
                spans.append((lo + shift, hi + shift, i))
        self._buffers, self._spans = [], []
        for lo, hi, i in sorted(spans):
            if self._spans and lo < self._spans[-1][1]:
                self._spans[-1] = (self._spans[-1][0], max(hi, self._spans[-1][1]))
                self._buffers[-1].args += (i,)
            else:
                self._spans.append((lo, hi))
                self._buffers.append(BufferTraffic(args=(i,), size=0))
        n = len(self._spans)
        los = (ctypes.c_uint64 * max(n, 1))(*(s[0] for s in self._spans))
        his = (ctypes.c_uint64 * max(n, 1))(*(s[1] for s in self._spans))
        self._begin(los, his, n)

    def end(self, kernel: str, grid: tuple[int, int, int], block: tuple[int, int, int]) -> LaunchTraffic:
        out = (ctypes.c_uint64 * (_FIELDS * max(len(self._buffers), 1)))()
        self._end(out)
        for k, (b, (lo, hi)) in enumerate(zip(self._buffers, self._spans)):
            v = out[_FIELDS * k : _FIELDS * (k + 1)]
            b.size = hi - lo
            b.read, b.written, b.read_accesses, b.write_accesses = v[0], v[1], v[2], v[3]
            b.read_vec16, b.write_vec16, b.unique_read, b.unique_written = v[4], v[5], v[6], v[7]
        return LaunchTraffic(kernel, grid, block, self._buffers)
