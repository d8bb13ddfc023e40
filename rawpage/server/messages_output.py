"""A Reply in Anthropic's shapes: the message object, and the event stream that builds
the same message block by block.

    message_start                the message, empty, with usage.input_tokens
    ping
    content_block_start / _delta / _stop   per block: thinking (thinking_delta, then one
                                 signature_delta), text (text_delta), tool_use
                                 (input_json_delta, as the arguments are written)
    message_delta                stop_reason, stop_sequence, usage.output_tokens
    message_stop

A failure after the stream began is one `error` event in Anthropic's error shape.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response

from rawpage.outputs import CompletionOutput, RequestOutput
from rawpage.server.chat_reply import Reply, ReplyParser, delta_parts
from rawpage.server.chat_request import TokenCounts, reply_steps, token_counts
from rawpage.server.protocol import APIError
from rawpage.server.request import MessagesRequest
from rawpage.server.state import ServerState
from rawpage.server.streaming import sse, sse_response
from rawpage.server.tool_parsers import ToolCall


def stop_reason(reply: Reply, o: CompletionOutput) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a finished output."""
    if reply.finish_reason == "abort":
        raise APIError(
            "the request was aborted (--request-timeout, or the server is shutting down)",
            500,
            type="internal_server_error",
        )
    if reply.calls or reply.finish_reason == "tool_calls":  # a reply that calls a tool, even one cut
        return "tool_use", None  # at max_tokens just after its call, ends tool_use (as vLLM)
    if reply.finish_reason == "length":
        return "max_tokens", None
    if isinstance(o.stop_reason, str):  # one of stop_sequences (a stop token id is a plain end of turn)
        return "stop_sequence", o.stop_reason
    return "end_turn", None


def tool_use(call: ToolCall) -> dict[str, Any]:
    """A call as a tool_use block."""
    return {"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": json.loads(call.arguments)}


def tool_use_id(call: ToolCall) -> str:
    """The call's id in Anthropic's toolu_ form."""
    return "toolu_" + call.id.removeprefix("call_")


def content_blocks(reply: Reply, sign: Callable[[str], str], omit: bool = False) -> list[dict[str, Any]]:
    """The reply's blocks; `sign` makes a thinking block's signature (reasoning_seal.py), which
    alone carries the thinking when `omit` (thinking.display "omitted")."""
    blocks = []
    if reply.reasoning:
        thinking = "" if omit else reply.reasoning
        blocks.append({"type": "thinking", "thinking": thinking, "signature": sign(reply.reasoning)})
    if reply.content or not reply.calls:
        blocks.append({"type": "text", "text": reply.content})
    return blocks + [tool_use(c) for c in reply.calls]


def usage(counts: TokenCounts, output_tokens: int) -> dict[str, Any]:
    """input and output tokens; cache_read_input_tokens under --enable-prompt-tokens-details."""
    out: dict[str, Any] = {"input_tokens": counts.prompt, "output_tokens": output_tokens}
    if counts.cached is not None:
        out["cache_read_input_tokens"] = counts.cached
    return out


def message_object(
    rid: str,
    model: str,
    reply: Reply,
    o: CompletionOutput,
    counts: TokenCounts,
    sign: Callable[[str], str],
    omit: bool = False,
) -> dict[str, Any]:
    reason, sequence = stop_reason(reply, o)
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(reply, sign, omit),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(counts, counts.completion),
    }


def error_events(err: APIError) -> list[str]:
    return [sse(err.anthropic_body(), "error")]


def stream_message(
    state: ServerState, req: MessagesRequest, gen: AsyncIterator[RequestOutput], parser: ReplyParser
) -> Response:
    rid = req.chat.request_id
    events = MessageEvents(rid, req.model, state.seal.seal, req.omit_thinking)
    return sse_response(_events(state, parser, events, gen), rid, error_events)


