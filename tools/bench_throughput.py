"""Offline throughput: a seeded batch of requests through the engine, continuous vs static batching.

    python tools/bench_throughput.py                      # 64 requests, prompts 32-512, outputs 32-256
    python tools/bench_throughput.py --static-batching    # fixed batches: nothing admitted until a batch is done

Every request runs with ignore_eos, so it produces exactly its output length.
Static batching is what a naive server does (and `transformers.generate` on
padded batches): a batch's short requests wait for its longest one.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def make_workload(n: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab: int, seed: int):
    """Seeded random token prompts (avoiding the first 100 ids, where special tokens live)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(100, vocab, rng.integers(input_len[0], input_len[1] + 1)).tolist() for _ in range(n)]
    outputs = rng.integers(output_len[0], output_len[1] + 1, n).tolist()
    return prompts, outputs


def run_rawpage(prompts, outputs, args) -> float:
    from rawpage import LLM, SamplingParams

    kw = {"max_num_seqs": args.max_num_seqs, "device": args.device}
    if args.max_num_batched_tokens:
        kw["max_num_batched_tokens"] = args.max_num_batched_tokens
    llm = LLM(args.model, **kw)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outputs]
    reqs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(reqs[:2], params[:2], use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    if args.static_batching:
        b = args.max_num_seqs
        for i in range(0, len(reqs), b):
            llm.generate(reqs[i : i + b], params[i : i + b], use_tqdm=False)
    else:
        llm.generate(reqs, params, use_tqdm=not args.quiet)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model path (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--input-len", default="32:512", help="prompt length range LO:HI in tokens (default 32:512)")
    ap.add_argument("--output-len", default="32:256", help="output length range LO:HI in tokens (default 32:256)")
    ap.add_argument("--max-num-seqs", type=int, default=32, help="batch size (and the static batch size)")
    ap.add_argument("--max-num-batched-tokens", type=int)
    ap.add_argument("--static-batching", action="store_true", help="fixed batches of --max-num-seqs requests")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=49152, help="token ids are drawn below this")
    ap.add_argument("--result-file", help="write the figures as JSON here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    lo_in, hi_in = (int(x) for x in args.input_len.split(":"))
    lo_out, hi_out = (int(x) for x in args.output_len.split(":"))
    prompts, outputs = make_workload(args.num_requests, (lo_in, hi_in), (lo_out, hi_out), args.vocab, args.seed)
    elapsed = run_rawpage(prompts, outputs, args)
    n_in, n_out = sum(map(len, prompts)), sum(outputs)
    result = {
        "mode": "static" if args.static_batching else "continuous",
        "num_requests": args.num_requests,
        "batch": args.max_num_seqs,
        "prompt_tokens": n_in,
        "output_tokens": n_out,
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(args.num_requests / elapsed, 3),
        "total_tok_per_s": round((n_in + n_out) / elapsed, 1),
        "output_tok_per_s": round(n_out / elapsed, 1),
    }
    print(json.dumps(result, indent=1))
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
