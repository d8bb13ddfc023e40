"""Tool calling in OpenAI's chat shape: the request's `tools`, `tool_choice` and
`parallel_tool_calls`, the grammars that keep calls valid, and the conversation's
earlier calls and results on their way to the chat template.

    tool_choice   how the reply is made                       how calls are read back
    "none"        free text; tools are not shown the model    never
    "auto"        free text; from the call tag on, the        --tool-call-parser (or the
                  parser's lazy grammar (--tool-call-grammar)  chat template's format)
    "required"    grammar: a JSON array of {"name", "arguments"}, one item per call
    named         grammar: that function's arguments object
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

from rawpage.server.args import ServerConfig
from rawpage.server.protocol import APIError, Body, loads_field
from rawpage.server.tool_parsers import TOOL_PARSERS, CallDraft, Scan, ToolCall, template_tool_format
from rawpage.server.tool_parsers.base import Malformed, skip_ws, valid_call
from rawpage.server.tool_parsers.grammar import SpecialTokens, any_call_schema, arguments_schema
from rawpage.server.tool_parsers.json_formats import call_list
from rawpage.structured_output import StructuredOutputsParams
from rawpage.text.chat_template import ChatTemplate

logger = logging.getLogger("rawpage.server")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
CHATML_TOOLS_TEMPLATE = os.path.join(os.path.dirname(__file__), "templates", "chatml_tools.jinja")


@dataclass
class ToolRequest:
    tools: list[dict[str, Any]]  # as the client sent them: {"type": "function", "function": {...}}
    choice: str  # none | auto | required | named
    named: str | None  # the function's name when choice == "named"
    parallel: bool
    parser: Any = None  # the --tool-call-parser, for "auto"
    grammar: bool = True  # "auto" keeps calls valid with the parser's lazy grammar (--no-tool-call-grammar: off)
    tokens: SpecialTokens = field(default_factory=lambda: SpecialTokens({}))  # the tokenizer's special tokens

    @property
    def functions(self) -> dict[str, dict[str, Any]]:
        return {t["function"]["name"]: t["function"] for t in self.tools}

    def template_tools(self) -> list[dict[str, Any]] | None:
        return self.tools if self.tools and self.choice != "none" else None

    def constraint(self) -> StructuredOutputsParams | None:
        """The grammar: for "required" a JSON array of calls, for a named choice its arguments,
        and for "auto" (unless --no-tool-call-grammar) the parser's lazy grammar, which leaves
        text free until a call starts (tool_parsers/grammar.py)."""
        if self.choice == "named":
            return StructuredOutputsParams(json=arguments_schema(self.functions[self.named]))
        if self.choice == "auto" and self.grammar:
            return StructuredOutputsParams(grammar=self.parser.grammar(self.functions, self.tokens))
        if self.choice != "required":
            return None
        schema = {"type": "array", "items": any_call_schema(self.functions, "arguments", "/items"), "minItems": 1}
        if not self.parallel:
            schema["maxItems"] = 1
        return StructuredOutputsParams(json=schema)

    def keeps_special_tokens(self) -> bool:
        """The reply must be decoded with special tokens kept: the format's tags are some
        (Mistral's [TOOL_CALLS], DeepSeek's fences), as vLLM's mistral parser asks too."""
        tags = self.parser.special_tags if self.choice == "auto" else ()
        return any(self.tokens.special_id(t) is not None for t in tags)

    def scan(self, text: str, final: bool = False) -> Scan:
        """The reply so far: its certain content and its calls as far as they go (a stream
        sends both as they grow). Under a forced choice the text is the grammar's JSON."""
        if self.choice == "named":
            args = text.strip() if final else text.lstrip().rstrip()  # trailing blanks may be inside the JSON
            return Scan("", [CallDraft(self.named, args, final)])
        if self.choice == "required":
            i = skip_ws(text, 0)
            return Scan("", [] if i == len(text) else call_list(text, i, final))
        if self.choice == "auto":
            return self.parser.scan(text, final)
        return Scan(text)

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        """A reply's content -> (content without the calls, calls). Unparsable: (text, []).
        The text is the model's: whatever it holds, a failure to parse it is no 500."""
        try:
            return self._extract(text)
        except Exception:  # noqa: BLE001 - a parser bug must not turn a finished reply into an error
            logger.exception("tool-call parsing failed; the reply is returned as content")
            return ("" if self.choice in ("named", "required") else text), []

    def _extract(self, text: str) -> tuple[str, list[ToolCall]]:
        # Under a forced choice the text is the grammar's JSON; cut short (max_tokens) it is
        # no call and no content either: vLLM answers content "" and finish_reason "length".
        if self.choice in ("named", "required"):
            try:
                calls = [valid_call(c) for c in self.scan(text, final=True).calls]
            except (Malformed, RecursionError):
                calls = [None]
            return "", calls if calls and all(calls) else []
        if self.choice == "auto":
            content, calls = self.parser.parse(text)
            return content, calls if self.parallel else calls[:1]
        return text, []


