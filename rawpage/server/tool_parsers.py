"""Tool-call parsers: a model's raw text -> (content, tool calls), one class per format.

Selected with `--tool-call-parser`; used for `tool_choice: "auto"`, where the model
decides. (`"required"` and a named function do not need one: a grammar makes the
model write a JSON array of calls, or the named function's arguments.)

Text that does not parse as calls comes back whole as plain content: a model's
malformed call is its answer, never a server error.

Streaming: `content_end(text)` says how much of the text so far is certainly plain
content. Text from there on is held until the end and then parsed with `parse`,
so a stream carries exactly the calls and content of the non-streamed response.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's shape)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def model_json(text: str) -> object:
    """The model's JSON text parsed, or NOT_JSON: bad JSON, or nesting past the parser's
    recursion, is a malformed call (its text is content), never an exception."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return NOT_JSON


NOT_JSON = object()


def call_from_json(obj: object, args_key: str = "arguments") -> ToolCall | None:
    """{"name": str, "arguments" (or "parameters"): object or its JSON text} -> ToolCall,
    or None when it is not one (any other shape, arguments that are not an object)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("parameters", obj.get("arguments", {})))
    args = model_json(args) if isinstance(args, str) else args
    if not isinstance(args, dict):
        return None
    try:
        call = ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
        (call.name + call.arguments).encode("utf-8")  # "\\ud800" parses to a lone surrogate: no response could carry it
    except (ValueError, RecursionError, UnicodeEncodeError):
        return None
    return call


def hold_prefix(text: str, tag: str) -> int:
    """Length of text minus its longest suffix that begins `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return len(text) - k
    return len(text)


class HermesToolParser:
    """<tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number of them, with
    content around them (Hermes, Qwen2.5/3 and many ChatML models)."""

    START, END = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.START not in text:
            return text, []
        calls = []
        for m in self._BLOCK.finditer(text):
            call = call_from_json(model_json(m.group(1)))
            if call is None:
                return text, []
            calls.append(call)
        return self._BLOCK.sub("", text), calls

    def content_end(self, text: str) -> int:
        at = text.find(self.START)
        return at if at != -1 else hold_prefix(text, self.START)


class Llama3JsonToolParser:
    """Llama 3.x JSON tool calls: the whole reply is {"name": ..., "parameters": {...}},
    optionally after <|python_tag|>, several separated by ';'."""

    TAG = "<|python_tag|>"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        body = text.strip()
        body = body[len(self.TAG) :].lstrip() if body.startswith(self.TAG) else body
        if not body.startswith("{"):
            return text, []
        decoder, calls, at = json.JSONDecoder(), [], 0
        while at < len(body):
            try:
                obj, at = decoder.raw_decode(body, at)
            except (ValueError, RecursionError):
                return text, []
            call = call_from_json(obj, "parameters")
            if call is None:
                return text, []
            calls.append(call)
            rest = body[at:].lstrip()
            if rest.startswith(";"):
                rest = rest[1:].lstrip()
            elif rest:
                return text, []
            at = len(body) - len(rest)
        return "", calls

    def content_end(self, text: str) -> int:
        body = text.lstrip()
        if not body or body.startswith("{") or body.startswith(self.TAG) or self.TAG.startswith(body):
            return 0  # a call may be starting: hold it all
        return len(text)


TOOL_PARSERS = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}
