"""Batch-1 decode with n-gram speculative decoding against none (issue 19's GPU target).

    python -m tools.gpu_check.spec --device cuda --config tools/configs/llama-3-8b/config.json \\
        --result-file spec.json

Two engines on the same dummy model (the weights are drawn from the same seeds),
one after the other: plain, then `speculative_config={"method": "ngram",
"num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}`.
CUDA graphs on (the default), --max-num-seqs 1.

The workload. Random weights do not copy text by induction, so a prompt that
quotes a passage does not make the model repeat it. What random weights do, under
greedy decoding, is fall into runs and short loops: the same token many times
over, then another (on the tiny CPU model, about 80% of tokens repeat what
followed the previous occurrence of the token before them). So the plain engine
first generates G (--output-len tokens, greedy) from a random prompt P, and both
engines are then measured on the prompt P + G, whose continuation goes on in
that manner; prompt lookup finds it in the prompt and in the output. The JSON
reports how copyable G and the measured output were (lookup_hit_rate_*: the
share of tokens that follow the previous occurrence of the token before them)
and the acceptance rate actually measured; a model that does not repeat itself
gives a low one, and the figures say so.

Measured: decode tok/s of one request (--output-len tokens, greedy, ignore_eos;
(tokens - 1) / the wall time of the steps after the first token), the best of
--repeats runs after a warm-up, for each engine; the acceptance rate (accepted /
drafted) and mean accepted length (tokens per verification step, 1 + accepted);
and the step costs behind the speedup: the median wall time (and, on cuda, GPU
time from CUDA events around the forward pass) of a verification step that
verified k drafts (k + 1 query tokens) against a plain decode step; the draft
length adapts (rawpage/spec_decode/adaptive.py), so steps with fewer drafts are
listed too (verify_steps, by drafts). The speedup
is about tokens per step / (verification cost / decode cost).

The greedy outputs of every measured run of both engines must be identical
(speculation changes the speed, never the tokens): if not, the result says where
they first differ and the tool exits 1.

Memory (cuda): the plain engine plans for --gpu-memory-utilization 0.4 of the
device and is dropped before the n-gram engine starts, which plans for 0.85. The
planner counts memory still in use as "other" (rawpage/memory.py), so even if
the first engine's memory were not all returned, the second still fits.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import numpy as np

from tools.gpu_check.common import write_json


def spec_config(k: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


def make_llm(args, speculative_config: dict | None, utilization: float):
    from rawpage import LLM

    return LLM(
        args.config,
        load_format="dummy",
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=1,
        max_model_len=args.max_model_len,
        enable_prefix_caching=False,
        gpu_memory_utilization=utilization,
        speculative_config=speculative_config,
        seed=0,
    )


def run_request(engine, timer, prompt: list[int], output_len: int, request_id: str) -> dict:
    """One request through engine.step(), timing each step after the first token.
    Returns the output tokens, decode tok/s and per decode step (wall s, drafted,
    accepted, GPU ms or None)."""
    from rawpage import SamplingParams

    spec = engine.spec.stats if engine.spec is not None else None  # None without speculation
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    req = engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    while req.seqs[0].num_output_tokens == 0 and req.error is None:
        engine.step()  # the prompt (chunked if long); the first token comes out here
    steps, token_ids = [], None
    while token_ids is None and req.error is None:
        before = (spec.num_draft_tokens, spec.num_accepted_tokens) if spec else (0, 0)
        timer.reset()
        t = time.perf_counter()
        outputs = engine.step()
        wall = time.perf_counter() - t
        drafted = spec.num_draft_tokens - before[0] if spec else 0
        accepted = spec.num_accepted_tokens - before[1] if spec else 0
        steps.append((wall, drafted, accepted, timer.summary().get("gpu_forward_ms")))
        for out in outputs:
            if out.request_id == request_id and out.finished:
                token_ids = list(out.outputs[0].token_ids)
    if req.error is not None:
        raise RuntimeError(f"spec: request {request_id} failed in the engine: {req.error}")
    decode_s = sum(s[0] for s in steps)
    return {"token_ids": token_ids, "decode_tok_s": (len(token_ids) - 1) / max(decode_s, 1e-9), "steps": steps}


def measure(llm, prompt: list[int], args, name: str) -> dict:
    """A warm-up, then --repeats runs; the best run's rate, every run's steps."""
    from tools.gpu_check.throughput import StepTimer

    engine = llm.engine
    timer = StepTimer(engine)
    run_request(engine, timer, prompt, min(16, args.output_len), f"{name}-warmup")
    runs = [run_request(engine, timer, prompt, args.output_len, f"{name}-{i}") for i in range(args.repeats)]
    steps = [s for r in runs for s in r["steps"]]
    return {
        "decode_tok_s": max(r["decode_tok_s"] for r in runs),
        "all_runs_tok_s": [r["decode_tok_s"] for r in runs],
        "token_ids": [r["token_ids"] for r in runs],  # each run's
        "steps": steps,
        "graph_replays": graph_replays(engine),
    }


def graph_replays(engine) -> dict[str, int] | None:
    """Replays per captured shape, "BxQ" (batch x query tokens a sequence); None: no graphs."""
    graphs = engine.runner.graphs
    if graphs is None:
        return None
    return {f"{size}x{q}": n for (size, q), n in sorted(graphs.num_replays.items())}


def step_cost(steps: list[tuple], drafted: int) -> dict:
    """Median wall (and GPU) ms of the steps that verified exactly `drafted` drafts."""
    picked = [s for s in steps if s[1] == drafted]
    gpu = [s[3] for s in picked if s[3] is not None]
    return {
        "steps": len(picked),
        "wall_ms": 1e3 * statistics.median(s[0] for s in picked) if picked else None,
        "gpu_ms": statistics.median(gpu) if gpu else None,
    }


def lookup_hit_rate(prompt: list[int], tokens: list[int]) -> float:
    """How copyable `tokens` are, after `prompt`: the fraction of them that follow the most
    recent earlier occurrence of the token before them (what prompt lookup with n = 1
    would draft first)."""
    context, hits = list(prompt), 0
    for t in tokens:
        last = context[-1]
        earlier = [i for i in range(len(context) - 2, -1, -1) if context[i] == last]
        hits += bool(earlier) and context[earlier[0] + 1] == t
        context.append(t)
    return hits / max(1, len(tokens))


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def release_memory(device: str) -> None:
    """After an engine is dropped: collect it and, on cuda, give the memory pool's free
    blocks back to the device."""
    gc.collect()
    if device == "cuda":
        import cupy

        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()


def run_plain(args) -> tuple[list[int], list[int], dict]:
    """The plain engine: draws P, generates G from it, measures on P + G. Returns P, G and
    the measurement; the engine is dropped on return."""
    llm = make_llm(args, None, 0.4)
    vocab = llm.engine.model_config.vocab_size
    p = np.random.default_rng(args.seed).integers(100, vocab, args.prompt_len).tolist()
    g = run_request(llm.engine, NoTimer(), p, args.output_len, "generate-G")["token_ids"]
    return p, g, measure(llm, p + g, args, "plain")


def run_ngram(args, prompt: list[int]) -> dict:
    llm = make_llm(args, spec_config(args.k), 0.85)
    on = measure(llm, prompt, args, "ngram")
    graphs = llm.engine.runner.graphs  # query lengths q > 1 with graphs; None: eager
    on["verification_graphs"] = sorted(q for q in graphs.sizes if q > 1) if graphs is not None else None
    return on


def run(args) -> dict:
    k = args.k
    p, g, off = run_plain(args)
    release_memory(args.device)
    prompt = p + g
    on = run_ngram(args, prompt)
    release_memory(args.device)
    drafted = sum(s[1] for s in on["steps"])
    accepted = sum(s[2] for s in on["steps"])
    verified = sum(1 for s in on["steps"] if s[1])  # steps that verified at least one draft
    tokens_per_step = 1 + accepted / max(1, verified)
    decode = step_cost(off["steps"], 0)
    by_drafts = {n: step_cost(on["steps"], n) for n in range(k + 1)}
    verify = by_drafts[k]
    ratio = verify["wall_ms"] / decode["wall_ms"] if verify["wall_ms"] and decode["wall_ms"] else None
    gpu_ratio = verify["gpu_ms"] / decode["gpu_ms"] if verify["gpu_ms"] and decode["gpu_ms"] else None
    reference = off["token_ids"][0]  # every run of both engines must give these tokens
    diffs = [first_difference(reference, t) for t in off["token_ids"] + on["token_ids"]]
    diff = min((d for d in diffs if d is not None), default=None)
    return {
        "device": args.device,
        "dtype": args.dtype,
        "model": args.config,
        "k": k,
        "prompt_tokens": len(prompt),
        "output_tokens": args.output_len,
        "lookup_hit_rate_g": lookup_hit_rate(p, g),  # how repetitive greedy G was, after the random P
        "plain_decode_tok_s": off["decode_tok_s"],
        "ngram_decode_tok_s": on["decode_tok_s"],
        "plain_all_runs_tok_s": off["all_runs_tok_s"],
        "ngram_all_runs_tok_s": on["all_runs_tok_s"],
        "speedup": on["decode_tok_s"] / off["decode_tok_s"],
        "acceptance_rate": accepted / max(1, drafted),  # over the measured runs
        "mean_accepted_length": tokens_per_step,  # 1 + accepted, a verification step
        "drafted_tokens": drafted,
        "decode_step": decode,
        "verify_step": verify,  # the steps that verified k drafts
        "verify_steps": {str(n): c for n, c in by_drafts.items() if c["steps"]},  # 0: no draft
        "step_cost_ratio": ratio,
        "step_cost_ratio_gpu": gpu_ratio,
        "predicted_speedup": tokens_per_step / ratio if ratio else None,
        "graph_replays_plain": off["graph_replays"],
        "graph_replays_ngram": on["graph_replays"],
        "verification_graphs_captured": on["verification_graphs"],
        "lookup_hit_rate_output": lookup_hit_rate(prompt, reference),
        "outputs_match": diff is None,
        "first_difference": diff,
    }


NAME = "n-gram speculation k=4, batch 1, repetitive prompt"


def summary_rows(r: dict | None) -> list[tuple[str, str, str, str]]:
    """(check, figure, target, verdict) rows for summary.py's table."""
    if not r:
        return [(NAME, "not measured", "reported; greedy tokens identical", "—")]
    fig = (
        f"{r['ngram_decode_tok_s']:.0f} decode tok/s vs {r['plain_decode_tok_s']:.0f} without = {r['speedup']:.2f}x; "
        f"acceptance {r['acceptance_rate']:.0%}, {r['mean_accepted_length']:.2f} tokens/step"
    )
    v, d = r["verify_step"], r["decode_step"]
    if r.get("step_cost_ratio"):
        fig += f"; verify step {v['wall_ms']:.2f} ms vs decode step {d['wall_ms']:.2f} ms = {r['step_cost_ratio']:.2f}x"
    if r.get("step_cost_ratio_gpu"):
        fig += f" (GPU {v['gpu_ms']:.2f} vs {d['gpu_ms']:.2f} ms)"
    graphs = "verification graphs" if r.get("verification_graphs_captured") else "eager verification"
    match = "tokens identical" if r["outputs_match"] else f"TOKENS DIFFER at {r['first_difference']}"
    name = f"{NAME}, {r['model'].split('/')[-2] if '/' in r['model'] else r['model']}, {graphs}"
    return [(name, f"{fig}; {match}", "reported; greedy tokens identical", "ok" if r["outputs_match"] else "MISS")]


