"""A Reply in the Responses API's shapes: the `response` object with its output items,
and the stream of events that builds the same object piece by piece.

    output item     from
    reasoning       Reply.reasoning (--reasoning-parser), as one reasoning_text part
    message         Reply.content, as one output_text part (present unless there are only calls)
    function_call   each of Reply.calls: call_id, name, arguments (a JSON string)

The stream's last event (response.completed, .incomplete or .failed) carries the object
the same request answers without `stream`, item ids included.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable
from typing import Any

from rawpage.server.chat_reply import Reply, delta_parts
from rawpage.server.protocol import APIError
from rawpage.server.streaming import sse
from rawpage.server.tool_parsers import ToolCall


def _hex() -> str:
    return uuid.uuid4().hex


def new_envelope(rid: str, model: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The response object before any output: the request's settings echoed, as OpenAI does."""
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "truncation": "disabled",
        "usage": None,
        **fields,
    }


_BLOCKS = {"reasoning": "reasoning", "content": "message"}  # a delta's text part -> the block (item) it goes into


class OutputItems:
    """A response's output items. Their ids are drawn once, so that a stream's events and
    its final response name the same items. `seal` (include: ["reasoning.encrypted_content"])
    signs the reasoning into the item's encrypted_content (reasoning_seal.py)."""

    def __init__(self, seal: Callable[[str], str] | None = None) -> None:
        self.reasoning_id, self.message_id = f"rs_{_hex()}", f"msg_{_hex()}"
        self.seal = seal

    def reasoning(self, text: str, status: str = "completed") -> dict[str, Any]:
        content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
        item = {"type": "reasoning", "id": self.reasoning_id, "summary": [], "content": content, "status": status}
        if self.seal is not None and status == "completed":
            item["encrypted_content"] = self.seal(text)
        return item

    def message(self, text: str | None, status: str = "completed") -> dict[str, Any]:
        content = [output_text(text)] if text is not None else []
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    @staticmethod
    def function_call(call: ToolCall, status: str = "completed") -> dict[str, Any]:
        arguments = call.arguments if status == "completed" else ""
        fid = "fc_" + call.id.removeprefix("call_")
        return {
            "type": "function_call",
            "id": fid,
            "call_id": call.id,
            "name": call.name,
            "arguments": arguments,
            "status": status,
        }

    def of(self, reply: Reply) -> list[dict[str, Any]]:
        """Every item of a finished reply, in the order a stream opens them."""
        items = [self.reasoning(reply.reasoning)] if reply.reasoning else []
        if reply.content or not reply.calls:
            items.append(self.message(reply.content))
        return items + [self.function_call(c) for c in reply.calls]


