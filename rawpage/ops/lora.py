"""Batched LoRA at the Linear seam: y = x·Wᵀ + scale · (x·Aᵀ)·Bᵀ, with each token's A
and B picked by its sequence's adapter slot (scale is folded into B at load).

The adapters resident on the device sit in fixed-size slots per Linear layer
(`LoRASlots`); a targeted layer's weight is a `LoRALinear` that the backend's
`linear()` recognizes: the base GEMM first, then the delta. A fused layer (q/k/v,
gate/up) stacks its parts' ranks along R, with B block-diagonal (zeros where a
part does not reach), so a fused layer is still one delta.

Three implementations of the delta:
- `lora_shrink_ref` / `lora_expand_ref`: the NumPy reference, segment by segment;
- `add_lora_grouped`: the CPU path: tokens grouped by adapter, two small GEMMs
  per group (gather, shrink, expand, scatter-add);
- `launch_lora_shrink` / `launch_lora_expand`: cuda/lora.cu, for sim and cuda.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawpage.ops.launch import KernelLoader, ceil_div, data_ptr, dtype_suffix


@dataclass
class LoRASlots:
    """One Linear layer's adapter slots, S of them, each padded to rank R (all parts)."""

    a: Any  # (S, R, in)
    b: Any  # (S, R, out), scale folded in

    @property
    def nbytes(self) -> int:
        return int(self.a.nbytes) + int(self.b.nbytes)


@dataclass
class LoRABatch:
    """What the forward pass in flight says about adapters: each sequence's slot, -1 for
    none. Shared by every LoRALinear; the model runner sets it before each forward."""

    seg_starts: Any = None  # (B+1,) int32 device array: query_start_loc
    seg_slots: Any = None  # (B,) int32 device array: the adapter slot of each sequence
    host_query_lens: np.ndarray | None = None  # (B,)
    _groups: list[tuple[int, Any]] | None = field(default=None, repr=False)

    def set(self, seg_starts: Any, seg_slots: Any, host_query_lens: np.ndarray) -> None:
        self.seg_starts, self.seg_slots, self.host_query_lens = seg_starts, seg_slots, host_query_lens
        self._groups = None

    def token_groups(self) -> list[tuple[int, Any]]:
        """CPU: (slot, rows of that slot's tokens: a slice where contiguous) for each adapter
        in the batch, from seg_slots (a NumPy array there); once per forward pass."""
        if self._groups is None:
            self._groups = []
            slots = None if self.seg_slots is None else np.asarray(self.seg_slots)
            if slots is not None and (slots >= 0).any():
                slot_of_token = np.repeat(slots, self.host_query_lens)  # (T,)
                for s in np.unique(slot_of_token[slot_of_token >= 0]).tolist():
                    rows = np.flatnonzero(slot_of_token == s)
                    contiguous = rows[-1] - rows[0] + 1 == len(rows)
                    self._groups.append((s, slice(int(rows[0]), int(rows[-1]) + 1) if contiguous else rows))
        return self._groups


@dataclass
class LoRALinear:
    """A Linear weight with adapters: the backend's linear() adds the LoRA delta."""

    base: Any  # whatever prepare_linear made of W
    slots: LoRASlots
    batch: LoRABatch

    @property
    def nbytes(self) -> int:
        """The base weight's bytes (the memory plan counts the slots on their own)."""
        return int(self.base.nbytes)


# --- reference ---------------------------------------------------------------------------
def lora_shrink_ref(x: np.ndarray, a: np.ndarray, seg_starts: np.ndarray, seg_slots: np.ndarray) -> np.ndarray:
    """x: (T, in), a: (S, R, in) -> v: (T, R) float32; rows of segments without an adapter are 0."""
    v = np.zeros((x.shape[0], a.shape[1]), np.float32)
    for b, s in enumerate(seg_slots):
        lo, hi = int(seg_starts[b]), int(seg_starts[b + 1])
        if s >= 0:
            v[lo:hi] = x[lo:hi].astype(np.float32) @ a[s].astype(np.float32).T
    return v


def lora_expand_ref(
    y: np.ndarray, v: np.ndarray, b: np.ndarray, seg_starts: np.ndarray, seg_slots: np.ndarray
) -> np.ndarray:
    """y: (T, out), v: (T, R), b: (S, R, out) -> y + v · B[slot] per segment (a new array)."""
    out = y.astype(np.float32)
    for i, s in enumerate(seg_slots):
        lo, hi = int(seg_starts[i]), int(seg_starts[i + 1])
        if s >= 0:
            out[lo:hi] += v[lo:hi] @ b[s].astype(np.float32)
    return out


# --- CPU -----------------------------------------------------------------------------------
def add_lora_grouped(y: np.ndarray, x: np.ndarray, slots: LoRASlots, groups: list[tuple[int, Any]]) -> None:
    """y (T, out) += (x·A[s]ᵀ)·B[s] for each group of tokens sharing slot s, in place:
    a gather, two GEMMs of rank R and a scatter-add per adapter in the batch."""
    for s, rows in groups:
        y[rows] += (x[rows] @ slots.a[s].T) @ slots.b[s]


# --- launch (cuda/lora.cu) ------------------------------------------------------------------
# shrink: one block per (segment, 4 rank rows), a warp per rank row. expand: one block
# per (segment, 256 output columns), a thread per column.
SHRINK_WARPS = 4
EXPAND_THREADS = 256


def launch_lora_shrink(xp: Any, loader: KernelLoader, x: Any, a: Any, seg_starts: Any, seg_slots: Any) -> Any:
    """x: (T, in), a: (S, R, in), seg_starts: (B+1,), seg_slots: (B,) int32 -> v: (T, R) float32."""
    x = xp.ascontiguousarray(x)
    T, n_in = x.shape
    B, R = seg_slots.shape[0], a.shape[1]
    if a.shape[2] != n_in or a.dtype != x.dtype:
        raise ValueError(f"LoRA A {a.shape} {a.dtype} does not fit x {x.shape} {x.dtype}")
    v = xp.empty((T, R), dtype=np.float32)
    if T and B:
        vec = 16 // x.itemsize
        if n_in % vec or data_ptr(x) % 16 or data_ptr(a) % 16:
            vec = 1
        kernel = loader.get_function("lora.cu", f"lora_shrink_{dtype_suffix(x)}_v{vec}")
        grid = (B, ceil_div(R, SHRINK_WARPS))
        kernel(grid, (32 * SHRINK_WARPS,), (v, x, a, seg_starts, seg_slots, np.int32(n_in), np.int32(R)))
    return v


def launch_lora_expand(xp: Any, loader: KernelLoader, y: Any, v: Any, b: Any, seg_starts: Any, seg_slots: Any) -> None:
    """y: (T, out) contiguous, updated in place; v: (T, R) float32; b: (S, R, out)."""
    T, out = y.shape
    B, R = seg_slots.shape[0], b.shape[1]
    if b.shape[2] != out or v.shape != (T, R) or b.dtype != y.dtype or not y.flags.c_contiguous:
        raise ValueError(f"LoRA B {b.shape} and v {v.shape} do not fit y {y.shape}")
    if T and B:
        kernel = loader.get_function("lora.cu", f"lora_expand_{dtype_suffix(y)}")
        grid = (B, ceil_div(out, EXPAND_THREADS))
        kernel(grid, (EXPAND_THREADS,), (y, v, b, seg_starts, seg_slots, np.int32(out), np.int32(R)))
