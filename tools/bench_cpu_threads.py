"""Decode speed on the CPU by batch size and BLAS thread count, quiet and beside a busy core.

    python tools/bench_cpu_threads.py                       # batches 1 8 32 64, 1 and all usable cores
    python tools/bench_cpu_threads.py --busy 1 --json r.json
    python tools/bench_cpu_threads.py --pairs 9 --batches 1  # the busy-core ratio

Each cell is decode tokens per second over --steps steps after the prompts are
prefilled (16-token prompts, greedy, ignore_eos). --busy N runs N spinning
processes beside the measurement (tools/cpu_burner.py). The default thread policy
(rawpage/backends/cpu_threads.py) is chosen from this table: run it on a machine
no other job is loading, or the figures say more about the other jobs than about us.

--pairs N measures issue 14's target instead: the default policy's decode speed
with one core kept busy, as a share of its quiet speed. A VM's speed drifts by
20% from minute to minute, so the quiet and busy runs alternate, N times, in one
process, and the median of the N ratios is the figure. After the burner starts,
the policy gets --settle seconds to see it (it reads the load every 0.25 s).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path


def spin() -> None:
    """A busy core: another job on the machine (tools/cpu_burner.py does the same for a command)."""
    while True:
        pass


def decode_tok_per_s(llm, batch: int, threads: int | None, steps: int) -> float:
    from rawpage import SamplingParams

    eng = llm.engine
    eng.backend.threads.cpu_threads = threads
    params = SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"b{batch}-t{threads}-{i}", {"prompt_token_ids": [100 + i] * 16}, params)
    while any(s.num_output_tokens == 0 for r in eng.requests.values() for s in r.seqs):
        eng.step()  # prefill, untimed
    start, done = time.perf_counter(), 0
    for _ in range(steps):
        for out in eng.step():
            done += sum(len(o.delta_token_ids) for o in out.outputs)
    elapsed = time.perf_counter() - start
    while eng.has_unfinished_requests():
        eng.step()
    return done / elapsed


def busy_ratio(llm, batch: int, steps: int, pairs: int, settle: float) -> dict:
    """The policy's tokens per second with one core busy over its quiet speed, alternating."""
    runs = []
    for _ in range(pairs):
        quiet = decode_tok_per_s(llm, batch, None, steps)
        burner = multiprocessing.Process(target=spin, daemon=True)
        burner.start()
        try:
            time.sleep(settle)
            busy = decode_tok_per_s(llm, batch, None, steps)
        finally:
            burner.terminate()
            burner.join()
        time.sleep(settle)  # the policy sees the core free again
        runs.append({"quiet": round(quiet, 1), "busy": round(busy, 1), "ratio": round(busy / quiet, 3)})
    return {"batch": batch, "pairs": runs, "median_ratio": statistics.median(r["ratio"] for r in runs)}


def main() -> int:
    from rawpage import LLM
    from rawpage.backends.cpu_threads import usable_cores

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64], help="batch sizes (default: 1 8 32 64)")
    p.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1 and all usable)")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per cell (default: 32)")
    p.add_argument("--busy", type=int, default=0, help="spinning processes beside the measurement (default: 0)")
    p.add_argument("--pairs", type=int, default=0, help="alternate quiet and one-core-busy runs N times (policy only)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds between starting the burner and a busy run")
    p.add_argument("--json", help="write the table here")
    args = p.parse_args()
    if args.pairs:
        llm = LLM(args.model, device="cpu", max_num_seqs=max(args.batches), log_stats_interval=0)
        result = {
            "usable_cores": usable_cores(),
            "busy_ratio": [busy_ratio(llm, b, args.steps, args.pairs, args.settle) for b in args.batches],
        }
        print(json.dumps(result, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    threads = args.threads or sorted({1, usable_cores()})
    burners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for b in burners:
        b.start()
    try:
        llm = LLM(args.model, device="cpu", max_num_seqs=max(args.batches), log_stats_interval=0)
        # "policy": the default (rawpage/backends/cpu_threads.py), which follows the other processes' load
        table = {
            f"batch {b}": {
                (f"{t} threads" if t else "policy"): round(decode_tok_per_s(llm, b, t, args.steps), 1)
                for t in [*threads, None]
            }
            for b in args.batches
        }
    finally:
        for b in burners:
            b.terminate()
    result = {"usable_cores": usable_cores(), "busy_cores": args.busy, "decode_tok_per_s": table}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
