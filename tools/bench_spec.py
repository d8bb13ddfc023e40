"""Single-stream decode speed with and without n-gram speculative decoding.

    python -m tools.bench_spec [--model PATH] [--device cpu] [--max-tokens 200] [--k 4] [--repeats 2]
        [--lookup-min N] [--lookup-max N] [--tasks repetitive,chat]

Two chat prompts, greedy, one request at a time:
  - repetitive: "fix the typos in this text" with a paragraph the answer copies, where
    prompt lookup finds most of the answer in the prompt;
  - chat: an ordinary open question, where drafts are rare.
Decode tok/s is (tokens - 1) / (finished - first token), the best of --repeats runs;
the acceptance rate is accepted / drafted tokens over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time

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
    a = ap.parse_args()
    spec = {"method": "ngram", "num_speculative_tokens": a.k}
    for key, value in (("prompt_lookup_min", a.lookup_min), ("prompt_lookup_max", a.lookup_max)):
        if value is not None:
            spec[key] = value
    engines = {
        "off": LLM(a.model, device=a.device, enable_prefix_caching=False),
        "ngram": LLM(a.model, device=a.device, enable_prefix_caching=False, speculative_config=spec),
    }
    print(
        f"# load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    for task in a.tasks.split(","):
        bench_task(task, engines, a.max_tokens, a.repeats)


def bench_task(task: str, engines: dict[str, LLM], max_tokens: int, repeats: int) -> None:
    """Runs alternate between the engines (off, ngram, off, ngram...) so that a change in the
    machine's load hits both alike; each engine's best run counts."""
    stats = engines["ngram"].engine.spec.stats
    before = (stats.num_draft_tokens, stats.num_accepted_tokens)
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, llm in engines.items():
            runs[name].append(decode_rate(llm, PROMPTS[task], max_tokens))
    drafted, accepted = stats.num_draft_tokens - before[0], stats.num_accepted_tokens - before[1]
    for name in engines:
        rate, n = max(runs[name])
        row = {"task": task, "spec": name, "decode_tok_s": round(rate, 2), "tokens": n}
        row["all_runs_tok_s"] = [round(r, 2) for r, _ in runs[name]]
        if name == "ngram":
            row.update(acceptance_rate=round(accepted / max(1, drafted), 3), drafted=drafted)
        print(json.dumps(row), flush=True)
    speedup = max(runs["ngram"])[0] / max(runs["off"])[0]
    print(json.dumps({"task": task, "speedup": round(speedup, 2)}), flush=True)


if __name__ == "__main__":
    main()
