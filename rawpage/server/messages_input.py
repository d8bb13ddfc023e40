"""Anthropic's Messages body, parsed once into a MessagesRequest (request.py) and so
into chat's terms.

    Anthropic                                   chat
    system: "..." or [{"type": "text"}]          {"role": "system"}
    {"role": "user", "content": [text...]}      {"role": "user", "content": joined text}
    {"type": "tool_result", "tool_use_id"}      {"role": "tool", "tool_call_id", "content"}
    {"type": "tool_use", "id", "name", "input"} a tool call on the assistant message
    {"type": "thinking", "thinking", "signature"} the assistant message's reasoning_content
    tools: [{"name", "description", "input_schema"}]   [{"type": "function", "function": {...}}]
    tool_choice auto / any / tool / none        auto / required / named / none

`cache_control` marks are accepted on blocks, tools and the request: prefix caching
already reuses every prompt prefix the server has seen, which is what they ask for.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from rawpage.server.chat_reply import ReplyParser
from rawpage.server.guided import structured_outputs_from
from rawpage.server.protocol import APIError, Body, checked_sampling_params
from rawpage.server.reasoning_input import ReasoningControls, anthropic_controls
from rawpage.server.reasoning_seal import ReasoningSeal
from rawpage.server.request import (
    ChatRequest,
    MessagesRequest,
    bounded_str,
    cache_salt,
    constraint_for,
    model_sampling_defaults,
    parse_model,
    reply_parser,
    served_name,
    tool_request,
)
from rawpage.server.state import Caller, RenderOptions, ServerState
from rawpage.server.tools import prepare_tool_messages
from rawpage.structured_output import StructuredOutputsParams

_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def cache_control(b: Body) -> None:
    """A `cache_control` mark: {"type": "ephemeral"} (with a ttl) and nothing else."""
    cc = b.obj("cache_control")
    if cc.data and cc.str("type") != "ephemeral":
        raise APIError(f"'{cc.path}type' must be 'ephemeral'", param=f"{cc.path}type")
    cc.str("ttl")
    cc.reject_unread()


def system_messages(body: Body) -> list[dict[str, Any]]:
    value = body.value("system")
    if value is None:
        return []
    text = value if isinstance(value, str) else _texts(value, "system")
    return [{"role": "system", "content": text}] if text else []


def _texts(blocks: Any, where: str) -> str:
    """Text blocks joined (a tool_result's content or the system prompt)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise APIError(f"'{where}' must be a string or a list of text blocks", param=where)
    texts = []
    for j, block in enumerate(blocks):
        b = Body(block, f"{where}[{j}].")
        if b.str("type") != "text":
            raise APIError(f"'{where}[{j}].type' must be text; this server reads text only", param=f"{where}[{j}].type")
        texts.append(b.required_str("text"))
        cache_control(b)
        b.reject_unread()
    return "".join(texts)


def chat_messages(body: Body, seal: ReasoningSeal) -> list[dict[str, Any]]:
    """`system` and `messages` as chat messages, every block checked (a thinking block's
    signature against `seal`)."""
    body.mark_read("messages")
    messages = body.data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list", param="messages")
    out, calls = system_messages(body), set()
    for i, m in enumerate(messages):
        msg = Body(m, f"messages[{i}].")
        role = msg.str("role")
        if role not in ("user", "assistant"):
            raise APIError(f"'messages[{i}].role' must be user or assistant", param=f"messages[{i}].role")
        blocks = msg.value("content")
        msg.reject_unread()
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        if not isinstance(blocks, list):
            raise APIError(
                f"'messages[{i}].content' must be a string or a list of blocks", param=f"messages[{i}].content"
            )
        parts = [Body(b, f"messages[{i}].content[{j}].") for j, b in enumerate(blocks)]
        out += _user(parts, calls) if role == "user" else _assistant(parts, calls, seal)
    return out


def _block_type(b: Body, allowed: tuple[str, ...]) -> str:
    kind = b.str("type")
    if kind not in allowed:
        raise APIError(
            f"'{b.path}type' {str(kind)[:64]!r} is not supported here; this role takes {', '.join(allowed)} blocks",
            param=f"{b.path}type",
        )
    cache_control(b)
    return kind


def _text(b: Body) -> str:
    """A text block's text; `citations` may come back as the API returned it: null or empty."""
    if b.value("citations"):
        raise APIError(f"'{b.path}citations' is not supported: this server reads text only", param=f"{b.path}citations")
    return b.required_str("text")


def _user(blocks: list[Body], calls: set[str]) -> list[dict[str, Any]]:
    """A user turn: its tool results (chat's tool messages), then its text and images."""
    out, parts = [], []
    for b in blocks:
        kind = _block_type(b, ("text", "image", "tool_result"))
        if kind == "text":
            parts.append({"type": "text", "text": _text(b)})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(b)}})
        else:
            use_id = b.required_str("tool_use_id")
            if use_id not in calls:
                raise APIError(
                    f"'{b.path}tool_use_id' {use_id[:64]!r} matches no tool_use block in an earlier assistant message",
                    param=f"{b.path}tool_use_id",
                )
            content = _texts(b.value("content") or "", f"{b.path}content")
            if b.bool("is_error", False):
                content = f"Error: {content}"  # the template has no error flag: say it in the text
            out.append({"role": "tool", "tool_call_id": use_id, "content": content})
        b.reject_unread()
    if any(p["type"] == "image_url" for p in parts):
        return [*out, {"role": "user", "content": parts}]
    return out + ([{"role": "user", "content": "".join(p["text"] for p in parts)}] if parts else [])


