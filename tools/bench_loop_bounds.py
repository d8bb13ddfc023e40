"""What one client's large or many requests cost the others (issue 44, SECURITY.md's figures).

    rawpage serve --api-key k1,k2,k3 --max-model-len 1024 --port 8000 &
    python tools/bench_loop_bounds.py --url http://127.0.0.1:8000

1. /health's latency while keys k1 and k2 post 4 MB lists of token ids in a loop (each
   refused for length, after the body is decoded and checked).
2. How long a 4 MB text takes to be refused for length.
3. Key k3's small /tokenize and chat, alone, then while k1 and k2 flood /tokenize with
   80,000-digit texts (8 connections each), beside the flooders' own latency.

With --body-stalls MIB [MIB ...] it measures instead how long json.loads of one body
holds the event loop (it holds Python's lock wherever it runs): /health's worst latency,
polled every 10 ms, while one body at a time is posted, of each size and each of the
shapes that cost the most per byte, then the server's rawpage:event_loop_lag_max_seconds.
Start that server with --max-request-bytes at least the largest size:

    rawpage serve --api-key k1,k2,k3 --max-model-len 1024 --max-request-bytes 16MiB --port 8000 &
    python tools/bench_loop_bounds.py --url http://127.0.0.1:8000 --body-stalls 1 4 16
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class Flood:
    """Connections that post one body over and over, timing the answers that are 200s."""

    def __init__(self, url: str, body: bytes, keys: list[str]) -> None:
        self.stop, self.ok_seconds, self.statuses = threading.Event(), [], []
        self.threads = [threading.Thread(target=self._run, args=(url, body, k)) for k in keys]

    def _run(self, url: str, body: bytes, key: str) -> None:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        with httpx.Client(timeout=300) as client:
            while not self.stop.is_set():
                t0 = time.monotonic()
                self.statuses.append(client.post(url, content=body, headers=headers).status_code)
                if self.statuses[-1] == 200:
                    self.ok_seconds.append(time.monotonic() - t0)

    def __enter__(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def timed(fn) -> float:
    t0 = time.monotonic()
    r = fn()
    assert r.status_code in (200, 400), r.text[:300]
    return time.monotonic() - t0


# Per byte, the bodies json.loads takes longest over: many small values (each a Python object).
BODY_SHAPES = {"token ids": b"1,", "empty lists": b"[],", "floats": b"1.5,"}


def body_stalls(url: str, sizes_mib: list[float], repeats: int = 3) -> None:
    """/health's worst latency while one body of each shape and size is posted (the worst of `repeats`)."""
    for mib in sizes_mib:
        for shape, item in BODY_SHAPES.items():
            count = (int(mib * (1 << 20)) - len(b'{"prompt": []}')) // len(item)
            body = b'{"prompt": [' + item * count + b"]}"
            body = body.replace(b",]}", b"]}")  # the last item's comma
            worst = [worst_health_during(url, body) for _ in range(repeats)]
            print(f"{mib:g} MiB of {shape}: /health's worst latency {max(worst):.3f} s (runs {worst})")
    metrics = httpx.get(url + "/metrics", headers={"Authorization": "Bearer k1"}).text
    print(next(line for line in metrics.splitlines() if line.startswith("rawpage:event_loop_lag_max_seconds")))


def worst_health_during(url: str, body: bytes) -> float:
    """/health's worst latency, polled every 10 ms, while `body` is posted to /v1/completions."""
    done, polls, statuses = threading.Event(), [], []

    def post() -> None:
        headers = {"Authorization": "Bearer k1", "Content-Type": "application/json"}
        try:
            statuses.append(httpx.post(url + "/v1/completions", content=body, headers=headers, timeout=300))
        finally:
            done.set()

    poster = threading.Thread(target=post)
    poster.start()
    with httpx.Client(timeout=300) as client:
        while not done.is_set():
            polls.append(timed(lambda: client.get(url + "/health")))
            time.sleep(0.01)
    poster.join()
    r = statuses[0]
    assert r.status_code == 400, r.text[:300]  # longer than --max-model-len, or not token ids
    return round(max(polls), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--seconds", type=float, default=8.0, help="how long each flood runs")
    ap.add_argument("--body-stalls", type=float, nargs="+", metavar="MIB", help="measure one body's stall instead")
    args = ap.parse_args()
    url, seconds = args.url, args.seconds
    if args.body_stalls:
        body_stalls(url, args.body_stalls)
        return
    k3 = {"Authorization": "Bearer k3"}

    ids = b'{"prompt": [' + b"1," * 1_999_999 + b'1], "max_tokens": 1}'
    health = []
    with Flood(url + "/v1/completions", ids, ["k1", "k2"]) as flood, httpx.Client(timeout=300) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            health.append(timed(lambda: client.get(url + "/health")))
            time.sleep(0.02)
    print(
        f"/health beside two clients posting 4 MB id lists: median {statistics.median(health):.3f} s, "
        f"max {max(health):.3f} s ({len(health)} polls, {len(flood.statuses)} lists refused)"
    )

    text = {"prompt": "1" * 4_000_000}
    refused = timed(lambda: httpx.post(url + "/tokenize", json=text, headers=k3, timeout=300))
    print(f"a 4 MB text refused for length in {refused:.3f} s")

    def small() -> float:
        return timed(lambda: httpx.post(url + "/tokenize", json={"prompt": "hi"}, headers=k3, timeout=300))

    def chat() -> float:
        return timed(lambda: httpx.post(url + "/v1/chat/completions", json=CHAT, headers=k3, timeout=300))

    alone = (statistics.median(small() for _ in range(3)), statistics.median(chat() for _ in range(3)))
    digits = b'{"prompt": "' + b"1" * 80_000 + b'"}'
    with Flood(url + "/tokenize", digits, ["k1"] * 8 + ["k2"] * 8) as flood:
        time.sleep(1.0)
        flooded = (statistics.median(small() for _ in range(3)), statistics.median(chat() for _ in range(3)))
        time.sleep(max(0.0, seconds - 1.0))
    print(
        f"k3 alone: /tokenize {alone[0]:.3f} s, chat {alone[1]:.3f} s; beside two keys' /tokenize floods: "
        f"/tokenize {flooded[0]:.3f} s, chat {flooded[1]:.3f} s; the flooders' own requests "
        f"{statistics.median(flood.ok_seconds):.3f} s ({flood.statuses.count(429)} of theirs refused 429)"
    )


if __name__ == "__main__":
    main()
