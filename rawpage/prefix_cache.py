"""Prefix caching: the part of the BlockManager that names full blocks by their content.

A full block's name is a SHA-256 of its tokens chained on the previous block's name
and rooted in the request's extra keys (cache salt; rawpage/block_hash.py), so a
new request with the same prefix finds the blocks an earlier one filled. Mixed into
BlockManager (rawpage/block_manager.py), whose allocator forgets a name only when it
reuses the block: this class reads and writes the manager's `block_hash` (physical
block -> name), `cached` (name -> physical block), `ref_counts` and `block_size`.
"""

from __future__ import annotations

from collections.abc import Collection

from rawpage.block_hash import block_digest
from rawpage.kv_usage import NULL_BLOCK
from rawpage.sequence import Sequence


class PrefixCaching:
    block_size: int
    enable_prefix_caching: bool
    ref_counts: list[int]
    block_hash: list[bytes | None]
    cached: dict[bytes, int]

    def cached_block_ids(self) -> Collection[int]:
        """Blocks whose content is named in the prefix cache, in use or free."""
        return self.cached.values()

    def block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[bytes]:
        """Chained names of the sequence's first full blocks, memoised on the sequence
        (tokens of a full block never change)."""
        hashes, bs = seq.block_hashes, self.block_size
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else seq.request.root_digest
            hashes.append(block_digest(parent, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes[:num_full_blocks]

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Physical blocks holding the longest cached prefix of a sequence that has none yet.
        At least one token is always left to compute, so the step yields its logits."""
        if not self.enable_prefix_caching:
            return []
        matched = []
        for h in self.block_hashes(seq, (seq.num_tokens - 1) // self.block_size):
            block = self.cached.get(h)
            if block is None:
                break
            matched.append(block)
        return matched

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Name the sequence's newly completed blocks by their content, after a forward pass."""
        if not self.enable_prefix_caching:
            return
        n_full = (seq.num_computed_tokens - seq.num_draft_tokens) // self.block_size  # never a drafted token
        hashes = self.block_hashes(seq, n_full)
        for i in range(seq.num_hashed_blocks, n_full):
            block, h = seq.block_table[i], hashes[i]
            if block != NULL_BLOCK and self.block_hash[block] is None and h not in self.cached:
                self.block_hash[block] = h
                self.cached[h] = block
        seq.num_hashed_blocks = n_full

    def reset_prefix_cache(self) -> None:
        for b, h in enumerate(self.block_hash):
            if h is not None and self.ref_counts[b] == 0:
                self.block_hash[b] = None
                del self.cached[h]
