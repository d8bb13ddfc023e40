"""The attention contract's two arguments, besides q and the caches: what every layer
of one step shares, and what one layer of the model fixes at load.

    Backend.paged_attention(q, k_cache, v_cache, meta: AttentionMetadata, opts: AttentionOptions)

AttentionMetadata is built once per step from the forward batch (ForwardBatch.attn);
every layer reads the same object. AttentionOptions is built once per layer when the
model loads. The semantics of each field are the module docstring's of
rawpage/ops/paged_attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class AttentionMetadata:
    """One step's batch as attention sees it. The arrays are the backend's (device
    arrays on cuda); max_query_len and max_seq_len are host-side facts about them, so
    that a kernel backend picks its launch without reading device memory (an upper
    bound is enough: a CUDA graph is captured with the longest context)."""

    block_tables: Any  # (B, max_blocks) int32, physical block of each logical block
    seq_lens: Any  # (B,) int32, context length including this step's tokens
    query_start_loc: Any  # (B+1,) int32, sequence i's query rows are [qsl[i], qsl[i+1])
    max_query_len: int  # the longest chunk: 1 means every sequence decodes
    max_seq_len: int  # the longest context
    # (T,) int32, the last key each row sees beyond its own position: the last token of
    # its image for an image's rows (they attend to each other both ways, Gemma 3), -1 for
    # other rows; None: a step without image rows, causal throughout
    key_end: Any = None

    @classmethod
    def from_host(
        cls,
        block_tables: np.ndarray,
        seq_lens: np.ndarray,
        query_start_loc: np.ndarray,
        key_end: np.ndarray | None = None,
    ) -> AttentionMetadata:
        """From host (NumPy) arrays, with the two maxima read off them."""
        max_query_len = int(np.diff(query_start_loc).max(initial=0))
        return cls(block_tables, seq_lens, query_start_loc, max_query_len, int(np.max(seq_lens, initial=0)), key_end)


@dataclass(frozen=True)
class AttentionOptions:
    """One layer's attention, fixed at load.
    sliding_window W: a query at position p sees keys p-W+1..p only (Mistral, Gemma's
    local layers). soft_cap c: scores become c * tanh(scores / c) (Gemma 2)."""

    scale: float  # scores are Q K^T * scale (usually D**-0.5)
    sliding_window: int | None = None  # None: every earlier key
    soft_cap: float | None = None  # None: no cap
