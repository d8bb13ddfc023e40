"""What the Responses and Messages APIs add to a request's latency over chat completions.

    rawpage serve --port 8000 &
    python tools/bench_api_overhead.py --url http://127.0.0.1:8000

All three routes get the same conversation at temperature 0 with the same token budget,
so the engine generates the same tokens for each (the report checks the output token
counts agree); whatever differs is the API layer: parsing, translation, formatting and,
for Responses, the store. Requests go one at a time, the routes interleaved round by
round (so that a drift in the machine's load hits all three alike), non-streamed and
streamed, after --warmup rounds. The report gives each route's median and mean latency
and its overhead over chat's median; a quiet machine (`uptime` load < 1.5) makes the
medians worth comparing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx

QUESTION = (
    "Write a short story about a cat who learns to fly."  # longer than --max-tokens: every route generates all of them
)


def bodies(model: str, max_tokens: int, stream: bool) -> dict[str, tuple[str, dict]]:
    """route name -> (path, body): one conversation in each API's shape."""
    messages = [{"role": "user", "content": QUESTION}]
    common = {"model": model, "temperature": 0, "stream": stream}
    return {
        "chat": ("/v1/chat/completions", {**common, "messages": messages, "max_tokens": max_tokens}),
        "responses": ("/v1/responses", {**common, "input": QUESTION, "max_output_tokens": max_tokens}),
        "messages": ("/v1/messages", {**common, "messages": messages, "max_tokens": max_tokens}),
    }


def output_tokens(route: str, reply: dict) -> int:
    usage = reply["usage"]
    return usage["completion_tokens"] if route == "chat" else usage["output_tokens"]


def timed(client: httpx.Client, path: str, body: dict) -> tuple[float, dict | None]:
    """Seconds from sending to the last byte; the parsed reply when not streamed."""
    t0 = time.perf_counter()
    if body["stream"]:
        with client.stream("POST", path, json=body) as r:
            r.raise_for_status()
            for _ in r.iter_bytes():
                pass
        return time.perf_counter() - t0, None
    r = client.post(path, json=body)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()


def measure(client: httpx.Client, routes: dict, rounds: int, warmup: int) -> tuple[dict, dict]:
    """route -> latencies (s), and route -> output tokens of its last reply."""
    times: dict[str, list[float]] = {name: [] for name in routes}
    tokens: dict[str, int] = {}
    for i in range(warmup + rounds):
        for name, (path, body) in routes.items():
            seconds, reply = timed(client, path, body)
            if i >= warmup:
                times[name].append(seconds)
            if reply is not None:
                tokens[name] = output_tokens(name, reply)
    return times, tokens


def report(label: str, times: dict[str, list[float]], tokens: dict[str, int]) -> None:
    base = statistics.median(times["chat"])
    print(f"{label}:")
    for name, ts in times.items():
        med, mean = statistics.median(ts), statistics.fmean(ts)
        extra = f"  output tokens {tokens[name]}" if name in tokens else ""
        print(
            f"  {name:10s} median {med * 1e3:7.1f} ms  mean {mean * 1e3:7.1f} ms  vs chat {100 * (med / base - 1):+5.1f}%{extra}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--max-tokens", type=int, default=32, help="the token budget of every request")
    p.add_argument("--rounds", type=int, default=30, help="measured rounds (each sends one request per route)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--api-key", default="unused")
    args = p.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"}
    with httpx.Client(base_url=args.url, headers=headers, timeout=600) as client:
        for stream in (False, True):
            routes = bodies(args.model, args.max_tokens, stream)
            times, tokens = measure(client, routes, args.rounds, args.warmup)
            if len(set(tokens.values())) > 1:
                print(f"warning: the routes generated different token counts {tokens}: not the same work")
            report("streamed" if stream else "not streamed", times, tokens)


if __name__ == "__main__":
    main()
