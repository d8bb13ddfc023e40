"""16-bit float weights on the CPU, kept as the checkpoint stores them (half_matmul.c).

    half_matmul(lib, x, w, nthreads, bias, f16=False, round_x=False)   y (T, N) = x (T, K) W^T (+ bias)
    half_rows(lib, w, ids, nthreads, f16=False)                         W[ids] (T, K) widened (an embedding)

W is (N, K) uint16: bfloat16 bits, or IEEE half bits (f16=True: a GGUF's F16 tensors).
The backend runs round_x=False: the weights widened
exactly, x in float32, so the result is the float32 model's to summation rounding, with
half its weight bytes. round_x=True is vdpbf16ps on x rounded to bf16 (AVX512-BF16;
elsewhere the same rounding through FMAs), kept to measure the two side by side:
docs/benchmarks.md. Reference: rawpage/ops/bf16_linear.py bf16_linear_ref.
"""

from __future__ import annotations

import numpy as np

from rawpage.native.library import NativeLibrary, addr, contiguous_rows, empty, int32_rows, ptr, weight_address


def half_matmul(
    lib: NativeLibrary,
    x: np.ndarray,
    w: np.ndarray,
    nthreads: int,
    bias: np.ndarray | None = None,
    f16: bool = False,
    round_x: bool = False,
) -> np.ndarray:
    """x (T, K) float32 (any layout; made C-contiguous), w (N, K) uint16 C-contiguous -> (T, N) float32."""
    N, K = w.shape
    x = contiguous_rows(x)
    if x.ndim != 2 or x.shape[1] != K or w.dtype != np.uint16 or not w.flags.c_contiguous:
        raise ValueError(f"half_matmul: x {x.shape} and 16-bit weight {w.shape} {w.dtype} do not make a product")
    if f16 and round_x:
        raise ValueError("half_matmul: round_x (vdpbf16ps) takes bf16 weights")
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=np.float32)
        if bias.shape != (N,):
            raise ValueError(f"bias has shape {bias.shape}, want ({N},)")
    T = x.shape[0]
    y = empty((T, N))
    if T and N:
        scratch = np.empty(T * K * 6 if round_x else 0, np.uint8)  # bf16(x) as floats, then as bits
        lib.call(
            "rp_half_matmul",
            f16=int(f16),
            y=addr(y),
            x=addr(x),
            w=weight_address(w),
            bias=ptr(bias),
            T=T,
            N=N,
            K=K,
            round_x=int(round_x),
            scratch=ptr(scratch) if round_x else None,
            nthreads=nthreads,
        )
    return y


def half_rows(lib: NativeLibrary, w: np.ndarray, ids: np.ndarray, nthreads: int, f16: bool = False) -> np.ndarray:
    """w (V, K) uint16 bf16 / f16 bits, ids (T,) -> w[ids] (T, K) float32, exact."""
    ids = int32_rows(np.asarray(ids).reshape(-1))  # token ids: the batch's own int32 array, read in place
    if ids.size and (ids.min() < 0 or ids.max() >= len(w)):
        raise ValueError(f"row ids must be in 0 .. {len(w) - 1}; got {ids.min()} .. {ids.max()}")
    out = empty((ids.size, w.shape[1]))
    if ids.size:
        lib.call(
            "rp_half_rows",
            f16=int(f16),
            out=addr(out),
            table=weight_address(w),
            ids=addr(ids),
            T=ids.size,
            n=w.shape[1],
            nthreads=nthreads,
        )
    return out
