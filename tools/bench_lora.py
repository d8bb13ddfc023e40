"""Multi-LoRA throughput: a batch mixing adapters against the same batch without LoRA.

    python tools/bench_lora.py                       # CPU, default model, batch 32, 4 adapters of rank 16
    python tools/bench_lora.py --device cuda --model tools/configs/llama-3-8b/config.json \\
        --load-format dummy --batch 64 --adapters 8 --result-file lora.json

Random PEFT adapters (every q/k/v/o/gate/up/down projection, rank --rank) are
written to a temporary folder for the model's shapes. Each run serves --batch
requests of --prompt-len random tokens and --output-len output tokens (greedy,
ignore_eos), all admitted at once (one batch):
  base      an engine without --enable-lora;
  lora      an engine with --enable-lora --max-loras --adapters, request i using
            adapter i mod --adapters.
The two engines run one after the other, never side by side: on cuda each plans
the GPU's memory as its own, and on cpu each sets the process's BLAS thread count
(a second engine in the same process would change the first one's).
Reported: output tokens per second of the whole run and of its decode steps alone
(the engine's own step timings), each the best of --repeats, and lora / base.
"""

from __future__ import annotations

import rawpage  # noqa: F401  (first: it sets how long OpenBLAS spins before NumPy loads it)

# isort: split
import argparse
import gc
import json
import os
import tempfile
import time

import numpy as np


def write_adapters(folder: str, config, n: int, rank: int, seed: int = 0) -> list[str]:
    """n random PEFT LoRA folders for `config`'s shapes (float16 on disk, to keep them small)."""
    from safetensors.numpy import save_file

    from rawpage.lora.adapter import TARGETS, projection_shape

    rng = np.random.default_rng(seed)
    paths = []
    for k in range(n):
        tensors = {}
        for i in range(config.num_layers):
            for m in TARGETS:
                n_in, n_out = projection_shape(config, m)
                p = f"base_model.model.model.layers.{i}.{'self_attn' if m[0] in 'qkvo' else 'mlp'}.{m}."
                tensors[p + "lora_A.weight"] = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float16)
                tensors[p + "lora_B.weight"] = (0.01 * rng.standard_normal((n_out, rank))).astype(np.float16)
        path = os.path.join(folder, f"adapter{k}")
        os.makedirs(path)
        save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
        with open(os.path.join(path, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS)}, f)
        paths.append(path)
    return paths


def run(llm, prompts: list[list[int]], output_len: int, loras: list | None) -> dict:
    """One batch of every prompt; throughput overall and of decode steps alone."""
    from rawpage import SamplingParams

    engine = llm.engine
    step, decode_time = engine.step, [0.0]

    def timed_step():
        decode = bool(engine.scheduler.running) and not engine.scheduler.waiting
        decode = decode and all(not s.is_prefill for s in engine.scheduler.running)
        t0 = time.perf_counter()
        out = step()
        if decode:
            decode_time[0] += time.perf_counter() - t0
        return out

    engine.step = timed_step
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=loras)
    wall = time.perf_counter() - t0
    engine.step = step
    tokens = len(prompts) * output_len
    decode_tokens = len(prompts) * (output_len - 1)
    decode_tok_s = decode_tokens / max(decode_time[0], 1e-9)
    return {"tok_s": tokens / wall, "decode_tok_s": decode_tok_s, "wall_s": wall, "decode_s": decode_time[0]}


def lora_kw(args) -> dict:
    return dict(enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--enforce-eager", action="store_true", help="cuda: no decode graphs")
    ap.add_argument("--result-file", default=None)
    args = ap.parse_args(argv)

    from rawpage import LLM, LoRARequest

    common = dict(device=args.device, max_num_seqs=args.batch, load_format=args.load_format, seed=0)
    common.update(enforce_eager=args.enforce_eager, max_model_len=args.prompt_len + args.output_len + 16)
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("base", "lora"):  # one engine at a time (see the module docstring)
            llm = LLM(args.model, **common, **({} if name == "base" else lora_kw(args)))
            config = llm.engine.model_config
            rng = np.random.default_rng(0)
            prompts = [rng.integers(100, config.vocab_size, args.prompt_len).tolist() for _ in range(args.batch)]
            loras = None
            if name == "lora":
                paths = write_adapters(tmp, config, args.adapters, args.rank)
                reqs = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(paths)]
                loras = [reqs[i % len(reqs)] for i in range(args.batch)]
            run(llm, prompts, 4, loras)  # warm-up: reads the adapters, fills the slots
            results[name] = [run(llm, prompts, args.output_len, loras) for _ in range(args.repeats)]
            del llm
            gc.collect()
    best = {k: {m: max(r[m] for r in v) for m in ("tok_s", "decode_tok_s")} for k, v in results.items()}
    summary = {
        "model": args.model or "SmolLM2-135M (embedded)",
        "device": args.device,
        "batch": args.batch,
        "adapters": args.adapters,
        "rank": args.rank,
        **{f"{k}_{m}": round(best[k][m], 1) for k in best for m in ("tok_s", "decode_tok_s")},
        "ratio": round(best["lora"]["tok_s"] / best["base"]["tok_s"], 3),
        "decode_ratio": round(best["lora"]["decode_tok_s"] / best["base"]["decode_tok_s"], 3),
    }
    summary["runs"] = {k: [{m: round(x, 2) for m, x in r.items()} for r in v] for k, v in results.items()}
    print(json.dumps(summary, indent=2))
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump({"lora": summary}, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