def _image_url(b: Body) -> str:
    """An image block's source as an image URL: base64 data as a data URL, or its url."""
    source = Body(b.value("source") or {}, f"{b.path}source.")
    kind = source.str("type")
    if kind == "base64":
        media_type, data = source.required_str("media_type"), source.required_str("data")
        url = f"data:{media_type};base64,{data}"
    elif kind == "url":
        url = source.required_str("url")
    else:
        raise APIError(f"'{b.path}source.type' must be base64 or url", param=f"{b.path}source.type")
    source.reject_unread()
    return url


def _assistant(blocks: list[Body], calls: set[str], seal: ReasoningSeal) -> list[dict[str, Any]]:
    """An assistant turn: its text, its tool calls and its thinking, as one message. A
    thinking block's signature is ours (reasoning_seal.py): its text must be what we signed."""
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for b in blocks:
        kind = _block_type(b, ("text", "tool_use", "thinking"))
        if kind == "text":
            msg["content"] += _text(b)
        elif kind == "thinking":
            text, signature = b.required_str("thinking"), b.str("signature")
            if signature and not text:  # display "omitted": the signature holds the thinking
                text = seal.open(signature, f"{b.path}signature")
            elif signature and seal.open(signature, f"{b.path}signature") != text:
                raise APIError(
                    f"'{b.path}thinking' is not the thinking its signature signed", param=f"{b.path}thinking"
                )
            msg["reasoning_content"] = msg.get("reasoning_content", "") + text
        else:
            use_id, name = b.required_str("id"), b.required_str("name")
            args = b.value("input")
            if not isinstance(args, dict):
                raise APIError(f"'{b.path}input' must be an object", param=f"{b.path}input")
            call = {"id": use_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            msg.setdefault("tool_calls", []).append(call)
            calls.add(use_id)
        b.reject_unread()
    return [msg]


def chat_tools(body: Body) -> Body:
    """`tools` and `tool_choice` in chat's shapes, as a Body for tools.tool_request_from."""
    tools = body.value("tools")
    fields: dict[str, Any] = {}
    if tools is not None:
        if not isinstance(tools, list):
            raise APIError("'tools' must be a list", param="tools")
        fields["tools"] = [_chat_tool(Body(t, f"tools[{i}].")) for i, t in enumerate(tools)]
    choice = body.obj("tool_choice")
    if choice.data:
        kind = choice.str("type")
        if kind == "tool":
            fields["tool_choice"] = {"type": "function", "function": {"name": choice.str("name")}}
        elif kind in _TOOL_CHOICES:
            fields["tool_choice"] = _TOOL_CHOICES[kind]
        else:
            raise APIError("'tool_choice.type' must be auto, any, tool or none", param="tool_choice.type")
        fields["parallel_tool_calls"] = not choice.bool("disable_parallel_tool_use", False)
        choice.reject_unread()
    if tools and "tool_choice" not in fields:
        fields["tool_choice"] = "auto"
    return Body(fields)


def _chat_tool(t: Body) -> dict[str, Any]:
    """{"name", "description", "input_schema"} (a custom tool) -> chat's function tool."""
    if t.str("type", "custom") != "custom":
        raise APIError(
            f"'{t.path}type' {t.data['type']!r} is not supported; this server runs custom (client) tools only",
            param=f"{t.path}type",
        )
    cache_control(t)
    fn = {"name": t.value("name"), "description": t.str("description"), "parameters": t.dict("input_schema")}
    if not fn["parameters"]:
        raise APIError(f"'{t.path}input_schema' must be a JSON schema object", param=f"{t.path}input_schema")
    if t.bool("strict", None) is not None:
        fn["strict"] = t.data["strict"]
    t.reject_unread()
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


def parse_messages_request(body: Body, state: ServerState, caller: Caller) -> MessagesRequest:
    """A Messages body -> its MessagesRequest: every field read, the rest refused."""
    lora = parse_model(body, state, caller)
    if body.data.get("max_tokens") is None:  # Anthropic requires it
        raise APIError("max_tokens: Field required", param="max_tokens")
    max_tokens = body.int("max_tokens", None, 1)
    messages, reply, constraint, controls = _conversation(body, state)
    config = state.config
    defaults = model_sampling_defaults(state)  # --generation-config: min_p, repetition_penalty too
    params = checked_sampling_params(
        **{
            **defaults,
            "temperature": body.float("temperature", defaults.get("temperature", 1.0), 0.0, 1.0),
            "top_p": body.float("top_p", defaults.get("top_p", 1.0), 0.0, 1.0),
            "top_k": body.int("top_k", defaults.get("top_k", 0), 0),
        },
        max_tokens=max_tokens,
        stop=stop_sequences(body, config.max_stop_strings, config.max_stop_string_chars),
        structured_outputs=constraint,
    )
    render, params = controls.resolve(state, RenderOptions(), params)
    chat = ChatRequest(
        f"msg_{uuid.uuid4().hex[:24]}", messages, params, reply, render, lora=lora, cache_salt=cache_salt(body)
    )
    meta = body.obj("metadata")
    bounded_str(meta, "user_id")  # an end-user id for abuse monitoring: nothing to monitor here
    meta.reject_unread()
    stream = bool(body.bool("stream", False))
    body.reject_unread()
    return MessagesRequest(chat, served_name(state, lora), stream, controls.omitted)


def parse_count_tokens(body: Body, state: ServerState, caller: Caller) -> ChatRequest:
    """A count_tokens body: the conversation of a Messages body, rendered the same way."""
    parse_model(body, state, caller)
    messages, reply, constraint, controls = _conversation(body, state)
    body.reject_unread()
    render, params = controls.resolve(state, RenderOptions(), checked_sampling_params(structured_outputs=constraint))
    return ChatRequest("count", messages, params, reply, render)


def _conversation(
    body: Body, state: ServerState
) -> tuple[list[dict[str, Any]], ReplyParser, StructuredOutputsParams | None, ReasoningControls]:
    """What /v1/messages and count_tokens share: the messages, the tools, the grammar and
    the thinking controls (`thinking`, output_config.effort: reasoning_input.py)."""
    messages = chat_messages(body, state.seal)
    prepare_tool_messages(messages)
    reply = reply_parser(state, tool_request(state, chat_tools(body)))
    config = body.obj("output_config")
    constraint = constraint_for(_output_format(config), "output_config.format", reply)
    controls = anthropic_controls(body, config.str("effort"))
    config.reject_unread()
    cache_control(body)  # a top-level mark: see messages_input
    return messages, reply, constraint, controls


def _output_format(config: Body) -> StructuredOutputsParams | None:
    """`output_config.format`: {"type": "json_schema", "schema"}, through chat's grammar path."""
    fmt = config.obj("format")
    if not fmt.data:
        return None
    if fmt.str("type") != "json_schema":
        raise APIError("'output_config.format.type' must be json_schema", param="output_config.format.type")
    schema = fmt.dict("schema")
    fmt.reject_unread()
    rf = {"type": "json_schema", "json_schema": {"schema": schema, "strict": True}}
    try:
        return structured_outputs_from(Body({"response_format": rf}))
    except APIError as e:
        raise APIError(
            e.message.replace("response_format.json_schema", "output_config.format"), param="output_config.format"
        ) from None


def stop_sequences(body: Body, max_count: int, max_chars: int) -> list[str]:
    value = body.value("stop_sequences") or []
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise APIError("'stop_sequences' must be a list of non-empty strings", param="stop_sequences")
    if len(value) > max_count or any(len(s) > max_chars for s in value):
        raise APIError(
            f"'stop_sequences' allows {max_count} strings of {max_chars} characters (--max-stop-strings, "
            "--max-stop-string-chars)",
            param="stop_sequences",
        )
    return value
