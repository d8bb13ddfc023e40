"""SIGTERM while streams run: no new requests, running streams get --shutdown-timeout to
finish, the rest end with a final chunk (finish_reason "abort") and [DONE]; exit 0, no traceback."""

import json
import signal
import threading
import time

import httpx

from tests.server.harness import ServerProcess


def read_stream(url: str, started: threading.Event, result: dict) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    lines = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[len("data: ") :])
                started.set()
    result["lines"], result["end"] = lines, time.monotonic()


def test_sigterm_during_four_streams_ends_each_with_done_and_exits_0(tiny_model_dir):
    server = ServerProcess("--model", str(tiny_model_dir), "--shutdown-timeout", "1")
    results = [{} for _ in range(4)]
    events = [threading.Event() for _ in results]
    threads = [threading.Thread(target=read_stream, args=(server.url, e, r)) for e, r in zip(events, results)]
    for t in threads:
        t.start()
    assert all(e.wait(120) for e in events), server.output()
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    code = server.proc.wait(timeout=60)  # no second signal: that would force the exit
    server.stop()
    output = server.output()
    assert code == 0, output
    assert "Traceback" not in output, output
    reasons = []
    for r in results:
        assert r["lines"][-1] == "[DONE]", r["lines"][-3:]
        assert r["end"] - sent < 1 + 5  # the timeout, plus the time to say goodbye
        last = json.loads(r["lines"][-2])
        reasons.append(last["choices"][0]["finish_reason"])
    assert "abort" in reasons and set(reasons) <= {"abort", "length"}, reasons


def test_a_second_ctrl_c_ends_streams_at_once_with_done_and_no_traceback(tiny_model_dir):
    server = ServerProcess("--model", str(tiny_model_dir), "--shutdown-timeout", "60")
    results = [{} for _ in range(2)]
    events = [threading.Event() for _ in results]
    threads = [threading.Thread(target=read_stream, args=(server.url, e, r)) for e, r in zip(events, results)]
    for t in threads:
        t.start()
    assert all(e.wait(120) for e in events), server.output()
    server.proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGINT)  # impatient: not 60 s
    for t in threads:
        t.join(30)
    code = server.proc.wait(timeout=30)
    server.stop()
    output = server.output()
    assert code == 0 and "Traceback" not in output, output
    for r in results:
        assert r["lines"][-1] == "[DONE]" and r["end"] - sent < 10, (r["lines"][-3:], output)
        assert json.loads(r["lines"][-2])["choices"][0]["finish_reason"] == "abort"
