"""Where do the milliseconds of one decode step go? GEMMs, attention, sampling, Python.

    python tools/profile_step.py --batch 32 --context 300

Fills the batch with `--batch` sequences of `--context` prompt tokens, prefills them,
then times `--steps` decode steps, splitting each into the backend's ops, the
sampler, the scheduler, building the batch, and everything else. A decode step
replayed from a graph (CUDA graphs; the CPU's recorded kernel calls, batches up to 8)
shows as one "graph replay" row, split on the CPU by entry point (each call timed in C);
--enforce-eager splits it into the backend's ops. With --prefill it
times the prefill instead (`--batch 40 --context 160 --prefill`: 6,400 prompt tokens
in chunks of --max-num-batched-tokens). For a
mixture-of-experts model it also shows the expert load: how many tokens each
layer's experts received during those steps.
"""

from __future__ import annotations

import rawpage  # noqa: F401  (first: it sets how long OpenBLAS spins before NumPy loads it)

# isort: split
import argparse
import time
from collections import defaultdict

import numpy as np

OPS = [
    "linear",  # (the NumPy backend's linear calls matmul: only the outermost timed call counts)
    "matmul",
    "logits",
    "paged_attention",
    "fused_add_rms_norm",
    "rms_norm",
    "rope",
    "write_kv",
    "silu_and_mul",
    "gelu_tanh_and_mul",
    "embedding",
]


_depth = [0]  # timed calls open now: a call inside another timed one is the outer one's time


def timed(obj, name: str, totals: dict, label: str | None = None) -> None:
    fn = getattr(obj, name)
    label = label or name

    def wrapper(*a, **kw):
        if _depth[0]:
            return fn(*a, **kw)
        _depth[0] += 1
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            totals[label] += time.perf_counter() - t
            _depth[0] -= 1

    setattr(obj, name, wrapper)


def split_replay(graph, replays: dict) -> None:
    """A CPU graph (backends/cpu.py NativeGraph) replays with each call timed in C, summed by entry point."""
    names = graph.recording.op_names()

    def replay():
        seconds = np.zeros(len(names))
        graph.recording.replay(graph.backend.threads.set_for(len(graph.output)), seconds)
        for name, t in zip(names, seconds, strict=True):
            replays[name] += t
        return graph.output

    graph.replay = replay


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--speculative-config", default=None, help='JSON, e.g. {"method": "ngram", "num_speculative_tokens": 4}'
    )
    ap.add_argument(
        "--prefill",
        action="store_true",
        help="time the prefill of the --batch prompts instead (after one untimed step), in --max-num-batched-tokens chunks",
    )
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument(
        "--max-model-len", type=int, default=None, help="for models whose own context does not fit the default KV pool"
    )
    ap.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run every step eagerly, so that each op's time shows (a decode step replayed from a graph is one row)",
    )
    ap.add_argument("--kv-cache-dtype", default="auto", help="as rawpage serve's flag")
    args = ap.parse_args(argv)
    from rawpage import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        args.model,
        device=args.device,
        max_num_seqs=args.batch,
        speculative_config=args.speculative_config,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enforce_eager=args.enforce_eager,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    print(f"engine ready in {time.perf_counter() - t0:.2f} s (open the model, dequantize, build weights, KV pool)")
    eng = llm.engine
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0, max_tokens=1 if args.prefill else args.steps + 2, ignore_eos=True)
    high = min(30000, eng.model_config.vocab_size)  # (tiny test models have a few hundred tokens)

    def prompt() -> dict:
        return {"prompt_token_ids": rng.integers(high // 300, high, args.context).tolist()}

    def prefilling() -> bool:
        return any(s.is_prefill for s in eng.scheduler.running + eng.scheduler.waiting)

    if args.prefill:  # warm up on a prompt of its own (untimed): the measured ones may fit one step
        eng.add_request("warm-up", prompt(), params)
        while eng.has_unfinished_requests():
            eng.step()
    for i in range(args.batch):
        eng.add_request(str(i), prompt(), params)
    if not args.prefill:
        eng.step()  # (untimed: the first step also warms up)
        while prefilling():
            eng.step()
    totals: dict[str, float] = defaultdict(float)
    for op in OPS:
        timed(eng.backend, op, totals)
    replays: dict[str, float] = defaultdict(float)  # a CPU replay's time by entry point
    if eng.runner.graphs is not None:  # a replayed step's forward pass, every layer in one call
        timed(eng.runner.graphs, "run", totals, "graph replay")
        for graph in eng.runner.graphs.graphs.values():
            if hasattr(graph, "recording"):
                split_replay(graph, replays)
    timed(eng.scheduler, "schedule", totals)
    timed(eng.runner, "build_batch", totals)
    timed(eng.sampler, "sample_rows", totals)
    if eng.spec is not None:  # speculative decoding: drafting, and acceptance + appending
        timed(eng.spec, "propose", totals)
        timed(eng.spec, "verify", totals)
    generated, prompt = eng.stats.generation_tokens_total, eng.stats.prompt_tokens_total
    experts_before = getattr(eng.model, "expert_tokens", np.zeros(0)).copy()
    t0, steps = time.perf_counter(), 0
    while (steps < args.steps) if not args.prefill else prefilling():
        eng.step()
        steps += 1
    total = time.perf_counter() - t0
    generated = eng.stats.generation_tokens_total - generated
    per = {k: v / steps * 1000 for k, v in totals.items()}
    if args.prefill:
        prompt = eng.stats.prompt_tokens_total - prompt
        print(f"prefill: {prompt} prompt tokens in {steps} steps, {total * 1000:.0f} ms ({prompt / total:.1f} tok/s)")
    else:
        print(
            f"decode step at batch {args.batch}, context ~{args.context}: {total / steps * 1000:.1f} ms "
            f"({generated / total:.1f} tok/s)"
        )
    if eng.spec is not None:
        sp = eng.spec.stats
        print(
            f"  speculative: acceptance rate {sp.acceptance_rate:.1%}, mean accepted length {sp.mean_accepted_length:.2f}"
        )
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {k:20s} {v:8.2f} ms  {100 * v / (total / steps * 1000):5.1f}%")
        if k == "graph replay":
            for name, t in sorted(replays.items(), key=lambda kv: -kv[1]):
                print(f"    {name:24s} {t / steps * 1000:8.2f} ms")
    rest = total / steps * 1000 - sum(per.values())
    print(f"  {'other (Python)':20s} {rest:8.2f} ms  {100 * rest / (total / steps * 1000):5.1f}%")
    if eng.model_config.num_experts:
        load = eng.model.expert_tokens - experts_before  # (layers, E) tokens routed during the timed steps
        print(
            f"expert load over {args.steps} steps (tokens per expert; {eng.model_config.num_experts_per_tok} "
            f"of {eng.model_config.num_experts} per token):"
        )
        for i, row in enumerate(load):
            if row.any():
                print(f"  layer {i:3d}: idle {int((row == 0).sum()):3d}  max {int(row.max()):6d}  {row.tolist()}")
        c = eng.model_config  # the grouped GEMMs multiply routed rows only: gate|up (2 I x dim), down (dim x I)
        flops = 2 * int(load.sum()) * 3 * c.moe_intermediate_size * c.hidden_size / steps
        print(f"expert GEMMs: {flops / 1e9:.3f} GFLOP per step (routed rows only, whatever the expert count)")


if __name__ == "__main__":
    main()
