"""Prefix caching: the BlockManager's index of full blocks by their content.

A full block's name is a SHA-256 of its tokens chained on the previous block's name
and rooted in the request's extra keys (cache salt; rawpage/block_hash.py), so a
new request with the same prefix finds the blocks an earlier one filled. The
BlockManager (rawpage/block_manager.py) owns one PrefixCache, and names are
forgotten only when the allocator reuses a block (`forget`) or on a reset.
"""

from __future__ import annotations

from rawpage.block_hash import block_digest
from rawpage.sequence import NULL_BLOCK, Sequence


class PrefixCache:
    def __init__(self, num_blocks: int, block_size: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.enabled = enabled
        self.block_hash: list[bytes | None] = [None] * num_blocks  # physical block -> its name
        self.cached: dict[bytes, int] = {}  # block name -> physical block

    def block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[bytes]:
        """Chained names of the sequence's first full blocks, memoised on the sequence
        (tokens of a full block never change)."""
        hashes, bs = seq.block_hashes, self.block_size
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else seq.request.root_digest
            images = [
                im.digest for im in seq.request.images if im.offset < (i + 1) * bs and im.offset + im.length > i * bs
            ]
            hashes.append(block_digest(parent, seq.token_ids[i * bs : (i + 1) * bs], images))
        return hashes[:num_full_blocks]

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Physical blocks holding the longest cached prefix of a sequence that has none yet.
        At least one token is always left to compute, so the step yields its logits."""
        if not self.enabled:
            return []
        matched = []
        for h in self.block_hashes(seq, (seq.num_tokens - 1) // self.block_size):
            block = self.cached.get(h)
            if block is None:
                break
            matched.append(block)
        return matched

    def cache_full_blocks(self, seq: Sequence) -> int:
        """Name the sequence's newly completed blocks by their content, after a forward pass.
        Returns how many leading blocks are named now (BlockManager keeps it on the sequence)."""
        if not self.enabled:
            return seq.num_hashed_blocks
        n_full = (seq.num_computed_tokens - seq.num_draft_tokens) // self.block_size  # never a drafted token
        hashes = self.block_hashes(seq, n_full)
        for i in range(seq.num_hashed_blocks, n_full):
            block, h = seq.block_table[i], hashes[i]
            if block != NULL_BLOCK and self.block_hash[block] is None and h not in self.cached:
                self.block_hash[block] = h
                self.cached[h] = block
        return n_full

    def forget(self, block: int) -> bool:
        """The allocator is about to overwrite `block`: drop its name. True if it had one (an eviction)."""
        h, self.block_hash[block] = self.block_hash[block], None
        if h is not None and self.cached.get(h) == block:
            del self.cached[h]
        return h is not None

    def reset(self, ref_counts: list[int]) -> None:
        """Forget the names of the blocks no sequence holds (ref_counts[b] == 0)."""
        for b, h in enumerate(self.block_hash):
            if h is not None and ref_counts[b] == 0:
                self.block_hash[b] = None
                del self.cached[h]
