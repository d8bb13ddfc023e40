"""What one forward pass needs to know about the batch: built on the host with NumPy
by the model runner, sent to the device in one copy.

The batch is flat: the T tokens of all B sequences laid end to end, each
sequence's new tokens contiguous (a prefill chunk, or one decode token).

BatchArrays declares the batch's int32 arrays once. The runner fills them on the
host (HostBatch: vectorized NumPy, no per-token Python per layer); `BatchBuffer.upload`
packs them end to end into one host array, copies that to the device in one
host-to-device transfer, and hands the model a ForwardBatch whose arrays are views
into the one device buffer:

    [input_ids T | positions T | slot_mapping T | seq_lens B | query_start_loc B+1
     | logits_indices N | block_tables B*W | lora_slots B]

The device buffer never moves. So a CUDA graph captured on the views of a given
(T, B, N, W) reads the new step's data when the same shapes are uploaded again:
the decode graphs (rawpage/decode_graphs.py) rely on that.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from rawpage.backends.base import Backend
from rawpage.multimodal.mm_batch import MultimodalBatch
from rawpage.ops.attention_metadata import AttentionMetadata


@dataclass
class BatchArrays:
    """One step's int32 arrays, in the order BatchBuffer packs them."""

    input_ids: Any  # (T,)
    positions: Any  # (T,) rotary position of each token: its place in its sequence (M-RoPE: its t position)
    slot_mapping: Any  # (T,) KV cache slot (block * BS + offset) for each token, -1 = skip
    seq_lens: Any  # (B,) context length after this step
    query_start_loc: Any  # (B+1,) prefix sums of new tokens per sequence
    logits_indices: Any  # (N,) rows of the hidden states to turn into logits
    block_tables: Any  # (B, max_blocks) physical block of each logical block
    lora_slots: Any = None  # (B,) the LoRA adapter slot of each sequence, -1 = none


@dataclass
class ForwardBatch(BatchArrays):
    """The arrays on the device, with host copies of the small facts, so that backends
    choose a launch without reading device memory."""

    host_query_lens: np.ndarray = field(kw_only=True)  # (B,)
    host_seq_lens: np.ndarray = field(kw_only=True)  # (B,)
    # logits_indices is 0 .. T-1 (every row is sampled: a decode step, a padded graph
    # batch), so the model skips gathering them: on the CPU a gather is NumPy work that a
    # recorded graph would not replay (backends/cpu.py capture_graph)
    samples_every_row: bool = field(kw_only=True, default=False)
    mm: MultimodalBatch | None = field(kw_only=True, default=None)  # the step's image rows, on the host
    key_end: Any = field(kw_only=True, default=None)  # (T,) mm.key_end on the device; None without images
    attn: AttentionMetadata = field(init=False)  # built once per step, read by every layer

    def __post_init__(self) -> None:
        self.attn = AttentionMetadata(
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            max_query_len=int(self.host_query_lens.max(initial=0)),
            max_seq_len=int(self.host_seq_lens.max(initial=0)),
            key_end=self.key_end,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.host_query_lens.sum())


FIELDS = tuple(f.name for f in fields(BatchArrays))  # the packing order


@dataclass
class HostBatch(BatchArrays):
    """One step's metadata on the host, all int32 NumPy arrays (BatchArrays says what
    each is); lora_slots None: no adapter at all; mm: the step's image rows (None: none)."""

    mm: MultimodalBatch | None = None

    def __post_init__(self) -> None:
        if self.lora_slots is None:
            self.lora_slots = np.full(len(self.seq_lens), -1, np.int32)

    @property
    def query_lens(self) -> np.ndarray:
        return np.diff(self.query_start_loc)

    @property
    def is_decode(self) -> bool:
        """Every sequence has exactly one new token (the decode kernel's case)."""
        return len(self.seq_lens) > 0 and len(self.input_ids) == len(self.seq_lens)

    def num_ints(self) -> int:
        return sum(getattr(self, f).size for f in FIELDS)


class BatchBuffer:
    """A device int32 buffer that receives each step's HostBatch in one copy."""

    def __init__(self, backend: Backend, capacity: int = 1 << 16) -> None:
        self.backend = backend
        self.device = backend.zeros((capacity,), np.int32)
        self.frozen = False  # set once graphs hold views into self.device

    def upload(self, hb: HostBatch) -> ForwardBatch:
        n = hb.num_ints()
        if n > self.device.shape[0]:
            if self.frozen:
                raise RuntimeError(
                    f"batch metadata of {n} ints does not fit the {self.device.shape[0]} captured graphs read from"
                )
            self.device = self.backend.zeros((max(n, 2 * self.device.shape[0]),), np.int32)
        flat = np.concatenate([getattr(hb, f).ravel() for f in FIELDS]).astype(np.int32, copy=False)
        self.backend.copy_from_host(self.device[:n], flat)
        views, start = {}, 0
        for f in FIELDS:
            a = getattr(hb, f)
            views[f] = self.device[start : start + a.size].reshape(a.shape)
            start += a.size
        every_row = np.array_equal(hb.logits_indices, np.arange(len(hb.input_ids)))
        # a step with images (never graphed) sends its image rows' key ends in a copy of their own
        key_end = None if hb.mm is None or hb.mm.key_end is None else self.backend.asarray(hb.mm.key_end, np.int32)
        return ForwardBatch(
            **views,
            host_query_lens=hb.query_lens,
            host_seq_lens=hb.seq_lens,
            samples_every_row=every_row,
            mm=hb.mm,
            key_end=key_end,
        )
