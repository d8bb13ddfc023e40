"""Decode attention on the CPU: the C kernel (rawpage/native/paged_attention.c) against
the NumPy path (CPUBackend without the kernels: paged_attention_ref), in GB/s of K/V read.

    python tools/bench_cpu_attention.py                        # batches 1 8 32, contexts 256 1024 4096
    python tools/bench_cpu_attention.py --batches 8 --contexts 1024 --dtypes float16 --json r.json
    python tools/bench_cpu_attention.py --shape 1b --batches 1 16 --contexts 160 1024
    python tools/bench_cpu_attention.py --against OLD.so --batches 1 2 4 --contexts 64 256 600

--against SO times the C kernel of another build (e.g. main's: `build_library` in a
worktree of it prints its path) instead of the NumPy path, the two alternating in
rounds (--rounds) in one process, so that a busy machine's load falls on both: the
median call, its 10th percentile and the fastest (on a shared machine a call whose
second thread the OS preempts waits ~0.5 ms: the lower columns are the undisturbed
calls), and the ratio of the 10th percentiles (other / this build).

One call is one layer of a decode step of the default model's attention shape (H 9,
Hkv 3, D 64: SmolLM2-135M; --shape 1b: Llama-3.2-1B's H 32, Hkv 8, where one head's K
row of a key lies 2 KiB past the previous key's; --shape 3b: Llama-3.2-3B's H 24,
Hkv 8, D 128): B sequences of one query each over a context of the given length, their
blocks scattered over the pool. A step reads every layer's K/V once,
and 30 layers of it do not stay in the L3 cache, so the calls cycle over as many
layers' pools (up to 30) as it takes to pass --cold-bytes: each call reads its K/V
from memory as it would in a real step. GB/s = K and V bytes of the batch / time of a
call (median of the repeats). Both paths get --threads threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BS, LAYERS = 16, 30
SHAPES = {"135m": (9, 3, 64), "1b": (32, 8, 64), "3b": (24, 8, 128)}  # (query heads H, KV heads Hkv, head size D)
H, HKV, D = SHAPES["135m"]  # main() sets them from --shape


def pools(rng, batch: int, context: int, dtype: np.dtype, cold_bytes: int) -> tuple[list, np.ndarray]:
    """[(k_cache, v_cache)] for enough layers to pass cold_bytes, and (B, blocks) tables."""
    per_seq = -(-context // BS)
    nb = batch * per_seq
    layer_bytes = 2 * nb * BS * HKV * D * np.dtype(dtype).itemsize
    layers = max(1, min(LAYERS, -(-cold_bytes // layer_bytes)))
    caches = [
        tuple(rng.random((nb, BS, HKV, D), dtype=np.float32).astype(dtype) - np.asarray(0.5, dtype) for _ in "kv")
        for _ in range(layers)
    ]
    tables = rng.permutation(nb).reshape(batch, per_seq).astype(np.int32)
    return caches, tables


def time_calls(fn, caches: list, min_time: float, min_calls: int) -> float:
    """Median seconds of one call, cycling over the layers' pools."""
    times, i = [], 0
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < min_time:
        k, v = caches[i % len(caches)]
        t = time.perf_counter()
        fn(k, v)
        times.append(time.perf_counter() - t)
        i += 1
    return statistics.median(times)


def time_rounds(fns: dict, caches: list, args) -> dict:
    """{name: [seconds of each call]} of fns alternating in --rounds rounds (ABBA order);
    each round starts after a pause, so that the other build's pool workers have stopped
    spinning, and after a few calls that are not timed."""
    times: dict = {name: [] for name in fns}
    for r in range(args.rounds):
        for name in list(fns)[:: 1 if r % 2 == 0 else -1]:
            time.sleep(0.01)
            for i in range(3):
                fns[name](*caches[i % len(caches)])
            for i in range(args.min_calls):
                k, v = caches[i % len(caches)]
                t = time.perf_counter()
                fns[name](k, v)
                times[name].append(time.perf_counter() - t)
    return times


