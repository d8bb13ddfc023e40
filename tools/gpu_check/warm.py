"""Compile every kernel module with NVRTC, all at once, into CuPy's disk cache.

    python -m tools.gpu_check.warm [--jobs N]

A module compiles at its first kernel lookup, one at a time and in whichever step
needs it first; decode attention alone is seven builds (one per head size, see
RP_ONE_HEAD_SIZE in cuda/paged_attention_decode.cu). Here each (file, defines)
build runs in its own process, as many at once as the machine has cores, through
the same CupyKernelLoader the backend uses, so the later steps find every cubin in
CuPy's cache (keyed by source, options and GPU) instead of timing out in NVRTC.
Prints each build's seconds; exits 1 if one fails to compile.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def decode_head_sizes(source: str) -> list[int]:
    """The head sizes the decode file's DECODE_HEAD_SIZES list instantiates."""
    return [int(d) for d in re.findall(r"DECODE_GROUPS\(T, C, suffix, (\d+), KIND\)", source)]


def builds() -> list[tuple[str, tuple[str, ...]]]:
    from rawpage.ops.launch import cuda_source_dir

    jobs: list[tuple[str, tuple[str, ...]]] = []
    for path in sorted(cuda_source_dir().glob("*.cu")):
        if path.name == "paged_attention_decode.cu":
            jobs += [(path.name, (f"RP_ONE_HEAD_SIZE={d}",)) for d in decode_head_sizes(path.read_text())]
        else:
            jobs.append((path.name, ()))
    return jobs


def compile_one(job: tuple[str, tuple[str, ...]]) -> tuple[str, float, str]:
    from rawpage.backends.cuda import CupyKernelLoader

    name, defines = job
    start = time.perf_counter()
    try:
        CupyKernelLoader().module(name, defines).compile()
        error = ""
    except Exception as e:  # a compile error: report it, the others go on
        error = f"{type(e).__name__}: {str(e)[:2000]}"
    return f"{name} {' '.join(defines)}".strip(), time.perf_counter() - start, error


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    start = time.perf_counter()
    failed = 0
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for label, seconds, error in pool.map(compile_one, builds()):
            print(f"  {label}: {seconds:.1f} s{'  FAILED ' + error if error else ''}", flush=True)
            failed += bool(error)
    print(f"warm: {len(builds())} builds in {time.perf_counter() - start:.1f} s, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
