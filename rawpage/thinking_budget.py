"""ThinkingBudget: one sequence's think block, counted, and closed once it has used its budget.

A reasoning model writes <think>…</think> before its answer. `thinking_token_budget`
(SamplingParams, vLLM's name; llama-server's --reasoning-budget, Anthropic's
budget_tokens, an effort mapped to tokens) bounds the tokens written inside the block.
When the budget is spent and the block is still open, the end tag's tokens are forced,
one per step (the sampler leaves only that token), and the answer follows as usual:

    prompt leaves a block open ─► THINKING ─┬─ model writes </think> ────────► OPEN (answer)
    otherwise: MAYBE ─ first token opens it ┘─ budget spent: force </think> ─► OPEN

The phase is the ReasoningGate's (structured_output/reasoning_gate.py): tags found in
decoded text, the prompt's last tag deciding where the output starts. The same record
counts the block's tokens, tags included, for usage's reasoning_tokens.

The state depends only on the tokens appended (Sequence.append_token, by the scheduler),
so it follows a sequence through forks (n > 1) and preemption, as a grammar's does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rawpage.structured_output.reasoning_gate import OPEN, THINKING, ReasoningGate, TokenTexts, prompt_phase

DEFAULT_TAGS = ("<think>", "</think>")


class ThinkingBudget:
    """`budget`: tokens allowed inside the block (None: unlimited, only counted);
    `end_ids`: the end tag's tokens, forced in order once the budget is spent."""

    def __init__(self, gate: ReasoningGate, budget: int | None, end_ids: list[int]) -> None:
        self.gate, self.budget, self.end_ids = gate, budget, end_ids
        self.num_thinking = 0  # tokens the model wrote inside the block (not forced, no start tag)
        self.num_reasoning_tokens = 0  # every token of the block: tags, thinking, forced end
        self.num_forced = 0  # end-tag tokens forced so far

    def fork(self) -> ThinkingBudget:
        child = ThinkingBudget(self.gate.fork(), self.budget, self.end_ids)
        child.num_thinking, child.num_reasoning_tokens = self.num_thinking, self.num_reasoning_tokens
        child.num_forced = self.num_forced
        return child

    @property
    def may_force(self) -> bool:
        """The budget may still close the block: a step must honour forced_token."""
        return self.budget is not None and self.gate.phase != OPEN

    def forced_token(self) -> int | None:
        """The token this sequence must sample next, or None when it samples freely."""
        if not self.may_force or self.gate.phase != THINKING:
            return None
        if self.num_forced == 0 and self.num_thinking < self.budget:
            return None
        return self.end_ids[self.num_forced] if self.num_forced < len(self.end_ids) else None

    def accept(self, token_id: int) -> None:
        """Sequence.append_token: one more token of the output."""
        gate = self.gate
        if gate.phase == OPEN:
            return
        forced = self.forced_token() == token_id
        before = gate.phase
        gate.accept(token_id)
        if before == THINKING or gate.phase != OPEN:  # a token of the block (MAYBE's opener included)
            self.num_reasoning_tokens += 1
            if forced:
                self.num_forced += 1
            elif before == THINKING:
                self.num_thinking += 1


def force_end_tags(logits: np.ndarray, seqs: list[Any]) -> None:
    """Each row (N, V) whose sequence must write its end tag now keeps only that token."""
    for i, s in enumerate(seqs):
        forced = s.thinking.forced_token() if s.thinking is not None else None
        if forced is not None:
            logits[i] = np.where(np.arange(logits.shape[1]) == forced, 0.0, -np.inf)


class ThinkingBudgets:
    """Builds each sequence's ThinkingBudget: composed once at engine setup, used only by
    requests that ask (thinking_token_budget or reasoning_tags)."""

    def __init__(self, texts: TokenTexts, decode: Callable[[list[int]], str], encode: Callable[[str], list[int]]):
        self.texts, self.decode, self.encode = texts, decode, encode
        self._end_ids: dict[str, list[int]] = {}

    def new_state(self, budget: int | None, tags: tuple[str, str] | None, prompt_ids: Sequence[int]) -> ThinkingBudget:
        tags = tags or DEFAULT_TAGS
        phase = prompt_phase(self.decode, prompt_ids, tags)  # OPEN: the prompt closed the block (0 tokens)
        end = tags[1]
        if end not in self._end_ids:
            self._end_ids[end] = self.encode(end)
        return ThinkingBudget(ReasoningGate(tags, phase, self.texts), budget, self._end_ids[end])
