"""Offline throughput on a dummy model, our engine or the static-batching baseline.

    python -m tools.gpu_check.throughput --engine rawpage --config tools/configs/llama-3-8b/config.json
    python -m tools.gpu_check.throughput --engine hf      --config tools/configs/llama-3-8b/config.json

The workload: --num-requests prompts of random token ids, lengths uniform in
--input-len, each generating exactly --output-len tokens (ignore_eos; greedy).

--engine rawpage: time to ready (LLM() returns: weights drawn on the GPU,
memory profiled, KV cache allocated, graphs captured), then the whole workload
through LLM.generate: output and total tok/s; per engine step, the wall time,
the CPU time spent building batch metadata, and the GPU time of the forward
pass (CUDA events around it). Then a decode-only phase for each batch in
--decode-batches (default 1 and 256): that many sequences of --decode-context
tokens, timing --decode-steps steps (graphs on unless --enforce-eager): wall,
GPU and roofline (weight bytes + KV bytes read) / measured copy bandwidth.

--engine hf: transformers' LlamaForCausalLM of the same shapes (its own random
init) running `generate` on static, left-padded batches of --hf-batch requests:
the naive baseline. It runs the first --hf-requests requests of the same
workload (whole batches; a rate is a rate) to stay inside the check's time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tools.gpu_check.common import GB, write_json


def workload(args) -> tuple[list[list[int]], int]:
    from tools.bench_throughput import make_workload

    lo, hi = (int(x) for x in args.input_len.split(":"))
    vocab = _vocab_size(args.config)
    prompts, _ = make_workload(args.num_requests, (lo, hi), (args.output_len, args.output_len), vocab, args.seed)
    return prompts, vocab


def _vocab_size(config: str) -> int:
    from rawpage.loader.dummy import load_dummy_config

    return load_dummy_config(config).vocab_size


class StepTimer:
    """Wraps one engine's runner to time what one step costs where: the CPU building
    batch metadata, and the GPU running the forward pass (events on cuda)."""

    def __init__(self, engine) -> None:
        self.runner = engine.runner
        self.cuda = engine.backend.name == "cuda"
        self.build_s: list[float] = []
        self.events: list[tuple] = []
        build, execute = self.runner.build_batch, self.runner.execute

        def timed_build(*a, **k):
            t = time.perf_counter()
            out = build(*a, **k)
            self.build_s.append(time.perf_counter() - t)
            return out

        def timed_execute(*a, **k):
            if not self.cuda:
                return execute(*a, **k)
            import cupy

            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            out = execute(*a, **k)
            end.record()
            self.events.append((start, end))
            return out

        self.runner.build_batch, self.runner.execute = timed_build, timed_execute

    def reset(self) -> None:
        self.build_s, self.events = [], []

    def summary(self) -> dict:
        out = {"steps": len(self.build_s), "build_batch_ms": 1e3 * float(np.mean(self.build_s or [0]))}
        if self.events:
            import cupy

            self.events[-1][1].synchronize()
            gpu = [cupy.cuda.get_elapsed_time(s, e) for s, e in self.events]
            out["gpu_forward_ms"] = float(np.mean(gpu))
        return out


def run_rawpage(args) -> dict:
    from rawpage import LLM, SamplingParams

    prompts, vocab = workload(args)
    copy_gbs = None
    if args.device == "cuda":
        from tools.gpu_check.common import copy_bandwidth_gbs

        copy_gbs = copy_bandwidth_gbs(256 << 20)  # before the KV cache takes the memory
    t0 = time.perf_counter()
    llm = LLM(
        args.config,
        load_format="dummy",
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        enforce_eager=args.enforce_eager,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    ready_s = time.perf_counter() - t0
    engine = llm.engine
    timer = StepTimer(engine)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params, use_tqdm=False)  # warm-up
    timer.reset()
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    n_in, n_out = sum(map(len, prompts)), args.output_len * len(prompts)
    steps = timer.summary()
    result = {
        "model": engine.model_config.name,
        "startup_s": ready_s,
        "memory": engine.memory.describe(),
        "num_requests": len(prompts),
        "prompt_tokens": n_in,
        "output_tokens": n_out,
        "elapsed_s": elapsed,
        "output_tok_s": n_out / elapsed,
        "total_tok_s": (n_in + n_out) / elapsed,
        "step_wall_ms": 1e3 * elapsed / max(1, steps["steps"]),
        **{f"step_{k}": v for k, v in steps.items()},
    }
    if args.decode_steps:
        for batch in (int(b) for b in args.decode_batches.split(",")):
            result[f"decode_b{batch}"] = decode_phase(engine, timer, args, batch, vocab, copy_gbs)
    return result


def decode_phase(engine, timer: StepTimer, args, batch: int, vocab: int, copy_gbs: float | None) -> dict:
    """`batch` sequences decoding together; time --decode-steps steps of that."""
    from rawpage import SamplingParams

    rng = np.random.default_rng(args.seed + 1)
    params = SamplingParams(temperature=0, max_tokens=args.decode_steps + 8, ignore_eos=True)
    for i in range(batch):
        prompt = rng.integers(100, vocab, args.decode_context).tolist()
        engine.add_request(f"decode-{batch}-{i}", {"prompt_token_ids": prompt}, params)
    while any(s.num_output_tokens == 0 for r in engine.requests.values() for s in r.seqs):
        engine.step()  # prefill everyone (chunked); the first tokens come out here
    timer.reset()
    walls = []
    for _ in range(args.decode_steps):
        t = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t)
    steps = timer.summary()
    c = engine.model_config
    kv_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * engine.backend.dtype.itemsize
    mean_context = args.decode_context + 1 + args.decode_steps / 2
    kv_bytes = batch * mean_context * kv_per_token
    weight_bytes = engine.model.num_bytes()
    engine.abort_request(list(engine.requests))
    engine.step()
    out = {
        "batch": batch,
        "context": args.decode_context,
        "graphs": engine.runner.graphs is not None,
        "wall_ms": 1e3 * float(np.median(walls)),
        "gpu_ms": steps.get("gpu_forward_ms"),  # CUDA events around the forward pass (cuda only)
        "roofline_ms": None,
        "build_batch_ms": steps["build_batch_ms"],
        "weight_gb": weight_bytes / GB,
        "kv_read_gb": kv_bytes / GB,
    }
    if copy_gbs:
        out["copy_gbs"] = copy_gbs
        out["roofline_ms"] = 1e3 * (weight_bytes + kv_bytes) / (copy_gbs * GB)
        out["wall_over_roofline"] = out["wall_ms"] / out["roofline_ms"]
    return out


def run_hf(args) -> dict:
    import torch

    from tools.gpu_check.common import hf_llama

    prompts, _ = workload(args)
    prompts = prompts[: max(args.hf_batch, args.hf_requests // args.hf_batch * args.hf_batch)]
    device = "cuda" if args.device == "cuda" else "cpu"
    t0 = time.perf_counter()
    hf = hf_llama(args.config, getattr(torch, args.dtype), device)
    ready_s = time.perf_counter() - t0

    def run_batch(batch: list[list[int]]) -> None:
        width = max(map(len, batch))
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):  # left padding, as generate() wants for decoder-only models
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.no_grad():
            hf.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                do_sample=False,
                max_new_tokens=args.output_len,
                min_new_tokens=args.output_len,
                pad_token_id=0,
            )

    run_batch([p[:16] for p in prompts[:2]])  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(0, len(prompts), args.hf_batch):
        run_batch(prompts[i : i + args.hf_batch])
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    n_in, n_out = sum(map(len, prompts)), args.output_len * len(prompts)
    return {
        "startup_s": ready_s,
        "num_requests": len(prompts),
        "batch": args.hf_batch,
        "prompt_tokens": n_in,
        "output_tokens": n_out,
        "elapsed_s": elapsed,
        "output_tok_s": n_out / elapsed,
        "total_tok_s": (n_in + n_out) / elapsed,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["rawpage", "hf"], default="rawpage")
    ap.add_argument("--config", default="tools/configs/llama-3-8b/config.json", help="a config.json (dummy weights)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu", "sim"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-requests", type=int, default=512)
    ap.add_argument("--input-len", default="256:1024", help="prompt lengths LO:HI (default 256:1024)")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--decode-batches", default="1,256", help="decode-only phases, one per batch size")
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=20, help="0 skips the decode-only phase")
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--hf-requests", type=int, default=128, help="hf: run this many of the requests (whole batches)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--result-file")
    args = ap.parse_args(argv)
    result = run_rawpage(args) if args.engine == "rawpage" else run_hf(args)
    write_json(args.result_file, {f"throughput_{args.engine}": result})
    return result


if __name__ == "__main__":
    main()
