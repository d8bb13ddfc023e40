"""Scheduler: decides, every iteration, which sequences run and how many tokens each.

Iteration-level scheduling (continuous batching) with a token budget, as in
vLLM: every step gets at most `max_num_batched_tokens` new tokens.
  1. Running sequences go first, oldest first. A decoding sequence needs one
     token; a sequence still in its prompt takes as many tokens as the budget
     allows (chunked prefill). If the pool has no room for a sequence's next
     tokens, the newest running sequence is preempted (its blocks freed, to be
     recomputed, or swapped to CPU memory), until there is room.
  2. If nothing was preempted, waiting requests are admitted in priority then
     arrival order while the budget, `max_num_seqs` and free blocks allow,
     first reusing any prefix already in the cache.
Prefill chunks and decodes then run together in one forward pass.

The scheduler is the one owner of a sequence's state (vLLM v1's rule; nano-vllm's
`postprocess`): besides scheduling, only its methods below change a sequence once it
exists. The runner, the sampler, the output processor, beam search and speculative
decoding return data and decisions (tokens, a Stop), and the engine hands them here.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rawpage.block_manager import BlockManager
from rawpage.lora.lora_limit import lora_fits
from rawpage.sequence import Request, Sequence, SequenceStatus
from rawpage.stop_checker import TokenChecks

if TYPE_CHECKING:
    from rawpage.sampler import SamplerOutput


@dataclass
class SchedulerConfig:
    """The engine's settings the scheduler reads; their defaults live on EngineArgs (the
    engine fills in max_num_batched_tokens for its device and max_model_len for its model)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    preemption_mode: str  # "recompute" or "swap"
    max_loras: int = 0  # --max-loras: most adapters among the running sequences (0: LoRA off)


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, new tokens)
    preempted: list[Sequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write, before the forward
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu, cpu) block copies, done first
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu, gpu) block copies, done next

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


