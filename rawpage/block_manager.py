"""BlockManager: who owns which KV block.

The KV cache is one pool of `num_blocks` blocks of `block_size` token slots.
A sequence's block table maps its logical blocks (token i lives in logical
block i // BS) to any physical blocks. Blocks are reference-counted so that
sequences can share them:
  - fork (n > 1, beams): children point at the parent's blocks;
  - prefix caching: a full block is named by a SHA-256 of its tokens chained on
    the previous block's name and rooted in the request's cache salt
    (rawpage/block_hash.py), so a new request with the same prefix (and salt)
    finds it.
A shared block is never written: a sequence about to write into one gets its
own copy first (copy-on-write; the runner does the copy before the forward).

Freed blocks go to the back of an LRU free queue and keep their hash, so a
later request can still hit them; allocation takes from the front and only
then forgets the hash.

Sliding window W in every layer: append_slots releases a running sequence's blocks
wholly older than its next token's window; their entries become NULL_BLOCK (positions
kept; no kernel reads them). They keep the prefix-cache names they got when they filled.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from rawpage.kv_usage import KVUsage, stored_tokens
from rawpage.prefix_cache import PrefixCache
from rawpage.sequence import NULL_BLOCK, Sequence


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        watermark: float = 0.01,
        num_cpu_blocks: int = 0,
        sliding_window: int | None = None,  # only if every layer has it: a global layer reads all keys
    ) -> None:
        self.num_blocks = num_blocks
        self.sliding_window = sliding_window
        self.num_window_releases = 0  # block references dropped out of the window
        self.block_size = block_size
        self.prefix_cache = PrefixCache(num_blocks, block_size, enable_prefix_caching)
        self.watermark_blocks = int(watermark * num_blocks)
        self.ref_counts = [0] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.pending_copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) for the runner
        self.num_cow_copies = 0
        self.num_evictions = 0  # cached blocks whose content was dropped to make room
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found
        # The swap pool: same block layout, in CPU memory. Swapped sequences own CPU blocks only.
        self.num_cpu_blocks = num_cpu_blocks
        self.cpu_free: list[int] = list(range(num_cpu_blocks - 1, -1, -1))

    # --- queries -----------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_shared_blocks_saved(self) -> int:
        """Physical blocks saved by sharing: each extra reference to a block is one block not stored twice."""
        return sum(r - 1 for r in self.ref_counts if r > 1)

    def cached_block_ids(self) -> Collection[int]:
        """Blocks whose content is named in the prefix cache, in use or free."""
        return self.prefix_cache.cached.values()

    def usage(self, seqs: list[Sequence]) -> KVUsage:
        """Account for the blocks of the given sequences (the ones holding GPU blocks)."""
        used, free, stored = self.num_used_blocks, self.num_free_blocks, stored_tokens(seqs, self.block_size)
        logical, waste = sum(s.num_computed_tokens for s in seqs), used * self.block_size - stored
        return KVUsage(used, free, logical, stored, waste, self.num_shared_blocks_saved(), self.num_window_releases)

    # --- allocation ----------------------------------------------------------------------
    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int]) -> bool:
        """Can a waiting sequence start with `cached_blocks` plus room for num_new_tokens,
        keeping a small watermark free so running sequences are not preempted at once?"""
        start = len(cached_blocks) * self.block_size
        new = self.blocks_for(start + num_new_tokens) - len(cached_blocks)
        return new <= self.num_allocatable_blocks(cached_blocks)

    def num_allocatable_blocks(self, cached_blocks: list[int]) -> int:
        """Fresh blocks a waiting sequence may take if it starts on `cached_blocks`: the free
        queue minus the watermark, minus the cached blocks that are themselves in the free
        queue (no owner right now), because starting on them takes them out of it."""
        revived = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        return self.num_free_blocks - self.watermark_blocks - revived

    def allocate(self, seq: Sequence, cached_blocks: list[int]) -> None:
        """Start a sequence on its cached prefix; append_slots adds the rest."""
        assert not seq.block_table
        if self.prefix_cache.enabled:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += len(cached_blocks) * self.block_size
        for b in cached_blocks:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]
            self.ref_counts[b] += 1
        seq.block_table = list(cached_blocks)
        seq.num_hashed_blocks = len(cached_blocks)
        seq.num_computed_tokens = len(cached_blocks) * self.block_size

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for the next num_new_tokens of a sequence; False (and no change) if the
        pool is too small. A shared block about to be written is copied first; blocks that left
        the sliding window are released first (and stay released either way)."""
        self.release_out_of_window(seq)
        first = seq.num_computed_tokens // self.block_size  # the block the first new token lands in
        cow = first < len(seq.block_table) and self.ref_counts[seq.block_table[first]] > 1
        new = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if max(new, 0) + cow > self.num_free_blocks:
            return False
        if cow:
            src = seq.block_table[first]
            dst = self._take_free_block()
            self.ref_counts[src] -= 1
            seq.block_table[first] = dst
            self.pending_copies.append((src, dst))
            self.num_cow_copies += 1
        for _ in range(new):
            seq.block_table.append(self._take_free_block())
        return True

    def release_out_of_window(self, seq: Sequence) -> None:
        """Release the blocks wholly older than the window of the sequence's next token
        (position p = num_computed_tokens sees keys p-W+1 .. p)."""
        oldest_visible = seq.num_computed_tokens - self.sliding_window + 1 if self.sliding_window else 0
        for i in range(max(0, oldest_visible) // self.block_size):
            if seq.block_table[i] != NULL_BLOCK:
                self._release(seq.block_table[i])
                seq.block_table[i] = NULL_BLOCK
                self.num_window_releases += 1

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Name the sequence's newly completed blocks in the prefix cache (prefix_cache.py)."""
        seq.num_hashed_blocks = self.prefix_cache.cache_full_blocks(seq)

    def trim(self, seq: Sequence) -> None:
        """Speculative decoding's rollback: drop the tail blocks past the sequence's tokens
        (they held only rejected drafts, and were never named in the prefix cache)."""
        for b in seq.block_table[self.blocks_for(seq.num_tokens) :]:
            self._release(b)
        del seq.block_table[self.blocks_for(seq.num_tokens) :]

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write (src, dst) block copies made since the last call, for the runner
        to do before the next forward pass."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_hashed_blocks = parent.num_hashed_blocks
        for b in filter(lambda b: b != NULL_BLOCK, child.block_table):
            self.ref_counts[b] += 1

    # --- swapping ---------------------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        return sum(b != NULL_BLOCK for b in seq.block_table) <= len(self.cpu_free)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move a sequence's blocks to the CPU pool. Returns (gpu block, cpu block) copies for
        the runner, which must happen before the freed GPU blocks are written again."""
        cpu_table = [NULL_BLOCK if b == NULL_BLOCK else self.cpu_free.pop() for b in seq.block_table]
        mapping = [(b, c) for b, c in zip(seq.block_table, cpu_table) if b != NULL_BLOCK]
        self.free(seq)  # shared blocks stay on the GPU for their other owners
        seq.cpu_block_table = cpu_table
        return mapping

    def can_swap_in(self, seq: Sequence, num_new_tokens: int) -> bool:
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - seq.cpu_block_table.count(NULL_BLOCK)
        return need <= self.num_free_blocks - self.watermark_blocks

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring a swapped sequence back into fresh GPU blocks. Returns (cpu, gpu) copies."""
        gpu_table = [NULL_BLOCK if c == NULL_BLOCK else self._take_free_block() for c in seq.cpu_block_table]
        mapping = [(c, g) for c, g in zip(seq.cpu_block_table, gpu_table) if c != NULL_BLOCK]
        seq.block_table = gpu_table
        self.cpu_free.extend(c for c, _ in mapping)
        seq.cpu_block_table = []
        return mapping

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references. Tail blocks are freed first so that the LRU queue
        evicts a prefix's last blocks before its first ones."""
        self.cpu_free.extend(c for c in seq.cpu_block_table if c != NULL_BLOCK)
        seq.cpu_block_table = []
        for b in reversed(seq.block_table):
            if b != NULL_BLOCK:
                self._release(b)
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        assert self.ref_counts[block] >= 0, f"block {block} freed twice"
        if self.ref_counts[block] == 0:
            self.free_queue[block] = None

    def _take_free_block(self) -> int:
        block, _ = self.free_queue.popitem(last=False)
        self.num_evictions += self.prefix_cache.forget(block)  # its old content is about to be overwritten
        self.ref_counts[block] = 1
        return block
