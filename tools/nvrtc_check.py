"""Compile every kernel in cuda/ with NVRTC, as cupy.RawModule will on a GPU
machine, with the options the cuda backend passes (rawpage.backends.cuda).

    python tools/nvrtc_check.py            # sm_80 and sm_90

NVRTC accepts less than nvcc (no host headers, no implicit cuda_runtime.h),
so this is the check that the sources load as RawModules. It needs libnvrtc:
from a CUDA toolkit, or `pip install nvidia-cuda-nvrtc`. No GPU is needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import sys
from pathlib import Path

ARCHS = ("sm_80", "sm_90")


def find_nvrtc() -> ctypes.CDLL | None:
    candidates = []
    try:
        import nvidia  # the pip wheels' namespace package

        for root in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            candidates += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")))
    if found := ctypes.util.find_library("nvrtc"):
        candidates.append(found)
    for path in candidates:
        if "builtins" in path or "alt" in os.path.basename(path):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def compile_source(lib: ctypes.CDLL, source: Path, options: list[str]) -> tuple[bool, str]:
    """(compiled, log) for one source file."""
    prog = ctypes.c_void_p()
    code = source.read_bytes()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), code, source.name.encode(), 0, None, None)
    if rc:
        return False, f"nvrtcCreateProgram failed ({rc})"
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        ok = lib.nvrtcCompileProgram(prog, len(options), opts) == 0
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        return ok, log.value.decode(errors="replace").strip()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _passed_marker(lib: ctypes.CDLL, source: Path, options: list[str]) -> Path:
    """Where a successful compile of exactly these inputs is remembered."""
    from rawpage.sim.build import cache_dir

    h = hashlib.sha256(" ".join([lib._name, *options]).encode())
    for p in [source, *sorted(source.parent.glob("*.cuh"))]:
        h.update(p.name.encode() + p.read_bytes())
    return cache_dir() / "nvrtc" / f"{source.stem}-{h.hexdigest()[:20]}.ok"


def check(files: list[Path], archs: tuple[str, ...] = ARCHS) -> dict[tuple[str, str], str]:
    """{(file, arch): log} for every failure; empty when all compile. An arch such
    as compute_80 stops at PTX (the front end, which is what differs from nvcc)."""
    from rawpage.backends.cuda import nvrtc_options

    lib = find_nvrtc()
    if lib is None:
        raise RuntimeError("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    failures = {}
    for source in files:
        for arch in archs:
            options = [*nvrtc_options(source.parent), f"--gpu-architecture={arch}"]
            marker = _passed_marker(lib, source, options)
            if marker.exists():
                continue
            ok, log = compile_source(lib, source, options)
            if ok:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
            else:
                failures[(source.name, arch)] = log
    return failures


def main() -> int:
    files = sorted((Path(__file__).resolve().parent.parent / "cuda").glob("*.cu"))
    failures = check(files)
    for (name, arch), log in failures.items():
        print(f"--- {name} for {arch}:\n{log}\n")
    print(f"{len(files) * len(ARCHS) - len(failures)} of {len(files) * len(ARCHS)} compiled")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
