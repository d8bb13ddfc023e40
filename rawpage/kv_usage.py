"""KV pool accounting: blocks in use, tokens stored, slots wasted, blocks saved by sharing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

NULL_BLOCK = -1  # a block-table entry released by the sliding window (block_manager.py)

if TYPE_CHECKING:
    from rawpage.block_manager import BlockManager
    from rawpage.sequence import Sequence


@dataclass
class KVUsage:
    """Memory accounting of the pool, for the log, the metrics and the benchmarks."""

    blocks_used: int
    blocks_free: int
    logical_tokens: int  # tokens in the cache as the sequences see them (shared ones counted per sequence)
    stored_tokens: int  # tokens physically stored (shared ones counted once)
    waste: int  # allocated slots holding no token: blocks_used * BS - stored_tokens
    blocks_saved_by_sharing: int  # extra references: blocks that would exist without sharing
    blocks_released_by_window: int  # block references dropped out of sliding windows (since start)


def kv_usage(bm: BlockManager, seqs: list[Sequence]) -> KVUsage:
    """Account for the blocks of the given sequences (the ones holding GPU blocks)."""
    filled: dict[int, int] = {}  # physical block -> slots holding a token
    logical = 0
    for s in seqs:
        logical += s.num_computed_tokens
        for i, b in enumerate(s.block_table):
            n = min(bm.block_size, max(0, s.num_computed_tokens - i * bm.block_size))
            filled[b] = max(filled.get(b, 0), n)
    filled.pop(NULL_BLOCK, None)  # entries released by a sliding window hold nothing
    stored = sum(filled.values())
    used = bm.num_used_blocks
    saved, released = bm.num_shared_blocks_saved(), bm.num_window_releases
    return KVUsage(used, bm.num_free_blocks, logical, stored, used * bm.block_size - stored, saved, released)
