"""Per-launch wall time of a few kernels under the simulator (not a GPU benchmark:
it says how long `--device sim` and the kernel tests take per launch).

    python tools/sim_bench.py [--workers N]

Shapes are written next to each line. Times are the median of 5 launches after
a warm-up, on RAWPAGE_SIM_THREADS worker threads (default: all CPUs, at most 8).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.layer_ops import cos_sin_cache, launch_rms_norm, launch_rope, launch_silu_and_mul
from rawpage.ops.paged_attention import launch_paged_attention
from rawpage.sim import SimKernelLoader


def timed(fn: Callable[[], object], repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def attention_case(rng, B, q_len, ctx, H, Hkv, D, BS=16, dtype=np.float16):
    nb = -(-ctx // BS)
    k_cache = rng.standard_normal((B * nb, BS, Hkv, D)).astype(dtype)
    v_cache = rng.standard_normal((B * nb, BS, Hkv, D)).astype(dtype)
    tables = rng.permutation(B * nb).astype(np.int32).reshape(B, nb)
    q = rng.standard_normal((B * q_len, H, D)).astype(dtype)
    seq_lens = np.full(B, ctx, np.int32)
    qsl = np.arange(B + 1, dtype=np.int32) * q_len
    return q, k_cache, v_cache, AttentionMetadata.from_host(tables, seq_lens, qsl)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    loader = SimKernelLoader(debug=False, workers=args.workers)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4096)).astype(np.float16)
    w = rng.standard_normal(4096).astype(np.float16)
    gate_up = rng.standard_normal((64, 2 * 1536)).astype(np.float16)
    qkv = rng.standard_normal((64, (9 + 6) * 64)).astype(np.float16)
    positions = np.arange(64, dtype=np.int32)
    cs = cos_sin_cache(1.0 / (10000.0 ** (np.arange(0, 64, 2) / 64)), 128)
    q, k = qkv[:, : 9 * 64].reshape(64, 9, 64), qkv[:, 9 * 64 : 12 * 64].reshape(64, 3, 64)
    decode = attention_case(rng, B=8, q_len=1, ctx=512, H=32, Hkv=8, D=128)
    opts = AttentionOptions(0.1)
    prefill = attention_case(rng, B=1, q_len=256, ctx=256, H=8, Hkv=2, D=128)
    cases = [
        ("rms_norm f16, 64 x 4096", lambda: launch_rms_norm(np, loader, x, w, 1e-5)),
        ("silu_and_mul f16, 64 x 1536", lambda: launch_silu_and_mul(np, loader, gate_up)),
        (
            "rope f16, 64 tokens, 9 + 3 heads of 64",
            lambda: launch_rope(np, loader, positions, q, k, cs),
        ),
        (
            "decode f16, B=8, H=32/Hkv=8, D=128, 512 tokens, 1 partition",
            lambda: launch_paged_attention(np, loader, *decode, opts, partitions=1),
        ),
        (
            "decode f16, same, split into 4 partitions + reduce",
            lambda: launch_paged_attention(np, loader, *decode, opts, partitions=4),
        ),
        (
            "prefill f16, 256-token prompt, H=8/Hkv=2, D=128",
            lambda: launch_paged_attention(np, loader, *prefill, opts),
        ),
    ]
    workers = loader.module("rms_norm.cu").workers
    print(f"simulator, {workers} worker thread(s), median ms per launch")
    for name, fn in cases:
        print(f"{timed(fn):9.1f} ms  {name}")


if __name__ == "__main__":
    main()
