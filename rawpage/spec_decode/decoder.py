"""SpecDecoder: speculative decoding's two hooks in the engine's step.

    propose()  before scheduling: each decoding sequence gets up to k drafted tokens,
               appended to its token_ids (seq.num_draft_tokens of them), so the scheduler
               and the runner treat them as extra query tokens of one chunk (as chunked
               prefill does); the forward pass computes their K/V and their logits.
    settle()   after scheduling: drafts of sequences that were not scheduled (preempted,
               out of budget) are dropped; a chunk cut short by the budget keeps the
               drafts it covers.
    verify()   after the forward pass: rows j = 0..k of a sequence's chunk are the
               target's distributions after its first j drafts. Acceptance
               (rejection.py) picks the accepted drafts plus one token of the target's;
               the scheduler appends them one by one, the output processor checking
               each (stop strings, max_tokens, logprobs), and the KV slots of rejected
               drafts are rolled back. The drafts themselves are added, cut and taken
               back by the scheduler (Scheduler.add_drafts ... verified), which alone
               changes a sequence.

Prefix caching never names a block holding a draft: the block manager names only blocks
below `num_computed_tokens - num_draft_tokens`, and after verification every computed
token is an accepted one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawpage.device_logits import DeviceLogits
from rawpage.output_processor import OutputProcessor
from rawpage.sampler import Sampler, plain_greedy
from rawpage.scheduler import Scheduler, SchedulerOutput
from rawpage.sequence import Request, Sequence
from rawpage.spec_decode.adaptive import DraftLengths
from rawpage.spec_decode.config import SpeculativeConfig
from rawpage.spec_decode.rejection import greedy_accept, rejection_sample

# verify's answer: the sequences to sample as usual (with their logits rows), how many
# tokens verification appended, and the requests that failed while appending (with why).
Verified = tuple[list[tuple[Sequence, int]], int, list[tuple[Request, Exception]]]

logger = logging.getLogger("rawpage")


@dataclass
class SpecDecodeStats:
    """Counters for /metrics (rawpage:spec_decode_*) and the stats log."""

    num_drafts: int = 0  # sequence-steps that verified at least one drafted token
    num_draft_tokens: int = 0  # drafted tokens verified
    num_accepted_tokens: int = 0  # of which accepted
    num_emitted_tokens: int = 0  # tokens appended by verification steps (accepted + the target's own)
    draft_seconds: float = 0.0  # time spent proposing

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / max(1, self.num_draft_tokens)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verified sequence-step: 1 + accepted drafts (k + 1 at most)."""
        return 1 + self.num_accepted_tokens / max(1, self.num_drafts)


class RowView:
    """What the sampler reads of a sequence, as the sequence would be after `extra` drafts:
    the basis of row j's logit processors (penalties, min_tokens, grammar mask)."""

    def __init__(self, seq: Sequence, extra: list[int], grammar: Any) -> None:
        self.request, self.num_prompt_tokens, self.grammar = seq.request, seq.num_prompt_tokens, grammar
        self.thinking = None  # a sequence whose budget may still force a token does not draft (_candidates)
        self.token_ids = seq.token_ids + extra
        self.seq_id = -1 - seq.seq_id  # never matches a grammar mask prefetched for the sequence itself

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


