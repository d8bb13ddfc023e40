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
from rawpage.server.tool_parsers.base import Malformed
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
    """A reply's stream of chat deltas. Content goes out once it is certainly content; a
    call goes out as it is written, OpenAI's way: a first `tool_calls` entry with the id,
    type and name (and the arguments so far), then entries that add to its arguments. At
    the end the whole text is parsed as `message` parses it, and what is left goes out, so
    the stream adds up to the non-streamed reply. A call found malformed after its first
    entry went out (no grammar, or cut off by max_tokens) cannot be taken back: the stream
    stops adding to it, and at the end the reply's content follows as the non-streamed
    reply has it (its whole text), with that reply's finish_reason."""

    def __init__(self, parser: ReplyParser) -> None:
        self.parser = parser
        self.split = parser.reasoning.streamer() if parser.reasoning else None
        self.content = ""  # the content part of the text so far
        self.sent = ""  # the reply's content sent so far
        self.calls: list[ToolCall] = []  # calls begun in the stream; their arguments as sent so far
        self.broken = False  # the text stopped parsing as calls: nothing more until the end

    def feed(self, delta: str) -> dict[str, Any]:
        """The delta to send for this much more text ({} when nothing is certain yet)."""
        reasoning, content = self.split.feed(delta) if self.split else ("", delta)
        self.content += content
        out = self._delta(reasoning if self.parser.include_reasoning else "", "")
        tools = self.parser.tools
        if tools is None:
            return self._delta(out.get("reasoning_content", ""), self._take(self.content))
        if self.broken or not (content or reasoning):
            return out
        try:
            scan = tools.scan(self.content)
        except Malformed:
            self.broken = True
            return out
        out = self._delta(out.get("reasoning_content", ""), self._take(scan.content))
        drafts = scan.calls if tools.parallel else scan.calls[:1]
        entries = self._grow([(d.name, d.arguments) for d in drafts if d.name])
        if entries:
            out["tool_calls"] = entries
        return out

    def finish(self, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The last delta (everything held, and the rest of the calls) and the finish reason."""
        reasoning, content = self.split.feed("", final=True) if self.split else ("", "")
        self.content += content
        tools = self.parser.tools
        text, calls = tools.extract(self.content) if tools else (self.content, [])
        delta = self._delta(reasoning if self.parser.include_reasoning else "", self._take(text))
        entries = self._grow([(c.name, c.arguments) for c in calls])
        if entries:
            delta["tool_calls"] = entries
        return delta, _finish(finish_reason, bool(calls))

    def _take(self, content: str) -> str:
        """The content not sent yet (content only grows; anything else sends nothing)."""
        if len(content) <= len(self.sent) or not content.startswith(self.sent):
            return ""
        out, self.sent = content[len(self.sent) :], content
        return out

    def _grow(self, drafts: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """`tool_calls` entries that bring the sent calls up to these (name, arguments so far)."""
        entries = []
        for i, (name, args) in enumerate(drafts):
            if i == len(self.calls):
                self.calls.append(ToolCall(name, ""))
                entries.append({**self.calls[i].to_openai(i)})
            call = self.calls[i]
            if call.name != name or not args.startswith(call.arguments):
                break  # not the call that was begun: it was malformed
            if len(args) > len(call.arguments):
                more, call.arguments = args[len(call.arguments) :], args
                if entries and entries[-1].get("index") == i and "id" in entries[-1]:
                    entries[-1]["function"]["arguments"] += more
                else:
                    entries.append({"index": i, "function": {"arguments": more}})
        return entries

    @staticmethod
    def _delta(reasoning: str, content: str) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning"] = delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        return delta


def delta_parts(delta: dict[str, Any]) -> list[tuple[str, Any]]:
    """A chat delta as ("reasoning" | "content", text) and ("call", tool_calls entry) parts,
    in the order a block-by-block API (Anthropic's, Responses) writes them: reasoning, the
    rest of a call already begun, the content, then new calls."""
    entries = delta.get("tool_calls") or []
    first_new = next((i for i, e in enumerate(entries) if "id" in e), len(entries))
    parts: list[tuple[str, Any]] = [("reasoning", delta["reasoning_content"])] if delta.get("reasoning_content") else []
    parts += [("call", e) for e in entries[:first_new]]
    parts += [("content", delta["content"])] if delta.get("content") else []
    return parts + [("call", e) for e in entries[first_new:]]


def _finish(reason: str | None, has_calls: bool) -> str | None:
    return "tool_calls" if has_calls and reason == "stop" else reason
