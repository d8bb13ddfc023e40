"""What sharing KV blocks saves: parallel sampling and a shared system prompt.

    python tools/bench_sharing.py                 # both experiments on the default model
    python tools/bench_sharing.py --only prefix   # or --only parallel

parallel: 16 prompts with n=4 samples each, once with the prompt's blocks shared
          by the four samples (copy-on-write for the partial last block) and once
          with every sample keeping its own copy. Reports peak KV blocks and tok/s.
prefix:   64 requests that share a 512-token system prompt, all arriving at once,
          with prefix caching on and off. Reports mean/median TTFT and tok/s.
"""

from __future__ import annotations

import rawpage  # noqa: F401  (first: it sets how long OpenBLAS spins before NumPy loads it)

# isort: split
import argparse
import json
import time

import numpy as np


def drive(llm, prompts, params) -> dict:
    """Run requests step by step; peak blocks, elapsed time, per-request TTFT."""
    eng = llm.engine
    t0, arrival = time.monotonic(), time.time()  # request metrics are epoch seconds
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, params, arrival_time=arrival)
    peak, ttfts, generated = 0, [], 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            generated += sum(len(o.delta_token_ids) for o in out.outputs)
            if out.finished and out.metrics.first_token_time is not None:
                ttfts.append(out.metrics.first_token_time - out.metrics.arrival_time)
        peak = max(peak, eng.block_manager.num_used_blocks)
    elapsed = time.monotonic() - t0
    prompt_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    return {
        "peak_blocks": peak,
        "elapsed_s": round(elapsed, 2),
        "output_tok_per_s": round(generated / elapsed, 1),
        "total_tok_per_s": round((generated + prompt_tokens) / elapsed, 1),
        "ttft_mean_s": round(float(np.mean(ttfts)), 3),
        "ttft_median_s": round(float(np.median(ttfts)), 3),
        "prompt_tokens_computed": eng.stats.prompt_tokens_total,
    }


def copying_forker(engine):
    """The comparison point: a Forker whose children store (and compute) the prompt again
    instead of pointing at the parent's blocks."""
    from rawpage.forking import Forker

    forker = Forker(engine.scheduler, engine.forker.seq_ids)
    forker.share_blocks = False
    return forker


def parallel(args) -> dict:
    from rawpage import LLM, SamplingParams

    rng = np.random.default_rng(args.seed)
    prompts = [{"prompt_token_ids": rng.integers(100, 40000, 200).tolist()} for _ in range(16)]
    params = SamplingParams(n=4, temperature=1.0, seed=0, max_tokens=64, ignore_eos=True)
    out = {}
    for name, share in (("shared", True), ("separate copies", False)):
        llm = LLM(args.model, enable_prefix_caching=False, max_num_seqs=64)
        if not share:
            llm.engine.forker = copying_forker(llm.engine)
        out[name] = drive(llm, prompts, params)
    return out


def prefix(args) -> dict:
    from rawpage import LLM, SamplingParams

    rng = np.random.default_rng(args.seed)
    system = rng.integers(100, 40000, 512).tolist()
    prompts = [{"prompt_token_ids": system + rng.integers(100, 40000, 32).tolist()} for _ in range(64)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    out = {}
    for name, caching in (("prefix caching on", True), ("prefix caching off", False)):
        llm = LLM(args.model, enable_prefix_caching=caching, max_num_seqs=64)
        out[name] = drive(llm, prompts, params)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model path (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--only", choices=["parallel", "prefix"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--result-file")
    args = ap.parse_args()
    results = {}
    if args.only in (None, "parallel"):
        results["parallel sampling n=4"] = parallel(args)
    if args.only in (None, "prefix"):
        results["shared 512-token prefix"] = prefix(args)
    print(json.dumps(results, indent=1))
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
