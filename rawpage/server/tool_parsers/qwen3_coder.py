"""Qwen3-Coder's XML tool calls (`--tool-call-parser qwen3_coder`):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A parameter's value is text; it becomes JSON by the type the tool declares for it, as
vLLM's parser does: integer and number as numbers, boolean as true/false, object and
array as the JSON written, and everything else (string, or a name the tool does not
declare) as a string, so a stream can send a string value a character at a time. One
newline on each side of a value is the format's, not the value's.
"""

from __future__ import annotations

import json
from typing import Any

from rawpage.server.tool_parsers.base import CallDraft, Malformed, Scan, ToolParser, hold_prefix, skip_ws
from rawpage.server.tool_parsers.grammar import arguments_schema, lark_json, lazy_grammar
from rawpage.server.tool_parsers.json_formats import expect, scan_tagged

_TYPED = ("integer", "number", "boolean", "object", "array")


class Qwen3CoderToolParser(ToolParser):
    name = "qwen3_coder"
    START, END = "<tool_call>", "</tool_call>"
    FN, FN_END, P, P_END = "<function=", "</function>", "<parameter=", "</parameter>"
    template_marks = ("<function=",)

    def scan(self, text: str, final: bool) -> Scan:
        return scan_tagged(text, final, self.START, self._call)

    def _call(self, text: str, i: int, final: bool, calls: list[CallDraft]) -> int | None:
        """Reads one call after its <tool_call> into `calls`: the index after </tool_call>,
        or None when the text ends inside the call."""
        i = expect(text, skip_ws(text, i), self.FN, final)
        close = -1 if i is None else text.find(">", i)
        if close == -1:
            if final:
                raise Malformed
            return None
        name = text[i:close]
        draft = CallDraft(name, "{")
        calls.append(draft)
        types = self._types(name)
        i, first = close + 1, True
        while True:
            i = skip_ws(text, i)
            if text.startswith(self.FN_END, i):
                draft.arguments, draft.done = draft.arguments + "}", True
                i = skip_ws(text, i + len(self.FN_END))
                return len(text) if final and i == len(text) else expect(text, i, self.END, final)
            i = expect(text, i, self.P, final) if not self.FN_END.startswith(text[i:]) or final else None
            if i is None:
                return None
            i = self._parameter(text, i, final, draft, types, first)
            if i is None:
                return None
            first = False

    def _parameter(
        self, text: str, i: int, final: bool, draft: CallDraft, types: dict[str, str], first: bool
    ) -> int | None:
        close = text.find(">", i)
        if close == -1:
            if final:
                raise Malformed
            return None
        key = text[i:close]
        if not key or "<" in key:
            raise Malformed
        head = ("" if first else ", ") + json.dumps(key, ensure_ascii=False) + ": "
        end = text.find(self.P_END, close + 1)
        raw = text[close + 1 : end if end != -1 else len(text)]
        raw = raw[1:] if raw.startswith("\n") else raw
        kind = types.get(key, "string")
        if end == -1:
            if final:
                raise Malformed
            if kind not in _TYPED:  # a string grows as it is written; hold a trailing newline and a tag starting
                raw = raw[: hold_prefix(raw, self.P_END)]
                raw = raw[:-1] if raw.endswith("\n") else raw
                draft.arguments += head + json.dumps(raw, ensure_ascii=False)[:-1]
            return None
        raw = raw[:-1] if raw.endswith("\n") else raw
        draft.arguments += head + _value_json(raw, kind)
        return end + len(self.P_END)

    def _types(self, name: str) -> dict[str, str]:
        props = (self.functions.get(name, {}).get("parameters") or {}).get("properties") or {}
        return {k: v.get("type") for k, v in props.items() if isinstance(v, dict) and isinstance(v.get("type"), str)}

    def grammar(self, functions: dict[str, dict[str, Any]], tokens: Any) -> str:
        rules, alts = [], []
        for f, (name, fn) in enumerate(functions.items()):
            schema = arguments_schema(fn)
            props, required = schema.get("properties") or {}, set(schema.get("required") or [])
            params = []
            for p, (key, sub) in enumerate(props.items()):
                rule = f"f{f}_p{p}"
                rules.append(f'{rule}: "<parameter={key}>\\n" {_value_rule(sub, rule, rules)} "\\n"')
                params.append(rule if key in required else f"{rule}?")
            alts.append(f'"{name}>\\n" {" ".join(params)}')
        body = f'"\\n<function=" ({" | ".join(alts)}) "</function>\\n</tool_call>"'
        return lazy_grammar([(self.START, body)], tokens) + "\n" + "\n".join(rules)


def _value_json(raw: str, kind: str) -> str:
    """A parameter's text as JSON by its declared type; text that is no such value stays a string."""
    if kind in _TYPED:
        value: Any = {"true": True, "false": False}.get(raw.strip()) if kind == "boolean" else None
        if kind != "boolean":
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError):
                value = None
        ok = {
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "boolean": isinstance(value, bool),
            "object": isinstance(value, dict),
            "array": isinstance(value, list),
        }[kind]
        if ok:
            return json.dumps(value, ensure_ascii=False)
    return json.dumps(raw, ensure_ascii=False)


def _value_rule(schema: dict[str, Any], rule: str, rules: list[str]) -> str:
    """A parameter's value and its end tag in the grammar: JSON for typed values, one of
    the texts for a string enum, else any text up to the tag."""
    if schema.get("type") in _TYPED:
        return f'{lark_json(schema)} "\\n</parameter>"'
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
        return f'({" | ".join(json.dumps(v) for v in schema["enum"])}) "\\n</parameter>"'
    rules.append(f'{rule}_text[lazy]: /(.|\\n)*/ "\\n</parameter>"')
    return f"{rule}_text"
