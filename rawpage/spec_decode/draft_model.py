"""Draft-model proposer: a small model of the same vocabulary drafts k tokens greedily.

It keeps its own paged KV cache (its own BlockManager and ModelRunner, block tables of
its own) for every sequence it drafts for: as many blocks as the target's pool, sized
with it in the memory plan (rawpage/memory.py). Each step it first catches up on the
tokens the target accepted since its last draft (for a new sequence, the whole prompt),
which also yields the first draft; a long catch-up is split into passes of at most
--max-num-batched-tokens, the size the memory plan profiled. Then k - 1 one-token decode
steps, all sequences batched.
Its K/V stays valid up to the longest common prefix of what it drafted and what the
target kept, so rejected drafts cost nothing to roll back.

A greedy request drafts the draft model's argmax. A sampled request draws each draft
from q, the draft model's distribution under the request's temperature, top_k, min_p
and top_p, with the sequence's own generator; q is kept for rejection sampling
(rejection.py), which then keeps the target's distribution exactly.
"""

from __future__ import annotations

import numpy as np

from rawpage.backends.base import Backend
from rawpage.block_manager import BlockManager
from rawpage.loader import load_checkpoint
from rawpage.model_runner import KVPool, ModelRunner
from rawpage.ops.sampling import inverse_cdf
from rawpage.rank_setup import build_rank
from rawpage.sampler import Sampler
from rawpage.sequence import Sequence, SequenceStatus


class DraftSequence:
    """The draft model's record of one target sequence: what the block manager and the
    runner read (token_ids, num_computed_tokens, block_table)."""

    def __init__(self, target: Sequence) -> None:
        self.target = target
        self.token_ids: list[int] = []  # the target's tokens, then this step's drafts
        self.num_computed_tokens = 0  # tokens with K/V in the draft's cache
        self.num_draft_tokens = 0
        self.block_table: list[int] = []
        self.cpu_block_table: list[int] = []
        self.block_hashes: list[bytes] = []
        self.num_hashed_blocks = 0


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def load_draft_model(model_path: str, backend: Backend, vocab_size: int, seed: int = 0):
    """The draft model on the backend. The engine loads it before sizing the KV cache, so
    that its weights and its pool are in the memory plan (rawpage/memory.py)."""
    ckpt = load_checkpoint(model_path, "auto", seed)
    if ckpt.config.vocab_size != vocab_size:
        raise ValueError(
            f"speculative_config: the draft model {model_path} has a vocabulary of {ckpt.config.vocab_size} "
            f"tokens, the target {vocab_size}; a draft model must share the target's tokenizer"
        )
    return build_rank(ckpt, backend, "auto")


class DraftModelProposer:
    def __init__(
        self,
        model,
        backend: Backend,
        block_size: int,
        num_blocks: int,
        max_model_len: int,
        vocab_size: int,
        max_num_batched_tokens: int,
    ) -> None:
        """model: from load_draft_model; num_blocks: the target pool's (the plan sized both);
        max_num_batched_tokens: the most tokens one catch-up pass runs (the profiled peak)."""
        self.model = model
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.runner = ModelRunner(self.model, backend, KVPool(block_size, num_blocks), None, max_model_len)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.states: dict[int, DraftSequence] = {}  # target seq_id -> its draft record
        self.sampler = Sampler(vocab_size, [])  # q: the draft's distribution under each request's parameters
        self.draft_probs: dict[int, list[np.ndarray]] = {}  # seq_id -> q (V,) of each draft, sampled requests

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """Up to ks[i] drafts for each sequence (its token_ids hold no drafts yet)."""
        self._release_idle()
        self.draft_probs = {s.seq_id: [] for s in seqs if not s.request.params.greedy}
        states = [self._sync(s) for s in seqs]
        drafts: list[list[int]] = [[] for _ in seqs]
        active = list(range(len(seqs)))
        while active:
            batch = self._schedule(states, active)
            if not batch:
                break
            logits = self.runner.execute([(states[i], n) for i, n in batch], [np.array([n - 1]) for _, n in batch])
            caught_up = []  # (row, i): sequences whose last pass reached their newest token
            for row, (i, n) in enumerate(batch):
                states[i].num_computed_tokens += n
                if states[i].num_computed_tokens == len(states[i].token_ids):
                    caught_up.append((row, i))
            if not caught_up:
                continue
            rows = np.array([row for row, _ in caught_up], dtype=np.int64)
            for (_, i), tok in zip(caught_up, self._choose([seqs[i] for _, i in caught_up], logits, rows)):
                states[i].token_ids.append(int(tok))
                drafts[i].append(int(tok))
            active = [i for i in active if len(drafts[i]) < ks[i]]
        return drafts

    def _schedule(self, states: list[DraftSequence], active: list[int]) -> list[tuple[int, int]]:
        """(i, n): run n tokens of sequence i in the next pass, at most max_num_batched_tokens
        in all (the memory plan profiled that many), so a long catch-up spans passes. A
        sequence the draft pool cannot hold leaves `active`: it drafts no more this step."""
        batch, budget = [], self.max_num_batched_tokens
        for i in list(active):
            st = states[i]
            n = min(len(st.token_ids) - st.num_computed_tokens, budget)
            if n == 0:  # this pass is full; the rest run in the next
                break
            if self.block_manager.append_slots(st, n):
                batch.append((i, n))
                budget -= n
            else:
                active.remove(i)
        return batch

    def _choose(self, seqs: list[Sequence], logits, rows: np.ndarray) -> np.ndarray:
        """The next draft of each sequence from its row of logits: argmax, or a draw from q."""
        tokens = logits.argmax(rows)
        sampled = [j for j, s in enumerate(seqs) if s.seq_id in self.draft_probs]
        if sampled:
            picked = [seqs[j] for j in sampled]
            q = self.sampler.probs(logits[rows[sampled]][:, : self.sampler.vocab_size].copy(), picked)
            q /= q.sum(axis=1, keepdims=True)
            for j, s, qj in zip(sampled, picked, q):
                tokens[j] = inverse_cdf(qj, s.rng.random())
                self.draft_probs[s.seq_id].append(qj)
        return tokens

    def _sync(self, seq: Sequence) -> DraftSequence:
        """The draft record of `seq`, its K/V kept up to what it shares with the target's tokens."""
        st = self.states.get(seq.seq_id)
        if st is None:
            st = self.states[seq.seq_id] = DraftSequence(seq)
        common = common_prefix_len(st.token_ids, seq.token_ids)
        st.num_computed_tokens = min(st.num_computed_tokens, common, seq.num_tokens - 1)
        st.token_ids = list(seq.token_ids)
        return st

    def _release_idle(self) -> None:
        """Free the draft K/V of sequences that finished, or were preempted (they recompute)."""
        for sid, st in list(self.states.items()):
            if st.target.status != SequenceStatus.RUNNING:
                self.block_manager.free(st)
                del self.states[sid]

    def release(self, seq: Sequence) -> None:
        st = self.states.pop(seq.seq_id, None)
        if st is not None:
            self.block_manager.free(st)
