"""Skipping GPU tests where there is no GPU, and failing them where there is one.

A GPU test skips only when no GPU is visible at all. If nvidia-smi (or the
driver, or torch) shows one but CuPy cannot use it, or if RAWPAGE_REQUIRE_GPU=1
(tools/gpu_check.sh sets it), the test fails with CuPy's own error: the first
H200 run reported 210 skips, caused by one import error, as "ok"."""

from __future__ import annotations

import functools
import os

import pytest

from rawpage.backends.gpu_probe import cupy_problem, visible_gpus


@functools.cache
def _why_not() -> tuple[str | None, str | None]:
    """(CuPy's problem or None, the first visible GPU or None), asked once per session."""
    problem = cupy_problem()
    gpus = visible_gpus() if problem else []
    return problem, gpus[0] if gpus else None


def skip_without_cuda() -> None:
    """Return if CuPy can use a GPU; otherwise skip, or fail where a GPU is expected."""
    problem, gpu = _why_not()
    if problem is None:
        return
    if gpu:
        pytest.fail(f"{gpu} is visible but CuPy cannot use it: {problem}", pytrace=False)
    if os.environ.get("RAWPAGE_REQUIRE_GPU") == "1":
        pytest.fail(f"RAWPAGE_REQUIRE_GPU=1 but CuPy cannot use a GPU: {problem}", pytrace=False)
    pytest.skip(f"no GPU visible ({problem})")
