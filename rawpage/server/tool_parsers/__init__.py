"""Tool-call parsers: a model's raw text -> (content, tool calls), one class per format,
chosen with `--tool-call-parser` (vLLM's names) or read off the chat template.

Used for tool_choice "auto", where the model decides. ("required" and a named function
need none: a grammar makes the model write a JSON array of calls, or the named
function's arguments.) Text that does not parse as calls comes back whole as plain
content: a model's malformed call is its answer, never a server error.

    name              format                                         module
    hermes            <tool_call>{"name", "arguments"}</tool_call>   json_formats.py
    llama3_json       {"name", "parameters"}; ...  (whole reply)     json_formats.py
    llama4_json       the same as llama3_json, as in vLLM            json_formats.py
    mistral           [TOOL_CALLS][{...}] or [TOOL_CALLS]f[ARGS]{...} json_formats.py
    deepseek_v3       <｜tool▁calls▁begin｜>... ```json {...}```       json_formats.py
    qwen3_coder       <tool_call><function=f><parameter=p>v</parameter>  qwen3_coder.py
    pythonic          [f(a=1), g(b="x")]  (whole reply)              pythonic.py
    llama4_pythonic   the same, in <|python_start|>…<|python_end|>   pythonic.py

Each parser's `scan` reads a whole reply or a stream so far (base.py); its `grammar` is
the lazy grammar that keeps its calls valid (grammar.py).
"""

from __future__ import annotations

from rawpage.server.tool_parsers.base import (
    NOT_JSON,
    CallDraft,
    Scan,
    ToolCall,
    ToolParser,
    call_from_json,
    hold_prefix,
    model_json,
)
from rawpage.server.tool_parsers.json_formats import (
    DeepSeekV3ToolParser,
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
)
from rawpage.server.tool_parsers.pythonic import PythonicToolParser
from rawpage.server.tool_parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "deepseek_v3": DeepSeekV3ToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "pythonic": PythonicToolParser,
    "llama4_pythonic": PythonicToolParser,
}

# Read off a chat template, most specific first: Qwen3-Coder's template writes <tool_call>
# too, around its <function=...>. Llama 3.1-3.3 and Llama 4 templates (JSON or pythonic)
# share their markers, so those stay a --tool-call-parser choice.
_DETECT_ORDER = ("qwen3_coder", "deepseek_v3", "mistral", "hermes")


def template_tool_format(source: str) -> str | None:
    """The format a chat template's source shows its model writing, when that is unambiguous."""
    for name in _DETECT_ORDER:
        if any(mark in source for mark in TOOL_PARSERS[name].template_marks):
            return name
    return None


__all__ = [
    "NOT_JSON",
    "TOOL_PARSERS",
    "CallDraft",
    "Scan",
    "ToolCall",
    "ToolParser",
    "call_from_json",
    "hold_prefix",
    "model_json",
    "template_tool_format",
]