def output_text(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def finished(
    envelope: dict[str, Any], reply: Reply, items: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    """The response object once the reply is done: its status from why generation stopped."""
    out = {**envelope, "output": items, "usage": usage, "status": "completed"}
    if reply.finish_reason == "length":  # max_output_tokens (or the context) cut it
        out["status"], out["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    elif reply.finish_reason == "abort":  # --request-timeout, or a server shutting down
        message = "the request was aborted (--request-timeout, or the server is shutting down)"
        out["status"], out["error"] = "failed", {"code": "server_error", "message": message}
    return out


def usage(prompt: int, completion: int, cached: int | None, reasoning: int) -> dict[str, Any]:
    """Responses' usage; cached_tokens is 0 unless --enable-prompt-tokens-details (see SECURITY.md)."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached or 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


_TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


class ResponseEvents:
    """The SSE events of one streamed response, each with its `sequence_number`."""

    def __init__(self, envelope: dict[str, Any], items: OutputItems) -> None:
        self.envelope, self.items = envelope, items
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # items opened so far, in output_index order
        self.open: str | None = None  # "reasoning", "message" or "function_call": the item being written
        self.reasoning, self.content = "", ""
        self.calls: list[ToolCall] = []
        # logprob items of tokens not yet sent (include ["message.output_text.logprobs"]):
        # the next text delta carries them; those sent with the message, for its done event
        self.pending_logprobs: list[dict[str, Any]] = []
        self.message_logprobs: list[dict[str, Any]] = []

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(data, kind)

    def start(self) -> list[str]:
        snapshot = copy.deepcopy(self.envelope)
        return [
            self.event("response.created", response=snapshot),
            self.event("response.in_progress", response=snapshot),
        ]

    def feed(self, delta: dict[str, Any]) -> list[str]:
        """One ReplyStep's delta: reasoning text, content text, and the calls' entries as they grow."""
        events = []
        for kind, part in delta_parts(delta):
            events += self._call(part) if kind == "call" else self._text(_BLOCKS[kind], part)
        return events

    def reply(self, finish_reason: str | None) -> Reply:
        """What the stream carried, as the Reply a non-streamed request parses from the whole text."""
        return Reply(self.reasoning or None, self.content, self.calls, finish_reason)

    def finish(
        self, reply: Reply, usage_: dict[str, Any], extras: Callable[[dict[str, Any]], dict[str, Any]] = lambda r: r
    ) -> tuple[list[str], dict[str, Any]]:
        """The closing events and the final response (the one a non-streamed request gets,
        `extras` added to it as there: logprobs, raw messages)."""
        events = self._close()
        if not self.content and not self.calls:  # an empty answer is still a message, as unstreamed
            events += self._open("message") + self._close()
        response = extras(finished(self.envelope, reply, self.items.of(reply), usage_))
        return events + [self.event(_TERMINAL[response["status"]], response=response)], response

    def error_events(self, err: APIError) -> list[str]:
        """A failure after the stream began: an error event, then response.failed."""
        error = {"code": err.code or err.type, "message": err.message}
        failed = {**self.envelope, "status": "failed", "error": error, "output": self.output}
        return [self.event("error", **error, param=err.param), self.event("response.failed", response=failed)]

    def _text(self, kind: str, text: str) -> list[str]:
        events = [] if self.open == kind else self._close() + self._open(kind)
        index, item_id = len(self.output) - 1, self.output[-1]["id"]
        sent, self.pending_logprobs = self.pending_logprobs, []  # a reasoning delta's tokens go nowhere
        if kind == "reasoning":
            self.reasoning += text
            return events + [
                self.event(
                    "response.reasoning_text.delta", item_id=item_id, output_index=index, content_index=0, delta=text
                )
            ]
        self.content += text
        self.message_logprobs += sent
        where = dict(item_id=item_id, output_index=index, content_index=0)
        return events + [self.event("response.output_text.delta", **where, delta=text, logprobs=sent)]

    def _open(self, kind: str) -> list[str]:
        item = (
            self.items.reasoning("", "in_progress") if kind == "reasoning" else self.items.message(None, "in_progress")
        )
        self.output.append(item)
        self.open = kind
        events = [self.event("response.output_item.added", output_index=len(self.output) - 1, item=item)]
        if kind == "message":
            where = dict(item_id=item["id"], output_index=len(self.output) - 1, content_index=0)
            events.append(self.event("response.content_part.added", **where, part=output_text("")))
        return events

    def _close(self) -> list[str]:
        """Finish the open reasoning, message or function_call item."""
        if self.open is None:
            return []
        index, kind = len(self.output) - 1, self.open
        self.open = None
        if kind == "function_call":
            call = self.calls[-1]
            item = self.output[index] = self.items.function_call(call)
            where = dict(item_id=item["id"], output_index=index)
            done = [
                self.event("response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments)
            ]
        elif kind == "reasoning":
            item = self.output[index] = self.items.reasoning(self.reasoning)
            where = dict(item_id=item["id"], output_index=index, content_index=0)
            done = [self.event("response.reasoning_text.done", **where, text=self.reasoning)]
        else:
            item = self.output[index] = self.items.message(self.content)
            where = dict(item_id=item["id"], output_index=index, content_index=0)
            done = [
                self.event("response.output_text.done", **where, text=self.content, logprobs=self.message_logprobs),
                self.event(
                    "response.content_part.done", **where, part=output_text(self.content, self.message_logprobs)
                ),
            ]
        return done + [self.event("response.output_item.done", output_index=index, item=item)]

    def _call(self, entry: dict[str, Any]) -> list[str]:
        """One chat `tool_calls` entry: the first of a call adds its function_call item, and
        each adds its piece of the arguments (response.function_call_arguments.delta)."""
        events = []
        if "id" in entry:
            events = self._close()
            call = ToolCall(entry["function"]["name"], "", entry["id"])
            self.calls.append(call)
            item = self.items.function_call(call, "in_progress")
            self.output.append(item)
            self.open = "function_call"
            events.append(self.event("response.output_item.added", output_index=len(self.output) - 1, item=item))
        more = entry["function"].get("arguments", "")
        if more:
            self.calls[entry["index"]].arguments += more
            where = dict(item_id=self.output[-1]["id"], output_index=len(self.output) - 1)
            events.append(self.event("response.function_call_arguments.delta", **where, delta=more))
        return events
