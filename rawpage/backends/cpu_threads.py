"""How many threads the CPU path gives BLAS (and OpenMP), per forward pass.

OpenBLAS's worker threads spin while they wait for work. When another process
keeps one of our cores busy, a spinning worker and that process fight over it,
and a decode step that should take milliseconds waits for the scheduler instead:
single-stream decode fell to 0.30x with one core busy (issue 14). A small batch
(few rows per weight) gains little from more threads anyway, so it runs on one;
a large batch or a long prefill chunk (many rows: real GEMMs) uses every core
this process may run on, never more (os.sched_getaffinity, not cpu_count:
a container or `taskset` may give us fewer than the machine has).

The switch point is provisional until tools/bench_cpu_threads.py is run on a
quiet machine (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import os

from threadpoolctl import ThreadpoolController

logger = logging.getLogger("rawpage")

# Rows (tokens in the forward pass) from which the GEMMs use every usable core. High on
# purpose until measured: on a loaded 2-core machine a 2-thread short chat prefill was
# slow enough to time out a server test that passed with one thread everywhere.
SMALL_BATCH_ROWS = 64


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), which may be fewer than the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def threads_for(rows: int, usable: int, cpu_threads: int | None = None) -> int:
    """Threads for a forward pass over `rows` tokens. --cpu-threads N fixes the count (capped
    at the usable cores); by default, 1 for small batches and every usable core otherwise."""
    if cpu_threads is not None:
        return max(1, min(cpu_threads, usable))
    return 1 if rows < SMALL_BATCH_ROWS else usable


class CpuThreads:
    """Applies threads_for() before each forward pass; a no-op when the count is unchanged."""

    def __init__(self, cpu_threads: int | None = None, usable: int | None = None) -> None:
        self.cpu_threads = cpu_threads
        self.usable = usable or usable_cores()
        self.controller = ThreadpoolController()  # finds the loaded BLAS / OpenMP libraries once
        self.current: int | None = None

    def describe(self) -> str:
        libs = ", ".join(sorted({i["internal_api"] for i in self.controller.info()})) or "no BLAS found"
        if self.cpu_threads is not None:
            chosen = f"{threads_for(1, self.usable, self.cpu_threads)} (--cpu-threads)"
        else:
            chosen = f"1 below {SMALL_BATCH_ROWS} tokens per step, {self.usable} from there (set with --cpu-threads)"
        return f"CPU threads ({libs}): {self.usable} usable cores; using {chosen}"

    def set_for(self, rows: int) -> int:
        n = threads_for(rows, self.usable, self.cpu_threads)
        if n != self.current:
            self.controller.limit(limits=n)
            self.current = n
        return n
