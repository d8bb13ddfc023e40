"""The Responses API's body, parsed once into a ResponsesRequest (request.py) and so into
chat's terms: `input` items -> chat messages, flat function tools -> chat tools,
`text.format` -> a grammar; the settings the response object repeats; previous_response_id's
stored conversation.

    input item                               chat message
    "a string"                               {"role": "user", "content": ...}
    {"type": "message", "role", "content"}   that role ("developer" is "system"); input_text /
                                             output_text parts joined
    {"type": "reasoning", "content"|"summary"|"encrypted_content"}
                                             an assistant message's reasoning_content
    {"type": "function_call", "call_id", "name", "arguments"}
                                             a tool call on the assistant message before it
    {"type": "function_call_output", "call_id", "output"}
                                             {"role": "tool", "tool_call_id", "content"}

Each item and part is checked: an unknown type, a missing field or an output whose call_id
no earlier call has is a 400 naming its place (`input[3].call_id`).
"""

from __future__ import annotations

import uuid
from typing import Any

from rawpage.sampling_params import SamplingParams
from rawpage.server.guided import structured_outputs_from
from rawpage.server.protocol import APIError, Body, checked_sampling_params, logit_bias, logprobs_count
from rawpage.server.reasoning_input import responses_controls
from rawpage.server.reasoning_seal import ReasoningSeal
from rawpage.server.request import (
    ChatRequest,
    ResponsesRequest,
    bounded_str,
    cache_salt,
    constraint_for,
    default_max_tokens,
    model_sampling_defaults,
    parse_model,
    reject_unread,
    reply_parser,
    served_name,
    tool_request,
)
from rawpage.server.state import Caller, RenderOptions, ServerState
from rawpage.server.tools import prepare_tool_messages
from rawpage.structured_output import StructuredOutputsParams

_METADATA_LIMITS = (16, 64, 512)  # OpenAI's: keys, key length, value length
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")
OUTPUT_LOGPROBS = "message.output_text.logprobs"  # the `include` values that apply here
ENCRYPTED_REASONING = "reasoning.encrypted_content"  # reasoning_seal.py


def parse_responses(body: Body, state: ServerState, caller: Caller) -> ResponsesRequest:
    """A Responses body -> its ResponsesRequest: every field is read, refused or a documented
    no-op. `owner` (the caller's key) is whose stored responses previous_response_id names."""
    lora = parse_model(body, state, caller)
    owner = caller.key_id
    previous = body.str("previous_response_id")
    history = _previous(state, previous, owner)
    instructions = bounded_str(body, "instructions")
    body.mark_read("input")
    conversation = [*history, *input_messages(body.data.get("input"), history, state.seal)]
    messages = [dict(m) for m in conversation]  # prepare_tool_messages rewrites them: the store keeps JSON text
    messages = [{"role": "system", "content": instructions}, *messages] if instructions else messages
    prepare_tool_messages(messages)
    tools_body = chat_tools(body)
    reply = reply_parser(state, tool_request(state, tools_body))
    params = _sampling_params(body, state, constraint_for(text_format(body), "text.format", reply))
    controls, reasoning = responses_controls(body)
    render, params = controls.resolve(state, RenderOptions(), params)
    store, stream = bool(body.bool("store", True)), bool(body.bool("stream", False))
    fields = {**_echoed(body, previous, instructions, params, store, tools_body), "reasoning": reasoning}
    raw_messages = bool(body.bool("enable_response_messages", False))
    _refuse_unsupported(body, stream)
    salt = cache_salt(body)
    reject_unread(body)
    rid = f"resp_{uuid.uuid4().hex}"  # never a client's X-Request-Id: ids are keys of the store
    chat = ChatRequest(rid, messages, params, reply, render, lora=lora, cache_salt=salt, param="input")
    model, sealed = served_name(state, lora), ENCRYPTED_REASONING in (body.value("include") or [])
    return ResponsesRequest(chat, fields, conversation, owner, model, store, stream, raw_messages, sealed)


