"""A newcomer's commands: the README's serve command starts the server, and its curl example works."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import httpx

from tests.server.harness import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_block(marker: str) -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(rf"<!-- readme-test: {marker} -->\s*```bash\n(.*?)```", text, re.S)
    assert m, f"README lost its {marker} example"
    return m.group(1)


def test_readme_serve_command_and_curl_example(tmp_path):
    text = open(os.path.join(ROOT, "README.md")).read()
    assert "make serve " in text and "make test " in text
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        ["make", "serve", f"ARGS=--port {port}"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 600  # a fresh clone installs first
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://localhost:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        curl = readme_block("curl").replace("localhost:8000", f"localhost:{port}")
        out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120)
        reply = json.loads(out.stdout)
        assert "Tokyo" in reply["choices"][0]["message"]["content"]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
        log.close()


# --- every shell command in README.md and docs/*.md ----------------------------------------------
# Commands not run here, each with why. The rest run as written (python is this interpreter) from the
# repository root with no PYTHONPATH, as from a fresh clone: rawpage's flags parse, tools show their
# --help after the documented arguments (a bad value still fails), make targets dry-run (make -n).
NOT_RUN = {
    "curl ": "needs a running server: test_readme_serve_command_and_curl_example runs the README's curl",
    "docker ": "needs Docker; tests/test_deploy_files.py lints the Dockerfiles",
    "kubectl ": "needs a Kubernetes cluster; tests/test_deploy_files.py checks the manifest",
    "ray ": "needs a Ray cluster (cloud credentials)",
    "pip install ": "needs the network",
    "bash tools/gpu_wheels.sh": "downloads wheels from PyPI (network)",
    "OUT=": "tools/gpu_check.sh needs a GPU",
    "RAWPAGE_CHAOS_SECONDS=": "a 30 s chaos run; tests/server/test_chaos.py is in the suite",
    ".venv/bin/python -c ": "builds the CUDA simulator (minutes from a cold cache); tests/kernels run it",
    ".venv/bin/pytest -m live": "collects the whole suite; the live tests need torch and transformers",
    "python -m tools.bench_gemm_split": "history in docs/benchmarks.md: the tool went at c9c1f30 with the "
    "NumPy row split it measured (git show 98a0348:tools/bench_gemm_split.py)",
}


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for every command in a ```bash block, continuation lines joined."""
    out = []
    for path in [
        "README.md",
        *sorted(f"docs/{n}" for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")),
    ]:
        text = open(os.path.join(ROOT, path)).read()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            pending = ""
            for line in block.splitlines():
                pending += line.rstrip().removesuffix("\\") + " " if pending or line.strip() else ""
                if line.rstrip().endswith("\\") or not _complete(pending):
                    continue
                if pending.strip() and not pending.lstrip().startswith("#"):
                    out.append((path, pending.strip()))
                pending = ""
    return out


def _complete(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
        return True
    except ValueError:  # an open quote: the command goes on on the next line
        return False


def check_command(command: str) -> None:
    argv = shlex.split(command, comments=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if argv[0] == "rawpage":
        from rawpage import cli

        cli.parse_args(argv[1:])  # an unknown flag or a bad value exits here
        return
    if argv[0] == "make":
        subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, check=True, capture_output=True, timeout=60)
        return
    if argv[0] in ("python", ".venv/bin/python"):
        if argv[1].startswith("tools/"):  # run as a script, tools/ is on sys.path but the root is not
            source = open(os.path.join(ROOT, argv[1])).read()
            assert not re.search(r"^\s*(from tools\b|import tools\b)", source, re.M), (
                f"{argv[1]} imports the tools package: document it as python -m tools.{argv[1][6:-3]}"
            )
        cmd = [sys.executable, *argv[1:], "--help"]
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "usage:" in out.stdout, out.stderr
        return
    if argv[0] == ".venv/bin/pytest":
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", *argv[1:]]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
        return
    raise AssertionError(f"no check for {command!r}: run it here, or list it in NOT_RUN with why")


def test_every_documented_command_runs_or_is_listed_with_why():
    commands = documented_commands()
    assert len(commands) > 40 and any("kernel_report" in c for _, c in commands)
    failures = []
    for path, command in dict.fromkeys(commands):
        if any(command.startswith(prefix) for prefix in NOT_RUN):
            continue
        try:
            check_command(command)
        except (AssertionError, SystemExit, subprocess.SubprocessError) as e:
            failures.append(f"{path}: {command}\n  {e}")
    assert not failures, "\n".join(failures)