async def _events(state: ServerState, parser: ReplyParser, ev: MessageEvents, gen: AsyncIterator[RequestOutput]):
    last: tuple[RequestOutput, CompletionOutput, str | None] | None = None
    async for out, steps in reply_steps(gen, parser):
        if last is None:
            for e in ev.start(token_counts(state, out)):
                yield e
        for step in steps:
            for e in ev.feed(step.delta):
                yield e
            last = (out, step.o, step.finish)
    out, o, finish = last
    for e in ev.finish(ev.reply(finish), o, token_counts(state, out)):
        yield e


_BLOCKS = {"reasoning": "thinking", "content": "text"}  # a delta's text part -> the block (item) it goes into


class MessageEvents:
    """The SSE events of one streamed message."""

    def __init__(self, rid: str, model: str, sign: Callable[[str], str], omit: bool = False) -> None:
        self.rid, self.model, self.sign = rid, model, sign
        self.omit = omit  # thinking.display "omitted": no thinking_delta, the signature carries it
        self.index = -1  # the open (or last) content block's index
        self.open: str | None = None  # "thinking", "text" or "tool_use": the block being written
        self.reasoning, self.content = "", ""
        self.calls: list[ToolCall] = []

    @staticmethod
    def event(kind: str, **fields: Any) -> str:
        return sse({"type": kind, **fields}, kind)

    def start(self, counts: TokenCounts) -> list[str]:
        message = {
            "id": self.rid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(counts, 0),
        }
        return [self.event("message_start", message=message), self.event("ping")]

    def feed(self, delta: dict[str, Any]) -> list[str]:
        events = []
        for kind, part in delta_parts(delta):
            events += self._call(part) if kind == "call" else self._text(_BLOCKS[kind], part)
        return events

    def reply(self, finish_reason: str | None) -> Reply:
        """What the stream carried, as the Reply a non-streamed request parses from the whole text."""
        return Reply(self.reasoning or None, self.content, self.calls, finish_reason)

    def finish(self, reply: Reply, o: CompletionOutput, counts: TokenCounts) -> list[str]:
        events = self._close()
        if not self.content and not self.calls:  # an empty answer is still a text block, as unstreamed
            events += self._open("text") + self._close()
        reason, sequence = stop_reason(reply, o)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        return events + [
            self.event("message_delta", delta=delta, usage={"output_tokens": counts.completion}),
            self.event("message_stop"),
        ]

    def _text(self, kind: str, text: str) -> list[str]:
        events = [] if self.open == kind else self._close() + self._open(kind)
        if kind == "thinking":
            self.reasoning += text
            if self.omit:
                return events
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            self.content += text
            delta = {"type": "text_delta", "text": text}
        return events + [self.event("content_block_delta", index=self.index, delta=delta)]

    def _open(self, kind: str) -> list[str]:
        self.index += 1
        self.open = kind
        block = (
            {"type": "thinking", "thinking": "", "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": ""}
        )
        return [self.event("content_block_start", index=self.index, content_block=block)]

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":  # the block's signature comes last, as Anthropic sends it
            delta = {"type": "signature_delta", "signature": self.sign(self.reasoning)}
            events.append(self.event("content_block_delta", index=self.index, delta=delta))
        self.open = None
        return events + [self.event("content_block_stop", index=self.index)]

    def _call(self, entry: dict[str, Any]) -> list[str]:
        """One chat `tool_calls` entry: the first of a call opens its tool_use block, and
        each adds its piece of the arguments as an input_json_delta."""
        events = []
        if "id" in entry:
            events = self._close()
            call = ToolCall(entry["function"]["name"], "", entry["id"])
            self.calls.append(call)
            self.index += 1
            self.open = "tool_use"
            block = {"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": {}}
            events.append(self.event("content_block_start", index=self.index, content_block=block))
        more = entry["function"].get("arguments", "")
        if more:
            self.calls[entry["index"]].arguments += more
            delta = {"type": "input_json_delta", "partial_json": more}
            events.append(self.event("content_block_delta", index=self.index, delta=delta))
        return events
