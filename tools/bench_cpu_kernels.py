"""The CPU's GGUF and 16-bit kernels (rawpage/native/gguf_matmul.c, half_matmul.c) against
the read bandwidth, at the shapes of real models.

    python tools/bench_cpu_kernels.py                           # decode and prefill, 1B shapes, every format
    python tools/bench_cpu_kernels.py --shape 3b --formats Q4_K Q6_K
    python tools/bench_cpu_kernels.py --decode-only --threads 2
    python tools/bench_cpu_kernels.py --float-only              # a float checkpoint's forms (part 3)
    python tools/bench_cpu_kernels.py --path avx2 --threads 1
    python tools/bench_cpu_kernels.py --against OLD.so --formats Q4_K --threads 2 --rounds 60
    python tools/bench_cpu_kernels.py --against-prefill OLD.so --formats Q4_K Q6_K --threads 2 --prefill-tokens 96

Part 1, decode: one decode step's GEMVs (T = 1) over every layer of a model's shape
(--shape: Llama-3.2-1B's 16 layers of qkv 3072x2048, o 2048x2048, gate_up 16384x2048,
down 2048x8192; 3b, 8b, or SmolLM2-135M's), random blocks of each format repacked as the
backend holds them, called from C by a recording (native/graph.c), so no Python between
calls, as a replayed decode step makes them; the weights (hundreds of MB) come from
memory. Each row: GB/s of weight bytes and its share of a plain read of 256 MB
(rawpage/native/read_probe.c) on the same threads in the same run. The target (issue
40): >= 85%. Then the LM head at the shape's vocabulary (49152 rows, SmolLM2's, as the
shaped models) in Q6_K (Q8_0 at 135m) with the head's two roundings (parts=2).

Part 2, prefill: the gate_up and down weights at T = 128 and 512 tokens: GFLOP/s
(2 T N K / time) per format, and for one format the same product by BLAS on the weight
dequantized to float32 (what the NumPy path does).

Part 3, a float checkpoint's weights in the forms the native backend can hold them, on
the default model's shapes: float32 through np.matmul, Q8_0 quantized from float
(--quantization q8_0), bf16 and f16 widened exactly in the kernel, and bf16 through
vdpbf16ps on x rounded to bf16 (the measured alternative).

--against SO: only a decode step of one format (the first of --formats) on the last of
--threads, this build's and another build's library (e.g. main's: `build_library` in a
worktree of it prints its path) alternating in --rounds rounds in one process: the
median, mean and 90th percentile of the step, for a change that the best round would
not show (tools/cpu_burner.py beside it: how a busy machine treats each).
--against-prefill SO: the same for the prefill GEMMs of part 2, per format and token
count (best and median GFLOP/s of each build, and the ratio of the medians).

Times are the minimum over repeated calls (the machine may be shared; the minimum is
the least disturbed run); the load average is printed with each table.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial

import rawpage  # noqa: F401  (before NumPy: OpenBLAS's idle workers must sleep soon, rawpage/_blas_env.py)

# isort: split
import numpy as np
from threadpoolctl import threadpool_limits

from rawpage.dtypes import bf16_from_f32
from rawpage.native import isa
from rawpage.native.gguf import gguf_matmul, repack
from rawpage.native.half import half_matmul
from rawpage.native.library import NativeLibrary, load_path, recording
from rawpage.quantization.gguf import FORMATS, gguf_dequantize_ref
from rawpage.quantization.q8_0 import quantize_q8_0

# name -> (layers, [(weight, N, K)]): one layer's Linear weights, q|k|v and gate|up fused as the model fuses them
SHAPES = {
    "135m": (30, [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536)]),
    "1b": (16, [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate_up", 16384, 2048), ("down", 2048, 8192)]),
    "3b": (28, [("qkv", 5120, 3072), ("o", 3072, 3072), ("gate_up", 16384, 3072), ("down", 3072, 8192)]),
    "8b": (32, [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]),
}
VOCAB = 49152  # the shaped models' vocabulary (SmolLM2's tokenizer)
FORMATS_DEFAULT = ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q3_K", "IQ4_XS"]
_F16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def random_blocks(rng: np.random.Generator, qtype: str, N: int, K: int) -> np.ndarray:
    """(N, row_bytes) uint8: random quants, small finite float16 scales (the speed does
    not depend on the values)."""
    f = FORMATS[qtype]
    raw = rng.integers(0, 256, (N, K // f.block, f.block_bytes), dtype=np.uint8)
    for off in _F16_FIELDS[qtype]:
        scale = rng.uniform(0.002, 0.02, (N, K // f.block)).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(N, K // f.block, 2)
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


def alternating_seconds(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Each call's times over `rounds` rounds of 3 calls, the calls taking turns in ABBA
    order, so that the machine's drift and any other load fall on all of them."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        for name in list(calls)[:: 1 if r % 2 == 0 else -1]:
            for _ in range(3):
                t0 = time.perf_counter()
                calls[name]()
                times[name].append(time.perf_counter() - t0)
    return times


def read_gbs(lib, nbytes: int, nthreads: int, budget: float) -> float:
    """The read bandwidth the kernels are held to: GB/s of rawpage/native/read_probe.c
    reading nbytes once a call on nthreads of the kernels' pool (wide loads, no
    arithmetic to speak of)."""
    buf = np.ones(max(nbytes // 8, 512), np.uint64)
    return buf.nbytes / best_seconds(budget, lib.fn.rp_read_probe, buf.ctypes.data, buf.nbytes, nthreads) / 1e9


def record_step(lib, step: list, xs: dict, qtype: str, nth: int):
    """A recording of one decode step's GEMVs (step: per layer [(panels, N, K)]) on lib."""
    with recording(lib) as rec:
        for layer in step:
            for w, N, K in layer:
                gguf_matmul(lib, xs[K], w, qtype, (N, K), nth)
    return rec


