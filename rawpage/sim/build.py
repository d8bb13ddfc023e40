"""Compile CUDA kernel sources for the CPU with g++, and cache what was built.

Two shared libraries come out of here:

    librpsim-<hash>.so   the runtime (runtime/*.cpp): fibers, barriers, warp
                         collectives, launches. Built once per runtime version.
    <name>-<hash>.so     one kernel module (one .cu file): the kernel source
                         compiled against include/cuda_sim.h, plus a generated
                         entry point per `extern "C" __global__` kernel that
                         unpacks a void** argument array as cuLaunchKernel does.

Building a module takes two g++ runs. The first only preprocesses the source
(with markers in place of __global__ and __shared__) to find the kernels' names
and the extern __shared__ array, which the wrapper must define. The second
compiles the wrapper, which #includes the .cu file unchanged, so compiler
messages point at the line in cuda/.

Everything is cached under $RAWPAGE_SIM_CACHE, else $XDG_CACHE_HOME/rawpage/sim,
else ~/.cache/rawpage/sim, keyed by a hash of the sources, the headers next to
them, the simulator's headers and runtime, the flags and the compiler version
(rawpage/compile_cache.py, shared with the CPU kernels' builds).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import rawpage.compile_cache as compile_cache
from rawpage.compile_cache import CompileError, digest, files_digest, publish

SIM_DIR = Path(__file__).resolve().parent
INCLUDE_DIR = SIM_DIR / "include"
RUNTIME_DIR = SIM_DIR / "runtime"

CXXFLAGS = [
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-fno-strict-aliasing",  # kernels reinterpret_cast between uint4 and element types
    "-Wno-unknown-pragmas",  # #pragma unroll
    # `extern __shared__` is a thread_local the wrapper defines after the kernel
    # source; without this flag g++ would call a TLS init function that does not exist.
    "-fno-extern-tls-init",
    # Touch every page of a large stack frame, so that a fiber that outgrows its
    # stack hits the guard page and is reported as a stack overflow.
    "-fstack-clash-protection",
    "-pthread",
]

# Traffic-counting builds (build_module(..., traffic=True)): gcc's ThreadSanitizer
# instrumentation turns every load and store into a call (__tsan_read16, ...) to
# a hook in runtime/traffic.cpp; the module is linked without the sanitizer's
# runtime. (AddressSanitizer's call mode would also do, but it drops a store's
# check when the same address was just loaded, so read-modify-writes would
# count no writes.)
# Scalar replacement of aggregates would split a uint4 load into four 4-byte
# loads, hiding the 16-byte vectors that the kernels use (and that nvcc keeps).
TRAFFIC_FLAGS = ["-fsanitize=thread", "-fno-tree-sra", "-fno-ipa-sra"]

GLOBAL_RE = re.compile(r'extern\s+"C"\s+__rp_global__\s+void\s+(\w+)\s*\(')
SHARED_RE = re.compile(r"extern\s+__rp_shared__\s+([\w\s:<>,*]+?)\s*(\w+)\s*\[\s*\]")


# One lock per output file: a thread that wants a module another thread is compiling (the
# test suite's prebuild beside the tests) waits for it instead of compiling it twice.
_building: dict[Path, threading.Lock] = {}
_building_guard = threading.Lock()


def _lock_for(out: Path) -> threading.Lock:
    with _building_guard:
        return _building.setdefault(out, threading.Lock())


class SimCompileError(CompileError):
    """g++ rejected a kernel source; the message is g++'s, with the file and line."""


@dataclass(frozen=True)
class BuiltModule:
    path: Path  # the .so
    kernels: tuple[str, ...]  # extern "C" __global__ entry points


def cache_dir() -> Path:
    return compile_cache.cache_dir("sim", "RAWPAGE_SIM_CACHE")


def compiler() -> str:
    return os.environ.get("RAWPAGE_SIM_CXX", "g++")


def cxxflags() -> list[str]:
    """CXXFLAGS, plus $RAWPAGE_SIM_CXXFLAGS (for example "-O0 -g" to debug a kernel
    in gdb, or "-DRP_SIM_UCONTEXT" to use the portable context switch)."""
    return CXXFLAGS + os.environ.get("RAWPAGE_SIM_CXXFLAGS", "").split()


def compiler_version(cxx: str) -> str:
    try:
        return compile_cache.compiler_version(cxx)
    except CompileError as e:
        raise SimCompileError(
            f"the simulator needs a C++17 compiler; {cxx!r} did not run ({e}). Install g++ or set RAWPAGE_SIM_CXX."
        ) from e


def _sim_headers() -> list[Path]:
    return sorted(INCLUDE_DIR.glob("*.h"))


def _run(cmd: list[str], what: str) -> str:
    try:
        return compile_cache.run_compiler(cmd, what)
    except CompileError as e:
        raise SimCompileError(str(e)) from None


def build_runtime() -> Path:
    cxx = compiler()
    sources = sorted(RUNTIME_DIR.glob("*.cpp"))
    key = digest(
        files_digest(sources + sorted(RUNTIME_DIR.glob("*.h")) + _sim_headers())
        + [" ".join(cxxflags()).encode(), compiler_version(cxx).encode()]
    )
    out = cache_dir() / f"librpsim-{key}.so"
    if out.exists():
        return out
    with _lock_for(out), tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        if out.exists():  # built by another thread while this one waited
            return out
        tmp_out = Path(tmp) / out.name
        cmd = [
            cxx,
            *cxxflags(),
            "-shared",
            f"-I{INCLUDE_DIR}",
            *map(str, sources),
            "-o",
            str(tmp_out),
        ]
        _run(cmd, "building the simulator runtime")
        publish(tmp_out, out)
    return out


