"""Reasoning output: split a model's thinking from its answer (`--reasoning-parser`).

Both supported styles wrap the thinking in <think>…</think>:
  - `qwen3`: the model opens the block itself; text is reasoning only inside an
    explicit <think>, so a reply with no <think> is all content.
  - `deepseek_r1`: the chat template already opened the block, so everything before
    </think> is reasoning (a leading <think> is dropped), and a reply that never
    closes it is all reasoning.
Once the prompt is known (`for_prompt`), it decides instead of the style: a prompt
that leaves a block open (Qwen3-Thinking's template, DeepSeek-R1's) starts the output
inside it; one that closes it (Qwen3 with enable_thinking: false) or has none (a model
that does not think) starts it outside, so an output with no tags is all content.
The split goes to `message.reasoning_content` and `message.content`; streamed, to
`delta.reasoning_content` and `delta.content`. A grammar (structured outputs, tool
calls) constrains the output outside the block (StructuredOutputsParams.reasoning,
rawpage/structured_output/reasoning_gate.py), from the first token when the model does not think.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rawpage.server.tool_parsers import hold_prefix
from rawpage.structured_output.reasoning_gate import THINKING, prompt_phase

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    implicit_start: bool  # deepseek_r1: the output begins inside the think block
    prompt_open: bool | None = None  # the prompt leaves a block open; None: not known, the style decides

    tags = (START, END)

    def for_prompt(self, decode: Callable[[list[int]], str], prompt_ids: Sequence[int]) -> ReasoningParser:
        """This parser for an output that follows these prompt tokens."""
        return dataclasses.replace(self, prompt_open=prompt_phase(decode, prompt_ids, self.tags) == THINKING)

    def split(self, text: str) -> tuple[str | None, str]:
        """Whole output -> (reasoning or None, content)."""
        body = text.lstrip()
        opened = body.startswith(START)
        if opened:
            body = body[len(START) :]
        inside = opened or (self.implicit_start if self.prompt_open is None else self.prompt_open)
        if END in body:
            if inside or self.implicit_start:  # deepseek_r1 also takes an end tag with no start
                reasoning, _, content = body.partition(END)
                return reasoning, content
            return None, text
        if inside:
            return body, ""
        return None, text

    def streamer(self) -> ReasoningStreamer:
        return ReasoningStreamer(self)


class ReasoningStreamer:
    """Splits a stream of text deltas the way `split` splits the whole, holding back only
    text that may still turn out to be a tag."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent_reasoning = 0  # characters of the reasoning already sent
        self.sent_content = 0

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        """Returns (reasoning delta, content delta) that are certain after this text."""
        self.text += delta
        reasoning, content = self.parser.split(self.text)
        if not final:
            reasoning, content = self._settled(reasoning, content)
        r = (reasoning or "")[self.sent_reasoning :]
        c = content[self.sent_content :]
        self.sent_reasoning += len(r)
        self.sent_content += len(c)
        return r, c

    def _settled(self, reasoning: str | None, content: str) -> tuple[str | None, str]:
        """What `split` will say of this prefix whatever follows it."""
        stripped = self.text.lstrip()
        if len(stripped) < len(START) and START.startswith(stripped):
            return "", ""  # may yet become <think>: nothing is certain
        if reasoning is not None and not content and END not in self.text:
            return reasoning[: hold_prefix(reasoning, END)], ""  # the end tag may be arriving
        return reasoning, content


PARSERS = {
    "qwen3": ReasoningParser("qwen3", implicit_start=False),
    "deepseek_r1": ReasoningParser("deepseek_r1", implicit_start=True),
}
