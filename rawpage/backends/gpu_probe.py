"""Is there a GPU, and can CuPy use it? Two different questions.

On the first H200 run CuPy failed to import (our cuda/ shadowed NVIDIA's `cuda`
package), `--device cuda` said "no GPU", and 210 GPU tests skipped as if the
machine had none. So when CuPy cannot be used we look for a GPU another way
(nvidia-smi, the driver's /proc entries, torch), and if one is there the error
is CuPy's own, shown as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from rawpage.errors import CudaUnusableError


def cupy_problem() -> str | None:
    """None if CuPy imports and sees at least one GPU; otherwise why not, as
    'ExceptionType: message' (the import error itself when CuPy does not import)."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # ImportError, CUDARuntimeError, a broken CUDA library: all say why
        return f"{type(e).__name__}: {e}"
    return None if n > 0 else "CuPy sees no GPU (getDeviceCount() == 0)"


def visible_gpus(use_torch: bool = False) -> list[str]:
    """GPUs seen without CuPy: `nvidia-smi -L`, else /proc/driver/nvidia/gpus, else
    torch (only if use_torch, or torch is already imported: importing it takes seconds)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
            gpus = [line.strip() for line in out.splitlines() if line.startswith("GPU ")]
            if gpus:
                return gpus
        except (OSError, subprocess.SubprocessError):
            pass
    proc = "/proc/driver/nvidia/gpus"
    if os.path.isdir(proc) and os.listdir(proc):
        return [f"GPU at PCI {bus}" for bus in sorted(os.listdir(proc))]
    if use_torch or "torch" in sys.modules:
        try:
            import torch

            if torch.cuda.is_available():
                return [f"GPU {i}: {torch.cuda.get_device_name(i)} (torch)" for i in range(torch.cuda.device_count())]
        except Exception:  # a broken torch is not our question here
            pass
    return []


def require_cuda(use_torch: bool = False) -> None:
    """For --device cuda: return if CuPy can use a GPU; raise CudaUnusableError with
    CuPy's error if a GPU is visible anyway, ValueError if there is none."""
    problem = cupy_problem()
    if problem is None:
        return
    gpus = visible_gpus(use_torch)
    if gpus:
        raise CudaUnusableError(
            f"{gpus[0]} is visible, but CuPy cannot use it: {problem}\n"
            "Install the CuPy wheel for this CUDA (pip install 'rawpage[cuda12]' or 'rawpage[cuda13]'), "
            "and make sure no folder named `cuda` with an __init__.py is ahead of NVIDIA's on sys.path."
        )
    raise ValueError(f"--device cuda needs CuPy and a visible GPU ({problem}); try --device cpu or sim")
