"""What one forward pass needs to know about the batch, built by the model runner.

The batch is flat: the T tokens of all B sequences laid end to end, each
sequence's new tokens contiguous (a prefill chunk, or one decode token).

BatchArrays declares the batch's int32 arrays once. The runner fills them on the
host (batch_buffer.HostBatch), BatchBuffer packs them in this order into one
device buffer, and the model reads them as views into it (ForwardBatch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawpage.ops.attention_metadata import AttentionMetadata


@dataclass
class BatchArrays:
    """One step's int32 arrays, in the order BatchBuffer packs them."""

    input_ids: Any  # (T,)
    positions: Any  # (T,) position of each token in its sequence
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
    attn: AttentionMetadata = field(init=False)  # built once per step, read by every layer

    def __post_init__(self) -> None:
        self.attn = AttentionMetadata(
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            max_query_len=int(self.host_query_lens.max(initial=0)),
            max_seq_len=int(self.host_seq_lens.max(initial=0)),
        )

    @property
    def num_tokens(self) -> int:
        return int(self.host_query_lens.sum())
