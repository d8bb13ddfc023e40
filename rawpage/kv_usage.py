"""KV pool accounting: blocks in use, tokens stored, slots wasted, blocks saved by sharing
(BlockManager.usage fills it in)."""

from __future__ import annotations

from dataclasses import dataclass

from rawpage.sequence import NULL_BLOCK, Sequence


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


def stored_tokens(seqs: list[Sequence], block_size: int) -> int:
    """Tokens physically stored in the blocks of these sequences (a shared block counted once)."""
    filled: dict[int, int] = {}  # physical block -> slots holding a token
    for s in seqs:
        for i, b in enumerate(s.block_table):
            n = min(block_size, max(0, s.num_computed_tokens - i * block_size))
            filled[b] = max(filled.get(b, 0), n)
    filled.pop(NULL_BLOCK, None)  # entries released by a sliding window hold nothing
    return sum(filled.values())