def _order(seq: Sequence) -> tuple:
    """Scheduling order: priority (lower first), then arrival, then sequence id."""
    return (seq.request.priority, seq.request.arrival_time, seq.seq_id)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: list[Sequence] = []  # kept sorted by _order
        self.running: list[Sequence] = []  # kept sorted by _order
        self.swapped: list[Sequence] = []  # preempted to CPU memory; resumed before new admissions
        self.num_preemptions = 0
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.encoder_budget = config.max_num_batched_tokens  # refilled each step (_image_chunk)
        self.num_waiting_deferred = 0  # waiting sequences let by in the last step: over --max-loras, grammar compiling

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_order)

    def add_running(self, seq: Sequence) -> None:
        """A forked child: it already shares its parent's blocks."""
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=_order)

    def finish(self, seq: Sequence, reason: str | None = None, stop_reason: int | str | None = None) -> None:
        """Remove a finished or aborted sequence and free its blocks at once. reason:
        "stop", "length" or "abort" (vLLM's finish_reason), and what stopped it."""
        for queue in (self.running, self.waiting, self.swapped):
            if seq in queue:
                queue.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        if reason is not None:
            seq.finish_reason, seq.stop_reason = reason, stop_reason

    # --- after a forward pass: the sequence's progress and tokens -------------------------
    def computed(self, seq: Sequence, n: int) -> None:
        """The forward pass computed n more of its tokens' K/V; the prefix cache names the
        blocks that filled."""
        seq.num_computed_tokens += n
        self.block_manager.cache_full_blocks(seq)

    def append_token(self, seq: Sequence, token: int, logprob: float, entry: dict | None = None) -> None:
        """A sampled (or verified) token joins the sequence; entry: its reported logprobs."""
        seq.append_token(token, logprob, entry)

    def postprocess(
        self, seqs: list[Sequence], out: SamplerOutput, output: TokenChecks
    ) -> list[tuple[Request, Exception]]:
        """Row i of the sampler's output is seqs[i]'s next token (nano-vllm's postprocess):
        appended, checked by the output processor (text, stop strings, stop tokens, lengths),
        and a sequence that stops is finished at once, its blocks freed this step. Rows of
        one sequence follow each other in order (verified drafts): a stop drops the rest.
        Returns the requests that failed here, with why; the others carry on."""
        now, failed = time.time(), []
        for i, seq in enumerate(seqs):
            if seq.is_finished:
                continue
            try:
                self.append_token(seq, *output.sampled(seq, out, i, now))
                stop = output.check_stop(seq)
                if stop is not None:
                    self.finish(seq, *stop)
            except Exception as e:  # noqa: BLE001 - isolated to this request
                failed.append((seq.request, e))
        return failed

    def fork(self, parent: Sequence, seq_id: int, index: int, share: bool = True) -> Sequence:
        """A new sequence of parent's request continuing from it, scheduled from the next
        step: it shares the parent's blocks if the parent holds them, else (or with share
        False: tools/bench_sharing.py's comparison point) recomputes them."""
        child = parent.fork(seq_id, index, parent.seed)
        parent.request.seqs.append(child)
        if share and parent.status == SequenceStatus.RUNNING:
            self.block_manager.fork(parent, child)
            self.add_running(child)
        else:
            child.num_computed_tokens = 0
            self.add(child)
        return child

    # --- speculative decoding: drafts ride at the end of token_ids until verified ---------
    def add_drafts(self, seq: Sequence, draft: list[int]) -> None:
        seq.token_ids += draft
        seq.num_draft_tokens = len(draft)

    def drop_drafts(self, seq: Sequence, keep: int) -> None:
        """Keep the first `keep` drafts (the ones this step will compute), drop the rest."""
        cut = seq.num_draft_tokens - min(keep, seq.num_draft_tokens)
        if cut:
            del seq.token_ids[len(seq.token_ids) - cut :]
            seq.num_draft_tokens -= cut

    def take_drafts(self, seq: Sequence) -> list[int]:
        """The drafts, taken off for verification: the accepted ones come back as tokens."""
        k = seq.num_draft_tokens
        draft = seq.token_ids[-k:]
        del seq.token_ids[-k:]
        seq.num_draft_tokens = 0
        seq.num_computed_tokens = seq.num_tokens  # the drafts' K/V are not yet accepted
        return draft

    def verified(self, seq: Sequence) -> None:
        """Every token but the newest now has its K/V (the accepted drafts'); the slots of the
        rejected ones are released (whole blocks) or overwritten by the next step."""
        seq.num_computed_tokens = seq.num_tokens - 1
        self.block_manager.trim(seq)
        self.block_manager.cache_full_blocks(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self.encoder_budget = self.config.max_num_batched_tokens  # image tokens whose encoder may run this step
        self.num_waiting_deferred = 0
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:  # a step that had to preempt admits nobody
            budget = self._schedule_swapped(out, budget)
            if not self.swapped:  # swapped sequences come back before new ones start
                self._schedule_waiting(out, budget)
        if self.config.max_loras:  # one adapter's sequences side by side: its LoRA rows are contiguous
            out.scheduled.sort(key=lambda item: id(item[0].request.lora) if item[0].request.lora else 0)
        out.block_copies = self.block_manager.take_copies()
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """1. Running sequences, oldest first; preempt from the newest end when out of
        blocks. Returns the token budget left."""
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._image_chunk(seq, seq.num_computed_tokens, min(seq.num_uncomputed_tokens, budget))
            if n == 0:  # a beam waiting for its siblings' logits, or an image that needs more budget
                i += 1
                continue
            while not self.block_manager.append_slots(seq, n):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.scheduled.append((seq, n))
                budget -= n
                i += 1
        return budget

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        """2. Swapped sequences come back, oldest first, while they fit."""
        bm = self.block_manager
        while self.swapped and budget > 0:
            seq = self.swapped[0]
            n = self._image_chunk(seq, seq.num_computed_tokens, min(seq.num_uncomputed_tokens, budget))
            if n == 0:
                break
            lora_ok = not self.config.max_loras or lora_fits(seq, self.running, self.config.max_loras)
            if len(self.running) >= self.config.max_num_seqs or not bm.can_swap_in(seq, n) or not lora_ok:
                break
            self.swapped.pop(0)
            out.swap_in += bm.swap_in(seq)
            self.num_swap_ins += 1
            self._start(seq, n, out)
            budget -= n
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        """3. Waiting sequences start in priority then arrival order, each on the longest
        prefix already in the cache, while seats, budget and blocks allow."""
        bm, i = self.block_manager, 0
        while i < len(self.waiting) and budget > 0:
            seq = self.waiting[i]
            if len(self.running) + self._seats(seq) > self.config.max_num_seqs:
                break
            # Over --max-loras, or its grammar still compiling (vLLM's WAITING_FOR_FSM): let others by.
            over_loras = self.config.max_loras and not lora_fits(seq, self.running, self.config.max_loras)
            if over_loras or (seq.grammar and not seq.grammar.ready):
                self.num_waiting_deferred += 1
                i += 1
                continue
            cached = bm.prefix_cache.match_prefix(seq) if seq.request.params.prompt_logprobs is None else []
            n = self._tokens_that_fit(seq, cached, budget)
            if n == 0 or not bm.can_allocate(seq, n, cached):
                break
            self.waiting.pop(i)
            bm.allocate(seq, cached)
            if seq.index == 0 and seq.num_output_tokens == 0:
                seq.request.num_cached_tokens = seq.num_computed_tokens
            self._start(seq, n, out)
            budget -= n

    def _start(self, seq: Sequence, n: int, out: SchedulerOutput) -> None:
        """Join the running batch with n new tokens; the caller checked the pool has room."""
        ok = self.block_manager.append_slots(seq, n)
        assert ok, "room was checked before starting the sequence"
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=_order)
        out.scheduled.append((seq, n))

    def _seats(self, seq: Sequence) -> int:
        """Running slots a waiting sequence will take: n for a request that will fork."""
        return seq.request.params.n if not seq.request.forked else 1

    def _tokens_that_fit(self, seq: Sequence, cached: list[int], budget: int) -> int:
        """How many of the sequence's tokens can start now: the budget, capped by free blocks
        (a long prompt may start with the chunk that fits rather than wait for the whole)."""
        bm = self.block_manager
        remaining = seq.num_tokens - len(cached) * bm.block_size
        free_slots = bm.num_allocatable_blocks(cached) * bm.block_size
        return self._image_chunk(seq, len(cached) * bm.block_size, max(0, min(remaining, budget, free_slots)))

    def _image_chunk(self, seq: Sequence, start: int, n: int) -> int:
        """n, or fewer: a chunk from `start` never ends inside an image (its tokens attend to
        each other both ways, Gemma 3, so the rest of an image is computed in one step), and
        the images a step's chunks start, whose encoder runs then, fit its encoder budget
        (vLLM's: --max-num-batched-tokens image tokens a step; PromptImages checks one fits)."""
        for image in seq.request.images:  # in prompt order
            if image.offset < start + n < image.offset + image.length:
                n = max(0, image.offset - start)
            if not start <= image.offset < start + n:
                continue
            if image.length > self.encoder_budget:
                return image.offset - start
            self.encoder_budget -= image.length
        return n

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Swap mode: copy the sequence's blocks to CPU memory and park it; it resumes where
        it was. Recompute mode (or a full CPU pool): drop its blocks; it rejoins the waiting
        queue and later recomputes its prompt and generated tokens in one prefill."""
        self.running.remove(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)
        bm = self.block_manager
        if self.config.preemption_mode == "swap" and bm.can_swap_out(seq):
            out.swap_out += bm.swap_out(seq)
            self.num_swap_outs += 1
            seq.status = SequenceStatus.SWAPPED
            bisect.insort(self.swapped, seq, key=_order)
            return
        self._recompute(seq)

    def preempt_all(self) -> None:
        """Every running sequence back to waiting, its blocks freed, to recompute later (as in
        recompute mode, whatever --preemption-mode says): LLMEngine.reset_prefix_cache."""
        for seq in list(self.running):
            self.running.remove(seq)
            self.num_preemptions += 1
            self._recompute(seq)

    def _recompute(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        self.add(seq)
