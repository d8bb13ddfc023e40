"""Keep freed memory in the process: glibc malloc settings for the CPU path.

Every layer of a forward pass allocates and frees the same large temporaries: a
2048-token prefill chunk's activations are 5-25 MB each. glibc returns blocks above
its mmap threshold to the kernel when they are freed, and trims the top of its heap
once more than its trim threshold is free there, so the next layer's arrays are
fresh pages, and the kernel faults and zeroes every 4 KB of them again. Raising
both thresholds keeps those pages in the process for the next layer: prefill of 40
prompts of 160 tokens measured 8-11% faster on the 2-core development machine
(docs/benchmarks.md). A vision encoder's temporaries are larger: SigLIP at 896 px has
70 MB MLP activations and 64 MB attention-score blocks, and with a 64 MB mmap threshold
every one of them was mapped afresh: Gemma 3 4B's tower took 101 s an image, 42 s of it
in the kernel faulting pages, against 58 s with blocks up to 256 MB kept on the heap
(AMD EPYC VM, 2 threads). A 2,048-token prefill step of Llama-3.2-1B frees ~300 MB at
each layer's end, and with the trim threshold at 256 MB the heap's top went back to the
kernel after every layer: each layer's silu_and_mul wrote its 67 MB output into fresh
pages, 1.37 s of a 12.6 s prefill against 0.14 s with the threshold at 1 GiB, and the
prefill went from 161-163 to 177-192 prompt tok/s (Intel Xeon VM, 2 threads; there a
first touch of fresh memory ran at 2.5-7 GiB/s, and at 0.06 GiB/s in huge pages the VM
had never backed, against ~10 GiB/s rewriting the same pages).
The cost is memory the process keeps after a peak, at most TRIM_THRESHOLD + TOP_PAD above
what it holds: the server gives it back once it has nothing to run (CPUBackend.idle ->
release_freed_memory), so it is held through a burst of requests, not after it.

Applied at runtime with mallopt(3) when a CPU backend starts, and by the server before
its engine thread starts (a thread's first malloc picks its arena, and a thread with one
of its own gets 64 MB heaps, from which no larger block can come), where the C library
has it (glibc); elsewhere it is a no-op. MALLOC_*_ environment variables the user set win.
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger("rawpage")

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8  # glibc's malloc.h
MMAP_THRESHOLD = 256 << 20  # blocks below this come from the heap (a vision encoder's too)
TRIM_THRESHOLD = 1 << 30  # free memory at the heap's top kept, up to this (a 2048-token step's temporaries)
TOP_PAD = 64 << 20  # extra asked of the kernel each time the heap grows
# One heap for every thread: glibc gives each thread that allocates its own arena, and the
# threads that repack a GGUF at load (native/gguf.py) each left 16 MB there that no trim
# returns (3B model: 47 MB of its resident set).
ARENA_MAX = 1
SETTINGS = {
    "MALLOC_MMAP_THRESHOLD_": (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    "MALLOC_TOP_PAD_": (M_TOP_PAD, TOP_PAD),
    "MALLOC_ARENA_MAX": (M_ARENA_MAX, ARENA_MAX),
}


def _apply(envs: list[str], libc: object | None) -> bool:
    """mallopt each of these SETTINGS that the environment does not set. True if they hold."""
    try:
        mallopt = (libc or ctypes.CDLL(None)).mallopt  # glibc, musl; absent on macOS
    except (OSError, AttributeError):
        return False
    return all(mallopt(*SETTINGS[env]) == 1 for env in envs if env not in os.environ)


def keep_freed_memory(libc: object | None = None) -> bool:
    """Sets glibc's thresholds (those the environment does not set). True if they hold."""
    ok = _apply(list(SETTINGS), libc)
    if not ok:
        logger.debug("malloc settings not applied; freed memory goes back to the kernel as the C library decides")
    return ok


def one_arena(libc: object | None = None) -> None:
    """M_ARENA_MAX=1 now, before any thread but the main one allocates. glibc fixes its
    arena limit once, at the first malloc of a thread without an arena; a later mallopt
    still returns 1 but no longer changes it. `rawpage serve` starts threads (the
    tokenizer's FairExecutor) before its engine thread: measured on 1B Q4_K_M, setting
    the limit only there left two repack arenas of 16 MB resident each (778 MiB against
    746 with MALLOC_ARENA_MAX=1 in the environment)."""
    _apply(["MALLOC_ARENA_MAX"], libc)


def release_freed_memory(libc: object | None = None) -> None:
    """Return the heap's free pages to the kernel once (glibc's malloc_trim): after the
    model is loaded, the load's temporaries (each weight's blocks copied out of the
    file, its repacked panels in the making) are free but, under the thresholds above,
    still resident; so are the last prefill's when the server falls idle. No-op where the
    C library has no malloc_trim."""
    try:
        (libc or ctypes.CDLL(None)).malloc_trim(0)
    except (OSError, AttributeError):
        pass
