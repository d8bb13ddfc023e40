"""Which instruction-set path the CPU kernels take.

The paths, best first. Each is a level of `RP_ISA_LEVEL` in common.h, where the
kernels pick their #if branch; the scalar path is plain C and defines the result.

    avx512vnni  512-bit integer dot products (vpdpbusd on zmm): AVX512F/BW/VL + VNNI
    avxvnni     the same instruction on 256-bit ymm registers: AVX-VNNI, or the EVEX
                form that AVX512-VNNI with AVX512VL also has
    avx2        maddubs + madd for the int8 dots, FMA for float (AVX2, FMA, F16C)
    scalar      plain C

$RAWPAGE_CPU_ISA names a path to use instead of the best one, never a higher one
than the CPU has (so the tests can run every path this machine can run).
"""

from __future__ import annotations

import functools
import os

PATHS = ("avx512vnni", "avxvnni", "avx2", "scalar")  # best first

# The /proc/cpuinfo flags each path needs.
_NEEDS = {
    "avx512vnni": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"},
    "avx2": {"avx2", "fma", "f16c"},
    "scalar": set(),
}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere: the scalar path)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def runnable_paths(flags: frozenset[str] | None = None) -> list[str]:
    """Every path this CPU can run, best first."""
    flags = cpu_flags() if flags is None else flags  # (an Arm CPU lists none of these: scalar)
    ok = [p for p in ("avx512vnni", "avx2", "scalar") if _NEEDS[p] <= flags]
    if ("avx_vnni" in flags and "avx2" in ok) or "avx512vnni" in ok:
        ok.insert(ok.index("avx2"), "avxvnni")
    return ok


def selected_path() -> str:
    """The best runnable path, or $RAWPAGE_CPU_ISA's if it names a runnable one."""
    paths = runnable_paths()
    want = os.environ.get("RAWPAGE_CPU_ISA", "").strip().lower()
    if not want:
        return paths[0]
    if want not in PATHS:
        raise ValueError(f"RAWPAGE_CPU_ISA={want!r}: choose one of {', '.join(PATHS)}")
    if want not in paths:
        raise ValueError(f"RAWPAGE_CPU_ISA={want!r}: this CPU runs only {', '.join(paths)}")
    return want


def level(path: str) -> int:
    """RP_ISA_LEVEL for a path: scalar 0 .. avx512vnni 3."""
    return len(PATHS) - 1 - PATHS.index(path)
