"""Compile the CPU kernels (every *.c in this folder) into one shared library per
instruction-set path, and cache it.

    cc -O3 -march=native -DRP_ISA_LEVEL=<level> -I<gen> -fPIC -pthread -c X.c -o X.o   (each *.c, in parallel)
    cc -shared *.o -o librpcpu-<path>-<hash>.so -lm

The files compile in parallel, largest first: gguf_matmul.c (every format's loops,
specialized) is ~6 of a path's ~10 s of gcc on our machine, the others ~4 together.

<gen> holds rp_entry_points.h, written for the build from rawpage/native/entry_points.py
(the entry points' prototypes and replay adapters) and the format table
(rawpage/quantization/gguf.py). The digest covers the sources and headers, that header, the flags, the compiler's version and the
CPU's feature flags (-march=native compiles for this CPU: a cache shared across
machines must never load another CPU's build). Cached under $RAWPAGE_CPU_CACHE, else
$XDG_CACHE_HOME/rawpage/cpu, else ~/.cache/rawpage/cpu. $RAWPAGE_CPU_CC names the
compiler (default cc); $RAWPAGE_CPU_CFLAGS adds flags (e.g. "-O0 -g" to debug).
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import rawpage.compile_cache as compile_cache
from rawpage.compile_cache import digest, files_digest, publish, run_compiler
from rawpage.native import isa
from rawpage.native.entry_points import header

NATIVE_DIR = Path(__file__).resolve().parent

CFLAGS = [
    "-std=gnu11",
    "-O3",
    "-march=native",
    "-fPIC",
    "-pthread",
    "-fvisibility=hidden",  # only RP_EXPORT entry points are visible to ctypes
    "-Wall",
    "-Wno-unknown-pragmas",
]


def compiler() -> str:
    return os.environ.get("RAWPAGE_CPU_CC", "cc")


def cflags(path: str) -> list[str]:
    return CFLAGS + [f"-DRP_ISA_LEVEL={isa.level(path)}"] + os.environ.get("RAWPAGE_CPU_CFLAGS", "").split()


def sources() -> list[Path]:
    return sorted(NATIVE_DIR.glob("*.c"))


def build_library(path: str) -> Path:
    """The shared library for one instruction-set path (isa.PATHS), built if not cached.
    Raises compile_cache.CompileError with the compiler's message."""
    cc, flags = compiler(), cflags(path)
    generated = header()
    key = digest(
        files_digest(sources() + sorted(NATIVE_DIR.glob("*.h")))
        + [
            generated.encode(),
            " ".join(flags).encode(),
            compile_cache.compiler_version(cc).encode(),
            " ".join(sorted(isa.cpu_flags())).encode(),
        ]
    )
    root = compile_cache.cache_dir("cpu", "RAWPAGE_CPU_CACHE")
    out = root / f"librpcpu-{path}-{key}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        tmp_out = Path(tmp) / out.name
        (Path(tmp) / "rp_entry_points.h").write_text(generated)

        def compile_one(source: Path) -> str:
            obj = str(Path(tmp) / f"{source.stem}.o")
            run_compiler(
                [cc, *flags, f"-I{tmp}", "-c", str(source), "-o", obj], f"compiling {source.name} ({path} path)"
            )
            return obj

        largest_first = sorted(sources(), key=lambda f: -f.stat().st_size)
        with ThreadPoolExecutor(max(1, min(len(largest_first), os.cpu_count() or 1))) as pool:
            objects = list(pool.map(compile_one, largest_first))
        run_compiler(
            [cc, *flags, "-shared", *objects, "-o", str(tmp_out), "-lm"], f"linking the CPU kernels ({path} path)"
        )
        publish(tmp_out, out)
    return out
