"""Embedding throughput: inputs per second through POST /v1/embeddings on running servers.

    rawpage serve path/to/Qwen3-Embedding-0.6B --runner pooling --port 8000 &
    python tools/bench_embeddings.py --url http://127.0.0.1:8000
    python tools/bench_embeddings.py --url http://127.0.0.1:8000 \\
        --llama-server /work/peers/llama.cpp/build/bin/llama-server --gguf qwen3-embedding-0.6b.gguf

Each run sends --inputs texts of about --tokens tokens each, all in one request (the
server batches them), --repeats times, and reports the best run's inputs/s and prompt
tokens/s (from the server's own `usage`). The texts are cut to --tokens tokens with the
rawpage server's /tokenize and /detokenize, so that every server embeds the same text.
With --llama-server, that binary is started with `--embedding --pooling last` on
--gguf, measured the same way, and stopped.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import time

import httpx
import numpy as np

WORDS = "the of and to in is was for on that with as by at from his her an were are which this be or had".split()


def make_texts(url: str, headers: dict, n: int, tokens: int, seed: int = 0) -> list[str]:
    """n texts of random words, each cut to `tokens` tokens by the rawpage server's tokenizer."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(n):
        words = " ".join(rng.choice(WORDS, size=2 * tokens))
        ids = httpx.post(f"{url}/tokenize", json={"prompt": words}, headers=headers).json()["tokens"][:tokens]
        texts.append(httpx.post(f"{url}/detokenize", json={"tokens": ids}, headers=headers).json()["prompt"])
    return texts


def measure(url: str, headers: dict, texts: list[str], repeats: int) -> dict:
    """The best of `repeats` requests that each embed every text: inputs/s and tokens/s."""
    best, tokens = float("inf"), 0
    body = {"input": texts, "encoding_format": "float"}
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/v1/embeddings", json=body, headers=headers, timeout=600)
        elapsed = time.perf_counter() - t0
        r.raise_for_status()
        assert len(r.json()["data"]) == len(texts), "the server returned fewer vectors than inputs"
        best, tokens = min(best, elapsed), r.json().get("usage", {}).get("prompt_tokens", 0)
    return {"seconds": best, "inputs_per_s": len(texts) / best, "prompt_tokens": tokens, "tokens_per_s": tokens / best}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_llama_server(binary: str, gguf: str, inputs: int, tokens: int) -> tuple[subprocess.Popen, str]:
    """llama-server with embeddings on, one slot per input and a context for all of them."""
    port = free_port()
    cmd = [binary, "-m", gguf, "--embedding", "--pooling", "last", "--port", str(port)]
    cmd += ["-np", str(inputs), "-c", str(inputs * (tokens + 16)), "-ub", str(4 * tokens), "-b", str(4 * tokens)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}: {' '.join(cmd)}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama-server was not ready after 5 minutes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="a rawpage server started with --runner pooling")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per input")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llama-server", default=None, help="a llama-server binary to measure too")
    ap.add_argument("--gguf", default=None, help="the model for --llama-server")
    a = ap.parse_args()
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    texts = make_texts(a.url, headers, a.inputs, a.tokens)
    results = {"rawpage": measure(a.url, headers, texts, a.repeats)}
    if a.llama_server:
        if not a.gguf:
            raise SystemExit("--llama-server needs --gguf (the same model as a GGUF file)")
        proc, url = start_llama_server(a.llama_server, a.gguf, a.inputs, a.tokens)
        try:
            results["llama-server"] = measure(url, {}, texts, a.repeats)
        finally:
            proc.terminate()
            proc.wait(30)
    for name, r in results.items():
        print(
            f"{name:>12}: {r['inputs_per_s']:8.1f} inputs/s  {r['tokens_per_s']:9.0f} prompt tokens/s  ({r['seconds']:.2f} s)"
        )
    print(json.dumps({"inputs": a.inputs, "tokens": a.tokens, "results": results}))


if __name__ == "__main__":
    main()
