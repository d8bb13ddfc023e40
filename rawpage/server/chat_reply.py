"""One chat choice's generated text -> the assistant message: reasoning, content and
tool_calls, whole (`message`) or as stream deltas (`ReplyStream`). The reasoning goes out
under vLLM's two names, `reasoning` and its older alias `reasoning_content`.

The stream holds back only text that may still turn out to be a tag or a call, and
at the end parses the held text exactly as `message` parses the whole, so both give
the same content and calls.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rawpage.server.reasoning import ReasoningParser
from rawpage.server.tool_parsers import ToolCall
from rawpage.server.tools import ToolRequest


@dataclass
class Reply:
    """One finished output, read: what every API's response is built from."""

    reasoning: str | None  # None without a --reasoning-parser (or under include_reasoning: false)
    content: str
    calls: list[ToolCall]
    finish_reason: str | None  # the engine's, with "stop" become "tool_calls" when there are calls


class ReplyParser:
    def __init__(
        self, tools: ToolRequest | None, reasoning: ReasoningParser | None, include_reasoning: bool = True
    ) -> None:
        self.tools, self.reasoning = tools, reasoning
        self.include_reasoning = include_reasoning  # vLLM's include_reasoning: false drops reasoning_content

    def for_prompt(self, tokenizer: Any, prompt_ids: Sequence[int]) -> ReplyParser:
        """This parser for the reply to these prompt tokens: whether they leave a think
        block open decides where the reply starts (reasoning.py)."""
        if self.reasoning is None:
            return self
        decode = functools.partial(tokenizer.decode, skip_special_tokens=False)
        return ReplyParser(self.tools, self.reasoning.for_prompt(decode, prompt_ids), self.include_reasoning)

    def parse(self, text: str, finish_reason: str | None) -> Reply:
        reasoning, content = self.reasoning.split(text) if self.reasoning else (None, text)
        content, calls = self.tools.extract(content) if self.tools else (content, [])
        return Reply(reasoning if self.include_reasoning else None, content, calls, _finish(finish_reason, bool(calls)))

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The reply as chat's assistant message, and its finish_reason."""
        reply = self.parse(text, finish_reason)
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": reply.content if reply.content or not reply.calls else None,
        }
        msg["reasoning"] = msg["reasoning_content"] = reply.reasoning  # null without a parser, as vLLM
        if reply.calls:
            msg["tool_calls"] = [c.to_openai() for c in reply.calls]
        return msg, reply.finish_reason

    def stream(self) -> ReplyStream:
        return ReplyStream(self)


class ReplyStream:
    def __init__(self, parser: ReplyParser) -> None:
        self.parser = parser
        self.split = parser.reasoning.streamer() if parser.reasoning else None
        self.content = ""  # the content part of the text so far
        self.sent = 0  # characters of it already sent

    def feed(self, delta: str) -> dict[str, Any]:
        """The delta to send for this much more text ({} when nothing is certain yet)."""
        reasoning, content = self.split.feed(delta) if self.split else ("", delta)
        self.content += content
        tools = self.parser.tools
        end = tools.hold_from(self.content) if tools else len(self.content)
        return self._delta(reasoning if self.parser.include_reasoning else "", self._take(max(end, self.sent)))

    def finish(self, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The last delta (everything held, and the calls) and the finish reason."""
        reasoning, content = self.split.feed("", final=True) if self.split else ("", "")
        self.content += content
        tools = self.parser.tools
        text, calls = tools.extract(self.content) if tools else (self.content, [])
        rest = text[self.sent :] if text.startswith(self.content[: self.sent]) else ""
        delta = self._delta(reasoning if self.parser.include_reasoning else "", rest)
        if calls:
            delta["tool_calls"] = [c.to_openai(i) for i, c in enumerate(calls)]
        return delta, _finish(finish_reason, bool(calls))

    def _take(self, end: int) -> str:
        out = self.content[self.sent : end]
        self.sent = end
        return out

    @staticmethod
    def _delta(reasoning: str, content: str) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning"] = delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        return delta


def _finish(reason: str | None, has_calls: bool) -> str | None:
    return "tool_calls" if has_calls and reason == "stop" else reason
