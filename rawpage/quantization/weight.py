"""One type for every quantized Linear weight, whatever format it came from.

    kind "gguf":  data = (out, row_bytes) uint8, each row whole GGUF blocks as stored
                  in the file (`qtype` names the block format, see ops/gguf_linear.py).

A QuantizedWeight holds host (NumPy) arrays when a loader makes it, and device
arrays once a backend's prepare_linear has uploaded it. The cpu backend never
keeps one: it dequantizes at load (`dequantize`), so every checkpoint runs there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Array = Any  # numpy.ndarray on the host and under sim, cupy.ndarray on cuda


@dataclass
class QuantizedWeight:
    kind: str  # "gguf"
    shape: tuple[int, int]  # (out, in), the dense weight's shape
    data: Array  # the packed weights; layout per kind (module docstring)
    qtype: str = ""  # gguf: the block format, e.g. "Q4_K"

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def with_data(self, data: Array) -> QuantizedWeight:
        """The same weight over other arrays (e.g. uploaded to the device)."""
        return QuantizedWeight(self.kind, self.shape, data, self.qtype)


def dequantize(w: QuantizedWeight) -> np.ndarray:
    """A host QuantizedWeight -> its dense float32 weight (out, in)."""
    if w.kind == "gguf":
        from rawpage.ops.gguf_linear import gguf_dequantize_ref

        return gguf_dequantize_ref(np.asarray(w.data), w.qtype, w.shape)
    raise ValueError(f"unknown quantized weight kind {w.kind!r}")


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight | None:
    """Fuses the weights of several Linear layers along `out` (q|k|v, gate|up), as
    the model does with dense weights; None when they do not share one format."""
    first = parts[0]
    if any((p.kind, p.qtype, p.shape[1]) != (first.kind, first.qtype, first.shape[1]) for p in parts):
        return None
    if len(parts) == 1:
        return first
    out = sum(p.shape[0] for p in parts)
    return QuantizedWeight(first.kind, (out, first.shape[1]), np.concatenate([p.data for p in parts]), first.qtype)
