"""POST /v1/messages (Anthropic's Messages API) and POST /v1/messages/count_tokens.

A request becomes a ChatRequest (messages_input.py) and runs on the same path as chat
completions (chat_request.py); its Reply is written as a message object, or as
Anthropic's event stream (messages_stream.py). Errors on these routes are in
Anthropic's shape, and the key may come as `x-api-key` (app.py).

    Reply            content block
    reasoning        {"type": "thinking", "thinking", "signature": ""} (--reasoning-parser)
    content          {"type": "text", "text"}  (present unless there are only tool calls)
    each call        {"type": "tool_use", "id", "name", "input"}
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.server.chat_reply import ReplyParser
from rawpage.server.chat_request import (
    ChatRequest,
    constraint_for,
    final_output,
    prompt_ids,
    reply_parser,
    submit,
    token_counts,
    tool_request,
)
from rawpage.server.guided import structured_outputs_from
from rawpage.server.messages_input import cache_control, chat_messages, chat_tools, stop_sequences
from rawpage.server.messages_output import message_object, stream_message
from rawpage.server.protocol import APIError, Body, checked_sampling_params
from rawpage.server.state import ServerState
from rawpage.server.tools import prepare_tool_messages
from rawpage.structured_output import StructuredOutputsParams


@dataclass
class MessageRequest:
    chat: ChatRequest
    model: str  # as the reply names it: the served name, or the LoRA adapter's
    stream: bool


async def create_message(request: Request, state: ServerState) -> Response:
    body = await state.read_body(request)
    req = parse_message_request(body, state)
    gen = await submit(request, state, req.chat)
    if req.stream:
        return stream_message(state, req.chat, req.model, gen)
    final = await final_output(request, gen)
    o = final.outputs[0]
    reply = req.chat.reply.parse(o.text, o.finish_reason)
    message = message_object(req.chat.request_id, req.model, reply, o, token_counts(state, final))
    return JSONResponse(message, headers={"request-id": req.chat.request_id})


async def count_message_tokens(request: Request, state: ServerState) -> Response:
    """The prompt's length in tokens, rendered exactly as /v1/messages renders it."""
    body = await state.read_body(request)
    state.check_model(body)
    messages, reply, constraint = _conversation(body, state)
    body.reject_unread()
    chat = ChatRequest("count", messages, checked_sampling_params(structured_outputs=constraint), reply)
    return JSONResponse({"input_tokens": len(await prompt_ids(state, chat))})


def parse_message_request(body: Body, state: ServerState) -> MessageRequest:
    lora = state.check_model(body)
    if body.data.get("max_tokens") is None:  # Anthropic requires it
        raise APIError("max_tokens: Field required", param="max_tokens")
    max_tokens = body.int("max_tokens", None, 1)
    messages, reply, constraint = _conversation(body, state)
    config = state.config
    params = checked_sampling_params(
        temperature=body.float("temperature", 1.0, 0.0, 1.0),
        top_p=body.float("top_p", 1.0, 0.0, 1.0),
        top_k=body.int("top_k", 0, 0),
        max_tokens=max_tokens,
        stop=stop_sequences(body, config.max_stop_strings, config.max_stop_string_chars),
        structured_outputs=constraint,
    )
    chat = ChatRequest(f"msg_{uuid.uuid4().hex[:24]}", messages, params, reply, lora=lora)
    meta = body.obj("metadata")
    meta.str("user_id")  # an end-user id for abuse monitoring: nothing to monitor here
    meta.reject_unread()
    stream = bool(body.bool("stream", False))
    body.reject_unread()
    return MessageRequest(chat, lora.lora_name if lora else state.model_name, stream)


def _conversation(
    body: Body, state: ServerState
) -> tuple[list[dict[str, Any]], ReplyParser, StructuredOutputsParams | None]:
    """What /v1/messages and count_tokens share: the messages, the tools and the grammar."""
    messages = chat_messages(body)
    prepare_tool_messages(messages)
    _refuse_thinking(body)
    reply = reply_parser(state, tool_request(state, chat_tools(body)))
    constraint = constraint_for(_output_format(body), "output_config.format", reply)
    cache_control(body)  # a top-level mark: see messages_input
    return messages, reply, constraint


def _refuse_thinking(body: Body) -> None:
    thinking = body.obj("thinking")
    if thinking.data and thinking.str("type") != "disabled":
        raise APIError(
            "'thinking' can only be disabled here: a model thinks by itself, and --reasoning-parser splits "
            "its thinking into thinking blocks",
            param="thinking",
        )
    thinking.reject_unread()


def _output_format(body: Body) -> StructuredOutputsParams | None:
    """`output_config.format`: {"type": "json_schema", "schema"}, through chat's grammar path."""
    config = body.obj("output_config")
    fmt = config.obj("format")
    config.reject_unread()
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
