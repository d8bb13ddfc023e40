"""The CPU's GGUF and bf16 kernels (rawpage/native/gguf_matmul.c, bf16_matmul.c) against
the read bandwidth.

    python tools/bench_cpu_kernels.py                        # the tables, this CPU's best path
    python tools/bench_cpu_kernels.py --path avx2 --threads 1
    python tools/bench_cpu_kernels.py --crossover-only       # prefill: int kernel vs dequantize + NumPy
    python tools/bench_cpu_kernels.py --float-only           # a float checkpoint's forms (part 3)
    python tools/bench_cpu_kernels.py --step-only            # a decode step's GEMVs, replayed from C

Part 1, decode and small batches: y = x W^T for the default model's weights
(SmolLM2-135M: Q4_1 576x576, gate_up 3072x576, down 576x1536, the Q8_0 LM head
49152x576) and larger K-quant ones, at T = 1, 2, 4, 8, 32, 128 tokens, on 1 and 2
threads. Each row: the kernel's GB/s (weight bytes / time), GFLOP/s (2 T N K / time),
and, at T = 1, its share of the read bandwidth measured in the same run: a plain read
(rawpage/native/read_probe.c; before 2026-12-02's third session a NumPy sum, which its
adds bind below what the kernels reach) of an array of the weight's size (so from the same cache level: the weight is read
call after call, as the same layer's weight is in a decode step's timing loop), split
over the same number of threads, and over 256 MB (DRAM). The target: T = 1 at >= 80%
of the same-size read. Then the same GEMVs as a replayed decode step makes them: 30
layers' qkv, o, gate_up and down weights in turn (from memory), called from C by a
recording (rawpage/native/graph.c), against the 256 MB read of the same run.

Part 2, prefill: at T = 16 .. 512 the int kernel against np.matmul on the weight
already dequantized to float32 (today's CPU path: dense W in memory) and against
dequantizing it (gguf_rows, all rows) and then np.matmul; the crossover is the
smallest T where the dense path is faster.

Part 3, a float checkpoint's weights in the forms the native backend can hold them,
on the default model's shapes: float32 through np.matmul (the NumPy backend; also
what --quantization none gives), Q8_0 quantized from float (--quantization q8_0:
quantization/q8_0.py, then gguf_matmul; the LM head row runs lm_head_q8_0, as the
backend does), bf16 widened exactly in the kernel (a bf16 checkpoint, what the backend
runs), and bf16 through vdpbf16ps on x rounded to bf16 (the measured alternative).

Times are the minimum over repeated calls (the machine may be shared; the minimum
is the least disturbed run); the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable

import rawpage  # noqa: F401  (before NumPy: OpenBLAS's idle workers must sleep soon, rawpage/_blas_env.py)

# isort: split
import numpy as np
from threadpoolctl import threadpool_limits

from rawpage.dtypes import bf16_from_f32
from rawpage.native import isa
from rawpage.native.bf16 import bf16_matmul
from rawpage.native.gguf import gguf_matmul, gguf_rows
from rawpage.native.library import load_path, recording
from rawpage.native.lm_head import lm_head_q8_0
from rawpage.quantization.gguf import GGUF_BLOCKS
from rawpage.quantization.q8_0 import quantize_q8_0

# (name, qtype, N, K): the default model's weights, then larger ones
WEIGHTS = [
    ("attn 576x576", "Q4_1", 576, 576),
    ("gate_up 3072x576", "Q4_1", 3072, 576),
    ("down 576x1536", "Q4_1", 576, 1536),
    ("lm_head 49152x576", "Q8_0", 49152, 576),
    ("4096x4096", "Q4_K", 4096, 4096),
    ("4096x4096", "Q6_K", 4096, 4096),
]
CROSSOVER_WEIGHTS = WEIGHTS[:3]
_F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_weight(rng: np.random.Generator, qtype: str, N: int, K: int) -> np.ndarray:
    """(N, row_bytes) uint8: random quants, small finite float16 scales (the speed does
    not depend on the values)."""
    block, size = GGUF_BLOCKS[qtype]
    raw = rng.integers(0, 256, (N, K // block, size), dtype=np.uint8)
    for off in _F16_FIELDS[qtype]:
        scale = rng.uniform(0.002, 0.02, (N, K // block)).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(N, K // block, 2)
    return raw.reshape(N, -1)


def best_seconds(budget: float, fn: Callable[..., object], *args: object) -> float:
    """The fastest of repeated calls fn(*args) within about `budget` seconds (at least 3)."""
    fn(*args)
    best, start, n = float("inf"), time.perf_counter(), 0
    while n < 3 or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
        n += 1
    return best


def _sum_round(part: np.ndarray, reps: int, barrier: threading.Barrier, ends: list[float]) -> None:
    barrier.wait()
    for _ in range(reps):
        part.sum()
    ends.append(time.perf_counter())


def read_gbs(lib, nbytes: int, nthreads: int, budget: float) -> float:
    """The read bandwidth the kernels are held to: GB/s of rawpage/native/read_probe.c
    reading nbytes once a call on nthreads of the kernels' pool (wide loads, no
    arithmetic to speak of; a NumPy sum is bound by its adds, see numpy_read_gbs)."""
    buf = np.ones(max(nbytes // 8, 512), np.uint64)
    return buf.nbytes / best_seconds(budget, lib.fn.rp_read_probe, buf.ctypes.data, buf.nbytes, nthreads) / 1e9


def numpy_read_gbs(nbytes: int, nthreads: int, budget: float) -> float:
    """GB/s of NumPy sums over nbytes of float32, split over nthreads (NumPy lets go of
    the GIL in the sum): the reference of the sections before 2026-12-02's third session.
    Each thread sums its part `reps` times after a common barrier, so that starting
    threads is not timed; like a kernel call, each sum pays Python's call overhead."""
    parts = np.array_split(np.ones(max(nbytes // 4, 1024), dtype=np.float32), nthreads)
    reps = max(1, int(2e-2 * 20e9 / max(nbytes, 1)))  # ~20 ms a round at 20 GB/s
    best, start = float("inf"), time.perf_counter()
    while best == float("inf") or time.perf_counter() - start < budget:
        barrier, ends = threading.Barrier(nthreads), []
        threads = [threading.Thread(target=_sum_round, args=(p, reps, barrier, ends)) for p in parts[1:]]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        _sum_round(parts[0], reps, barrier, ends)
        for t in threads:
            t.join()
        best = min(best, (max(ends) - t0) / reps)
    return nbytes / best / 1e9


def dequantize_then_matmul(lib, x: np.ndarray, data: np.ndarray, qtype: str, shape: tuple[int, int], nth: int):
    """The float path on a quantized weight: W (N, K) float32 from its blocks, then x W^T."""
    return np.matmul(x, gguf_rows(lib, data, qtype, shape, np.arange(shape[0]), nth).T)


def decode_table(lib, args) -> None:
    rng = np.random.default_rng(0)
    dram = {nth: read_gbs(lib, 256 << 20, nth, 1.0) for nth in args.threads}
    print(
        f"\n## GGUF GEMV/GEMM, {lib.path} path, load average {os.getloadavg()[0]:.1f}; "
        f"256 MB read: {', '.join(f'{dram[n]:.1f} GB/s on {n}' for n in args.threads)}\n"
    )
    print("| weight | type | MB | threads | same-size read GB/s | " + " | ".join(f"T={t}" for t in args.tokens) + " |")
    print("|---|---|---|---|---|" + "---|" * len(args.tokens))
    for name, qtype, N, K in WEIGHTS:
        data = random_weight(rng, qtype, N, K)
        for nth in args.threads:
            same = read_gbs(lib, data.nbytes, nth, args.budget)
            cells = []
            for T in args.tokens:
                x = rng.standard_normal((T, K)).astype(np.float32)
                sec = best_seconds(args.budget, gguf_matmul, lib, x, data, qtype, (N, K), nth)
                gbs, gflops = data.nbytes / sec / 1e9, 2 * T * N * K / sec / 1e9
                share = f" ({100 * gbs / same:.0f}%)" if T == 1 else ""
                cells.append(f"{gbs:.1f} GB/s{share}, {gflops:.0f} GF")
            print(f"| {name} | {qtype} | {data.nbytes / 1e6:.1f} | {nth} | {same:.1f} | " + " | ".join(cells) + " |")


# A decode step's layer GEMVs: the default model's 30 layers (SmolLM2-135M, Q4_1)
STEP_LAYERS = 30
STEP_WEIGHTS = [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536)]


def step_table(lib, args) -> None:
    """The layer GEMVs at T = 1 as a replayed decode step makes them: every layer's weight
    in turn, called from C by a recording (native/graph.c), so no Python between calls.
    One recording per weight kind (its 30 calls; some kinds' 30 weights fit the L3 cache)
    and one of the whole step (120 calls in layer order, 66 MB: from memory)."""
    rng = np.random.default_rng(3)
    layers = [{k: random_weight(rng, "Q4_1", N, K) for k, N, K in STEP_WEIGHTS} for _ in range(STEP_LAYERS)]
    xs = {K: rng.standard_normal((1, K)).astype(np.float32) for K in {K for _, _, K in STEP_WEIGHTS}}
    shapes = {k: (N, K) for k, N, K in STEP_WEIGHTS}
    kinds_mb = {k: sum(layer[k].nbytes for layer in layers) / 1e6 for k, _, _ in STEP_WEIGHTS}
    total = sum(w.nbytes for layer in layers for w in layer.values())
    print(
        f"\n## Decode-step GEMVs (T = 1, Q4_1, {STEP_LAYERS} layers, {total / 1e6:.0f} MB), replayed from C, "
        f"{lib.path} path, load average {os.getloadavg()[0]:.1f}\n"
    )
    print("Each kind's 30 weights: " + ", ".join(f"{k} {mb:.0f} MB" for k, mb in kinds_mb.items()) + ".\n")
    head = "| threads | read 256 MB | read the step's bytes | NumPy sum 256 MB | "
    print(head + " | ".join(kinds_mb) + " | whole step |")
    print("|---|---|---|---|" + "---|" * (len(kinds_mb) + 1))
    for nth in args.threads:
        dram, same = read_gbs(lib, 256 << 20, nth, 1.0), read_gbs(lib, total, nth, 1.0)
        numpy_dram = numpy_read_gbs(256 << 20, nth, 1.0)
        cells = []
        for kinds in [[k] for k in kinds_mb] + [list(kinds_mb)]:
            with recording(lib) as rec:
                for layer in layers:
                    for k in kinds:
                        gguf_matmul(lib, xs[shapes[k][1]], layer[k], "Q4_1", shapes[k], nth)
            nbytes = sum(layer[k].nbytes for layer in layers for k in kinds)
            gbs = nbytes / best_seconds(args.budget, rec.replay, nth) / 1e9
            cells.append(f"{gbs:.1f} ({100 * gbs / dram:.0f}%)")
        print(f"| {nth} | {dram:.1f} | {same:.1f} | {numpy_dram:.1f} | " + " | ".join(cells) + " |")
    print("\n(GB/s of weight bytes; in brackets, the share of the 256 MB read (read_probe.c) in the same run)")


def crossover_table(lib, args) -> None:
    rng = np.random.default_rng(1)
    print(f"\n## Prefill: int kernel vs dense float32 W + np.matmul, {lib.path} path (ms; x = fastest)\n")
    print("| weight | threads | T | int kernel | np.matmul, W dense | dequantize + np.matmul |")
    print("|---|---|---|---|---|---|")
    for name, qtype, N, K in CROSSOVER_WEIGHTS:
        data = random_weight(rng, qtype, N, K)
        for nth in args.threads:
            dense = gguf_rows(lib, data, qtype, (N, K), np.arange(N), nth)  # (N, K) float32
            crossed = None
            with threadpool_limits(nth):
                for T in args.crossover_tokens:
                    x = rng.standard_normal((T, K)).astype(np.float32)
                    t_int = best_seconds(args.budget, gguf_matmul, lib, x, data, qtype, (N, K), nth)
                    t_dense = best_seconds(args.budget, np.matmul, x, dense.T)
                    t_deq = best_seconds(args.budget, dequantize_then_matmul, lib, x, data, qtype, (N, K), nth)
                    ms = [t_int * 1e3, t_dense * 1e3, t_deq * 1e3]
                    mark = [f"{m:.3f}" + (" x" if m == min(ms) else "") for m in ms]
                    print(f"| {name} {qtype} | {nth} | {T} | " + " | ".join(mark) + " |")
                    if crossed is None and t_dense < t_int:
                        crossed = T
            print(f"| {name} {qtype} | {nth} | crossover (dense W faster) | T = {crossed or 'none'} | | |")


def float_forms(w: np.ndarray, lm_head: bool) -> list[tuple[str, np.ndarray, Callable[..., np.ndarray]]]:
    """(form, weight array, fn(lib, x, nthreads)) for each way a float weight w (N, K) can be held."""
    N, K = w.shape
    dense, q8, bf16 = np.ascontiguousarray(w), quantize_q8_0(w), bf16_from_f32(w)

    def q8_0(lib, x, nth):
        if lm_head:
            return lm_head_q8_0(lib, x, q8, (N, K), nth)
        return gguf_matmul(lib, x, q8, "Q8_0", (N, K), nth)

    return [
        ("float32, np.matmul", dense, lambda lib, x, nth: (dense @ x.T).T),
        ("Q8_0 (lm_head: float x)" if lm_head else "Q8_0", q8, q8_0),
        ("bf16 exact (FMA)", bf16, lambda lib, x, nth: bf16_matmul(lib, x, bf16, nth)),
        ("bf16 vdpbf16ps, x rounded", bf16, lambda lib, x, nth: bf16_matmul(lib, x, bf16, nth, round_x=True)),
    ]


def float_table(lib, args) -> None:
    rng = np.random.default_rng(2)
    print(f"\n## A float checkpoint's weights: float32, Q8_0, bf16; {lib.path} path (weight GB/s, GFLOP/s)\n")
    print("| weight | form | MB | threads | same-size read GB/s | " + " | ".join(f"T={t}" for t in args.tokens) + " |")
    print("|---|---|---|---|---|" + "---|" * len(args.tokens))
    for name, _, N, K in WEIGHTS[:4]:
        w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        for form, data, fn in float_forms(w, name.startswith("lm_head")):
            for nth in args.threads:
                same = read_gbs(lib, data.nbytes, nth, args.budget)
                cells = []
                with threadpool_limits(nth):
                    for T in args.tokens:
                        x = rng.standard_normal((T, K)).astype(np.float32)
                        sec = best_seconds(args.budget, fn, lib, x, nth)
                        gbs, gflops = data.nbytes / sec / 1e9, 2 * T * N * K / sec / 1e9
                        share = f" ({100 * gbs / same:.0f}%)" if T == 1 else ""
                        cells.append(f"{gbs:.1f} GB/s{share}, {gflops:.0f} GF")
                row = f"| {name} | {form} | {data.nbytes / 1e6:.1f} | {nth} | {same:.1f} | "
                print(row + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", default=isa.selected_path(), choices=isa.runnable_paths(), help="instruction-set path")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 32, 128])
    p.add_argument("--crossover-tokens", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    p.add_argument("--budget", type=float, default=0.15, help="seconds of repeats per measurement")
    p.add_argument("--crossover-only", action="store_true")
    p.add_argument("--float-only", action="store_true", help="only part 3: float32, Q8_0 and bf16 weights")
    p.add_argument("--step-only", action="store_true", help="only the decode step's GEMVs, replayed from C")
    args = p.parse_args()
    lib = load_path(args.path)
    if args.step_only:
        step_table(lib, args)
        return
    if args.float_only:
        float_table(lib, args)
        return
    if not args.crossover_only:
        decode_table(lib, args)
        step_table(lib, args)
    crossover_table(lib, args)
    if not args.crossover_only:
        float_table(lib, args)


if __name__ == "__main__":
    main()