def _discover(source: Path, cxx: str, flags: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Kernel names and (type, name) of extern __shared__ arrays, from the preprocessed source."""
    cmd = [cxx, "-E", "-x", "c++", "-DRP_SIM_DISCOVER", *flags, str(source)]
    text = _run(cmd, f"preprocessing {source.name}")
    kernels = list(dict.fromkeys(GLOBAL_RE.findall(text)))
    shared = list(dict.fromkeys((t.strip(), n) for t, n in SHARED_RE.findall(text)))
    return kernels, shared


def _wrapper(source: Path, kernels: list[str], shared: list[tuple[str, str]]) -> str:
    lines = [
        "// Generated by rawpage.sim.build: the kernel source, unchanged, and one",
        '// launch entry point per extern "C" __global__ kernel.',
        '#include "cuda_sim.h"',
        f'#include "{source}"',
        "",
    ]
    if shared:
        (elem, name), *rest = shared
        if rest:
            names = ", ".join(n for _, n in shared)
            raise SimCompileError(
                f"{source}: the simulator supports one extern __shared__ array per module, "
                f"found {names}; declare it once (for example in a helper that returns it as T*)"
            )
        lines += [
            f"thread_local {elem} {name}[RP_SIM_DYNAMIC_SMEM_BYTES / sizeof({elem})] __attribute__((aligned(128)));",
            f"static void* rp_sim_dynamic_smem() {{ return (void*){name}; }}",
        ]
        smem = "RP_SIM_DYNAMIC_SMEM_BYTES, &rp_sim_dynamic_smem"
    else:
        smem = "0, nullptr"
    lines += [f"RP_SIM_ENTRY({k}, {smem})" for k in kernels]
    return "\n".join(lines) + "\n"


def _module_key(
    source: Path, include_dirs: tuple[Path, ...], defines: tuple[str, ...], traffic: bool, cxx: str, runtime: Path
) -> str:
    """No path is in the key: the include directories' headers are in it by name and
    content, so a second checkout (a fresh clone, a worktree) reuses the builds."""
    neighbours = [
        p
        for d in (source.parent, *include_dirs)
        for p in Path(d).iterdir()
        if p.suffix in (".cuh", ".h") and p.is_file()
    ]
    return digest(
        files_digest([source, *neighbours, *_sim_headers()])
        + [
            runtime.name.encode(),
            " ".join(cxxflags() + [f"-D{d}" for d in defines] + (TRAFFIC_FLAGS if traffic else [])).encode(),
            compiler_version(cxx).encode(),
        ]
    )


def build_module(
    source: Path, include_dirs: tuple[Path, ...] = (), defines: tuple[str, ...] = (), traffic: bool = False
) -> BuiltModule:
    """Compile one .cu file for the simulator (cached). Raises SimCompileError.
    traffic=True builds the variant whose global-memory accesses can be counted."""
    source = Path(source).resolve()
    cxx = compiler()
    runtime = build_runtime()
    flags = [f"-I{INCLUDE_DIR}", f"-I{source.parent}", *(f"-I{d}" for d in include_dirs)]
    flags += [f"-D{d}" for d in defines]
    key = _module_key(source, include_dirs, defines, traffic, cxx, runtime)
    out = cache_dir() / f"{source.stem}{'-traffic' if traffic else ''}-{key}.so"
    meta = out.with_suffix(".json")
    with _lock_for(out):
        if not (out.exists() and meta.exists()):
            _compile_module(source, cxx, flags, traffic, out, meta, runtime)
    return BuiltModule(out, tuple(json.loads(meta.read_text())["kernels"]))


def _compile_module(
    source: Path, cxx: str, flags: list[str], traffic: bool, out: Path, meta: Path, runtime: Path
) -> None:
    kernels, shared = _discover(source, cxx, ["-include", "cuda_sim.h", *flags])
    if not kernels:
        raise SimCompileError(f'{source}: found no extern "C" __global__ kernels')
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        wrapper = Path(tmp) / f"{source.stem}_sim.cpp"
        wrapper.write_text(_wrapper(source, kernels, shared))
        tmp_out = Path(tmp) / out.name
        if traffic:  # compile instrumented, then link without the sanitizer runtime
            obj = Path(tmp) / f"{source.stem}.o"
            cmd = [cxx, *cxxflags(), *TRAFFIC_FLAGS, "-c", *flags, str(wrapper), "-o", str(obj)]
            _run(cmd, f"compiling {source.name} for the simulator (traffic counting)")
            cmd = [cxx, *cxxflags(), "-shared", str(obj), "-o", str(tmp_out)]
        else:
            cmd = [cxx, *cxxflags(), "-shared", *flags, str(wrapper), "-o", str(tmp_out)]
        cmd += [str(runtime), f"-Wl,-rpath,{runtime.parent}"]
        _run(cmd, f"compiling {source.name} for the simulator")
        tmp_meta = Path(tmp) / meta.name
        tmp_meta.write_text(json.dumps({"source": str(source), "kernels": kernels}))
        publish(tmp_out, out)
        publish(tmp_meta, meta)
