"""Single-stream decode speed with and without n-gram speculative decoding.

    python -m tools.bench_spec [--model PATH] [--device cpu] [--max-tokens 200] [--k 4] [--repeats 2]
        [--lookup-min N] [--lookup-max N] [--tasks repetitive,chat] [--llama-server BIN]

Two chat prompts, greedy, one request at a time:
  - repetitive: "fix the typos in this text" with a paragraph the answer copies, where
    prompt lookup finds most of the answer in the prompt;
  - chat: an ordinary open question, where drafts are rare.
Decode tok/s is (tokens - 1) / (finished - first token), the best of --repeats runs;
the acceptance rate is accepted / drafted tokens over the runs.

With --llama-server (llama.cpp's binary, e.g. ../peers/llama.cpp-build/bin/llama-server)
the same GGUF is served by llama-server (one slot, --threads 2) and its runs join the
rotation: the same chat request, greedy, its decode rate from the reply's own timings
(predicted_per_second). Without --model, the GGUF is the default model's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import httpx

from rawpage import LLM, SamplingParams

TEXT = (
    "The quick brown fox jumpd over the lazy dog. It was a sunny day in the vilage, and the "
    "children were playing in the park near the old church. Their parents sat on the benches, "
    "talking about the harvest, the wether and the price of bread at the market. In the afternoon "
    "a light rain began to fall, and everyone hurried home before the streets became muddy."
)
PROMPTS = {
    "repetitive": f"Fix the spelling mistakes in this text. Reply with the corrected text only.\n\n{TEXT}",
    "chat": "Write a short story about a robot who learns to paint.",
}


def decode_rate(llm: LLM, prompt: str, max_tokens: int) -> tuple[float, int]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    out = llm.chat([{"role": "user", "content": prompt}], params, use_tqdm=False)[0]
    m, n = out.metrics, len(out.outputs[0].token_ids)
    return (n - 1) / max(1e-9, m.finished_time - m.first_token_time), n


class LlamaServer:
    """llama-server on a free port, serving `gguf` to one client at a time."""

    def __init__(self, binary: str, gguf: str, threads: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [binary, "-m", gguf, "-np", "1", "-c", "4096", "-t", str(threads), "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise TimeoutError("llama-server did not start in 120 s")

    def decode_rate(self, prompt: str, max_tokens: int) -> tuple[float, int]:
        body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": max_tokens}
        t = httpx.post(self.url + "/v1/chat/completions", json=body, timeout=600).json()["timings"]
        return t["predicted_per_second"], t["predicted_n"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@contextlib.contextmanager
def peer(binary: str | None, model: str | None) -> Iterator[LlamaServer | None]:
    if not binary:
        yield None
        return
    if model is None:
        from rawpage.loader.default_model import default_model_path

        model = default_model_path()
    server = LlamaServer(binary, model, threads=2)
    try:
        yield server
    finally:
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--lookup-min", type=int, default=None, help="default: the engine's (vLLM's 5 and 5)")
    ap.add_argument("--lookup-max", type=int, default=None)
    ap.add_argument("--tasks", default=",".join(PROMPTS), help="comma-separated: " + ", ".join(PROMPTS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary: add it to the rotation")
    a = ap.parse_args()
    spec = {"method": "ngram", "num_speculative_tokens": a.k}
    for key, value in (("prompt_lookup_min", a.lookup_min), ("prompt_lookup_max", a.lookup_max)):
        if value is not None:
            spec[key] = value
    off = LLM(a.model, device=a.device, enable_prefix_caching=False)
    ngram = LLM(a.model, device=a.device, enable_prefix_caching=False, speculative_config=spec)
    print(
        f"# load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    with peer(a.llama_server, a.model) as server:
        engines: dict[str, Callable[[str, int], tuple[float, int]]] = {
            "off": lambda p, n: decode_rate(off, p, n),
            "ngram": lambda p, n: decode_rate(ngram, p, n),
        }
        if server is not None:
            engines["llama-server"] = server.decode_rate
        for task in a.tasks.split(","):
            bench_task(task, engines, ngram.engine.spec.stats, a.max_tokens, a.repeats)


def bench_task(task: str, engines: dict[str, Callable], stats, max_tokens: int, repeats: int) -> None:
    """Runs alternate between the engines (off, ngram, [llama-server,] off, ...) so that a
    change in the machine's load hits all alike; each engine's best run counts."""
    before = (stats.num_draft_tokens, stats.num_accepted_tokens)
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, run in engines.items():
            runs[name].append(run(PROMPTS[task], max_tokens))
    drafted, accepted = stats.num_draft_tokens - before[0], stats.num_accepted_tokens - before[1]
    for name in engines:
        rate, n = max(runs[name])
        row = {"task": task, "spec": name, "decode_tok_s": round(rate, 2), "tokens": n}
        row["all_runs_tok_s"] = [round(r, 2) for r, _ in runs[name]]
        if name == "ngram":
            row.update(acceptance_rate=round(accepted / max(1, drafted), 3), drafted=drafted)
        print(json.dumps(row), flush=True)
    row = {"task": task, "speedup": round(max(runs["ngram"])[0] / max(runs["off"])[0], 2)}
    if "llama-server" in runs:
        row["ngram_vs_llama_server"] = round(max(runs["ngram"])[0] / max(runs["llama-server"])[0], 2)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