def decode_table(lib, args) -> None:
    """Every format's step recorded first, then --rounds rounds of (the 256 MB read, each
    format's replay) on each thread count: this machine's memory bandwidth drifts by 10-30%
    from minute to minute (and from process to process), so each kernel is held to the
    read measured in the same rounds, and each figure is its best round."""
    rng = np.random.default_rng(0)
    layers, weights = SHAPES[args.shape]
    xs = {K: rng.standard_normal((1, K)).astype(np.float32) for _, _, K in weights}
    steps, skipped = {}, []
    for qtype in args.formats:
        if any(K % FORMATS[qtype].block for _, _, K in weights):
            skipped.append(qtype)
            continue
        steps[qtype] = [
            [(repack(lib, random_blocks(rng, qtype, N, K), qtype, (N, K), 2), N, K) for _, N, K in weights]
            for _ in range(layers)
        ]
    K = weights[1][2]
    qhead = "Q6_K" if K % 256 == 0 else "Q8_0"  # a Q4_K_M file's head; SmolLM2's Q8_0
    head = repack(lib, random_blocks(rng, qhead, VOCAB, K), qhead, (VOCAB, K), 2)
    buf = np.ones(256 << 17, np.uint64)  # 256 MB
    best: dict[tuple[str, int], float] = {}
    for nth in args.threads:
        recs = {qtype: record_step(lib, step, xs, qtype, nth) for qtype, step in steps.items()}
        with recording(lib) as recs["head"]:
            gguf_matmul(lib, xs[K], head, qhead, (VOCAB, K), nth, None, 2)
        for _ in range(args.rounds):
            runs = {"read": (buf.nbytes, lambda n: lib.fn.rp_read_probe(buf.ctypes.data, buf.nbytes, n))}
            runs |= {q: (sum(w.nbytes for layer in st for w, _, _ in layer), recs[q].replay) for q, st in steps.items()}
            runs["head"] = (head.nbytes, recs["head"].replay)
            for name, (nbytes, fn) in runs.items():
                t0 = time.perf_counter()
                fn(nth)
                best[name, nth] = max(best.get((name, nth), 0.0), nbytes / (time.perf_counter() - t0) / 1e9)
    read = ", ".join(f"{best['read', n]:.1f} GB/s on {n}" for n in args.threads)
    print(
        f"\n## Decode GEMVs, {args.shape} shapes ({layers} layers), {lib.path} path, load average "
        f"{os.getloadavg()[0]:.1f}; 256 MB read, best of {args.rounds} rounds: {read}\n"
    )
    print(
        "| format | MB a step | "
        + " | ".join(f"{n} thread{'s' * (n > 1)}: GB/s (% of read)" for n in args.threads)
        + " |"
    )
    print("|---|---|" + "---|" * len(args.threads))
    for name, step in [*steps.items(), ("head", None)]:
        nbytes = head.nbytes if step is None else sum(w.nbytes for layer in step for w, _, _ in layer)
        label = f"LM head {VOCAB}x{K} {qhead}, parts=2" if step is None else name
        cells = [f"{best[name, n]:.1f} ({100 * best[name, n] / best['read', n]:.0f}%)" for n in args.threads]
        print(f"| {label} | {nbytes / 1e6:.0f} | " + " | ".join(cells) + " |")
    for qtype in skipped:
        print(f"| {qtype} | (K of {args.shape} is no multiple of its {FORMATS[qtype].block}-value block) |")


