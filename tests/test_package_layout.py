"""The top-level cuda/ (kernel sources) must not shadow NVIDIA's `cuda` package, and
the kernels must be found from a checkout and from an installed wheel.

On the first H200 run, cuda/__init__.py won over NVIDIA's `cuda` namespace when
the repository root was on sys.path, CuPy 14 failed on `from cuda import
pathfinder`, and every GPU test skipped. Each case runs in a fresh interpreter:
the import system caches what it found."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = {p.name for p in (ROOT / "cuda").glob("*.cu")}


def run_python(code: str, cwd: Path, pythonpath: list[Path] = ()) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, pythonpath)))
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("regular", [False, True], ids=["namespace", "regular"])
def test_nvidia_cuda_package_is_not_shadowed(tmp_path, regular):
    # NVIDIA's cuda-pathfinder and cuda-bindings install cuda/ as a namespace;
    # older cuda-python shipped cuda/__init__.py. Both must win over ours.
    fake = tmp_path / "site" / "cuda" / "pathfinder"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("FAKE = True\n")
    if regular:
        (fake.parent / "__init__.py").write_text("")
    code = (
        f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(tmp_path / 'site')!r}]\n"
        "import cuda.pathfinder; print(cuda.pathfinder.__file__); assert cuda.pathfinder.FAKE"
    )
    assert run_python(code, cwd=tmp_path) == str(fake / "__init__.py")


def test_kernels_found_from_a_checkout(tmp_path):
    # PYTHONPATH=. from the root, as tools/gpu_check.sh runs it on a bare GPU image
    code = (
        "import json, rawpage; from rawpage.ops.launch import cuda_source_dir; "
        "d = cuda_source_dir(); print(json.dumps([rawpage.__file__, str(d), sorted(p.name for p in d.glob('*.cu'))]))"
    )
    package, source_dir, kernels = json.loads(run_python(code, cwd=tmp_path, pythonpath=[ROOT]))
    assert Path(package).parent == ROOT / "rawpage"
    assert Path(source_dir) == ROOT / "cuda"
    assert set(kernels) == KERNELS


@pytest.mark.timeout(300)
def test_kernels_found_from_an_installed_wheel(tmp_path):
    wheels, target = tmp_path / "wheels", tmp_path / "target"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = subprocess.run(
        [*pip, "wheel", "-v", "--no-deps", "-w", str(wheels), str(ROOT)], check=True, capture_output=True, text=True
    )
    # setuptools' deprecations (a license table, data folders that are not listed packages)
    warnings = [x for x in build.stderr.splitlines() if "deprecated" in x or "would be ignored" in x]
    assert not warnings, "\n".join(warnings)
    (wheel,) = wheels.glob("rawpage-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, capture_output=True)
    assert not (target / "cuda").exists(), "the wheel must not install a top-level cuda package"
    code = (
        "import json, rawpage; from rawpage.ops.launch import cuda_source_dir; import rawpage.models.llama; "
        "d = cuda_source_dir(); print(json.dumps([rawpage.__file__, str(d), sorted(p.name for p in d.glob('*.cu'))]))"
    )
    package, source_dir, kernels = json.loads(run_python(code, cwd=tmp_path, pythonpath=[target]))
    assert Path(package).parent == target / "rawpage"
    assert Path(source_dir) == target / "rawpage" / "cuda"
    assert set(kernels) == KERNELS and (Path(source_dir) / "common.cuh").is_file()
    # the web page (GET /) is package data too, every file the server may serve
    from rawpage.server.web import PAGE_FILES

    assert all((target / "rawpage" / "web" / name).is_file() for name in PAGE_FILES)
    data = ["server/templates/chatml_tools.jinja", "sim/include/cuda_sim.h", "sim/runtime/launch.cpp"]
    assert all((target / "rawpage" / name).is_file() for name in data)
