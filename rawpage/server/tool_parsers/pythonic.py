"""Pythonic tool calls (`--tool-call-parser pythonic`, and `llama4_pythonic`): Llama 3.2
and Llama 4 write the whole reply as a Python list of calls with keyword arguments,

    [get_weather(city="Paris"), get_time(tz="UTC", exact=True)]

which Llama 4 may wrap in <|python_start|>…<|python_end|>. Each call is read with Python's
own parser (`ast`, never evaluated): values are literals (strings, numbers, True/False/
None, lists, dicts), and JSON's true/false/null are taken too. A stream sends each call's
name when its "(" arrives and its arguments once its ")" closes it.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from rawpage.server.tool_parsers.base import CallDraft, Malformed, Scan, ToolParser, skip_ws
from rawpage.server.tool_parsers.grammar import arguments_schema, lark_json, lark_lit

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_STR = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"", re.DOTALL)
_JSON_NAMES = {"true": True, "false": False, "null": None}


class PythonicToolParser(ToolParser):
    name = "pythonic"
    START, END = "<|python_start|>", "<|python_end|>"
    special_tags = (START, END)

    def scan(self, text: str, final: bool) -> Scan:
        i = skip_ws(text, 0)
        if text.startswith(self.START, i):
            i = skip_ws(text, i + len(self.START))
        elif not final and self.START.startswith(text[i:]):
            return Scan("")
        if i == len(text) and not final:
            return Scan("")
        if text[i : i + 1] != "[":
            return Scan(text)  # prose
        calls: list[CallDraft] = []
        i += 1
        while True:
            i = skip_ws(text, i)
            if calls and text[i : i + 1] == "]":
                return self._after_list(text, i + 1, final, calls)
            if calls:
                if i == len(text):
                    break
                if text[i] != ",":
                    raise Malformed
                i = skip_ws(text, i + 1)
            m = _NAME.match(text, i)
            if m is None or m.end() == len(text):
                if m is None and i < len(text):
                    raise Malformed
                break
            if text[m.end()] != "(":
                raise Malformed
            close = _call_end(text, m.end())
            calls.append(
                CallDraft(m.group(), "" if close is None else _arguments(text[m.end() : close]), close is not None)
            )
            if close is None:
                break
            i = close
        if final:
            raise Malformed
        return Scan("", calls)

    def _after_list(self, text: str, i: int, final: bool, calls: list[CallDraft]) -> Scan:
        i = skip_ws(text, i)
        if text.startswith(self.END, i):
            i = skip_ws(text, i + len(self.END))
        elif not final and self.END.startswith(text[i:]):
            return Scan("", calls)
        if i != len(text):
            raise Malformed
        return Scan("", calls)

    def grammar(self, functions: dict[str, dict[str, Any]], tokens: Any) -> str:
        alts = " | ".join(f'"{name}(" {_kwargs(fn)} ")"' for name, fn in functions.items())
        start = lark_lit(self.START, tokens) + "? " if tokens.special_id(self.START) is not None else ""
        return (
            "%llguidance {}\n"
            f'start: PROSE? | {start}"[" call (", " call)* "]"\n'
            f"call: {alts}\n"
            "PROSE: /[ \\t\\r\\n]*([^\\[ \\t\\r\\n<]|<[^|])(.|\\n)*/\n"
        )


def _call_end(text: str, i: int) -> int | None:
    """The index after the ")" that closes the "(" at text[i]; None when the text ends first."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c in "'\"":
            m = _STR.match(text, i)
            if m is None:
                if "\n" in text[i:]:
                    raise Malformed
                return None
            i = m.end()
            continue
        depth += c in "([{"
        depth -= c in ")]}"
        i += 1
        if depth == 0:
            return i
    return None


def _arguments(call_args: str) -> str:
    """ "(a=1, b='x')" -> '{"a": 1, "b": "x"}'."""
    try:
        node = ast.parse("f" + call_args, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise Malformed from None
    if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
        raise Malformed
    args = {k.arg: _literal(k.value) for k in node.keywords}
    try:
        return json.dumps(args, ensure_ascii=False)
    except (ValueError, RecursionError):
        raise Malformed from None


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
        return {k.value: _literal(v) for k, v in zip(node.keys, node.values)}
    raise Malformed


def _kwargs(fn: dict[str, Any]) -> str:
    """The keyword arguments in the grammar: the required ones in order, then any of the
    optional ones, in the order declared."""
    schema = arguments_schema(fn)
    props, required = schema.get("properties") or {}, schema.get("required") or []
    req = [f"{json.dumps(k + '=')} {_value(props[k])}" for k in required if k in props]
    opt = [f"{json.dumps(k + '=')} {_value(v)}" for k, v in props.items() if k not in required]
    if req:
        return ' ", " '.join(req) + "".join(f' (", " {o})?' for o in opt)
    if not opt:
        return ""
    firsts = [o + "".join(f' (", " {p})?' for p in opt[i + 1 :]) for i, o in enumerate(opt)]
    return "(" + " | ".join(f"({f})" for f in firsts) + ")?"


def _value(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if kind == "boolean":
        return '("True" | "False")'
    if kind == "null":
        return '"None"'
    return lark_json(schema)