def against_table(lib, args) -> None:
    """--against SO: one decode step's GEMVs (the first of --formats, --shape's layers) of
    this build and of another build's library, from one recording each, alternating in
    --rounds rounds (ABBA) of 3 steps in one process, so that the machine's drift and any
    other load fall on both: ms a step, median, mean and 90th percentile."""
    other = NativeLibrary(lib.path, args.against)
    rng = np.random.default_rng(0)
    layers, weights = SHAPES[args.shape]
    qtype, nth = args.formats[0], args.threads[-1]
    xs = {K: rng.standard_normal((1, K)).astype(np.float32) for _, _, K in weights}
    step = [
        [(repack(lib, random_blocks(rng, qtype, N, K), qtype, (N, K), 2), N, K) for _, N, K in weights]
        for _ in range(layers)
    ]
    builds = {"this build": lib, "other": other}
    recs = {name: record_step(build, step, xs, qtype, nth) for name, build in builds.items()}
    times = alternating_seconds({name: partial(rec.replay, nth) for name, rec in recs.items()}, args.rounds)
    nbytes = sum(w.nbytes for layer in step for w, _, _ in layer)
    print(
        f"\n## {qtype} decode step, {args.shape} shapes ({nbytes / 1e6:.0f} MB), {nth} threads, {lib.path} path, "
        f"{args.rounds} rounds; load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| build | median ms | mean ms | p90 ms |\n|---|---|---|---|")
    for name, ts in times.items():
        ms = np.array(ts) * 1e3
        print(f"| {name} | {np.median(ms):.2f} | {ms.mean():.2f} | {np.percentile(ms, 90):.2f} |")


def against_prefill_table(lib, args) -> None:
    """--against-prefill SO: the prefill GEMMs (--shape's gate|up and down, at each of
    --prefill-tokens) of each of --formats, this build's library and another's alternating
    (ABBA) in --rounds rounds of 3 calls in one process: GFLOP/s, best and median, and the
    ratio of the medians. The two builds must take the same scratch (native/gguf.py
    scratch_bytes)."""
    builds = {"this build": lib, "other": NativeLibrary(lib.path, args.against_prefill)}
    rng = np.random.default_rng(1)
    _, weights = SHAPES[args.shape]
    nth = args.threads[-1]
    print(
        f"\n## Prefill GEMMs against another build, {args.shape} shapes, {nth} threads, {lib.path} path, "
        f"{args.rounds} rounds; load average {os.getloadavg()[0]:.1f} (GFLOP/s, best / median)\n"
    )
    print("| format | weight | T | this build | other | median ratio |\n|---|---|---|---|---|---|")
    for qtype in args.formats:
        if any(K % FORMATS[qtype].block for _, _, K in weights):
            continue
        for name, N, K in weights[2:]:
            w = repack(lib, random_blocks(rng, qtype, N, K), qtype, (N, K), 2)
            for T in args.prefill_tokens:
                x = rng.standard_normal((T, K)).astype(np.float32)
                calls = {b: partial(gguf_matmul, build, x, w, qtype, (N, K), nth) for b, build in builds.items()}
                times = alternating_seconds(calls, args.rounds)
                gf = {
                    b: (2 * T * N * K / min(ts) / 1e9, 2 * T * N * K / np.median(ts) / 1e9) for b, ts in times.items()
                }
                cells = " | ".join(f"{best:.0f} / {med:.0f}" for best, med in gf.values())
                ratio = gf["this build"][1] / gf["other"][1]
                print(f"| {qtype} | {name} {N}x{K} | {T} | {cells} | {ratio:.2f} |")