class SpecDecoder:
    def __init__(
        self,
        config: SpeculativeConfig,
        proposer: Any,
        scheduler: Scheduler,
        sampler: Sampler,
        output: OutputProcessor,
        max_model_len: int,
    ) -> None:
        self.config, self.proposer, self.scheduler = config, proposer, scheduler
        self.sampler, self.output, self.max_model_len = sampler, output, max_model_len
        self.grammars: dict[int, list[Any]] = {}  # seq_id -> grammar states after 0..k drafts
        self.stats = SpecDecodeStats()
        self.lengths = DraftLengths(config.num_speculative_tokens)
        self._beam_logged = False

    # --- before scheduling ----------------------------------------------------------------
    def propose(self, running: list[Sequence]) -> None:
        t0 = time.perf_counter()
        for seq in running:  # leftovers of a failed step
            self.scheduler.drop_drafts(seq, 0)
        self.grammars = {}
        self.lengths.keep_only({s.seq_id for s in running})
        seqs, ks = self._candidates(running)
        for seq, draft in zip(seqs, self.proposer.propose(seqs, ks)):
            if seq.grammar is not None:
                draft = self._grammar_prefix(seq, draft)
            self.scheduler.add_drafts(seq, draft)
        self.stats.draft_seconds += time.perf_counter() - t0

    def _candidates(self, running: list[Sequence]) -> tuple[list[Sequence], list[int]]:
        """Decoding sequences and how many tokens each may draft: its adaptive length
        (adaptive.py), less near max_tokens or the context limit, and only into free blocks
        (speculation never preempts anyone)."""
        bm = self.scheduler.block_manager
        # What is left once every running sequence has room for its next token.
        free = (
            bm.num_free_blocks
            - bm.watermark_blocks
            - sum(bm.blocks_for(s.num_tokens) > len(s.block_table) for s in running)
        )
        seqs, ks = [], []
        for seq in running:
            if seq.request.beam is not None:
                self._log_beam_once()
                continue
            if seq.num_uncomputed_tokens != 1 or seq.num_output_tokens == 0:
                continue
            if seq.thinking is not None and seq.thinking.may_force:  # its next token may be forced: no drafts
                continue
            p = seq.request.params
            left = p.max_tokens - seq.num_output_tokens if p.max_tokens is not None else self.max_model_len
            k = min(self.lengths.allowed(seq.seq_id), left - 1, self.max_model_len - seq.num_tokens - 1)
            extra = bm.blocks_for(seq.num_tokens + k) - bm.blocks_for(seq.num_tokens)
            if k <= 0 or extra > free:
                continue
            free -= extra
            seqs.append(seq)
            ks.append(k)
        return seqs, ks

    def _grammar_prefix(self, seq: Sequence, draft: list[int]) -> list[int]:
        """The drafts the grammar allows, in order (cut at the first it forbids); keeps the
        grammar state after each, for verification's masks."""
        states = [seq.grammar]
        for t in draft:
            g = states[-1]
            row = g.mask()
            if row is not None and not (row.view(np.uint8)[t >> 3] >> (t & 7)) & 1:
                break
            g = g.fork()
            g.accept(t)
            states.append(g)
        self.grammars[seq.seq_id] = states
        return draft[: len(states) - 1]

    def _log_beam_once(self) -> None:
        if not self._beam_logged:
            logger.info("speculative decoding is off for beam-search requests (they decode one token per step)")
            self._beam_logged = True

    # --- after scheduling -------------------------------------------------------------------
    def settle(self, sched: SchedulerOutput) -> None:
        """Keep only the drafts the scheduled chunk covers (n - 1 of them); none if unscheduled."""
        scheduled = {seq.seq_id: n for seq, n in sched.scheduled}
        for seq in [*self.scheduler.running, *sched.preempted]:
            if seq.num_draft_tokens:
                self.scheduler.drop_drafts(seq, max(0, scheduled.get(seq.seq_id, 0) - 1))

    # --- after the forward pass ----------------------------------------------------------------
    def verify(self, logits: DeviceLogits, ready: list[tuple[Sequence, int]]) -> Verified:
        """ready: (sequence, its last logits row). Verifies the sequences that drafted and
        returns the others (to sample as usual), how many tokens verification appended, and
        the requests that failed while appending."""
        plain = [(s, r) for s, r in ready if not s.num_draft_tokens]
        spec = [(s, r) for s, r in ready if s.num_draft_tokens]
        if not spec:
            return plain, 0, []
        rows = [np.arange(last - s.num_draft_tokens, last + 1) for s, last in spec]
        drafts = [self.scheduler.take_drafts(s) for s, _ in spec]
        emitted = self._accept([s for s, _ in spec], drafts, rows, logits)
        before = [s.num_tokens for s, _ in spec]
        failed = self._append(spec, rows, emitted, logits)
        for (seq, _), d, e, n0 in zip(spec, drafts, emitted, before):
            self.stats.num_drafts += 1
            self.stats.num_draft_tokens += len(d)
            self.stats.num_accepted_tokens += len(e) - 1
            self.stats.num_emitted_tokens += seq.num_tokens - n0
            self.lengths.update(seq.seq_id, len(d), len(e) - 1)
            if seq.is_finished:
                self.proposer.release(seq)
            else:
                self.scheduler.verified(seq)
        return plain, sum(s.num_tokens - n0 for (s, _), n0 in zip(spec, before)), failed

    def _accept(
        self, seqs: list[Sequence], drafts: list[list[int]], rows: list[np.ndarray], logits: DeviceLogits
    ) -> list[list[int]]:
        """Each sequence's accepted drafts plus the target's next token."""
        out: list[list[int]] = [[] for _ in seqs]
        fast = [i for i, s in enumerate(seqs) if plain_greedy(s)]
        if fast:  # argmax on the device, one call for every plain greedy row
            targets = np.split(
                logits.argmax(np.concatenate([rows[i] for i in fast])), np.cumsum([len(rows[i]) for i in fast])[:-1]
            )
            for i, t in zip(fast, targets):
                m = greedy_accept(np.array(drafts[i]), t)
                out[i] = drafts[i][:m] + [int(t[m])]
        for i, seq in enumerate(seqs):
            if not out[i]:
                out[i] = self._accept_processed(seq, drafts[i], logits[rows[i]])
        return out

    def _accept_processed(self, seq: Sequence, draft: list[int], logits: np.ndarray) -> list[int]:
        """Acceptance on processed rows (penalties, bias, grammar masks...): logits (k+1, V)."""
        k = len(draft)
        states = self.grammars.get(seq.seq_id) or [seq.grammar] * (k + 1)
        views = [RowView(seq, draft[:j], states[j]) for j in range(k + 1)]
        processed = self.sampler.apply_processors(logits[:, : self.sampler.vocab_size].copy(), views)
        if seq.request.params.greedy:
            t = processed.argmax(axis=-1)
            m = greedy_accept(np.array(draft), t)
            return draft[:m] + [int(t[m])]
        probs = self.sampler.probs(processed, views)
        u = seq.rng.random(k + 1)  # k acceptance tests and one draw, from the sequence's own generator
        q = getattr(self.proposer, "draft_probs", {}).get(seq.seq_id)  # None: a deterministic draft
        q = np.stack(q[:k])[None] if q else None
        m, nxt = rejection_sample(
            probs[None] / probs.sum(axis=1)[None, :, None], np.array([draft]), u[None, :k], u[k:], q
        )
        return draft[: int(m[0])] + [int(nxt[0])]

    def _append(
        self, spec: list[tuple[Sequence, int]], rows: list[np.ndarray], emitted: list[list[int]], logits: DeviceLogits
    ) -> list[tuple[Request, Exception]]:
        """Hand the tokens to the scheduler one at a time, in order, so that a stop (string,
        token, max_tokens) ends the sequence there and the rest are dropped."""
        flat_seqs = [s for (s, _), e in zip(spec, emitted) for _ in e]
        flat_rows = np.concatenate([r[: len(e)] for r, e in zip(rows, emitted)])
        tokens = np.array([t for e in emitted for t in e], dtype=np.int64)
        wants = any(s.request.params.logprobs is not None for s in flat_seqs)
        raw = logits[flat_rows] if wants else np.zeros((len(flat_seqs), 0), np.float32)
        return self.scheduler.postprocess(flat_seqs, self.sampler.report(raw, tokens, flat_seqs), self.output)
