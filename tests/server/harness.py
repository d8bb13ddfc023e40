"""Start a real `rawpage serve` in a subprocess for tests, and stop it."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time

import httpx


def _limit_open_files(n: int) -> None:
    """`ulimit -n n` for the server process (run in the child before it starts)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self, *args: str, wait: bool = True, timeout: float = 180.0, max_open_files: int | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = f"/tmp/rawpage-test-server-{self.port}.log"
        self.log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "rawpage.cli", "serve", "--port", str(self.port), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        limit = None if max_open_files is None else lambda: _limit_open_files(max_open_files)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, preexec_fn=limit)
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def metric(self, name: str) -> float:
        """The value of one unlabelled-by-us Prometheus sample, e.g. 'rawpage:num_requests_running'."""
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


@contextlib.contextmanager
def in_process_app(args, config=None):
    """The app in this process, through Starlette's TestClient, once its engine has loaded:
    (client, ServerState)."""
    from starlette.testclient import TestClient

    from rawpage.server.app import build_app
    from rawpage.server.args import ServerConfig

    with TestClient(build_app(args, config or ServerConfig(allowed_hosts=["testserver"]))) as client:
        state = client.app.state.rawpage
        deadline = time.monotonic() + 120
        while state.engine.is_loading and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state.engine.info is not None, state.engine.error
        yield client, state
