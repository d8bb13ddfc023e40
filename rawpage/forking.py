"""Forking a sequence: the n samples of one prompt, and the beams of beam search.

A child starts as a copy of its parent's tokens and progress. If the parent holds
its KV blocks, the child points at the same blocks (reference counts; the block
manager copies a shared, partially filled block only when one of them writes into
it). If the parent lost its blocks to preemption, the child recomputes them.
"""

from __future__ import annotations

from collections.abc import Iterator

from rawpage.scheduler import Scheduler
from rawpage.sequence import Request, Sequence


class Forker:
    def __init__(self, scheduler: Scheduler, seq_ids: Iterator[int]) -> None:
        self.scheduler = scheduler
        self.seq_ids = seq_ids  # the engine's sequence id counter
        self.share_blocks = True  # children point at the parent's KV blocks (False: compute their own)

    def fork(self, req: Request, parent: Sequence, index: int) -> Sequence:
        """A new sequence of `req`, continuing from `parent`, scheduled from the next step
        (the scheduler makes it: Scheduler.fork)."""
        return self.scheduler.fork(parent, next(self.seq_ids), index, self.share_blocks)

    def fork_samples(self, seq: Sequence) -> list[Sequence]:
        """n > 1: once the shared prompt is computed, the parent forks n - 1 children; each
        samples its own first token from the same logits. Returns the sequences to sample."""
        req = seq.request
        if req.params.n == 1 or req.forked:
            return [seq]
        req.forked = True
        for i in range(1, req.params.n):
            self.fork(req, seq, i)
        return list(req.seqs)
