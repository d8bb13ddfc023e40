"""The tool-call formats whose arguments are the model's own JSON object: hermes,
llama3_json (and llama4_json), mistral and deepseek_v3. Their names are vLLM's
`--tool-call-parser` names; the formats are read from vLLM's and SGLang's parsers.

    hermes        <tool_call>{"name": "f", "arguments": {...}}</tool_call>  (any number, text around)
    llama3_json   {"name": "f", "parameters": {...}}; {...}  (the whole reply, after an optional <|python_tag|>)
    mistral       text[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]  (v0.3 tokenizers)
                  text[TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}     (v11+ tokenizers; [CALL_ID]id optional)
    deepseek_v3   text<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
                  ```json
                  {...}
                  ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from rawpage.server.tool_parsers.base import (
    CallDraft,
    Malformed,
    Scan,
    ToolParser,
    hold_prefix,
    json_end,
    object_call,
    skip_ws,
)
from rawpage.server.tool_parsers.grammar import any_call_schema, arguments_schema, lark_json, lark_lit, lazy_grammar


def expect(text: str, i: int, lit: str, final: bool) -> int | None:
    """The index after `lit` at text[i:]; None when the text ends inside it (mid-stream);
    Malformed when anything else is there."""
    if text.startswith(lit, i):
        return i + len(lit)
    if not final and lit.startswith(text[i:]):
        return None
    raise Malformed


def content_before(text: str, tag: str, final: bool) -> tuple[str, int]:
    """Content up to the first `tag` and the tag's index (-1: none; mid-stream, a tag that
    may be starting at the end is held back)."""
    at = text.find(tag)
    if at != -1:
        return text[:at], at
    return (text if final else text[: hold_prefix(text, tag)]), -1


def scan_tagged(text: str, final: bool, tag: str, read_call: Callable[..., int | None]) -> Scan:
    """Content with calls, each after `tag`: the content is the text around them.
    `read_call(text, i, final, calls)` reads the call at text[i:] (after its tag) into
    `calls` and says where it ended (None: the text ends inside it)."""
    content, calls, i = "", [], 0
    while True:
        part, at = content_before(text[i:], tag, final)
        content += part
        if at == -1:
            return Scan(content, calls)
        i = read_call(text, i + at + len(tag), final, calls)
        if i is None:
            return Scan(content, calls)


def call_list(text: str, i: int, final: bool) -> list[CallDraft]:
    """A JSON list of {"name", "arguments"} objects at text[i] ('['): Mistral's older calls,
    and what tool_choice "required" makes the model write."""
    if text[i] != "[":
        raise Malformed
    calls: list[CallDraft] = []
    i += 1
    while True:
        i = skip_ws(text, i)
        if i < len(text) and text[i] == "]" and calls:
            if skip_ws(text, i + 1) != len(text):
                raise Malformed
            return calls
        if calls:
            i = expect(text, i, ",", final)
            i = None if i is None else skip_ws(text, i)
        if i is None or i == len(text):
            if final:
                raise Malformed
            return calls
        draft, end = object_call(text, i)
        calls.append(draft)
        if end is None:
            if final:
                raise Malformed
            return calls
        i = end


class HermesToolParser(ToolParser):
    """Hermes, Qwen2.5/3 and many ChatML models. The content is the text around the blocks."""

    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    template_marks = ("<tool_call>",)

    def scan(self, text: str, final: bool) -> Scan:
        return scan_tagged(text, final, self.START, self._call)

    def _call(self, text: str, i: int, final: bool, calls: list[CallDraft]) -> int | None:
        """Reads the JSON call after a <tool_call> into `calls`: the index after its end tag,
        or None when the text ends inside it."""
        j = skip_ws(text, i)
        draft, end = object_call(text, j) if j < len(text) else (None, None)
        if draft is not None:
            calls.append(draft)
        if end is None:
            if final:
                raise Malformed
            return None
        k = skip_ws(text, end)
        if k == len(text) and final:  # a reply may end without the end tag
            return k
        return expect(text, k, self.END, final)

    def grammar(self, functions: dict[str, dict[str, Any]], tokens: Any) -> str:
        call = f'"\\n" {lark_json(any_call_schema(functions, "arguments"))} "\\n" {lark_lit(self.END, tokens)}'
        return lazy_grammar([(self.START, call)], tokens)


class Llama3JsonToolParser(ToolParser):
    """Llama 3.x (and vLLM's llama4_json): the whole reply is the calls."""

    name = "llama3_json"
    TAG = "<|python_tag|>"
    special_tags = (TAG,)

    def scan(self, text: str, final: bool) -> Scan:
        i = skip_ws(text, 0)
        if text.startswith(self.TAG, i):
            i = skip_ws(text, i + len(self.TAG))
        elif not final and self.TAG.startswith(text[i:]):
            return Scan("")  # nothing yet, or a tag starting
        if i == len(text) and not final:
            return Scan("")
        if i == len(text) or text[i] != "{":
            return Scan(text)  # prose: no call
        calls = []
        while True:
            draft, end = object_call(text, i, ("parameters", "arguments"))
            calls.append(draft)
            if end is None:
                if final:
                    raise Malformed
                return Scan("", calls)
            k = skip_ws(text, end)
            if k < len(text) and text[k] == ";":
                k = skip_ws(text, k + 1)
            elif k < len(text):
                raise Malformed
            if k == len(text):
                return Scan("", calls)
            i = k

    def grammar(self, functions: dict[str, dict[str, Any]], tokens: Any) -> str:
        # The reply is either prose (not starting with '{') or calls: no trigger in the text, a choice at the start.
        call = lark_json(any_call_schema(functions, "parameters"))
        tag = lark_lit(self.TAG, tokens) if tokens.special_id(self.TAG) is not None else ""
        return (
            "%llguidance {}\n"
            f'start: PROSE? | {tag + "? " if tag else ""}call ("; " call)*\n'
            f"call: {call}\n"
            "PROSE: /[ \\t\\r\\n]*([^{ \\t\\r\\n<]|<[^|])(.|\\n)*/\n"
        )


class MistralToolParser(ToolParser):
    """Mistral: content, then [TOOL_CALLS] and the calls, in either of its two shapes."""

    name = "mistral"
    TAG, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    special_tags = (TAG, ARGS, CALL_ID)
    template_marks = ("[TOOL_CALLS]",)
    _NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

    def scan(self, text: str, final: bool) -> Scan:
        content, at = content_before(text, self.TAG, final)
        if at == -1:
            return Scan(content)
        i = skip_ws(text, at + len(self.TAG))
        if i == len(text) and not final:
            return Scan(content)
        if text[i : i + 1] == "[":
            return Scan(content, call_list(text, i, final))
        return Scan(content, self._named(text, i, final))

    def _named(self, text: str, i: int, final: bool) -> list[CallDraft]:
        calls: list[CallDraft] = []
        while True:
            args = text.find(self.ARGS, i)
            if args == -1:
                if final:
                    raise Malformed
                return calls  # the name (and call id) still being written
            name = text[i:args].split(self.CALL_ID, 1)[0]
            if not self._NAME.fullmatch(name):
                raise Malformed
            j = skip_ws(text, args + len(self.ARGS))
            if j < len(text) and text[j] != "{":
                raise Malformed
            end = json_end(text, j) if j < len(text) else None
            calls.append(CallDraft(name, text[j : end or len(text)], end is not None))
            if end is None:
                if final:
                    raise Malformed
                return calls
            k = skip_ws(text, end)
            if k == len(text):
                return calls
            i = expect(text, k, self.TAG, final)
            if i is None:
                return calls
            i = skip_ws(text, i)

    def grammar(self, functions: dict[str, dict[str, Any]], tokens: Any) -> str:
        tag = self.TAG
        if tokens.special_id(self.ARGS) is not None:  # v11+: name[ARGS]{...}, one [TOOL_CALLS] each
            alts = " | ".join(
                f"{json.dumps(name)} {lark_lit(self.ARGS, tokens)} {lark_json(arguments_schema(fn))}"
                for name, fn in functions.items()
            )
            return lazy_grammar([(tag, f"({alts})")], tokens)
        call = f"{lark_json(any_call_schema(functions, 'arguments'))}"
        return lazy_grammar([(tag, f'"[" {call} (", " {call})* "]"')], tokens)


class DeepSeekV3ToolParser(ToolParser):
    """DeepSeek-V3 (and R1-0528): special-token fences, the arguments in a ```json block."""

    name = "deepseek_v3"
    BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    CALL, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
    special_tags = (BEGIN, END, CALL, SEP, CALL_END)
    template_marks = ("<｜tool▁calls▁begin｜>",)
    FENCE, FENCE_END = "\n```json\n", "\n```"

    def scan(self, text: str, final: bool) -> Scan:
        content, at = content_before(text, self.BEGIN, final)
        if at == -1:
            return Scan(content)
        calls: list[CallDraft] = []
        i = at + len(self.BEGIN)
        while True:
            i = skip_ws(text, i)
            if text.startswith(self.END, i) or (final and i == len(text) and calls):
                if skip_ws(text, i + len(self.END)) < len(text):
                    raise Malformed
                return Scan(content, calls)
            if (not final and self.END.startswith(text[i:])) or not self._call(text, i, final, calls):
                return Scan(content, calls)
            i = text.index(self.CALL_END, i) + len(self.CALL_END)

    def _call(self, text: str, i: int, final: bool, calls: list[CallDraft]) -> bool:
        """Reads one call at text[i:] into `calls`; False when the text ends inside it."""
        i = expect(text, i, self.CALL, final)
        sep = -1 if i is None else text.find(self.SEP, i)
        nl = -1 if sep == -1 else text.find("\n", sep)
        if nl == -1:
            if final:
                raise Malformed
            return False
        name = text[sep + len(self.SEP) : nl].strip()
        j = expect(text, nl, self.FENCE, final)
        if j is None:
            calls.append(CallDraft(name or None))
            return False
        end = json_end(text, j) if j < len(text) else None
        if j < len(text) and text[j] != "{":
            raise Malformed
        calls.append(CallDraft(name or None, text[j : end or len(text)], end is not None))
        if end is None:
            if final:
                raise Malformed
            return False
        k = expect(text, end, self.FENCE_END, final)
        k = None if k is None else expect(text, skip_ws(text, k), self.CALL_END, final)
        return k is not None

    def grammar(self, functions: dict[str, dict[str, Any]], tokens: Any) -> str:
        alts = " | ".join(
            f'{json.dumps(name)} "\\n```json\\n" {lark_json(arguments_schema(fn))}' for name, fn in functions.items()
        )
        call = f'{lark_lit(self.CALL, tokens)} "function" {lark_lit(self.SEP, tokens)} ({alts}) "\\n```" {lark_lit(self.CALL_END, tokens)}'
        return lazy_grammar([(self.BEGIN, f"({call})+ {lark_lit(self.END, tokens)}")], tokens)