def failed(r: dict | None) -> list[str]:
    """Speculation that changed the greedy tokens is a correctness failure of the check."""
    if r and not r["outputs_match"]:
        return [f"spec: greedy tokens differ from no speculation at output token {r['first_difference']}"]
    return []


class NoTimer:
    def reset(self) -> None:
        pass

    def summary(self) -> dict:
        return {}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tools/configs/llama-3-8b/config.json", help="a config.json (dummy weights)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu", "sim"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--prompt-len", type=int, default=32, help="the random prompt P")
    ap.add_argument("--output-len", type=int, default=128, help="tokens of G, and of each measured request")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--result-file")
    args = ap.parse_args(argv)
    if args.output_len < 2:
        ap.error("--output-len must be at least 2: the first token comes from the prefill, the rest are decoded")
    if args.prompt_len + 3 * args.output_len + args.k > args.max_model_len:
        ap.error("--max-model-len must hold --prompt-len + 3 x --output-len + --k (P + G + the output + drafts)")
    result = run(args)
    write_json(args.result_file, {"spec": result})
    if not result["outputs_match"]:
        print(
            f"spec: greedy outputs with and without n-gram speculation differ at output token "
            f"{result['first_difference']}: speculation must not change the tokens",
            file=sys.stderr,
        )
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
