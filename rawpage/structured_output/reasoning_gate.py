"""ReasoningGate: where a constrained sequence stands with a reasoning model's think block.

With --reasoning-parser, a grammar constrains the answer, not the thinking. But a model
that does not think (or Qwen3 with enable_thinking: false, whose template closes the
block in the prompt) never writes </think>; waiting for it switched the grammar off
for the whole reply (vLLM had the same bug, vllm#27447). So the gate starts from what
the prompt says:

    the prompt leaves a block open  ──► THINKING: free until the end tag, then OPEN
    the prompt closes it at its end ──► OPEN: constrained from the first token
    otherwise                       ──► MAYBE: constrained from the first token, except
                                        that the start tag is allowed too; writing it
                                        moves to THINKING

Tags are found in decoded text, never as one token sequence: "</think>" is one special
token for Qwen3, and several, split differently in different contexts, for a BPE
vocabulary that lacks it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

THINKING, MAYBE, OPEN = "thinking", "maybe", "open"
PROMPT_TAIL = 1024  # prompt tokens decoded first when looking for the last tag


def prompt_phase(decode: Callable[[list[int]], str], prompt_ids: Sequence[int], tags: tuple[str, str]) -> str:
    """The gate's first phase for this prompt: THINKING, OPEN or MAYBE (see above).
    decode(ids) -> text, special tokens kept."""
    start, end = tags
    text = decode(list(prompt_ids[-PROMPT_TAIL:]))
    if start not in text and end not in text and len(prompt_ids) > PROMPT_TAIL:
        text = decode(list(prompt_ids))  # a long open block: its tag is further back
    s, e = text.rfind(start), text.rfind(end)
    if s > e:
        return THINKING
    if e >= 0 and not text[e + len(end) :].strip():
        return OPEN
    return MAYBE


class TokenTexts:
    """Each token's decoded text (special tokens kept), and the bitmask of the tokens
    that begin with a tag. Built once per tokenizer, on first use."""

    def __init__(self, decode_each: Callable[[list[int]], list[str]], vocab_size: int, words: int) -> None:
        self.decode_each, self.vocab_size, self.words = decode_each, vocab_size, words
        self._masks: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # the engine thread and the mask thread both ask

    def text(self, token_id: int) -> str:
        return self.decode_each([token_id])[0]

    def starting_with(self, tag: str) -> np.ndarray:
        """(W,) int32: bit t set when token t's text begins with `tag`."""
        with self._lock:
            if tag not in self._masks:
                texts = self.decode_each(list(range(self.vocab_size)))
                bits = np.zeros(self.words * 32, dtype=bool)
                bits[: len(texts)] = [s.startswith(tag) for s in texts]
                self._masks[tag] = np.packbits(bits, bitorder="little").view(np.int32)
            return self._masks[tag]


class ReasoningGate:
    """One sequence's phase; `accept` each token it appends.

    MAYBE lasts one token: the grammar's tokens or a start-tag token (Qwen3's and
    DeepSeek-R1's <think> is one special token) may come first. The start tag is never
    allowed piece by piece: a model about to write "<tool_call>" would be led, "<" by
    "<", into a think block it never meant. A model whose vocabulary spells the tag in
    pieces is constrained from its first token (it loses its thinking, never its grammar)."""

    def __init__(self, tags: tuple[str, str], phase: str, texts: TokenTexts) -> None:
        self.start, self.end = tags
        self.phase, self.texts = phase, texts
        self.tail = ""  # THINKING: the last characters written, where the end tag may be arriving

    def fork(self) -> ReasoningGate:
        child = ReasoningGate((self.start, self.end), self.phase, self.texts)
        child.tail = self.tail
        return child

    def extra_mask(self) -> np.ndarray | None:
        """MAYBE: the tokens that open a think block, allowed besides the grammar's."""
        return self.texts.starting_with(self.start) if self.phase == MAYBE else None

    def opens_block(self, token_id: int) -> bool:
        """MAYBE: this first token opens a think block (else the grammar takes it)."""
        return self.texts.text(token_id).startswith(self.start)

    def accept(self, token_id: int) -> None:
        text = self.texts.text(token_id)
        if self.phase == MAYBE:
            if not text.startswith(self.start):
                self.phase = OPEN  # no think block: the grammar has had this token
                return
            self.phase, text = THINKING, text[len(self.start) :]
        if self.phase == THINKING:
            self.tail += text
            if self.end in self.tail:
                self.phase = OPEN  # what follows the tag within its token stays free text
            self.tail = self.tail[-len(self.end) :]
