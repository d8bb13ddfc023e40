"""A victim's latency beside an attacker (issue 44): one client's short chat, alone and while
another client runs an n = 64 request, benign or with the longest lists the server accepts.

    python tools/bench_attacker_victim.py            # starts `rawpage serve` (default model)
    python tools/bench_attacker_victim.py --url http://127.0.0.1:8000

Each attacker is a streamed /v1/completions request (n = 64, 256 tokens, ignore_eos) that
runs while the victim's chat (32 tokens, temperature 0, ignore_eos) is timed, and is closed
after it; --repeats runs of each, median reported. The attacker variants add, one at a time:
every id but one as stop_token_ids (a bias of 100 on that one keeps the request running),
the whole vocabulary as logit_bias, both with min_tokens (every stop id masked each step),
and 2,000,000 stop ids (refused now: the time of its 400 is shown).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

VOCAB = 49152  # the default model's
EVERY_ID = list(range(VOCAB - 1, -1, -1))
ATTACKS = {
    "none (victim alone)": None,
    "benign n=64": {},
    # every id but one stops, and a bias makes that one the choice: the request runs on, checking each token
    "stop_token_ids = vocabulary - 1": {
        "stop_token_ids": [t for t in EVERY_ID if t != 1000],
        "logit_bias": {"1000": 100},
    },
    "logit_bias = vocabulary": {"logit_bias": {str(t): 0.5 for t in EVERY_ID}},
    "min_tokens + stop ids + bias": {
        "min_tokens": 200,
        "stop_token_ids": EVERY_ID,
        "logit_bias": {str(t): 0.5 for t in EVERY_ID},
    },
}


def victim(url: str) -> float:
    body = {"messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 32}
    t = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json={**body, "temperature": 0, "ignore_eos": True}, timeout=600)
    assert r.status_code == 200, r.text
    return time.perf_counter() - t


def attacker(url: str, extra: dict, started: threading.Event, stop: threading.Event) -> None:
    body = {"prompt": "Once upon a time", "n": 64, "max_tokens": 256, "ignore_eos": True, "stream": True, **extra}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        assert r.status_code == 200, r.read()
        for _ in r.iter_lines():
            started.set()
            if stop.is_set():
                return  # closing the stream aborts the request


def measure(url: str, extra: dict | None) -> float:
    if extra is None:
        return victim(url)
    started, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=attacker, args=(url, extra, started, stop))
    t.start()
    started.wait(600)
    try:
        return victim(url)
    finally:
        stop.set()
        t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server (default: start one with the default model)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="run only the attackers whose name contains this")
    a = ap.parse_args()
    server = None
    url = a.url
    if url is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "rawpage.cli", "serve", "--port", str(port), "--max-num-seqs", "72"]
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    try:
        victim(url)  # warm-up
        for name, extra in ATTACKS.items():
            if a.only not in name:
                continue
            times = [measure(url, extra) for _ in range(a.repeats)]
            print(f"{name:>30}: victim {statistics.median(times):6.2f} s (runs {', '.join(f'{x:.2f}' for x in times)})")
        t = time.perf_counter()
        body = json.dumps({"prompt": "hi", "stop_token_ids": [1] * 2_000_000}, separators=(",", ":"))  # 4 MB
        r = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=600)
        print(
            f"{'2,000,000 stop ids':>30}: {r.status_code} in {time.perf_counter() - t:.2f} s: {r.json()['error']['message'][:90]}"
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)


if __name__ == "__main__":
    main()
