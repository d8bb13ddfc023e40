"""Who should split the CPU's GEMMs over the cores: OpenBLAS, or the backend's own threads?

    python tools/bench_gemm_split.py                          # one GEMM: M rows by W (rows, 576)
    python tools/bench_gemm_split.py --busy 1                 # the same beside a spinning process
    python tools/bench_gemm_split.py --engine --batches 1 2 3 4 --pairs 6

The first form times (W · xᵀ)ᵀ three ways, median milliseconds over --reps calls, with
8 other weights' GEMVs between calls so that W comes from memory as in a forward
pass: OpenBLAS on one thread, OpenBLAS on every usable core, and CPUBackend's
_matmul_by_rows (W's rows in chunks that the backend's threads take in turn, one
BLAS thread each).

--engine measures what rawpage/backends/cpu.py's splits_by_rows decides: decode
tokens per second of the default model at each batch size, every GEMM left to
OpenBLAS ("off") or split by that rule ("on"), alternating --pairs times in one
process (the VM drifts by 10-20% from minute to minute; the median of each side is
reported).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time

import rawpage  # noqa: F401  (before NumPy: OpenBLAS's idle workers must sleep soon, rawpage/_blas_env.py)

# isort: split
import numpy as np
from threadpoolctl import threadpool_limits

import rawpage.backends.cpu as cpu_backend
from rawpage.backends.cpu_threads import usable_cores


def spin() -> None:
    while True:
        pass


def gemm_ms(batches: list[int], rows: list[int], reps: int) -> dict:
    be, rng, n = cpu_backend.CPUBackend(), np.random.default_rng(0), usable_cores()
    others = [rng.standard_normal((3072, 576), dtype=np.float32) for _ in range(8)]
    be.threads.current = n
    table = {}
    for r in rows:
        w = rng.standard_normal((r, 576), dtype=np.float32)
        for m in batches:
            x = rng.standard_normal((m, 576), dtype=np.float32)
            ways = {"openblas 1 thread": (1, False), f"openblas {n} threads": (n, False)}
            if be.pool is not None:
                ways[f"by rows, {n} threads"] = (1, True)
            cell = {}
            for name, (blas, by_rows) in ways.items():
                times = []
                with threadpool_limits(blas):
                    for _ in range(reps):
                        for o in others:
                            o @ x[0]
                        t = time.perf_counter()
                        _ = be._matmul_by_rows(x, w, n) if by_rows else (w @ x.T).T
                        times.append(time.perf_counter() - t)
                cell[name] = round(statistics.median(times) * 1e3, 3)
            table[f"M={m} rows={r}"] = cell
    return table


def engine_ab(model: str | None, batches: list[int], pairs: int, steps: int) -> dict:
    if __package__ in (None, ""):  # run as `python tools/bench_gemm_split.py`: tools/ is on sys.path
        from bench_cpu_threads import decode_tok_per_s
    else:
        from tools.bench_cpu_threads import decode_tok_per_s

    from rawpage import LLM

    llm = LLM(model, device="cpu", max_num_seqs=max(batches), log_stats_interval=0)
    rule, result = cpu_backend.splits_by_rows, {}
    try:
        for b in batches:
            runs = {"off": [], "on": []}
            for _ in range(pairs):
                for side in runs:
                    cpu_backend.splits_by_rows = rule if side == "on" else (lambda rows, w_bytes: False)
                    runs[side].append(round(decode_tok_per_s(llm, b, None, steps), 1))
            ratio = statistics.median(runs["on"]) / statistics.median(runs["off"])
            result[f"batch {b}"] = {**runs, "median on/off": round(ratio, 3)}
    finally:
        cpu_backend.splits_by_rows = rule
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 32], help="rows of x (batch sizes)")
    p.add_argument(
        "--rows", type=int, nargs="+", default=[576, 3072, 49152], help="rows of W (default: 576 3072 49152)"
    )
    p.add_argument("--reps", type=int, default=30, help="calls per cell (default: 30)")
    p.add_argument("--busy", type=int, default=0, help="spinning processes beside the measurement (default: 0)")
    p.add_argument("--model", default=None, help="--engine: model (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--engine", action="store_true", help="decode A/B of the split in the engine instead")
    p.add_argument("--pairs", type=int, default=4, help="--engine: off/on pairs per batch size (default: 4)")
    p.add_argument("--steps", type=int, default=32, help="--engine: timed decode steps per run (default: 32)")
    args = p.parse_args()
    burners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for b in burners:
        b.start()
    try:
        time.sleep(1.0 if burners else 0)
        if args.engine:
            out = engine_ab(args.model, args.batches, args.pairs, args.steps)
        else:
            out = gemm_ms(args.batches, args.rows, args.reps)
    finally:
        for b in burners:
            b.terminate()
    print(json.dumps({"usable_cores": usable_cores(), "busy_cores": args.busy, "result": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