def prefill_table(lib, args) -> None:
    rng = np.random.default_rng(1)
    _, weights = SHAPES[args.shape]
    print(
        f"\n## Prefill GEMMs, {args.shape} shapes, {lib.path} path, load average {os.getloadavg()[0]:.1f} (GFLOP/s)\n"
    )
    cols = [(name, N, K, T) for name, N, K in weights[2:] for T in args.prefill_tokens]
    print("| format | threads | " + " | ".join(f"{n} {N}x{K}, T={T}" for n, N, K, T in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    fits = [q for q in args.formats if not any(K % FORMATS[q].block for _, _, K in weights)]
    for qtype in fits + ["BLAS, dequantized"]:
        fmt = fits[0] if qtype.startswith("BLAS") else qtype
        packed = {(N, K): random_blocks(rng, fmt, N, K) for _, N, K in weights[2:]}
        for nth in args.threads:
            cells = []
            for _, N, K, T in cols:
                x = rng.standard_normal((T, K)).astype(np.float32)
                if qtype.startswith("BLAS"):
                    dense = gguf_dequantize_ref(packed[N, K], fmt, (N, K))
                    with threadpool_limits(nth):
                        sec = best_seconds(args.budget, lambda x=x, dense=dense: (dense @ x.T).T)
                else:
                    w = repack(lib, packed[N, K], qtype, (N, K), 2)
                    sec = best_seconds(args.budget, gguf_matmul, lib, x, w, qtype, (N, K), nth)
                cells.append(f"{2 * T * N * K / sec / 1e9:.0f}")
            label = f"BLAS, {fmt} dequantized to float32" if qtype.startswith("BLAS") else qtype
            print(f"| {label} | {nth} | " + " | ".join(cells) + " |")


def float_forms(lib, w: np.ndarray, lm_head: bool) -> list[tuple[str, np.ndarray, Callable[..., np.ndarray]]]:
    """(form, weight array, fn(lib, x, nthreads)) for each way a float weight w (N, K) can be held."""
    N, K = w.shape
    dense, bf16, f16 = np.ascontiguousarray(w), bf16_from_f32(w), w.astype(np.float16).view(np.uint16)
    q8 = repack(lib, quantize_q8_0(w), "Q8_0", (N, K), 2)
    parts = 2 if lm_head else 1
    return [
        ("float32, np.matmul", dense, lambda lib, x, nth: (dense @ x.T).T),
        (
            "Q8_0 (lm_head: parts=2)" if lm_head else "Q8_0",
            q8,
            lambda lib, x, nth: gguf_matmul(lib, x, q8, "Q8_0", (N, K), nth, None, parts),
        ),
        ("bf16 exact (FMA)", bf16, lambda lib, x, nth: half_matmul(lib, x, bf16, nth)),
        ("f16 exact (F16C + FMA)", f16, lambda lib, x, nth: half_matmul(lib, x, f16, nth, f16=True)),
        ("bf16 vdpbf16ps, x rounded", bf16, lambda lib, x, nth: half_matmul(lib, x, bf16, nth, round_x=True)),
    ]


def float_table(lib, args) -> None:
    rng = np.random.default_rng(2)
    print(f"\n## A float checkpoint's weights: float32, Q8_0, bf16, f16; {lib.path} path (weight GB/s, GFLOP/s)\n")
    print("| weight | form | MB | threads | " + " | ".join(f"T={t}" for t in args.tokens) + " |")
    print("|---|---|---|---|" + "---|" * len(args.tokens))
    _, weights = SHAPES["135m"]
    for name, N, K in [*weights, ("lm_head", VOCAB, 576)]:
        w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        for form, data, fn in float_forms(lib, w, name == "lm_head"):
            for nth in args.threads:
                cells = []
                with threadpool_limits(nth):
                    for T in args.tokens:
                        x = rng.standard_normal((T, K)).astype(np.float32)
                        sec = best_seconds(args.budget, fn, lib, x, nth)
                        cells.append(f"{data.nbytes / sec / 1e9:.1f} GB/s, {2 * T * N * K / sec / 1e9:.0f} GF")
                print(f"| {name} {N}x{K} | {form} | {data.nbytes / 1e6:.1f} | {nth} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", default=isa.selected_path(), choices=isa.runnable_paths(), help="instruction-set path")
    p.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    p.add_argument("--formats", nargs="+", default=FORMATS_DEFAULT, choices=sorted(FORMATS))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--prefill-tokens", type=int, nargs="+", default=[128, 512])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 128], help="part 3's token counts")
    p.add_argument("--budget", type=float, default=0.3, help="seconds of repeats per measurement")
    p.add_argument("--rounds", type=int, default=8, help="part 1's interleaved rounds (each figure: its best)")
    part = p.add_mutually_exclusive_group()
    part.add_argument("--decode-only", action="store_true")
    part.add_argument("--prefill-only", action="store_true")
    part.add_argument("--float-only", action="store_true", help="only part 3: float32, Q8_0, bf16 and f16 weights")
    part.add_argument("--against", metavar="SO", help="only: this build's decode step against another build's library")
    part.add_argument(
        "--against-prefill", metavar="SO", help="only: this build's prefill GEMMs against another build's library"
    )
    args = p.parse_args()
    lib = load_path(args.path)
    if args.against:
        against_table(lib, args)
        return
    if args.against_prefill:
        against_prefill_table(lib, args)
        return
    if not (args.prefill_only or args.float_only):
        decode_table(lib, args)
    if not (args.decode_only or args.float_only):
        prefill_table(lib, args)
    if args.float_only:
        float_table(lib, args)


if __name__ == "__main__":
    main()
