"""Global-memory traffic of each kernel under the simulator, against the least
the math needs.

Each case runs one op's real launch code (all of its kernels: decode attention
and its reduce count together) on a traffic-counting SimKernelLoader
(rawpage/sim/traffic.py) and divides the bytes moved by the minimum: every
input byte the math reads once, every output byte written once. A ratio of 1.0
means nothing is re-read through L2 and nothing is written twice.

    python tools/kernel_report.py --traffic

tests/kernels/test_traffic.py holds each kernel to its ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.layer_ops import (
    cos_sin_cache,
    launch_fused_add_rms_norm,
    launch_rms_norm,
    launch_rope,
    launch_silu_and_mul,
)
from rawpage.ops.paged_attention import launch_paged_attention
from rawpage.sim import LaunchTraffic, SimKernelLoader


@dataclass
class TrafficCase:
    name: str  # the op, as the tests name it
    shape: str  # what was run, for the table
    minimum: int  # bytes the math must move
    run: Callable[[SimKernelLoader], None]
    # The simulated GPU's SM count, which sizes grids: small, so that the small
    # shapes here fill it as a large batch fills a real GPU.
    sm_count: int = 2


@dataclass
class TrafficResult:
    case: TrafficCase
    launches: list[LaunchTraffic]

    @property
    def moved(self) -> int:
        return sum(t.bytes_moved for t in self.launches)

    @property
    def unique(self) -> int:
        return sum(t.unique_bytes for t in self.launches)

    @property
    def ratio(self) -> float:
        return self.moved / self.case.minimum

    @property
    def vector_share(self) -> float:
        n = sum(b.read_accesses + b.write_accesses for t in self.launches for b in t.buffers)
        v = sum(b.read_vec16 + b.write_vec16 for t in self.launches for b in t.buffers)
        return v / n if n else 0.0


# Every attention case runs this head size (decode attention's launch builds one head size's
# kernels alone, RP_ONE_HEAD_SIZE in cuda/paged_attention_decode.cu).
HEAD_SIZE = 128


def traffic_loader(workers: int | None = None) -> SimKernelLoader:
    return SimKernelLoader(workers=workers, traffic=True)


def measure(case: TrafficCase, loader: SimKernelLoader) -> TrafficResult:
    first = len(loader.traffic_log)
    loader.sm_count = case.sm_count
    case.run(loader)
    return TrafficResult(case, loader.traffic_log[first:])


def _paged_batch(rng, dtype, ctx, q_lens, H, Hkv, D, BS):
    """A paged batch with scattered blocks: (q, k_cache, v_cache, tables, seq_lens, qsl)."""
    blocks = [-(-L // BS) for L in ctx]
    NB = sum(blocks) + 2
    k_cache = rng.standard_normal((NB, BS, Hkv, D)).astype(dtype)
    v_cache = rng.standard_normal((NB, BS, Hkv, D)).astype(dtype)
    tables = np.zeros((len(ctx), max(blocks)), np.int32)
    perm, used = rng.permutation(NB), 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[used : used + n]
        used += n
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), H, D)).astype(dtype)
    return q, k_cache, v_cache, tables, np.array(ctx, np.int32), qsl


def attention_case(
    name: str,
    H: int,
    Hkv: int,
    ctx: list[int],
    q_lens: list[int],
    D: int = HEAD_SIZE,
    BS: int = 16,
    sm_count: int = 2,
    window: int | None = None,
    fp8: bool = False,
    images: list[tuple[int, int, int]] = (),
) -> TrafficCase:
    """Minimum: q, the K and V of every visible context token (the last `window`
    of a decode's with a sliding window), the block-table entries that hold
    them, seq_lens and query_start_loc once, and the output once. sm_count sizes
    decode's split-K: the batches here fill 2 SMs without splitting. fp8: a
    1-byte e4m3 cache, and its two scales once. images: (sequence, first position,
    length) of each image of a prefill, whose rows see the whole image; then the
    rows' key_end once more."""
    itemsize, kv_itemsize = 2, 1 if fp8 else 2
    T = sum(q_lens)
    first = [max(0, L - window) if window else 0 for L in ctx]  # decode: the first visible key
    kv = sum(L - f for L, f in zip(ctx, first)) * Hkv * D * kv_itemsize * 2
    meta = 4 * (sum(-(-L // BS) - f // BS for L, f in zip(ctx, first)) + len(ctx) + len(ctx) + 1)
    minimum = 2 * T * H * D * itemsize + kv + meta + (8 if fp8 else 0) + (4 * T if images else 0)

    def run(loader: SimKernelLoader) -> None:
        rng = np.random.default_rng(0)
        q, k_cache, v_cache, *rest = _paged_batch(rng, np.float16, ctx, q_lens, H, Hkv, D, BS)
        scales = None
        if fp8:  # any codes will do for counting bytes; keep them finite
            k_cache, v_cache = (rng.integers(0, 0x7E, c.shape).astype(np.uint8) for c in (k_cache, v_cache))
            scales = np.array([0.01, 0.01], np.float32)
        key_end = None
        if images:  # the rows of each image see up to its last position
            key_end, qsl = np.full(T, -1, np.int32), np.cumsum([0, *q_lens])
            for i, pos, n in images:
                row = qsl[i] + pos - (ctx[i] - q_lens[i])
                key_end[row : row + n] = pos + n - 1
        meta = AttentionMetadata.from_host(*rest, key_end)
        opts = AttentionOptions(D**-0.5, sliding_window=window)
        launch_paged_attention(np, loader, q, k_cache, v_cache, meta, opts, kv_scales=scales)

    what = f"H={H} Hkv={Hkv} D={D} BS={BS} ctx={ctx} q={q_lens} f16" + (f", {sm_count} SMs" if sm_count != 2 else "")
    what += (f", window {window}" if window else "") + (", fp8 KV" if fp8 else "")
    what += "".join(f", image at {pos}..{pos + n - 1} of seq {i}" for i, pos, n in images)
    return TrafficCase(name, what, minimum, run, sm_count)


def rms_norm_case(T: int, dim: int, fused: bool) -> TrafficCase:
    """Minimum: x (and residual) read once, the weight once, the output(s) once.
    On 2 SMs, 16 blocks of 256 threads are resident: each walks 4 rows, reading
    the weight once."""
    rows = T * dim * 2
    minimum = (4 * rows if fused else 2 * rows) + dim * 2

    def run(loader: SimKernelLoader) -> None:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((T, dim)).astype(np.float16)
        w = rng.standard_normal(dim).astype(np.float16)
        if fused:
            launch_fused_add_rms_norm(np, loader, x, x.copy(), w, 1e-5)
        else:
            launch_rms_norm(np, loader, x, w, 1e-5)

    name = "fused_add_rms_norm" if fused else "rms_norm"
    return TrafficCase(name, f"T={T} dim={dim} f16", minimum, run)


def silu_and_mul_case(T: int, inter: int) -> TrafficCase:
    def run(loader: SimKernelLoader) -> None:
        x = np.random.default_rng(0).standard_normal((T, 2 * inter)).astype(np.float16)
        launch_silu_and_mul(np, loader, x)

    return TrafficCase("silu_and_mul", f"T={T} I={inter} f16", 3 * T * inter * 2, run)


def rope_case(T: int, H: int, Hkv: int, D: int) -> TrafficCase:
    """Minimum: q and k read and written once, each token's position and cos/sin row once."""
    minimum = 2 * T * (H + Hkv) * D * 2 + T * (4 + D * 4)

    def run(loader: SimKernelLoader) -> None:
        rng = np.random.default_rng(0)
        qkv = rng.standard_normal((T, (H + 2 * Hkv) * D)).astype(np.float16)
        q = qkv[:, : H * D].reshape(T, H, D)
        k = qkv[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D)
        cs = cos_sin_cache(1.0 / (10000.0 ** (np.arange(0, D, 2) / D)), 4096)
        launch_rope(np, loader, rng.permutation(4096)[:T].astype(np.int32), q, k, cs)

    return TrafficCase("rope", f"T={T} H={H} Hkv={Hkv} D={D} f16", minimum, run)


def cases() -> list[TrafficCase]:
    """Small shapes (the simulator counts every access), big enough that a
    kernel's per-block overheads show as they would at scale."""
    decode_ctx = [700, 517, 300, 64]
    return [
        attention_case("decode GQA 1", 4, 4, decode_ctx, [1] * 4),
        attention_case("decode GQA 4", 8, 2, decode_ctx, [1] * 4),
        attention_case("decode GQA 8", 16, 2, decode_ctx, [1] * 4),
        # One sequence on 16 SMs: split into 64-token partitions, each of which
        # writes and merges a float32 partial output.
        attention_case("decode GQA 4 split-K", 8, 2, [1000], [1], sm_count=16),
        # A sliding window of 100 tokens (not block-aligned): only in-window keys are read.
        attention_case("decode GQA 4 window 100", 8, 2, decode_ctx, [1] * 4, window=100),
        attention_case("decode GQA 4 fp8", 8, 2, decode_ctx, [1] * 4, fp8=True),
        attention_case("prefill GQA 4", 8, 2, [256, 100], [256, 100]),
        # Gemma 3's image rows: a 64-token image across query tiles 1 and 2 (rows 100..163),
        # whose early rows read keys past their tile (bidirectional inside the image).
        attention_case("prefill GQA 4 image", 8, 2, [256, 100], [256, 100], images=[(0, 100, 64)]),
        rms_norm_case(64, 2048, fused=False),
        rms_norm_case(64, 2048, fused=True),
        silu_and_mul_case(64, 1024),
        rope_case(64, 8, 2, 128),
    ]


def format_results(results: list[TrafficResult]) -> str:
    rows = [("kernel", "shape", "moved / min", "unique / min", "16-byte share", "launches")]
    for r in results:
        m = r.case.minimum
        rows.append(
            (
                r.case.name,
                r.case.shape,
                f"{r.ratio:.3f}",
                f"{r.unique / m:.3f}",
                f"{r.vector_share:.0%}",
                " + ".join(t.kernel for t in r.launches),
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows)


def report() -> list[TrafficResult]:
    loader = traffic_loader()
    return [measure(c, loader) for c in cases()]
