"""One type for every quantized Linear weight, whatever format it came from.

    kind "gguf":  data = (out, row_bytes) uint8, each row whole GGUF blocks as stored
                  in the file (`qtype` names the block format, see quantization/gguf.py);
                  layout "panels" (the CPU kernels, after prepare_linear): the same
                  blocks repacked 16 rows at a time, (ceil(out / 16), panel_bytes)
                  uint8 (rawpage/native/gguf.py).
    kind "int4":  AWQ and GPTQ, converted at load: data (out, in/8) uint32 nibbles,
                  scales and zeros per group, perm for act-order (quantization/int4.py).
    kind "fp8":   data (out, in) uint8 e4m3 bits, scales (out,) float32 (quantization/fp8.py).
    kind "bf16":  data (out, in) uint16 bfloat16 bits, a bf16 checkpoint's tensor as stored:
                  not quantized, but packed the same way, so that a backend with a bf16
                  kernel keeps it at 2 bytes a weight (native CPU) and others widen it.
    kind "f16":   data (out, in) uint16 IEEE half bits: a GGUF's F16 tensor, as "bf16".

A QuantizedWeight holds host (NumPy) arrays when a loader makes it, and device
arrays once a backend's prepare_linear has uploaded it. The NumPy CPU backend never
keeps one: it dequantizes at load (`dequantize`), so every checkpoint runs there.
The CPU backend on its C kernels keeps "gguf", "bf16" and "f16" (backends/cpu.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from rawpage.dtypes import bf16_to_f32
from rawpage.quantization.fp8 import fp8_dequantize_ref
from rawpage.quantization.gguf import GGUF_BLOCKS, gguf_dequantize_ref
from rawpage.quantization.int4 import int4_dequantize_ref

Array = Any  # numpy.ndarray on the host and under sim, cupy.ndarray on cuda


@dataclass
class QuantizedWeight:
    kind: str  # "gguf" | "int4" | "fp8" | "bf16" | "f16"
    shape: tuple[int, int]  # (out, in), the dense weight's shape
    data: Array  # the packed weights; layout per kind (module docstring)
    qtype: str = ""  # gguf: the block format, e.g. "Q4_K"
    scales: Array | None = None  # int4: (out, groups) float16; fp8: (out,) float32
    zeros: Array | None = None  # int4: (out, groups) float16
    perm: Array | None = None  # int4 act-order: (in,) int32, stored column -> input
    group_size: int = 0  # int4: inputs per group
    layout: str = "blocks"  # gguf: "blocks" as stored, or "panels" (the CPU kernels' repack)

    def arrays(self) -> dict[str, Array]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in _ARRAYS}

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays().values() if a is not None)

    def map_arrays(self, fn: Callable[[Array], Array]) -> QuantizedWeight:
        """The same weight over other arrays, e.g. fn = upload to the device."""
        return replace(self, **{k: None if a is None else fn(a) for k, a in self.arrays().items()})

    def rows(self, start: int, stop: int) -> QuantizedWeight:
        """Output rows [start, stop) (a column-parallel shard): every kind stores a row
        whole, with its own scales (perm is per input, so it stays)."""
        self._as_stored()
        cut = {k: None if a is None else a if k == "perm" else a[start:stop] for k, a in self.arrays().items()}
        return replace(self, shape=(stop - start, self.shape[1]), **cut)

    def columns(self, start: int, stop: int) -> QuantizedWeight | None:
        """Inputs [start, stop) of every row (a row-parallel shard) of a host weight, copied
        contiguous as the kernels read it; None where the cut would split a block or group:
        GGUF blocks (32 or 256 inputs), int4 groups and words, act-order int4 (its stored
        columns are permuted inputs), fp8's 16-input steps (the GEMM kernels'). fp8's and
        bf16's scales are per row: a cut keeps them."""
        self._as_stored()
        if self.kind == "fp8" and (start % 16 or stop % 16):
            return None
        cut: dict[str, Any] = {}
        if self.kind in ("fp8", "bf16", "f16"):
            cut["data"] = self.data[:, start:stop]
        elif self.kind == "gguf":
            elems, nbytes = GGUF_BLOCKS[self.qtype]
            if start % elems or stop % elems:
                return None
            cut["data"] = self.data[:, start // elems * nbytes : stop // elems * nbytes]
        else:  # int4
            group = self.shape[1] // self.scales.shape[1]
            if self.perm is not None or start % group or stop % group or start % 8 or stop % 8:
                return None
            g = slice(start // group, stop // group)
            cut = {"data": self.data[:, start // 8 : stop // 8], "scales": self.scales[:, g], "zeros": self.zeros[:, g]}
        cut = {k: np.ascontiguousarray(a) for k, a in cut.items()}
        return replace(self, shape=(self.shape[0], stop - start), **cut)

    def _as_stored(self) -> None:
        if self.layout != "blocks":
            raise ValueError(f"a {self.layout} weight is a backend's layout; cut or read the weight as stored")


_ARRAYS = ("data", "scales", "zeros", "perm")


def dequantize(w: QuantizedWeight | RowStack) -> np.ndarray:
    """A host QuantizedWeight (or RowStack) -> its dense float32 weight (out, in)."""
    if isinstance(w, RowStack):
        return np.concatenate([dequantize(p) for p in w.parts])
    w._as_stored()
    if w.kind == "gguf":
        return gguf_dequantize_ref(np.asarray(w.data), w.qtype, w.shape)
    if w.kind == "fp8":
        return fp8_dequantize_ref(w.data, w.scales)
    if w.kind == "bf16":
        return bf16_to_f32(np.asarray(w.data))  # exact: bf16 is float32's top half
    if w.kind == "f16":
        return np.asarray(w.data).view(np.float16).astype(np.float32)  # exact
    if w.kind == "int4":
        return int4_dequantize_ref(w.data, w.scales, w.zeros, w.perm)
    raise ValueError(f"unknown quantized weight kind {w.kind!r}")


@dataclass
class RowStack:
    """A fused Linear weight (q|k|v, gate|up) whose parts a checkpoint stores in
    different formats (llama.cpp's Q4_K_M keeps some layers' attn_v in Q6_K beside Q4_K
    q and k): y = [x P_0^T | x P_1^T | ...]. A backend with a kernel for every part
    multiplies each into its columns of one output (backends/cpu.py); the others hold
    it dense (dequantize)."""

    parts: list[QuantizedWeight]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight | RowStack | None:
    """Fuses the weights of several Linear layers along `out` (q|k|v, gate|up), as
    the model does with dense weights; GGUF blocks of different formats as a RowStack;
    None when they cannot be fused (other kinds that do not share one format)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    key = (first.kind, first.qtype, first.shape[1], first.group_size)
    if any((p.kind, p.qtype, p.shape[1], p.group_size) != key or p.perm is not None for p in parts):
        if all(p.kind == "gguf" and p.shape[1] == first.shape[1] for p in parts):
            return RowStack(parts)
        return None  # (act-order weights each permute their inputs their own way)
    out = sum(p.shape[0] for p in parts)
    cat = {k: None if a is None else np.concatenate([p.arrays()[k] for p in parts]) for k, a in first.arrays().items()}
    return replace(first, shape=(out, first.shape[1]), **cat)
