"""Kernel microbenchmarks on the GPU, against the device's copy bandwidth and torch's SDPA.

    python -m tools.gpu_check.microbench --result-file out.json

Every figure is the median of many runs timed with CUDA events after a
warm-up, cycling through several buffer sets so that no run finds its data in
L2 from the previous one.

- Decode paged_attention (bfloat16, batch 64, 32 q / 8 kv heads, head dim 128,
  block size 16, scattered blocks) at contexts 2048 and 4096: GB/s of K/V (plus
  q and out) read, against the measured device-to-device copy bandwidth
  (bytes read + written), beside torch SDPA on contiguous K/V of the same shapes.
- The same decode with an FP8 (e4m3) KV cache at batch 256, context 1024, beside
  bfloat16 at that shape (issue 18: FP8 at most 0.6x bfloat16's time); and with a
  sliding window of 1024 at context 4096 (issue 17: only in-window K/V is read, so
  GB/s counts the window's bytes).
- Prefill paged_attention, 8 sequences x 2048 tokens, causal: TFLOP/s
  (4 B H D L(L+1)/2 FLOPs: QK^T and PV over the causal half), beside SDPA's
  flash path on contiguous q/k/v.
- rms_norm on (16384, 4096) bfloat16: GB/s of x read plus out written.
"""

from __future__ import annotations

import argparse

import numpy as np

from tools.gpu_check.common import GB, copy_bandwidth_gbs, median_ms_cupy, median_ms_torch, write_json

H, HKV, D, BS = 32, 8, 128, 16


def decode_bytes(batch: int, context: int, itemsize: int = 2, kv_itemsize: int | None = None) -> int:
    """Bytes a decode attention step must move: all K and V of every context, q and out."""
    kv = 2 * batch * context * HKV * D * (kv_itemsize or itemsize)
    return kv + 2 * batch * H * D * itemsize


def prefill_flops(batch: int, length: int) -> float:
    """QK^T and PV (2 FLOPs per multiply-add each) over the causal half, L(L+1)/2 pairs."""
    return 4.0 * batch * H * D * length * (length + 1) / 2


