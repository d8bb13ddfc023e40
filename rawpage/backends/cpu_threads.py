"""How many threads the CPU path runs, per forward pass: the C kernels' pool
(backends/cpu.py passes the count to each kernel) and BLAS (and OpenMP) get the same.

OpenBLAS's worker threads spin while they wait for work. When another process
keeps one of our cores busy, a spinning worker and that process fight over it,
and a decode step that should take milliseconds waits for the scheduler instead:
single-stream decode fell to 0.30x with one core busy (issue 14).

Measured on the 2-core development machine (tools/bench_cpu_threads.py,
docs/benchmarks.md): on a quiet machine two threads beat one at every batch size
(1.5x at batch 1 and at batch 64), and beside one busy core one thread beats two at
every batch size (1.7x at batch 1). So the count follows the load, not the batch:
every usable core that other processes leave idle, at least one. CoreLoad reads that
from /proc/stat, at most every LOAD_PERIOD_S: the busy time of the cores this process
may use (os.sched_getaffinity, not cpu_count: a container or `taskset` may give us fewer
than the machine has) less this process's own CPU time. Where /proc/stat cannot be
read, every usable core is used. --cpu-threads N fixes the count.

A figure is the load over the time since the one before, so it must not span an idle
gap: read only at forward passes, the first pass after a pause would take the whole
pause's average, and another process's burst that ended just before the request would
put its prefill on one thread (measured: a first token 0.6 s after another server's
request took 553 ms, and 342 with the ticks below; docs/benchmarks.md). The server's
engine thread therefore calls observe() while it waits for work (AsyncEngine, every
IDLE_TICK_S), so that a request finds a figure of the last half second.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from threadpoolctl import ThreadpoolController

logger = logging.getLogger("rawpage")

LOAD_PERIOD_S = 0.25  # how often the other processes' load is measured (25 jiffies of a core at 100 Hz)
IDLE_TICK_S = 0.25  # how often an idle server's engine thread measures it (observe)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), which may be fewer than the machine's."""
    return len(_affinity()) if _affinity() else max(1, os.cpu_count() or 1)


def _affinity() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def threads_for(usable: int, cpu_threads: int | None = None, others_busy: float | None = None) -> int:
    """Threads for a forward pass. --cpu-threads N fixes the count (capped at the usable
    cores); by default, the usable cores that other processes leave idle (`others_busy`:
    how many cores' worth they keep busy; None if unknown), at least one."""
    if cpu_threads is not None:
        return max(1, min(cpu_threads, usable))
    if others_busy is None:
        return usable
    return max(1, min(usable, round(usable - others_busy)))


def read_proc_stat(cores: set[int], text: str | None = None) -> tuple[float, float]:
    """(busy, total) jiffies summed over `cores`, from /proc/stat's per-CPU lines
    (cpuN user nice system idle iowait irq softirq steal ...); idle and iowait are not busy."""
    if text is None:
        with open("/proc/stat") as f:
            text = f.read()
    busy = total = 0.0
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and (not cores or int(name[3:]) in cores):
            values = [float(v) for v in fields[:8]]
            total += sum(values)
            busy += sum(values) - values[3] - values[4]
    return busy, total


class CoreLoad:
    """How many of our usable cores other processes keep busy, over the last period."""

    def __init__(
        self,
        cores: set[int],
        stat: Callable[[], tuple[float, float]] | None = None,
        own_cpu: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.n = len(cores) or usable_cores()
        self.stat = stat or (lambda: read_proc_stat(cores))
        self.own_cpu = own_cpu or (lambda: sum(os.times()[:2]))  # this process's CPU seconds, all threads
        self.clock = clock
        self.others: float | None = None
        try:
            self._last = (self.clock(), *self.stat(), self.own_cpu())
        except OSError:  # no /proc: the load stays unknown
            self._last = None

    def update(self) -> float | None:
        """Other processes' busy cores (0 .. n), refreshed at most every LOAD_PERIOD_S; the
        last figure while /proc/stat cannot be read (no file descriptor left, say)."""
        now = self.clock()
        if self._last is None or now - self._last[0] < LOAD_PERIOD_S:
            return self.others
        try:
            busy, total, own = *self.stat(), self.own_cpu()
        except OSError:
            return self.others
        t0, busy0, total0, own0 = self._last
        self._last = (now, busy, total, own)
        if total <= total0:
            return self.others
        all_busy = self.n * (busy - busy0) / (total - total0)  # cores' worth busy, us included
        self.others = max(0.0, all_busy - (own - own0) / (now - t0))
        return self.others


class CpuThreads:
    """Applies threads_for() before each forward pass; a no-op when the count is unchanged."""

    def __init__(self, cpu_threads: int | None = None, usable: int | None = None, load: CoreLoad | None = None) -> None:
        self.cpu_threads = cpu_threads
        self.usable = usable or usable_cores()
        self.load = load if load is not None or cpu_threads is not None else CoreLoad(_affinity())
        self.controller = ThreadpoolController()  # finds the loaded BLAS / OpenMP libraries once
        self.current: int | None = None  # this pass's threads
        self.blas: int | None = None  # the limit last given to BLAS

    def describe(self) -> str:
        libs = ", ".join(sorted({i["internal_api"] for i in self.controller.info()})) or "no BLAS found"
        if self.cpu_threads is not None:
            chosen = f"{threads_for(self.usable, self.cpu_threads)} (--cpu-threads)"
        else:
            chosen = f"the usable cores other processes leave idle, measured every {LOAD_PERIOD_S:g} s (set with --cpu-threads)"
        return f"CPU threads ({libs}): {self.usable} usable cores; using {chosen}"

    def observe(self) -> None:
        """Measure the other processes' load now (where its period has passed) without
        running anything: an idle engine thread keeps the figure recent."""
        if self.load is not None:
            self.load.update()

    def set_for(self, rows: int) -> int:
        """Before a forward pass over `rows` tokens (the count does not depend on them today:
        more threads paid at every batch size measured), and during it (during_pass). BLAS
        gets the same count."""
        others = self.load.update() if self.load is not None else None
        self.current = n = threads_for(self.usable, self.cpu_threads, others)
        self._limit_blas(n)
        return n

    def during_pass(self) -> int:
        """The count for the pass's next kernel: set_for's again where the load's period has
        passed. A prefill of seconds would otherwise keep for all of it the count that the
        load at its start gave: a 2,048-token prompt that came right after its client's
        start-up (a second of another process's CPU) ran 22 s on one thread, not 11 on two.
        The kernels' results do not depend on their thread count."""
        if self.current is None or self.load is None:
            return self.current or 1
        return self.set_for(0)

    def _limit_blas(self, n: int) -> None:
        if n != self.blas:
            self.controller.limit(limits=n)
            self.blas = n