def cell(lib, backend, batch: int, context: int, dtype: str, args) -> dict:
    from rawpage.native.attention import paged_attention
    from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions

    rng = np.random.default_rng(batch * context)
    caches, tables = pools(rng, batch, context, np.dtype(dtype), args.cold_bytes)
    q = rng.standard_normal((batch, H, D)).astype(np.float32)
    seq_lens = np.full(batch, context, np.int32)
    qsl = np.arange(batch + 1, dtype=np.int32)
    meta = AttentionMetadata(tables, seq_lens, qsl, max_query_len=1, max_seq_len=context)
    opts = AttentionOptions(D**-0.5)

    def native(k, v):
        paged_attention(lib, q, k, v, meta, opts, args.threads)

    def numpy_path(k, v):
        backend.paged_attention(q, k, v, meta, opts)

    kv_bytes = 2 * batch * context * HKV * D * np.dtype(dtype).itemsize
    row = {"dtype": dtype, "batch": batch, "context": context, "layers": len(caches)}
    if backend is None:  # --against: this build's kernel and the other's
        fns = {
            "c": native,
            "against": lambda k, v: paged_attention(args.against_lib, q, k, v, meta, opts, args.threads),
        }
        for name, ts in time_rounds(fns, caches, args).items():
            s = statistics.median(ts)
            row[f"{name}_us"], row[f"{name}_gbs"] = s * 1e6, kv_bytes / s / 1e9
            row[f"{name}_p10_us"], row[f"{name}_min_us"] = float(np.percentile(ts, 10)) * 1e6, min(ts) * 1e6
        return row
    for name, fn in (("c", native), ("numpy", numpy_path)):
        fn(*caches[0])  # warm: page in, build
        s = time_calls(fn, caches, args.min_time, args.min_calls)
        row[f"{name}_us"], row[f"{name}_gbs"] = s * 1e6, kv_bytes / s / 1e9
    return row


def against_table(lib, args) -> None:
    """--against: this build's kernel and the other build's, alternating."""
    print(f"path {lib.path}, {args.threads} threads, load {os.getloadavg()[0]:.2f}; us per layer call")
    print(
        f"{'dtype':8} {'B':>3} {'context':>7} {'layers':>6}   C us: median  p10   min   other: median  p10   min    x"
    )
    rows = []
    for dtype in args.dtypes:
        for batch in args.batches:
            for context in args.contexts:
                r = cell(lib, None, batch, context, dtype, args)
                rows.append(r)
                print(
                    f"{dtype:8} {batch:>3} {context:>7} {r['layers']:>6} {r['c_us']:>14.1f} {r['c_p10_us']:>5.1f}"
                    f" {r['c_min_us']:>5.1f} {r['against_us']:>14.1f} {r['against_p10_us']:>5.1f}"
                    f" {r['against_min_us']:>5.1f} {r['against_p10_us'] / r['c_p10_us']:>5.2f}",
                    flush=True,
                )
    print(f"load {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="135m", help="attention heads (default 135m)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--dtypes", nargs="+", default=["float32", "float16"], choices=["float32", "float16"])
    p.add_argument("--threads", type=int, default=2, help="threads for both paths (default 2)")
    p.add_argument("--cold-bytes", type=int, default=96 << 20, help="K/V bytes to cycle over (default 96 MiB: 3x L3)")
    p.add_argument("--min-time", type=float, default=0.3, help="seconds of calls per cell and path")
    p.add_argument("--min-calls", type=int, default=5)
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--against", help="another build's shared library to time instead of the NumPy path")
    p.add_argument("--rounds", type=int, default=10, help="with --against: alternating rounds of --min-calls calls")
    args = p.parse_args()
    global H, HKV, D
    H, HKV, D = SHAPES[args.shape]

    from rawpage.backends.cpu import CPUBackend
    from rawpage.native.library import NativeLibrary, native_kernels

    lib = native_kernels()
    if lib is None:
        sys.exit("the native kernels did not build (see the log line above)")
    if args.against:
        args.against_lib = NativeLibrary(lib.path, args.against)
        against_table(lib, args)
        return
    backend = CPUBackend(None, cpu_threads=args.threads)  # None: the NumPy references
    backend.threads.set_for(1)  # a decode step's thread count, as embedding() sets it
    print(f"path {lib.path}, {args.threads} threads; GB/s of K/V read, us per layer call")
    print(
        f"{'dtype':8} {'B':>3} {'context':>7} {'layers':>6} {'C us':>9} {'C GB/s':>7} {'NumPy us':>9} {'NumPy GB/s':>10} {'x':>5}"
    )
    rows = []
    for dtype in args.dtypes:
        for batch in args.batches:
            for context in args.contexts:
                r = cell(lib, backend, batch, context, dtype, args)
                rows.append(r)
                print(
                    f"{dtype:8} {batch:>3} {context:>7} {r['layers']:>6} {r['c_us']:>9.0f} {r['c_gbs']:>7.1f} "
                    f"{r['numpy_us']:>9.0f} {r['numpy_gbs']:>10.2f} {r['numpy_us'] / r['c_us']:>5.1f}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
