"""The kernel sources compile for real GPUs: nvcc for sm_80 and sm_90 with
ptxas statistics (no local-memory spills in the attention kernels), and NVRTC,
which is what cupy.RawModule uses and accepts less than nvcc. Each part skips
where its compiler is absent; results are cached by content (see the tools)."""

from pathlib import Path

import pytest

from rawpage.ops.launch import cuda_source_dir
from rawpage.sim.build import build_module
from tools import kernel_report, nvrtc_check

SOURCES = sorted(cuda_source_dir().glob("*.cu"))


@pytest.fixture(scope="module")
def ptxas_stats():
    if kernel_report.nvcc_path() is None:
        pytest.skip("nvcc not on PATH")
    return kernel_report.report(SOURCES, ("sm_80", "sm_90"))


def test_every_kernel_builds_for_sm80_and_sm90(ptxas_stats):
    """nvcc sees the same kernels the simulator finds, for both architectures."""
    built = {(s.file, s.kernel, s.arch) for s in ptxas_stats}
    for source in SOURCES:
        for kernel in build_module(source).kernels:
            for arch in ("sm_80", "sm_90"):
                assert (source.name, kernel, arch) in built


def test_kernels_do_not_spill(ptxas_stats):
    spills = [
        f"{s.kernel} on {s.arch}: {s.spill_stores} B stored, {s.spill_loads} B loaded" for s in ptxas_stats if s.spills
    ]
    assert not spills, "local-memory spills:\n" + "\n".join(spills)


# The most threads a launch gives each kernel (rawpage/ops): registers x threads
# must fit the 64K-register file of one SM, or the launch fails on the GPU.
MAX_THREADS = {
    "rms_norm": 1024,
    "fused_add_rms_norm": 1024,
    "fused_add_layer_norm": 1024,
    "silu_and_mul": 256,
    "gelu_tanh": 256,  # gelu_tanh and gelu_tanh_and_mul
    "gelu_erf": 256,
    "rope": 128,
    "paged_attention_decode": 128,
}


def test_kernels_fit_the_register_file_at_their_block_size(ptxas_stats):
    for s in ptxas_stats:
        assert s.registers > 0, f"no register count parsed for {s.kernel}"
        threads = next((n for prefix, n in MAX_THREADS.items() if s.kernel.startswith(prefix)), None)
        if threads:
            assert s.registers * threads <= 65536, f"{s.kernel} on {s.arch}: {s.registers} registers x {threads}"


def test_report_parses_ptxas_output():
    text = """ptxas info    : Compiling entry function 'k_f16' for 'sm_90'
ptxas info    : Function properties for k_f16
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers, 4224 bytes smem, 448 bytes cmem[0]"""
    (s,) = kernel_report.parse_ptxas("k.cu", text)
    assert (s.kernel, s.arch, s.registers, s.smem) == ("k_f16", "sm_90", 72, 4224)
    assert (s.stack, s.spill_stores, s.spill_loads, s.spills) == (16, 8, 4, 12)


def test_sources_compile_with_nvrtc():
    if nvrtc_check.find_nvrtc() is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc to run this check)")
    failures = nvrtc_check.check([Path(s) for s in SOURCES], ("compute_80",))
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
