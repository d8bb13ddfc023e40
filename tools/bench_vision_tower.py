"""A vision tower's kernels on the CPU: the bfloat16 GEMM and attention (rawpage/native/bf16_gemm.c)
against the float32 path they replace (OpenBLAS on widened weights, attention a head at a time
through BLAS with the C softmax), at SigLIP-so400m's shapes (Gemma 3's tower: 4096 patches of
an 896 x 896 image, hidden 1152, 16 heads of 72, MLP 4304).

    python tools/bench_vision_tower.py                 # both threads
    python tools/bench_vision_tower.py --threads 1 --tokens 1024

Each row: the best of --repeats calls, GFLOP/s (2 T N K for a GEMM, 4 T^2 D H for attention)
and the ratio of the two paths. The tower runs the bf16 kernels where the CPU has AVX512-BF16
(rawpage/native/bf16_gemm.py bf16_dot); elsewhere this prints the float32 rows alone.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import rawpage  # noqa: F401  (before NumPy: OpenBLAS's idle workers must sleep soon, rawpage/_blas_env.py)

# isort: split
import numpy as np
from threadpoolctl import threadpool_limits

from rawpage.native import bf16_gemm, vision_ops
from rawpage.native.library import native_kernels
from rawpage.ops.paged_attention import encoder_attention_ref

# one SigLIP layer's Linear weights (N, K), q|k|v fused as models/siglip.py fuses them
LAYER = [("qkv", 3456, 1152), ("out", 1152, 1152), ("fc1", 4304, 1152), ("fc2", 1152, 4304)]


def best(repeats: int, fn: Callable[..., object], *args: object) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=4096, help="patches of one image (4096: Gemma 3 at 896 px)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=72)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    lib = native_kernels()
    if lib is None:
        raise SystemExit("the CPU kernels did not build")
    have_bf16, rng, T = bf16_gemm.bf16_dot(), np.random.default_rng(0), args.tokens
    print(f"{T} tokens, {args.threads} threads; vdpbf16ps: {'yes' if have_bf16 else 'no (float32 rows only)'}")
    print(
        "| op | shape | float32 (BLAS) s | GFLOP/s | bf16 s | GFLOP/s | float32 / bf16 |\n|---|---|---|---|---|---|---|"
    )
    with threadpool_limits(args.threads):
        for name, N, K in LAYER:
            x, w = rng.standard_normal((T, K), np.float32), rng.standard_normal((N, K), np.float32)
            flop = 2 * T * N * K / 1e9
            f32 = best(args.repeats, np.matmul, x, w.T)
            row = f"| {name} | {T}x{K} by {N}x{K} | {f32:.3f} | {flop / f32:.0f} |"
            if have_bf16:
                panels = bf16_gemm.pack(lib, w, args.threads)
                b16 = best(args.repeats, bf16_gemm.gemm, lib, x, panels, args.threads)
                row += f" {b16:.3f} | {flop / b16:.0f} | {f32 / b16:.2f}x |"
            print(row)
        H, D = args.heads, args.head_dim
        qkv = rng.standard_normal((T, 3 * H * D), np.float32)
        q, k, v = (qkv[:, i * H * D : (i + 1) * H * D].reshape(T, H, D) for i in range(3))
        flop = 4 * T * T * D * H / 1e9
        softmax = lambda s: vision_ops.softmax_rows(lib, s, args.threads)  # noqa: E731
        f32 = best(args.repeats, encoder_attention_ref, q, k, v, D**-0.5, softmax)
        row = f"| attention | {T} tokens, {H} heads of {D} | {f32:.3f} | {flop / f32:.0f} |"
        if have_bf16:
            b16 = best(args.repeats, bf16_gemm.encoder_attention, lib, q, k, v, D**-0.5, args.threads)
            row += f" {b16:.3f} | {flop / b16:.0f} | {f32 / b16:.2f}x |"
        print(row)


if __name__ == "__main__":
    main()
