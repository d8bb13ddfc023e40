"""What one request's outputs cost in server memory: the figures behind rawpage's
admission estimate (request_checks.OUTPUT_BYTES_PER_TOKEN, LOGPROB_BYTES_PER_TOKEN,
LOGPROB_BYTES_PER_ENTRY) and --max-request-output-memory (issue 44).

    python tools/measure_output_memory.py --n 8 --max-tokens 100 --logprobs 20
    python tools/measure_output_memory.py --n 64 --max-tokens 400 --logprobs 0

A token's logprobs cost a part per token and a part per entry, solved from the two runs'
"a logprob entry" lines e(0) and e(20) (each a token's logprobs cost over its entries):
per entry = (21 e(20) - e(0)) / 20, per token = e(0) - per entry.

Runs the server in this process (Starlette's TestClient around build_app, the default
model unless --model) and traces every allocation (tracemalloc, which NumPy reports to as
well; the KV pool exists before, so it is not counted). Each case is one non-streamed
/v1/chat/completions reply with ignore_eos, so every choice runs to max_tokens, after a
warm-up of the same shape; its cost is the traced peak during the request above the level
before it. A generated token's cost per choice is the slope between max_tokens and twice
that with no logprobs; a logprob entry's is the difference that --logprobs makes, over
n x 2 max_tokens x (logprobs + 1) entries. The peak includes the reply's JSON, built at the end.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from starlette.testclient import TestClient

from rawpage.engine_args import EngineArgs
from rawpage.server.app import build_app
from rawpage.server.args import ServerConfig


def peak(c: TestClient, body: dict) -> int:
    """Traced peak bytes during one request, above the level before it (after a warm-up)."""
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return tracemalloc.get_traced_memory()[1] - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model to serve (default: rawpage's default model)")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=100)
    ap.add_argument("--logprobs", type=int, default=20)
    a = ap.parse_args()
    args = EngineArgs(**({"model": a.model} if a.model else {}), max_num_seqs=max(16, a.n), max_model_len=1024)
    args.max_request_output_memory = 2**40
    tracemalloc.start()
    with TestClient(build_app(args, ServerConfig(allowed_hosts=["testserver"]))) as c:
        while c.get("/health").status_code != 200:  # the model loads on the engine's thread
            time.sleep(0.5)
        body = {
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "n": a.n,
            "ignore_eos": True,
            "temperature": 1.0,
            "seed": 0,
        }
        short = peak(c, {**body, "max_tokens": a.max_tokens})
        full = peak(c, {**body, "max_tokens": 2 * a.max_tokens})
        lp = peak(c, {**body, "max_tokens": 2 * a.max_tokens, "logprobs": True, "top_logprobs": a.logprobs})
    tokens = a.n * 2 * a.max_tokens
    per_token = (full - short) / (a.n * a.max_tokens)
    per_entry = (lp - full) / (tokens * (a.logprobs + 1))
    print(f"n {a.n}, traced peak: +{short / 2**20:.1f} MiB at max_tokens {a.max_tokens}, ", end="")
    print(f"+{full / 2**20:.1f} MiB at {2 * a.max_tokens}, +{lp / 2**20:.1f} MiB with logprobs {a.logprobs}")
    print(f"a generated token: {per_token:.0f} B a choice; a logprob entry: {per_entry:.0f} B")
    print(f"a token with logprobs {a.logprobs}: {per_token + per_entry * (a.logprobs + 1):.0f} B a choice")


if __name__ == "__main__":
    main()
