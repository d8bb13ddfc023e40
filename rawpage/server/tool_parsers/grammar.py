"""Tool calls that are always valid (tool_choice "auto"): a lazy grammar per format.

The reply is free text until the format's call tag appears; from the tag on, llguidance
holds the model to one of the declared tools with arguments valid for its schema, and
once the call closes the text is free again. Free text pays nothing: a lazy lexeme
(llguidance's `[lazy]`, its "structural tag" idea) matches the shortest text that ends in
the tag, so the grammar has no say until the tag is written.

    start: (call_0 | call_1)* TEXT          free text, any number of calls, free text
    call_0: trig_0 BODY                     the format's call after its tag
    trig_0[lazy]: TEXT "<tool_call>"        a text tag ...
    call_1: TEXT <[128010]> BODY            ... or a special token, by id (it is no text)

A tag that is one special token of the vocabulary (Mistral's [TOOL_CALLS]) is matched as
that token; text never spells a special token, so the text rule could never see it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from rawpage.server.json_schema import close_objects, rebase_refs
from rawpage.structured_output.schema_rewrite import cap_numbers


class SpecialTokens:
    """The special tokens of a tokenizer by their text (`special_id`), for the grammars."""

    def __init__(self, ids: dict[str, int]) -> None:
        self.ids = ids

    @classmethod
    @functools.lru_cache(maxsize=4)
    def of(cls, tokenizer: Any) -> SpecialTokens:
        hf = getattr(tokenizer, "hf", None)
        if hf is None:
            return cls({})
        return cls({t.content: i for i, t in hf.get_added_tokens_decoder().items() if t.special})

    def special_id(self, text: str) -> int | None:
        return self.ids.get(text)


def lark_lit(text: str, tokens: SpecialTokens) -> str:
    """A tag in Lark: the special token by id when it is one, else its text."""
    tid = tokens.special_id(text)
    return f"<[{tid}]>" if tid is not None else json.dumps(text)


# Inside a call: JSON spelled as models are taught it ({"a": 1, "b": 2}), with no free
# whitespace (a small model offered any whitespace emits newlines until max_tokens).
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def lark_json(schema: dict[str, Any]) -> str:
    """A JSON schema as a Lark %json rule, in that style; unbounded numbers are capped at
    16 digits, as for every schema (schema_rewrite.py)."""
    return f"%json {json.dumps({**cap_numbers(schema), 'x-guidance': _JSON_STYLE})}"


def arguments_schema(fn: dict[str, Any]) -> dict[str, Any]:
    """The arguments' schema, closed: no keys the tool did not declare (OpenAI's strict
    mode, which vLLM enforces for tool calls)."""
    return close_objects(fn.get("parameters") or {"type": "object", "properties": {}})


def any_call_schema(functions: dict[str, dict[str, Any]], args_key: str, at: str = "") -> dict[str, Any]:
    """{"name": one of the tools, args_key: its arguments}: one schema per tool, any of them.
    `at` is where the schema will sit in a larger one (its local refs are rebased there)."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": name},
                    args_key: rebase_refs(arguments_schema(fn), f"{at}/anyOf/{i}/properties/{args_key}"),
                },
                "required": ["name", args_key],
                "additionalProperties": False,
            }
            for i, (name, fn) in enumerate(functions.items())
        ]
    }


def lazy_grammar(calls: list[tuple[str, str]], tokens: SpecialTokens) -> str:
    """Free text with calls: each (tag, Lark body after the tag) is one kind of call."""
    rules, names = [], []
    for i, (tag, body) in enumerate(calls):
        names.append(f"call_{i}")
        if tokens.special_id(tag) is not None:
            rules.append(f"call_{i}: TEXT {lark_lit(tag, tokens)} {body}")
        else:
            rules.append(f"trig_{i}[lazy]: TEXT {json.dumps(tag)}")
            rules.append(f"call_{i}: trig_{i} {body}")
    return "\n".join(["%llguidance {}", f"start: ({' | '.join(names)})* TEXT", *rules, "TEXT: /(.|\\n)*/"])
