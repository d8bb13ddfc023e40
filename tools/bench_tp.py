"""Tensor-parallel throughput: the same seeded requests at each --tensor-parallel-size.

    python tools/bench_tp.py --device cpu --tp 1,2          # CPU: the 135M-sized dummy model
    python tools/bench_tp.py --device cuda --tp 1,2,4,8 --model tools/configs/llama-3-8b --num-requests 256

The model is `--load-format dummy` (random weights of a config's shapes) unless
--real: then --model is a checkpoint. Each size runs in a fresh engine (its workers
spawned and stopped); the figures are output tokens per second over the whole run
(prefill included) and the startup time. tools/gpu_check.sh --tp N runs this on N GPUs.
"""

from __future__ import annotations

import argparse
import json
import time

from tools.bench_throughput import make_workload


def run(size: int, prompts, outputs, args) -> dict:
    from rawpage import LLM, SamplingParams

    t0 = time.perf_counter()
    kw = {"load_format": "auto" if args.real else "dummy", "max_model_len": args.max_model_len}
    llm = LLM(args.model, device=args.device, tensor_parallel_size=size, max_num_seqs=args.max_num_seqs, **kw)
    startup = time.perf_counter() - t0
    try:
        params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outputs]
        reqs = [{"prompt_token_ids": p} for p in prompts]
        llm.generate(reqs[:2], params[:2], use_tqdm=False)  # warm-up
        t0 = time.perf_counter()
        llm.generate(reqs, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
    finally:
        if llm.engine.workers is not None:
            llm.engine.workers.close()
    return {"tp": size, "seconds": seconds, "output_tok_s": sum(outputs) / seconds, "startup_s": startup}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tools/configs/llama-135m-8h")
    ap.add_argument("--real", action="store_true", help="--model is a checkpoint, not a config for dummy weights")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tp", default="1,2", help="sizes to compare (default 1,2)")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--input-len", default="32:256")
    ap.add_argument("--output-len", default="32:64")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--result-file")
    args = ap.parse_args(argv)
    lo_in, hi_in = map(int, args.input_len.split(":"))
    lo_out, hi_out = map(int, args.output_len.split(":"))
    prompts, outputs = make_workload(args.num_requests, (lo_in, hi_in), (lo_out, hi_out), 1000, args.seed)
    rows = [run(int(s), prompts, outputs, args) for s in args.tp.split(",")]
    base = rows[0]["output_tok_s"]
    print(f"{'TP':>3} {'output tok/s':>13} {'vs first':>9} {'seconds':>8} {'startup s':>10}")
    for r in rows:
        r["speedup"] = r["output_tok_s"] / base
        print(
            f"{r['tp']:>3} {r['output_tok_s']:>13.1f} {r['speedup']:>8.2f}x {r['seconds']:>8.1f} {r['startup_s']:>10.1f}"
        )
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump({"device": args.device, "model": args.model, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