def _sampling_params(body: Body, state: ServerState, constraint: StructuredOutputsParams | None) -> SamplingParams:
    """OpenAI's temperature, top_p, max_output_tokens and top_logprobs (with include
    ["message.output_text.logprobs"]), and the sampling extras vLLM's ResponsesRequest takes."""
    config, d = state.config, model_sampling_defaults(state)  # d: --generation-config's, for what is left out
    return checked_sampling_params(
        temperature=body.float("temperature", d.get("temperature", 1.0), 0.0, 2.0),
        top_p=body.float("top_p", d.get("top_p", 1.0), 0.0, 1.0),
        top_k=body.int("top_k", d.get("top_k", 0), -1),
        min_p=d.get("min_p", 0.0),
        repetition_penalty=body.float("repetition_penalty", d.get("repetition_penalty", 1.0), 0.0),
        presence_penalty=body.float("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=body.float("frequency_penalty", 0.0, -2.0, 2.0),
        seed=body.int("seed", None, -(2**63), 2**63 - 1),
        stop=body.stop(config.max_stop_strings, config.max_stop_string_chars),
        ignore_eos=body.bool("ignore_eos", False),
        logit_bias=logit_bias(body.dict("logit_bias")) or None,
        skip_special_tokens=body.bool("skip_special_tokens", True),
        include_stop_str_in_output=body.bool("include_stop_str_in_output", False),
        logprobs=_output_logprobs(body, state),
        max_tokens=body.int("max_output_tokens", default_max_tokens(state, None), 1),
        structured_outputs=constraint,
    )


def _output_logprobs(body: Body, state: ServerState) -> int | None:
    """`include`: only "message.output_text.logprobs" applies here; it reports each output
    token's logprob with `top_logprobs` (0 to --max-logprobs) alternatives. Without it,
    top_logprobs asks for nothing (as in OpenAI and vLLM)."""
    include = body.value("include") or []
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise APIError("'include' must be a list of strings", param="include")
    other = [x for x in include if x not in (OUTPUT_LOGPROBS, ENCRYPTED_REASONING)]
    if other:
        raise APIError(
            f"'include' {other[0][:64]!r} is not supported: this server has no built-in tools or images; it can "
            f"include {OUTPUT_LOGPROBS!r} and {ENCRYPTED_REASONING!r}",
            param="include",
        )
    top = logprobs_count(body, "top_logprobs", state.info.max_logprobs, state.info.vocab_size)
    return (top or 0) if OUTPUT_LOGPROBS in include else None


def _previous(state: ServerState, previous: str | None, owner: str | None) -> list[dict[str, Any]]:
    """The stored conversation a previous_response_id continues (a 404 if it is not there)."""
    if previous is None:
        return []
    item = state.responses.get(previous, owner)
    if item is None:
        raise APIError(
            f"Previous response with id '{previous[:128]}' not found: it was never stored, was deleted, "
            "was evicted (--responses-store-max-items, --responses-store-max-bytes), or the server restarted",
            404,
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return item.history


def _echoed(
    body: Body, previous: str | None, instructions: str | None, params: SamplingParams, store: bool, tools: Body
) -> dict[str, Any]:
    """The request's settings as the response object repeats them."""
    tool_list = [{"type": "function", **t["function"]} for t in tools.data.get("tools") or []]
    choice = tools.data.get("tool_choice") or ("auto" if tool_list else "none")
    if isinstance(choice, dict):
        choice = {"type": "function", "name": choice["function"]["name"]}
    fmt = body.data.get("text", {}).get("format") if isinstance(body.data.get("text"), dict) else None
    return {
        "instructions": instructions,
        "max_output_tokens": params.max_tokens,
        "metadata": _metadata(body),
        "parallel_tool_calls": tools.data["parallel_tool_calls"],
        "previous_response_id": previous,
        "store": store,
        "temperature": params.temperature,
        "text": {"format": fmt or {"type": "text"}},
        "tool_choice": choice,
        "tools": tool_list,
        "top_p": params.top_p,
        "top_logprobs": params.logprobs,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "user": bounded_str(body, "user"),
    }


def _metadata(body: Body) -> dict[str, str]:
    """`metadata`: up to 16 string pairs, kept with the response and returned with it."""
    meta = body.dict("metadata")
    keys, key_len, value_len = _METADATA_LIMITS
    if len(meta) > keys:
        raise APIError(f"'metadata' has {len(meta)} keys; the limit is {keys}", param="metadata")
    for k, v in meta.items():
        if len(k) > key_len or not isinstance(v, str) or len(v) > value_len:
            raise APIError(
                f"'metadata' keys are strings of at most {key_len} characters, values of at most {value_len}",
                param=f"metadata.{k[:64]}",
            )
    return meta


def _refuse_unsupported(body: Body, stream: bool) -> None:
    """Fields whose only value here is the default: anything else is a 400 that names it."""
    if body.bool("background", False):
        raise APIError("'background' responses are not supported here; use 'stream': true", param="background")
    if body.str("truncation", "disabled") != "disabled":
        raise APIError("'truncation' must be 'disabled': an input over --max-model-len is a 400", param="truncation")
    options = body.obj("stream_options")
    if options.data and not stream:
        raise APIError("'stream_options' can only be given with 'stream': true", param="stream_options")
    if options.bool("include_obfuscation", False):
        raise APIError(
            "'stream_options.include_obfuscation' is not supported", param="stream_options.include_obfuscation"
        )
    options.reject_unread()


def input_messages(value: Any, history: list[dict[str, Any]], seal: ReasoningSeal) -> list[dict[str, Any]]:
    """`input` as chat messages, after the `history` of a previous response (whose tool
    calls its function_call_output items may answer)."""
    if isinstance(value, str):
        if not value:
            raise APIError("'input' must not be an empty string", param="input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise APIError("'input' must be a string or a non-empty list of items", param="input")
    calls = {c["id"] for m in history for c in m.get("tool_calls") or []}
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(f"'{where}' must be an object", param=where)
        kind = item.get("type", "message")
        read = _ITEMS.get(kind) if isinstance(kind, str) else None
        if read is None:
            raise APIError(
                f"'{where}.type' {str(kind)[:64]!r} is not supported; this server takes message, reasoning, "
                "function_call and function_call_output items",
                param=f"{where}.type",
            )
        if read is _reasoning:
            _reasoning(Body(item, f"{where}."), out, seal)
        else:
            read(Body(item, f"{where}."), out, calls)
    return out


def _message(item: Body, out: list[dict[str, Any]], calls: set[str]) -> None:
    item.str("type"), item.str("id"), item.str("status")
    role = item.str("role")
    if role not in _ROLES:
        raise APIError(f"'{item.path}role' must be one of {sorted(_ROLES)}", param=f"{item.path}role")
    text = _text(item, "content", images=role == "user")
    item.reject_unread()
    last = out[-1] if out else None
    if (
        role == "assistant"
        and last
        and last["role"] == "assistant"
        and not last["content"]
        and "tool_calls" not in last
    ):
        last["content"] = text  # the answer after a reasoning item: one turn
    else:
        out.append({"role": _ROLES[role], "content": text})


def _text(item: Body, name: str, images: bool = False) -> str | list[dict[str, Any]]:
    """A string, or text parts (input_text / output_text) joined; with images (a user
    message's input_image parts), chat's text and image_url parts in order."""
    value = item.value(name)
    if isinstance(value, str):
        return value
    where = f"{item.path}{name}"
    if not isinstance(value, list):
        raise APIError(f"'{where}' must be a string or a list of text parts", param=where)
    parts = []
    for j, part in enumerate(value):
        p = Body(part, f"{where}[{j}].")
        kind = p.str("type")
        if images and kind == "input_image":
            parts.append(_image_part(p))
            continue
        if kind not in _TEXT_PARTS:
            allowed = "input_text, input_image or output_text" if images else "input_text or output_text"
            raise APIError(f"'{where}[{j}].type' must be {allowed}", param=f"{where}[{j}].type")
        parts.append({"type": "text", "text": p.required_str("text")})
        p.value("annotations"), p.value("logprobs")  # an earlier output, sent back: nothing to act on
        p.reject_unread()
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _image_part(p: Body) -> dict[str, Any]:
    """An input_image part (image_url: a data URL) as chat's image_url part."""
    if p.value("file_id") is not None:
        raise APIError("input_image file_id is not supported: send image_url as a data URL", param=f"{p.path}file_id")
    url, detail = p.required_str("image_url"), p.str("detail", "auto")
    if detail not in ("auto", "low", "high"):
        raise APIError(f"'{p.path}detail' must be auto, low or high", param=f"{p.path}detail")
    p.reject_unread()
    return {"type": "image_url", "image_url": {"url": url}}


def _reasoning(item: Body, out: list[dict[str, Any]], seal: ReasoningSeal) -> None:
    """An earlier reply's reasoning, sent back: the chat template's reasoning_content. Its
    encrypted_content, when there is one, is what the model thought (signed by this server,
    a 400 if changed); the readable parts are then only the client's copy of it."""
    item.str("type"), item.str("id"), item.str("status")
    parts = [*_parts(item, "content", "reasoning_text"), *_parts(item, "summary", "summary_text")]
    sealed = item.value("encrypted_content")
    text = seal.open(sealed, f"{item.path}encrypted_content") if sealed is not None else "".join(parts)
    item.reject_unread()
    out.append({"role": "assistant", "content": "", "reasoning_content": text})


def _parts(item: Body, name: str, kind: str) -> list[str]:
    value = item.value(name) or []
    if not isinstance(value, list):
        raise APIError(f"'{item.path}{name}' must be a list", param=f"{item.path}{name}")
    texts = []
    for j, part in enumerate(value):
        p = Body(part, f"{item.path}{name}[{j}].")
        if p.str("type") != kind:
            raise APIError(f"'{p.path}type' must be {kind}", param=f"{p.path}type")
        texts.append(p.required_str("text"))
        p.reject_unread()
    return texts


def _function_call(item: Body, out: list[dict[str, Any]], calls: set[str]) -> None:
    item.str("type"), item.str("id"), item.str("status")
    call_id, name, arguments = (item.required_str(k) for k in ("call_id", "name", "arguments"))
    item.reject_unread()
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)  # parallel calls, or a call after text: one turn
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    calls.add(call_id)


def _function_call_output(item: Body, out: list[dict[str, Any]], calls: set[str]) -> None:
    item.str("type"), item.str("id"), item.str("status")
    call_id = item.required_str("call_id")
    if call_id not in calls:
        raise APIError(
            f"'{item.path}call_id' {call_id[:64]!r} answers no function_call before it", param=f"{item.path}call_id"
        )
    content = _text(item, "output")
    item.reject_unread()
    out.append({"role": "tool", "tool_call_id": call_id, "content": content})


_ITEMS = {
    "message": _message,
    "reasoning": _reasoning,
    "function_call": _function_call,
    "function_call_output": _function_call_output,
}


def chat_tools(body: Body) -> Body:
    """`tools`, `tool_choice` and `parallel_tool_calls` in chat's shapes, as a Body for
    tools.tool_request_from: the same checks, grammars and parsers as chat."""
    tools = body.value("tools")
    choice = body.value("tool_choice")
    fields: dict[str, Any] = {"parallel_tool_calls": body.bool("parallel_tool_calls", True)}
    if tools is not None:
        if not isinstance(tools, list):
            raise APIError("'tools' must be a list", param="tools")
        fields["tools"] = [_chat_tool(t, i) for i, t in enumerate(tools)]
    if isinstance(choice, dict):
        c = Body(choice, "tool_choice.")
        if c.str("type") != "function":
            raise APIError(
                '\'tool_choice\' must be none, auto, required or {"type": "function", "name": ...}', param="tool_choice"
            )
        choice = {"type": "function", "function": {"name": c.str("name")}}
        c.reject_unread()
    fields["tool_choice"] = choice
    return Body(fields)


def _chat_tool(tool: Any, i: int) -> dict[str, Any]:
    """{"type": "function", "name", "description", "parameters", "strict"} -> chat's nested shape."""
    t = Body(tool, f"tools[{i}].")
    kind = t.str("type")
    if kind != "function":
        raise APIError(
            f"'tools[{i}].type' {str(kind)[:64]!r} is not supported; this server runs function tools only",
            param=f"tools[{i}].type",
        )
    fn = {k: t.value(k) for k in ("name", "description", "parameters", "strict")}
    t.reject_unread()
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


def text_format(body: Body) -> StructuredOutputsParams | None:
    """`text.format`: text (no grammar), json_object, or json_schema {"name", "schema",
    "description", "strict"}, through chat's response_format and the same grammar path."""
    text = body.obj("text")
    fmt = text.obj("format")
    text.reject_unread()
    if not fmt.data:
        return None
    fields = {k: fmt.value(k) for k in ("name", "description", "schema", "strict")}
    kind = fmt.str("type")
    fmt.reject_unread()
    if kind == "json_schema":
        rf = {"type": kind, "json_schema": {k: v for k, v in fields.items() if v is not None}}
    else:
        rf = {"type": kind}
        extra = [k for k, v in fields.items() if v is not None]
        if extra:
            raise APIError(f"'text.format.{extra[0]}' goes with type json_schema", param=f"text.format.{extra[0]}")
    try:
        return structured_outputs_from(Body({"response_format": rf}))
    except APIError as e:  # name the Responses field, not chat's
        e.param = "text.format" if e.param and e.param.startswith("response_format") else e.param
        e.message = e.message.replace("response_format.json_schema", "text.format").replace(
            "response_format", "text.format"
        )
        raise
