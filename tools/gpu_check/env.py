"""The machine the GPU check ran on: GPU, driver, CUDA, CuPy, torch, transformers.

    python -m tools.gpu_check.env --result-file out.json

Whatever cannot be imported is reported as missing rather than failing, so the
later steps can say why they were skipped. The one exception is CuPy: if it
cannot use a GPU, the step prints CuPy's error and exits 1, and gpu_check.sh
stops there (the first H200 run went on, skipped 210 tests and said "ok").
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys

from tools.gpu_check.common import write_json


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception as e:  # missing, or broken in an interesting way: say which
        return f"missing ({type(e).__name__}: {e})"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def gpu_facts() -> dict:
    try:
        import cupy

        rt = cupy.cuda.runtime
        props = rt.getDeviceProperties(0)
        name = props["name"]
        return {
            "gpu": name.decode() if isinstance(name, bytes) else str(name),
            "compute_capability": f"{props['major']}.{props['minor']}",
            "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
            "sm_count": props["multiProcessorCount"],
            "driver_cuda": _cuda_version(rt.driverGetVersion()),
            "runtime_cuda": _cuda_version(rt.runtimeGetVersion()),
            "device_count": rt.getDeviceCount(),
            "nvrtc": _nvrtc_version(),
        }
    except Exception as e:
        return {"gpu": f"unavailable ({type(e).__name__}: {e})"}


def _nvrtc_version() -> str:
    try:
        from cupy_backends.cuda.libs import nvrtc

        return ".".join(map(str, nvrtc.getVersion()))
    except Exception as e:
        return f"unknown ({type(e).__name__}: {e})"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result-file")
    args = ap.parse_args(argv)
    result = {
        "python": platform.python_version(),
        **gpu_facts(),
        "cupy": _version("cupy"),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "pytest": _version("pytest"),
        "compute_sanitizer": shutil.which("compute-sanitizer") or "missing",
        "nvcc": shutil.which("nvcc") or "missing",
    }
    try:
        import torch

        result["torch_cuda"] = f"{torch.version.cuda}, available={torch.cuda.is_available()}"
    except Exception:
        pass
    from rawpage.backends.gpu_probe import cupy_problem, visible_gpus

    result["cupy_problem"] = cupy_problem()
    result["visible_gpus"] = visible_gpus(use_torch=True)
    write_json(args.result_file, {"env": result})
    return result


def fatal(result: dict) -> str | None:
    """Why the GPU check cannot go on, or None."""
    if result.get("cupy_problem") is None:
        return None
    gpus = result.get("visible_gpus") or []
    where = f"{gpus[0]} is visible, but CuPy cannot use it" if gpus else "CuPy sees no GPU"
    return f"{where}: {result['cupy_problem']}"


if __name__ == "__main__":
    reason = fatal(main())
    if reason:
        print(f"\nFATAL: {reason}", file=sys.stderr)
        raise SystemExit(1)
