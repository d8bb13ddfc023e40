"""A newcomer's commands: the README's serve command starts the server, and its curl example works."""

import json
import os
import re
import signal
import subprocess
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
        assert "Paris" in reply["choices"][0]["message"]["content"]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
        log.close()
