"""What every tool-call format shares: the call, the scan a format makes of a reply (whole
or cut off mid-stream), and the JSON scanning that finds a call's arguments in raw text.

A format answers one question, `scan(text, final)`: which part of the text is surely
content, and which calls it holds so far, each with its name once known and its
arguments as the JSON text written so far. The same scan serves a whole reply
(`final=True`: every call must be complete) and a stream (`final=False`: the last call
may still be growing). The stream sends each call's arguments as they grow, and since
the whole reply's arguments are that same text, the deltas add up to the whole call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's shape)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass
class CallDraft:
    """A call as far as the text goes: `name` is None until it is complete; `arguments` is
    the arguments' JSON text so far (only ever appended to); `done` once the call closed."""

    name: str | None
    arguments: str = ""
    done: bool = False


@dataclass
class Scan:
    content: str  # the content that is certain (text outside calls, minus a tag that may be starting)
    calls: list[CallDraft] = field(default_factory=list)


class Malformed(Exception):
    """The text cannot be calls in this format: it is content."""


class ToolParser:
    """One tool-call format. `functions` are the request's tools by name (some formats read
    their parameter types). `special_tags`: tags that are special tokens in the models that
    use the format; the reply is decoded with them kept (skip_special_tokens off)."""

    name = ""
    special_tags: tuple[str, ...] = ()
    template_marks: tuple[str, ...] = ()  # text in a chat template that says it writes this format

    def __init__(self, functions: dict[str, dict[str, Any]] | None = None) -> None:
        self.functions = functions or {}

    def scan(self, text: str, final: bool) -> Scan:
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """A whole reply -> (content, calls); (text, []) when it holds no well-formed calls.
        A reply that ends inside a call (max_tokens) keeps the calls it finished before,
        as its stream sent them; the unfinished one is dropped."""
        try:
            scan = self.scan(text, final=True)
        except (Malformed, RecursionError):
            scan = self._cut_short(text)
        calls = [valid_call(c) for c in scan.calls] if scan else []
        if not calls or not all(calls):
            return text, []
        return scan.content, calls

    def _cut_short(self, text: str) -> Scan | None:
        """A reply that is the start of a well-formed one: its finished calls (None when
        the text is malformed, not cut)."""
        try:
            scan = self.scan(text, final=False)
        except (Malformed, RecursionError):
            return None
        if scan.calls and not scan.calls[-1].done:
            scan.calls.pop()
        return scan

    def grammar(self, functions: dict[str, dict[str, Any]], tokens: Any) -> str:
        """The lazy Lark grammar for tool_choice "auto" (tool_grammar.py)."""
        raise NotImplementedError


def valid_call(draft: CallDraft) -> ToolCall | None:
    """A finished draft whose arguments are a JSON object that a response can carry."""
    if not draft.done or not draft.name:
        return None
    args = model_json(draft.arguments)
    if not isinstance(args, dict):
        return None
    try:
        (draft.name + json.dumps(args, ensure_ascii=False)).encode("utf-8")  # "\\ud800" parses to a lone surrogate
    except (ValueError, RecursionError, UnicodeEncodeError):
        return None
    return ToolCall(draft.name, draft.arguments)


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
        return valid_call(CallDraft(obj["name"], json.dumps(args, ensure_ascii=False), True))
    except (ValueError, RecursionError):
        return None


def hold_prefix(text: str, tag: str) -> int:
    """Length of text minus its longest suffix that begins `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return len(text) - k
    return len(text)


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SCALAR_END = re.compile(r"[\s,\]}]")
_CLOSE = {"}": "{", "]": "["}


def json_end(s: str, i: int) -> int | None:
    """End (exclusive) of the JSON value that starts at s[i], or None when s ends inside
    it. Only the structure is checked here (brackets, strings); json.loads checks the rest."""
    stack: list[str] = []
    while i < len(s):
        c = s[i]
        if c == '"':
            m = _STRING.match(s, i)
            if m is None:
                return None  # the string runs on past the text
            i = m.end()
        elif c in "{[":
            stack.append(c)
            i += 1
        elif c in "}]":
            if not stack or stack.pop() != _CLOSE[c]:
                raise Malformed
            i += 1
        elif stack:
            i += 1  # ':', ',', whitespace, a number or literal inside a container
            continue
        else:
            m = _SCALAR_END.search(s, i)
            return None if m is None else m.end() - 1  # a bare number may still grow
        if not stack:
            return i
    return None


def object_members(s: str, i: int) -> tuple[dict[str, tuple[int, int | None]], int | None]:
    """The top-level members of the JSON object at s[i] ('{'): key -> (value start, value
    end or None while it is being written), first occurrence of each key; and the object's
    end, or None while it is open."""
    if s[i] != "{":
        raise Malformed
    members: dict[str, tuple[int, int | None]] = {}
    i += 1
    while True:
        i = skip_ws(s, i)
        if i >= len(s):
            return members, None
        if s[i] == "}":
            return members, i + 1
        if members:
            if s[i] != ",":
                raise Malformed
            i = skip_ws(s, i + 1)
            if i >= len(s):
                return members, None
        if s[i] != '"':
            raise Malformed
        m = _STRING.match(s, i)
        if m is None:
            return members, None
        key = model_json(m.group())
        i = skip_ws(s, m.end())
        if i >= len(s):
            return members, None
        if s[i] != ":" or not isinstance(key, str):
            raise Malformed
        i = skip_ws(s, i + 1)
        if i >= len(s):
            return members, None
        end = json_end(s, i)
        members.setdefault(key, (i, end))
        if end is None:
            return members, None
        i = end


def object_call(
    s: str, i: int, args_keys: tuple[str, ...] = ("arguments", "parameters")
) -> tuple[CallDraft, int | None]:
    """{"name": ..., "arguments": {...}} at s[i] -> the call so far and the object's end.
    The arguments are the model's own JSON text, so a stream can send them as they grow;
    arguments written as a JSON string (some models do) are sent once complete."""
    members, end = object_members(s, i)
    name = None
    if "name" in members and members["name"][1] is not None:
        a, b = members["name"]
        name = model_json(s[a:b])
        if not isinstance(name, str):
            raise Malformed
    keys = sorted((members[k][0], k) for k in args_keys if k in members)
    if not keys:
        return CallDraft(name, "{}" if end is not None else "", end is not None), end
    a, b = members[keys[0][1]]
    if s[a] == '"':  # arguments as a string of JSON: only whole
        inner = model_json(s[a:b]) if b is not None else ""
        if not isinstance(inner, str):
            raise Malformed
        return CallDraft(name, inner.strip(), end is not None), end
    if s[a] != "{":
        raise Malformed
    return CallDraft(name, s[a : b if b is not None else len(s)], end is not None), end
