"""What drawing the next token costs on the host: rawpage/sampler.py on rows of logits as
wide as a real vocabulary, apart from any model.

    python tools/bench_sampler.py                      # 49,152 columns (SmolLM2's), batches 1 and 32
    python tools/bench_sampler.py --vocab 151936 --batches 1 8

Each row of the table is one SamplingParams: greedy (the argmax), plain temperature
(the OpenAI clients' default of 1.0), top_p, and llama.cpp's default chain (top_k 40,
top_p 0.95, min_p 0.05, temperature 0.8). A call is Sampler.__call__ on (batch, vocab)
float32 logits drawn N(0, 3): the logit copies, the processors, the distribution and
the draw, with glibc's thresholds as the CPU backend sets them. The time is the best of --rounds rounds of --calls calls (the first round
also warms the allocator up), per call and per row.
"""

from __future__ import annotations

import rawpage  # noqa: F401  (first: it sets how long OpenBLAS spins before NumPy loads it)

# isort: split
import argparse
import time

import numpy as np

from rawpage.backends.cpu_malloc import keep_freed_memory
from rawpage.sampler import Sampler
from rawpage.sampling_params import SamplingParams
from rawpage.sequence import Request, Sequence

PARAMS = {
    "greedy": SamplingParams(temperature=0),
    "temperature 1.0": SamplingParams(temperature=1.0),
    "temperature 0.7, top_p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
    "top_k 40, top_p 0.95, min_p 0.05, temperature 0.8": SamplingParams(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05
    ),
}


def sequences(params: SamplingParams, n: int) -> list[Sequence]:
    out = []
    for i in range(n):
        req = Request(f"r{i}", None, [1, 2, 3], params)
        seq = Sequence(i, req, [1, 2, 3], 0, i)
        req.seqs.append(seq)
        out.append(seq)
    return out


def best_ms(sampler: Sampler, logits: np.ndarray, seqs: list[Sequence], calls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        for _ in range(calls):
            sampler(logits, seqs)
        best = min(best, (time.perf_counter() - t0) / calls * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    keep_freed_memory()  # as the CPU backend sets it: large temporaries reuse their pages
    sampler = Sampler(args.vocab, [0])
    rng = np.random.default_rng(0)
    print(f"## Sampler, {args.vocab} columns: ms a call (ms a row)\n")
    print("| parameters | " + " | ".join(f"batch {b}" for b in args.batches) + " |")
    print("|---|" + "---|" * len(args.batches))
    for name, params in PARAMS.items():
        cells = []
        for b in args.batches:
            logits = (rng.standard_normal((b, args.vocab)) * 3).astype(np.float32)
            ms = best_ms(sampler, logits, sequences(params, b), max(1, args.calls // b), args.rounds)
            cells.append(f"{ms:.3f} ({ms / b:.3f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