def _paged_inputs(cupy, batch: int, context: int, sets: int, rng: np.random.Generator, fp8: bool = False):
    """`sets` independent (k_cache, v_cache, block_tables) of random bfloat16 bits (fp8:
    random finite e4m3 codes, uint8)."""
    from rawpage.dtypes import bf16_from_f32

    blocks = batch * (-(-context // BS))
    shape = (blocks, BS, HKV, D)

    def cache():
        if fp8:  # codes 0..0x7E with a random sign: every finite e4m3 value
            return (cupy.random.randint(0, 0x7F, shape) | (cupy.random.randint(0, 2, shape) << 7)).astype(cupy.uint8)
        return bf16_from_f32(cupy.random.standard_normal(shape, dtype=cupy.float32))  # normal, rounded

    out = []
    for _ in range(sets):
        k, v = cache(), cache()
        tables = cupy.asarray(rng.permutation(blocks).astype(np.int32).reshape(batch, -1))
        out.append((k, v, tables))
    return out


def bench_decode(context: int, batch: int = 64, sets: int = 2, window: int | None = None, fp8: bool = False) -> dict:
    import cupy

    from rawpage.backends.cuda import CupyKernelLoader
    from rawpage.dtypes import bf16_from_f32
    from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
    from rawpage.ops.paged_attention import launch_paged_attention

    loader, rng = CupyKernelLoader(), np.random.default_rng(0)
    inputs = _paged_inputs(cupy, batch, context, sets, rng, fp8)
    scales = cupy.asarray([0.01, 0.01], dtype=cupy.float32) if fp8 else None
    q = bf16_from_f32(cupy.random.standard_normal((batch, H, D), dtype=cupy.float32))
    seq_lens = cupy.full(batch, context, cupy.int32)
    qsl = cupy.arange(batch + 1, dtype=cupy.int32)

    opts = AttentionOptions(D**-0.5, sliding_window=window)

    def run(i: int) -> None:
        k, v, tables = inputs[i % sets]
        meta = AttentionMetadata(tables, seq_lens, qsl, max_query_len=1, max_seq_len=context)
        launch_paged_attention(cupy, loader, q, k, v, meta, opts, kv_scales=scales)

    ms = median_ms_cupy(run, iters=50)
    nbytes = decode_bytes(batch, min(context, window or context), kv_itemsize=1 if fp8 else 2)
    return {
        "context": context,
        "batch": batch,
        "window": window,
        "fp8": fp8,
        "ms": ms,
        "gbs": nbytes / (ms * 1e-3) / GB,
    }


def bench_sdpa_decode(context: int, batch: int = 64, sets: int = 2) -> dict:
    import torch
    import torch.nn.functional as F

    kv = [
        (
            torch.randn(batch, HKV, context, D, device="cuda", dtype=torch.bfloat16),
            torch.randn(batch, HKV, context, D, device="cuda", dtype=torch.bfloat16),
        )
        for _ in range(sets)
    ]
    q = torch.randn(batch, H, 1, D, device="cuda", dtype=torch.bfloat16)

    def run(i: int) -> None:
        k, v = kv[i % sets]
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    ms = median_ms_torch(run, iters=50)
    return {"context": context, "batch": batch, "ms": ms, "gbs": decode_bytes(batch, context) / (ms * 1e-3) / GB}


def bench_prefill(batch: int = 8, length: int = 2048, sets: int = 2) -> dict:
    import cupy

    from rawpage.backends.cuda import CupyKernelLoader
    from rawpage.dtypes import bf16_from_f32
    from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
    from rawpage.ops.paged_attention import launch_paged_attention

    loader, rng = CupyKernelLoader(), np.random.default_rng(0)
    inputs = _paged_inputs(cupy, batch, length, sets, rng)
    q = bf16_from_f32(cupy.random.standard_normal((batch * length, H, D), dtype=cupy.float32))
    seq_lens = cupy.full(batch, length, cupy.int32)
    qsl = cupy.arange(0, batch * length + 1, length, dtype=cupy.int32)

    opts = AttentionOptions(D**-0.5)

    def run(i: int) -> None:
        k, v, tables = inputs[i % sets]
        meta = AttentionMetadata(tables, seq_lens, qsl, max_query_len=length, max_seq_len=length)
        launch_paged_attention(cupy, loader, q, k, v, meta, opts)

    ms = median_ms_cupy(run, iters=20, warmup=3)
    return {"batch": batch, "length": length, "ms": ms, "tflops": prefill_flops(batch, length) / (ms * 1e-3) / 1e12}


def bench_sdpa_prefill(batch: int = 8, length: int = 2048, sets: int = 2) -> dict:
    """SDPA restricted to its flash backend; K/V expanded to all 32 heads (flash has
    no GQA of its own in every torch version), which does not change the FLOPs."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def rand() -> torch.Tensor:
        return torch.randn(batch, H, length, D, device="cuda", dtype=torch.bfloat16)

    qkv = [(rand(), rand(), rand()) for _ in range(sets)]

    def run(i: int) -> None:
        q, k, v = qkv[i % sets]
        F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        ms = median_ms_torch(run, iters=20, warmup=3)
    return {"batch": batch, "length": length, "ms": ms, "tflops": prefill_flops(batch, length) / (ms * 1e-3) / 1e12}


def bench_rms_norm(tokens: int = 16384, dim: int = 4096, sets: int = 4) -> dict:
    import cupy

    from rawpage.backends.cuda import CupyKernelLoader
    from rawpage.dtypes import bf16_from_f32
    from rawpage.ops.layer_ops import launch_rms_norm

    loader = CupyKernelLoader()
    xs = [bf16_from_f32(cupy.random.standard_normal((tokens, dim), dtype=cupy.float32)) for _ in range(sets)]
    w = bf16_from_f32(cupy.ones(dim, cupy.float32))

    def run(i: int) -> None:
        launch_rms_norm(cupy, loader, xs[i % sets], w, 1e-5)

    ms = median_ms_cupy(run, iters=50)
    nbytes = 2 * tokens * dim * 2 + dim * 2
    return {"tokens": tokens, "dim": dim, "ms": ms, "gbs": nbytes / (ms * 1e-3) / GB}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="2048,4096", help="decode contexts, comma-separated")
    ap.add_argument("--no-torch", action="store_true", help="skip the SDPA comparisons")
    ap.add_argument("--result-file")
    args = ap.parse_args(argv)
    result: dict = {"copy_gbs": copy_bandwidth_gbs()}
    result["decode"] = [bench_decode(int(c)) for c in args.contexts.split(",")]
    result["decode_fp8"] = {"fp8": bench_decode(1024, 256, fp8=True), "bf16": bench_decode(1024, 256)}
    result["decode_window"] = bench_decode(4096, 64, window=1024)
    result["prefill"] = bench_prefill()
    result["rms_norm"] = bench_rms_norm()
    if not args.no_torch:
        result["sdpa_decode"] = [bench_sdpa_decode(int(c)) for c in args.contexts.split(",")]
        result["sdpa_prefill"] = bench_sdpa_prefill()
    for d in [*result["decode"], result["decode_window"], *result["decode_fp8"].values()]:
        d["fraction_of_copy"] = d["gbs"] / result["copy_gbs"]
    result["decode_fp8"]["time_ratio"] = result["decode_fp8"]["fp8"]["ms"] / result["decode_fp8"]["bf16"]["ms"]
    result["prefill"]["fraction_of_sdpa"] = (
        result["prefill"]["tflops"] / result["sdpa_prefill"]["tflops"] if "sdpa_prefill" in result else None
    )
    write_json(args.result_file, {"microbench": result})
    return result


if __name__ == "__main__":
    main()
