"""What one forward pass needs to know about the batch, built by the model runner.

The batch is flat: the T tokens of all B sequences laid end to end, each
sequence's new tokens contiguous (a prefill chunk, or one decode token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class ForwardBatch:
    input_ids: Any  # (T,) int32
    positions: Any  # (T,) int32, position of each token in its sequence
    slot_mapping: Any  # (T,) int32, KV cache slot (block * BS + offset) for each token, -1 = skip
    block_tables: Any  # (B, max_blocks) int32, physical block of each logical block
    seq_lens: Any  # (B,) int32, context length after this step
    query_start_loc: Any  # (B+1,) int32, prefix sums of new tokens per sequence
    logits_indices: Any  # (N,) int32, rows of the hidden states to turn into logits
    # Host copies of the same small facts, so backends can choose a launch
    # without reading device memory.
    host_query_lens: np.ndarray  # (B,)
    host_seq_lens: np.ndarray  # (B,)
    lora_slots: Any = None  # (B,) int32, the LoRA adapter slot of each sequence, -1 = none

    @property
    def num_tokens(self) -> int:
        return int(self.host_query_lens.sum())

    @property
    def max_query_len(self) -> int:
        return int(self.host_query_lens.max()) if len(self.host_query_lens) else 0

    @property
    def max_seq_len(self) -> int:
        return int(self.host_seq_lens.max()) if len(self.host_seq_lens) else 0
