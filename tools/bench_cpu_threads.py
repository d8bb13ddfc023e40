"""Decode speed on the CPU by batch size and BLAS thread count, quiet and beside a busy core.

    python tools/bench_cpu_threads.py                       # batches 1 8 32 64, 1 and all usable cores
    python tools/bench_cpu_threads.py --busy 1 --json r.json

Each cell is decode tokens per second over --steps steps after the prompts are
prefilled (16-token prompts, greedy, ignore_eos). --busy N runs N spinning
processes beside the measurement (tools/cpu_burner.py). The default thread policy
(rawpage/backends/cpu_threads.py) is chosen from this table: run it on a machine
no other job is loading, or the figures say more about the other jobs than about us.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
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


def main() -> int:
    from rawpage import LLM
    from rawpage.backends.cpu_threads import usable_cores

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64], help="batch sizes (default: 1 8 32 64)")
    p.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1 and all usable)")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per cell (default: 32)")
    p.add_argument("--busy", type=int, default=0, help="spinning processes beside the measurement (default: 0)")
    p.add_argument("--json", help="write the table here")
    args = p.parse_args()
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
