"""bfloat16 weights on the CPU, kept as the checkpoint stores them (bf16_matmul.c).

    bf16_matmul(lib, x, w, nthreads, bias, round_x)   y (T, N) = x (T, K) W^T (+ bias)

W is (N, K) uint16, the bf16 bits. The backend runs round_x=False: the weights widened
exactly, x in float32, so the result is the float32 model's to summation rounding, with
half its weight bytes. round_x=True is vdpbf16ps on x rounded to bf16 (AVX512-BF16;
elsewhere the same rounding through FMAs), kept to measure the two side by side:
docs/benchmarks.md. Reference: rawpage/ops/bf16_linear.py bf16_linear_ref.
"""

from __future__ import annotations

import numpy as np

from rawpage.native.library import NativeLibrary, addr, contiguous_rows, empty, ptr, weight_address


def bf16_matmul(
    lib: NativeLibrary,
    x: np.ndarray,
    w: np.ndarray,
    nthreads: int,
    bias: np.ndarray | None = None,
    round_x: bool = False,
) -> np.ndarray:
    """x (T, K) float32 (any layout; made C-contiguous), w (N, K) uint16 C-contiguous -> (T, N) float32."""
    N, K = w.shape
    x = contiguous_rows(x)
    if x.ndim != 2 or x.shape[1] != K or w.dtype != np.uint16 or not w.flags.c_contiguous:
        raise ValueError(f"bf16_matmul: x {x.shape} and bf16 weight {w.shape} {w.dtype} do not make a product")
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=np.float32)
        if bias.shape != (N,):
            raise ValueError(f"bias has shape {bias.shape}, want ({N},)")
    T = x.shape[0]
    y = empty((T, N))
    if T and N:
        scratch = np.empty(T * K * 6 if round_x else 0, np.uint8)  # bf16(x) as floats, then as bits
        lib.call(
            "rp_bf16_matmul",
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
