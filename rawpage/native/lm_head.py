"""The LM head on its stored Q8_0 blocks with float activations (gguf_lm_head.c).

    lm_head_q8_0(lib, x, data, (N, K), nthreads)   logits (T, N) = x (T, K) W^T

Reference: x @ gguf_dequantize_ref(data, "Q8_0", (N, K)).T (rawpage/quantization/gguf.py;
ops/gguf_linear.py gguf_linear_ref). Why float and not int8 activations here: the file's header.
"""

from __future__ import annotations

import numpy as np

from rawpage.native.library import NativeLibrary, addr, contiguous_rows, empty, weight_address


def lm_head_q8_0(
    lib: NativeLibrary, x: np.ndarray, data: np.ndarray, shape: tuple[int, int], nthreads: int
) -> np.ndarray:
    """x (T, K) float32, data (N, K / 32 * 34) uint8 Q8_0 blocks -> (T, N) float32."""
    N, K = shape
    x = contiguous_rows(x)
    if x.ndim != 2 or x.shape[1] != K or K % 32 or data.shape != (N, K // 32 * 34) or not data.flags.c_contiguous:
        raise ValueError(f"lm_head_q8_0: x {x.shape} and Q8_0 blocks {data.shape} do not make a ({N}, {K}) weight")
    y = empty((len(x), N))
    if len(x):
        lib.call("rp_lm_head_q8_0", y=addr(y), x=addr(x), w=weight_address(data), T=len(x), N=N, K=K, nthreads=nthreads)
    return y
