"""A GPU that CuPy cannot use is an error with CuPy's own message, never "no GPU"
and never a skip (rawpage/backends/gpu_probe.py, tests/gpu_required.py). The GPU
is faked with an nvidia-smi script on PATH; CuPy is broken with a package that
raises the first H200 run's import error."""

import logging
import os
import sys

import pytest

from rawpage.backends import get_backend, gpu_probe
from rawpage.errors import CudaUnusableError

H200_ERROR = "cannot import name 'pathfinder' from 'cuda' (/repo/cuda/__init__.py)"


@pytest.fixture
def broken_cupy(tmp_path, monkeypatch):
    pkg = tmp_path / "broken" / "cupy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"raise ImportError({H200_ERROR!r})\n")
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.delitem(sys.modules, "cupy", raising=False)


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1" = "-L" ] && echo "GPU 0: NVIDIA H200 (UUID: GPU-0000)"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gpu_probe, "visible_gpus", lambda use_torch=False: [])


def test_cupy_problem_is_the_import_error(broken_cupy):
    assert gpu_probe.cupy_problem() == f"ImportError: {H200_ERROR}"


def test_nvidia_smi_lists_the_gpu(fake_nvidia_smi):
    assert gpu_probe.visible_gpus() == ["GPU 0: NVIDIA H200 (UUID: GPU-0000)"]


def test_device_cuda_with_a_visible_gpu_fails_with_cupys_error(broken_cupy, fake_nvidia_smi):
    with pytest.raises(CudaUnusableError) as e:
        get_backend("cuda")
    assert "GPU 0: NVIDIA H200" in str(e.value) and H200_ERROR in str(e.value)


def test_device_cuda_without_a_gpu_says_so(broken_cupy, no_gpu):
    with pytest.raises(ValueError, match="needs CuPy and a visible GPU.*try --device cpu"):
        get_backend("cuda")


def test_device_auto_falls_back_to_the_cpu_but_says_why(broken_cupy, fake_nvidia_smi, caplog):
    with caplog.at_level(logging.WARNING):
        assert get_backend("auto").name == "cpu"
    assert "NVIDIA H200" in caplog.text and H200_ERROR in caplog.text


def test_gpu_tests_fail_instead_of_skipping_when_a_gpu_is_visible(broken_cupy, fake_nvidia_smi):
    from tests import gpu_required

    gpu_required._why_not.cache_clear()
    try:
        with pytest.raises(
            pytest.fail.Exception,
            match=r"NVIDIA H200 \(UUID: GPU-0000\) is visible but CuPy cannot use it: ImportError",
        ):
            gpu_required.skip_without_cuda()
    finally:
        gpu_required._why_not.cache_clear()


@pytest.mark.parametrize("required", ["1", None])
def test_gpu_tests_skip_without_a_gpu_unless_one_is_required(broken_cupy, monkeypatch, required):
    from tests import gpu_required

    monkeypatch.setattr(gpu_required, "visible_gpus", lambda: [])
    if required:
        monkeypatch.setenv("RAWPAGE_REQUIRE_GPU", required)
    else:
        monkeypatch.delenv("RAWPAGE_REQUIRE_GPU", raising=False)
    gpu_required._why_not.cache_clear()
    try:
        with pytest.raises(pytest.fail.Exception if required else pytest.skip.Exception, match="ImportError"):
            gpu_required.skip_without_cuda()
    finally:
        gpu_required._why_not.cache_clear()


def test_the_cli_prints_cupys_error_in_one_line(tmp_path, fake_nvidia_smi):
    import subprocess

    broken = tmp_path / "cli" / "cupy"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(f"raise ImportError({H200_ERROR!r})\n")
    env = dict(os.environ, PYTHONPATH=str(broken.parent))
    out = subprocess.run(
        [sys.executable, "-m", "rawpage.cli", "generate", "hi", "--device", "cuda"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert (
        f"rawpage: error: GPU 0: NVIDIA H200 (UUID: GPU-0000) is visible, but CuPy cannot use it: ImportError: {H200_ERROR}"
        in out.stderr
    )
    assert "Traceback" not in out.stderr
