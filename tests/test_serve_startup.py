"""Issue 31, items 1-2: `rawpage serve` that cannot start exits at once, non-zero, with one
line saying why, and no traceback; a bad --port or --host is refused before anything loads."""

import importlib.util
import os
import subprocess
import sys

import pytest

from rawpage import cli
from rawpage.server import app as server_app

CASES = {
    "hub id, no network": (
        ["HuggingFaceTB/SmolLM2-135M-Instruct"],
        "model 'HuggingFaceTB/SmolLM2-135M-Instruct' (revision main) is not in the local Hugging Face cache",
    ),
    "max-model-len over the context": (["--max-model-len", "99999"], "exceeds the model's context length 8192"),
    "awq on a gguf": (["--quantization", "awq"], "--quantization awq: this checkpoint is not awq-quantized (gguf)"),
    "dtype float16 on cpu": (["--device", "cpu", "--dtype", "float16"], "--device cpu computes in float32"),
    "cuda without cupy": (["--device", "cuda"], "--device cuda needs CuPy and a visible GPU"),
}


def serve(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"))
    cmd = [sys.executable, "-m", "rawpage.cli", "serve", "--port", "0", *flags]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("case", list(CASES))
def test_an_engine_that_cannot_start_exits_with_its_one_line(tmp_path, case):
    flags, message = CASES[case]
    if case == "cuda without cupy" and importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    out = serve(tmp_path, *flags)
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert out.returncode == 2, out.stderr
    assert len(errors) == 1 and message in errors[0], out.stderr
    assert "Traceback" not in out.stderr
    assert "startup complete" not in out.stderr  # issue 42: uvicorn's line came before the error


def test_a_bad_local_path_exits_at_once(tmp_path):
    out = serve(tmp_path, "--model", str(tmp_path / "absent.gguf"))
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith("rawpage: error: model ")
    assert "Traceback" not in out.stderr


def must_not_load(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("the model started loading")

    monkeypatch.setattr(server_app, "build_app", refuse)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "99999"], "--port 99999: a port is a number from 0 to 65535 (0 picks a free one)"),
        (["--port", "-1"], "--port -1: a port is a number from 0 to 65535 (0 picks a free one)"),
        (["--host", "999.1.1.1"], "--host 999.1.1.1: not an address or host name this machine can resolve"),
    ],
)
def test_port_and_host_are_checked_before_loading(monkeypatch, capsys, flags, message):
    must_not_load(monkeypatch)
    assert cli.main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rawpage: error: " + message) and err.count("\n") == 1, err
