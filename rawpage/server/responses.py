"""POST /v1/responses (OpenAI's Responses API), and GET, DELETE and cancel of stored ones.

A request becomes a ChatRequest (responses_input.py), runs on the same path as chat
completions (chat_request.py), and its Reply is written as a response object or its
event stream (responses_output.py). With `store` (the default) the response and its
conversation go into the bounded in-memory store (response_store.py), which
`previous_response_id` continues from.

There is no background mode (`background: true` is a 400): a response is stored once it
has finished, so `cancel` finds it finished and returns it unchanged, as OpenAI does
for a finished background response.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.outputs import RequestOutput
from rawpage.sampling_params import SamplingParams
from rawpage.server.chat import NO_EFFECT_FIELDS
from rawpage.server.chat_reply import Reply
from rawpage.server.chat_request import (
    ChatRequest,
    constraint_for,
    final_output,
    reply_parser,
    reply_steps,
    submit,
    token_counts,
    tool_request,
)
from rawpage.server.protocol import APIError, Body, checked_sampling_params
from rawpage.server.responses_input import chat_tools, input_messages, text_format
from rawpage.server.responses_output import OutputItems, ResponseEvents, finished, new_envelope, usage
from rawpage.server.state import ServerState
from rawpage.server.streaming import sse_response
from rawpage.server.tools import prepare_tool_messages

_METADATA_LIMITS = (16, 64, 512)  # OpenAI's: keys, key length, value length


@dataclass
class ResponseRequest:
    """A Responses request on its way: the ChatRequest, and what its reply is written into."""

    chat: ChatRequest
    envelope: dict[str, Any]  # the response object's settings (responses_output.new_envelope)
    conversation: list[dict[str, Any]]  # chat messages without the instructions: what is stored
    owner: str | None
    store: bool
    stream: bool
    items: OutputItems = field(default_factory=OutputItems)


async def create_response(request: Request, state: ServerState) -> Response:
    body = await state.read_body(request)
    req = parse_response_request(body, state, request)
    gen = await submit(request, state, req.chat)
    if req.stream:
        events = ResponseEvents(req.envelope, req.items)
        return sse_response(_stream(state, req, gen, events), req.chat.request_id, events.error_events)
    final = await final_output(request, gen)
    o = final.outputs[0]
    reply = req.chat.reply.parse(o.text, o.finish_reason)
    response = finished(req.envelope, reply, req.items.of(reply), await _usage(state, final, reply))
    _keep(state, req, response, reply)
    return JSONResponse(response, headers={"X-Request-Id": req.chat.request_id})


async def _stream(state: ServerState, req: ResponseRequest, gen, events: ResponseEvents):
    for e in events.start():
        yield e
    final, reason = None, None
    async for out, steps in reply_steps(gen, req.chat.reply):
        for step in steps:
            for e in events.feed(step.delta):
                yield e
            reason = step.finish or reason
        final = out
    reply = events.reply(reason)
    closing, response = events.finish(reply, await _usage(state, final, reply))
    _keep(state, req, response, reply)
    for e in closing:
        yield e


async def _usage(state: ServerState, final: RequestOutput, reply: Reply) -> dict[str, Any]:
    """Usage, with the reasoning's tokens counted by the tokenizer (the engine counts only the whole)."""
    counts = token_counts(state, final)
    reasoning = len((await state.encode([reply.reasoning], add_special_tokens=False))[0]) if reply.reasoning else 0
    return usage(counts.prompt, counts.completion, counts.cached, min(reasoning, counts.completion))


def _keep(state: ServerState, req: ResponseRequest, response: dict[str, Any], reply: Reply) -> None:
    """Store a finished response with its conversation, the reply's turn included."""
    if not req.store or response["status"] == "failed":
        return
    turn: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.calls:
        turn["tool_calls"] = [c.to_openai() for c in reply.calls]
    if reply.reasoning:
        turn["reasoning_content"] = reply.reasoning
    state.responses.put(req.owner, response, [*req.conversation, turn])