def tool_request_from(
    body: Body, config: ServerConfig, template: ChatTemplate | None = None, tokens: SpecialTokens | None = None
) -> ToolRequest | None:
    """The request's tool fields, checked; None when it offers no tools. `template` is the
    model's chat template, which may tell the parser for "auto" (auto_tool_parser); `tokens`
    its tokenizer's special tokens, which some formats' tags are."""
    tools = body.value("tools")
    choice = body.value("tool_choice")
    parallel = body.bool("parallel_tool_calls", True)
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise APIError("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise APIError("'tools' must be a list", param="tools")
    names = [_check_tool(t, i) for i, t in enumerate(tools)]
    if len(set(names)) != len(names):
        raise APIError("'tools' has two functions with the same name", param="tools")
    named = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        fn = choice.get("function")
        named = fn.get("name") if choice.get("type") == "function" and isinstance(fn, dict) else None
        if named not in names:
            raise APIError(
                '\'tool_choice\' must name one of the tools: {"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        choice = "named"
    elif choice not in ("none", "auto", "required"):
        raise APIError("'tool_choice' must be none, auto, required or a named function", param="tool_choice")
    functions = {t["function"]["name"]: t["function"] for t in tools}
    parser = TOOL_PARSERS[auto_tool_parser(config, template)](functions) if choice == "auto" else None
    return ToolRequest(tools, choice, named, parallel, parser, config.tool_call_grammar, tokens or SpecialTokens({}))


def auto_tool_parser(config: ServerConfig, template: ChatTemplate | None) -> str:
    """The parser for tool_choice "auto": --tool-call-parser under --enable-auto-tool-choice.
    With neither flag, the one the tools template's format names: <tool_call> blocks (rawpage's
    ChatML tools template, Qwen's) are hermes. A server given only one of the flags keeps
    vLLM's rule, as does a template of unknown format: a 400."""
    if config.enable_auto_tool_choice and config.tool_call_parser:
        return config.tool_call_parser
    found = None
    if not config.enable_auto_tool_choice and not config.tool_call_parser:
        found = _template_tool_format(template)
    if found is None:
        raise APIError(
            'tool_choice "auto" (the default when tools are given) needs a server started with '
            '--enable-auto-tool-choice and --tool-call-parser; or send tool_choice "required" '
            "or a named function",
            param="tool_choice",
        )
    if found not in _LOGGED_AUTO:
        _LOGGED_AUTO.add(found)
        logger.info(
            'tool_choice "auto": the chat template writes tool calls in the %s format, so replies are '
            "parsed with --tool-call-parser %s (pass --enable-auto-tool-choice --tool-call-parser to choose)",
            found,
            found,
        )
    return found


_LOGGED_AUTO: set[str] = set()


def _template_tool_format(template: ChatTemplate | None) -> str | None:
    try:
        source = template_for_tools(template).source
    except APIError:
        return None
    return template_tool_format(source)


def _check_tool(tool: Any, i: int) -> str:
    where = f"tools[{i}]"
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
        raise APIError(f'{where} must be {{"type": "function", "function": {{...}}}}', param=where)
    unknown = set(tool) - {"type", "function"} or set(fn) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise APIError(f"{where}: '{sorted(unknown)[0]}' is not supported", param=where)
    if not isinstance(fn.get("name"), str) or not _NAME.fullmatch(fn["name"]):
        raise APIError(f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-'", param=where)
    if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
        raise APIError(f"{where}.function.parameters must be a JSON schema object", param=where)
    return fn["name"]


def prepare_tool_messages(messages: list[dict[str, Any]]) -> None:
    """Check earlier calls and results, and hand templates the arguments as objects (as
    vLLM does: Qwen's and Llama's templates `tojson` them). In place."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise APIError(f"messages[{i}]: a tool message needs a string 'tool_call_id'", param=f"messages[{i}]")
        if calls is None:
            continue
        if m["role"] != "assistant" or not isinstance(calls, list):
            raise APIError(
                f"messages[{i}].tool_calls must be a list on an assistant message", param=f"messages[{i}].tool_calls"
            )
        fixed = []
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if (
                not isinstance(fn, dict)
                or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("arguments"), str)
            ):
                raise APIError(
                    f"messages[{i}].tool_calls: each needs function.name and function.arguments (a JSON string)",
                    param=f"messages[{i}].tool_calls",
                )
            try:
                args = loads_field(fn["arguments"], f"messages[{i}].tool_calls[{j}].function.arguments")
            except json.JSONDecodeError:
                args = fn["arguments"]
            fixed.append({**c, "function": {**fn, "arguments": args}})
        m["tool_calls"] = fixed


def template_for_tools(template: ChatTemplate | None) -> ChatTemplate:
    """The model's template if it renders `tools`; for a ChatML model whose template ignores
    them, the ChatML tools template we ship; otherwise a 400 (never drop the tools)."""
    if template is not None and "tools" in template.source:
        return template
    if template is not None and "<|im_start|>" in template.source:
        return _chatml_tools()
    raise APIError(
        "this model's chat template does not render 'tools'; start the server with a --chat-template "
        f"that does (for ChatML models: {CHATML_TOOLS_TEMPLATE})",
        param="tools",
    )


@functools.cache
def _chatml_tools() -> ChatTemplate:
    return ChatTemplate.from_arg(CHATML_TOOLS_TEMPLATE)
