"""GGUF block formats in NumPy: the ones kept quantized on sim and cuda, a weight's
shape check against its format, and the reference dequantizer.

A weight (N, K) is stored as in the .gguf file: each row a run of blocks of `block`
values in `type_size` bytes (the formats are drawn in cuda/gguf_linear.cu).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The block formats kept quantized on sim and cuda: name -> (values, bytes) per block.
GGUF_BLOCKS = {
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}


def gguf_dequantize_ref(data: np.ndarray, qtype: str, shape: tuple[int, int]) -> np.ndarray:
    """(N, row_bytes) uint8 blocks -> (N, K) float32, by the `gguf` package (llama.cpp's
    own Python port of its dequantizers), independent of our kernel."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(np.asarray(data), GGMLQuantizationType[qtype]).astype(np.float32).reshape(shape)


def check_gguf_shape(qtype: str, shape: tuple[int, int], data: Any) -> None:
    if qtype not in GGUF_BLOCKS:
        raise ValueError(f"GGUF type {qtype} is not kept quantized (supported: {', '.join(GGUF_BLOCKS)})")
    block, size = GGUF_BLOCKS[qtype]
    N, K = shape
    if K % block or tuple(data.shape) != (N, K // block * size) or data.dtype != np.uint8:
        raise ValueError(
            f"{qtype} weight {shape}: want ({N}, {K // block * size}) uint8 blocks, "
            f"K a multiple of {block}; got {tuple(data.shape)} {data.dtype}"
        )