def parse_response_request(body: Body, state: ServerState, request: Request) -> ResponseRequest:
    """A Responses body -> ResponseRequest; every field is read, refused or a documented no-op."""
    lora = state.check_model(body)
    owner = state.owner(request)
    previous = body.str("previous_response_id")
    history = _previous(state, previous, owner)
    instructions = body.str("instructions")
    body.mark_read("input")
    conversation = [*history, *input_messages(body.data.get("input"), history)]
    messages = [dict(m) for m in conversation]  # prepare_tool_messages rewrites them: the store keeps JSON text
    messages = [{"role": "system", "content": instructions}, *messages] if instructions else messages
    prepare_tool_messages(messages)
    tools_body = chat_tools(body)
    reply = reply_parser(state, tool_request(state, tools_body))
    params = checked_sampling_params(
        temperature=body.float("temperature", 1.0, 0.0, 2.0),
        top_p=body.float("top_p", 1.0, 0.0, 1.0),
        max_tokens=body.int("max_output_tokens", state.config.max_tokens_default, 1),
        structured_outputs=constraint_for(text_format(body), "text.format", reply),
    )
    store, stream = bool(body.bool("store", True)), bool(body.bool("stream", False))
    fields = _echoed(body, previous, instructions, params, store, tools_body)
    _refuse_unsupported(body, stream)
    body.reject_unread(NO_EFFECT_FIELDS)
    rid = f"resp_{uuid.uuid4().hex}"  # never a client's X-Request-Id: ids are keys of the store
    chat = ChatRequest(rid, messages, params, reply, lora=lora, param="input")
    model = lora.lora_name if lora else state.model_name
    return ResponseRequest(chat, new_envelope(rid, model, fields), conversation, owner, store, stream)


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
        "reasoning": {"effort": None, "summary": None},
        "store": store,
        "temperature": params.temperature,
        "text": {"format": fmt or {"type": "text"}},
        "tool_choice": choice,
        "tools": tool_list,
        "top_p": params.top_p,
        "user": body.str("user"),
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
    include = body.value("include") or []
    if not isinstance(include, list) or include:
        raise APIError(
            f"'include' {str(include)[:100]} is not supported (no logprobs or encrypted reasoning here)",
            param="include",
        )
    if body.str("truncation", "disabled") != "disabled":
        raise APIError("'truncation' must be 'disabled': an input over --max-model-len is a 400", param="truncation")
    reasoning = body.obj("reasoning")
    for name in reasoning.data:  # reasoning is the model's own, split by --reasoning-parser
        if reasoning.data[name] is not None:
            raise APIError(
                f"'reasoning.{name}' is not supported: this server cannot steer reasoning", param=f"reasoning.{name}"
            )
    options = body.obj("stream_options")
    if options.data and not stream:
        raise APIError("'stream_options' can only be given with 'stream': true", param="stream_options")
    if options.bool("include_obfuscation", False):
        raise APIError(
            "'stream_options.include_obfuscation' is not supported", param="stream_options.include_obfuscation"
        )
    options.reject_unread()


def _stored(request: Request, state: ServerState) -> tuple[str, dict[str, Any]]:
    rid = request.path_params["response_id"]
    for name in request.query_params:  # include, stream, starting_after: none is implemented
        raise APIError(f"the query parameter '{name[:64]}' is not supported", param=name[:64])
    item = state.responses.get(rid, state.owner(request))
    if item is None:
        raise APIError(
            f"Response with id '{rid[:128]}' not found.", 404, param="response_id", code="response_not_found"
        )
    return rid, item.response


async def retrieve_response(request: Request, state: ServerState) -> Response:
    return JSONResponse(_stored(request, state)[1])


async def delete_response(request: Request, state: ServerState) -> Response:
    rid, _ = _stored(request, state)
    state.responses.delete(rid, state.owner(request))
    return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})


async def cancel_response(request: Request, state: ServerState) -> Response:
    """Every stored response has finished (no background mode): returned as it is."""
    return JSONResponse(_stored(request, state)[1])
